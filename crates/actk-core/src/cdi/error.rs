//! Errors of the CDI module: each variant names the input (file, field, name) and what was
//! expected, so a message is useful without a debugger.

use std::path::PathBuf;

/// An error from parsing names, checking versions, validating, loading, resolving or writing
/// CDI specs (CNCF container-device-interface SPEC.md).
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A kind or qualified device name breaks SPEC.md's syntax rules.
    #[error("invalid CDI name {input:?}: {rule}")]
    InvalidName {
        /// The string as given.
        input: String,
        /// The rule it breaks, in words.
        rule: String,
    },
    /// `cdiVersion` is not one of the released versions (0.3.0 .. 1.1.0).
    #[error("unknown cdiVersion {version:?}: known versions are {known}")]
    UnknownVersion {
        /// The declared version.
        version: String,
        /// The known versions, comma separated.
        known: String,
    },
    /// The spec uses a field newer than its declared `cdiVersion` (case F06).
    #[error(
        "spec declares cdiVersion {declared} but uses {field}, which needs cdiVersion >= {minimum}; raise cdiVersion to {minimum}"
    )]
    VersionTooLow {
        /// What the spec uses (`additionalGids`, `hostPath on a device node`, ...).
        field: String,
        /// The declared version.
        declared: String,
        /// The minimum version the field needs.
        minimum: String,
    },
    /// A spec document breaks the JSON schema or a SPEC.md rule. `pointer` is a JSON pointer
    /// (`/devices/0/containerEdits/hooks/1/path`); `file` is empty for in-memory specs.
    #[error("{}{pointer}: {message}", file_prefix(.file))]
    Invalid {
        /// The spec file, when the spec came from a file.
        file: Option<PathBuf>,
        /// JSON pointer to the offending value (empty for the whole document).
        pointer: String,
        /// What is wrong and what is expected.
        message: String,
    },
    /// A spec file could not be parsed as JSON or YAML.
    #[error("{}: cannot parse CDI spec as {format}: {message}", .file.display())]
    Parse {
        /// The spec file.
        file: PathBuf,
        /// `JSON` or `YAML`.
        format: &'static str,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A spec file (or its directory) that root does not own, or that group or others may write
    /// (crate::trusted): skipped, since its hooks would run as root in every container.
    #[error(transparent)]
    Untrusted(#[from] crate::trusted::Untrusted),
    /// Reading or writing a file failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No spec in the spec directories defines this kind.
    #[error("unresolvable CDI device {name}: no CDI spec for kind {kind} in {dirs} (known kinds: {known})")]
    UnknownKind {
        /// The requested qualified name.
        name: String,
        /// Its kind.
        kind: String,
        /// The spec directories searched.
        dirs: String,
        /// The kinds that do exist.
        known: String,
    },
    /// The kind exists but has no device of that name.
    #[error("unresolvable CDI device {name}: kind {kind} has devices {known}")]
    UnknownDevice {
        /// The requested qualified name.
        name: String,
        /// Its kind.
        kind: String,
        /// The device names that exist for this kind.
        known: String,
    },
    /// Two spec files of one directory define the same device.
    #[error("{message}")]
    Conflict {
        /// The qualified name.
        name: String,
        /// Which files define it and what to do.
        message: String,
    },
    /// The device's spec file defines it, but it was left out for what is wrong with it
    /// (its other devices stay usable).
    #[error("unresolvable CDI device {name}: its spec file defines it but it was refused: {message}")]
    Refused {
        /// The qualified name.
        name: String,
        /// The file and what is wrong with the device, with JSON pointers.
        message: String,
    },
    /// The profile, inventory or options cannot give a spec.
    #[error("cannot generate CDI spec for {kind}: {message}")]
    Generate {
        /// The kind being generated.
        kind: String,
        /// What is missing or wrong.
        message: String,
    },
}

fn file_prefix(file: &Option<PathBuf>) -> String {
    match file {
        Some(f) => format!("{}: ", f.display()),
        None => String::new(),
    }
}
