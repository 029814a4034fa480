//! CDI kinds (`vendor/class`) and qualified device names (`vendor/class=name`), parsed and
//! checked with the syntax rules of CNCF container-device-interface SPEC.md ("Kind", "CDI
//! Devices") as its reference parser applies them:
//!
//! - vendor: a DNS-subdomain-like prefix of at most 253 characters; starts with a letter, ends
//!   with a letter or digit, and has only letters, digits, `_`, `-`, `.` in between;
//! - class: at most 63 characters, same character rules as the vendor (dots need cdiVersion
//!   >= 0.6.0, which is a version rule, see [`super::version`], not a syntax rule);
//! - device name: starts and ends with a letter or digit, with letters, digits, `_`, `-`, `.`,
//!   `:` in between (a leading digit needs cdiVersion >= 0.5.0).

use super::CdiError;
use std::fmt;
use std::str::FromStr;

/// Longest vendor prefix SPEC.md allows (a DNS subdomain).
const VENDOR_MAX: usize = 253;
/// Longest class SPEC.md allows.
const CLASS_MAX: usize = 63;

/// A CDI kind: `vendor/class`, e.g. `nvidia.com/gpu`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kind {
    /// Vendor prefix (`nvidia.com`).
    pub vendor: String,
    /// Device class (`gpu`).
    pub class: String,
}

/// A fully qualified CDI device name: `vendor/class=name`, e.g. `nvidia.com/gpu=1`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    /// Vendor prefix (`nvidia.com`).
    pub vendor: String,
    /// Device class (`gpu`).
    pub class: String,
    /// Device name within the kind (`1`, `GPU-…`, `all`).
    pub name: String,
}

fn invalid(input: &str, rule: impl Into<String>) -> CdiError {
    CdiError::InvalidName { input: input.to_string(), rule: rule.into() }
}

/// Checks a vendor or class label (`what` is "vendor" or "class" for the message).
fn check_label(input: &str, what: &str, label: &str, max: usize) -> Result<(), CdiError> {
    if label.is_empty() {
        return Err(invalid(input, format!("the {what} is empty")));
    }
    if label.len() > max {
        return Err(invalid(input, format!("the {what} {label:?} is longer than {max} characters")));
    }
    let bytes = label.as_bytes();
    if !bytes[0].is_ascii_alphabetic() {
        return Err(invalid(input, format!("the {what} {label:?} must start with a letter")));
    }
    if !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return Err(invalid(input, format!("the {what} {label:?} must end with a letter or digit")));
    }
    if let Some(c) = label.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))) {
        return Err(invalid(
            input,
            format!("the {what} {label:?} has {c:?}; only letters, digits, '_', '-' and '.' are allowed"),
        ));
    }
    Ok(())
}

/// Checks a vendor prefix (`nvidia.com`). Errors name `input` and the rule broken.
pub fn check_vendor(input: &str, vendor: &str) -> Result<(), CdiError> {
    check_label(input, "vendor", vendor, VENDOR_MAX)
}

/// Checks a class (`gpu`). Errors name `input` and the rule broken.
pub fn check_class(input: &str, class: &str) -> Result<(), CdiError> {
    check_label(input, "class", class, CLASS_MAX)
}

/// Checks a device name (`0`, `GPU-8e6b…`, `all`). Errors name `input` and the rule broken.
pub fn check_device_name(input: &str, name: &str) -> Result<(), CdiError> {
    if name.is_empty() {
        return Err(invalid(input, "the device name is empty"));
    }
    let bytes = name.as_bytes();
    if !bytes[0].is_ascii_alphanumeric() {
        return Err(invalid(input, format!("the device name {name:?} must start with a letter or digit")));
    }
    if !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return Err(invalid(input, format!("the device name {name:?} must end with a letter or digit")));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))) {
        return Err(invalid(
            input,
            format!("the device name {name:?} has {c:?}; only letters, digits, '_', '-', '.' and ':' are allowed"),
        ));
    }
    Ok(())
}

impl Kind {
    /// Parses `vendor/class`. Errors: [`CdiError::InvalidName`] naming the input and the rule
    /// (missing `/`, more than one `/`, bad characters, too long).
    pub fn parse(input: &str) -> Result<Kind, CdiError> {
        let Some((vendor, class)) = input.split_once('/') else {
            return Err(invalid(input, "a kind is vendor/class, e.g. nvidia.com/gpu (no '/' found)"));
        };
        if class.contains('/') {
            return Err(invalid(input, "a kind has exactly one '/' (vendor/class)"));
        }
        check_vendor(input, vendor)?;
        check_class(input, class)?;
        Ok(Kind { vendor: vendor.to_string(), class: class.to_string() })
    }

    /// The qualified name of device `name` of this kind (not checked).
    pub fn device(&self, name: &str) -> QualifiedName {
        QualifiedName { vendor: self.vendor.clone(), class: self.class.clone(), name: name.to_string() }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

impl FromStr for Kind {
    type Err = CdiError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::parse(s)
    }
}

impl QualifiedName {
    /// Parses `vendor/class=name`. Errors: [`CdiError::InvalidName`] naming the input and the
    /// rule (missing `=`, missing vendor or class, bad characters).
    pub fn parse(input: &str) -> Result<QualifiedName, CdiError> {
        let Some((kind, name)) = input.split_once('=') else {
            return Err(invalid(
                input,
                "a qualified CDI device name is vendor/class=name, e.g. nvidia.com/gpu=0 (no '=' found)",
            ));
        };
        let kind = Kind::parse(kind).map_err(|e| match e {
            CdiError::InvalidName { rule, .. } => invalid(input, rule),
            other => other,
        })?;
        check_device_name(input, name)?;
        Ok(QualifiedName { vendor: kind.vendor, class: kind.class, name: name.to_string() })
    }

    /// True when `input` parses as a qualified name (used to tell CDI names from indexes and
    /// UUIDs in selection variables).
    pub fn is_qualified(input: &str) -> bool {
        QualifiedName::parse(input).is_ok()
    }

    /// The kind (`vendor/class`) of this name.
    pub fn kind(&self) -> Kind {
        Kind { vendor: self.vendor.clone(), class: self.class.clone() }
    }

    /// The kind as a string, `vendor/class`.
    pub fn kind_string(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

impl FromStr for QualifiedName {
    type Err = CdiError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        QualifiedName::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays_qualified_names() {
        for s in [
            "nvidia.com/gpu=0",
            "nvidia.com/gpu=GPU-8e6b8d4a-0ab1-4c5e-9f3e-1a2b3c4d5e6f",
            "aws.amazon.com/neuron=all",
            "foo.bar.baz/foo-bar123.B_az=a:b.c",
        ] {
            let q = QualifiedName::parse(s).unwrap();
            assert_eq!(q.to_string(), s);
        }
        let q = QualifiedName::parse("nvidia.com/gpu=1").unwrap();
        assert_eq!((q.vendor.as_str(), q.class.as_str(), q.name.as_str()), ("nvidia.com", "gpu", "1"));
        assert_eq!(q.kind_string(), "nvidia.com/gpu");
    }

    #[test]
    fn rejects_bad_names_naming_input_and_rule() {
        let cases = [
            ("nvidia.com/gpu", "no '=' found"),
            ("nvidia.com=0", "no '/' found"),
            ("vendor.com/foo/bar=0", "exactly one '/'"),
            ("/gpu=0", "vendor is empty"),
            ("nvidia.com/=0", "class is empty"),
            ("nvidia.com/gpu=", "device name is empty"),
            ("1nvidia.com/gpu=0", "must start with a letter"),
            ("nvidia.com-/gpu=0", "must end with a letter or digit"),
            ("nvidia.com/g*u=0", "'*'"),
            ("nvidia.com/gpu=-0", "must start with a letter or digit"),
            ("nvidia.com/gpu=0:", "must end with a letter or digit"),
            ("nvidia.com/gpu=a/b", "'/'"),
            ("nvidia.com/gpu=a b", "' '"),
        ];
        for (input, rule) in cases {
            let err = QualifiedName::parse(input).unwrap_err().to_string();
            assert!(err.contains(&format!("{input:?}")), "{err} should name {input}");
            assert!(err.contains(rule), "{err} should contain {rule}");
        }
        let long = format!("vendor.com/{}=0", "c".repeat(64));
        assert!(QualifiedName::parse(&long).unwrap_err().to_string().contains("longer than 63"));
    }

    #[test]
    fn kinds_parse() {
        let k = Kind::parse("aws.amazon.com/neuron").unwrap();
        assert_eq!(k.to_string(), "aws.amazon.com/neuron");
        assert_eq!(k.device("3").to_string(), "aws.amazon.com/neuron=3");
        assert!(Kind::parse("foo").unwrap_err().to_string().contains("no '/'"));
        assert!(Kind::parse("vendor.com/foo/").is_err());
    }
}
