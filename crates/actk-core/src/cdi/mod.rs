//! CDI: the spec model, generation from an inventory, version rules, validation, and the
//! registry of spec files in the spec directories (CNCF container-device-interface SPEC.md).
//!
//! - [`name`]: qualified device names `vendor/class=name` and kinds;
//! - [`version`]: minimum `cdiVersion` of a spec, and the declared-version check (F06);
//! - [`generate`]: one spec per kind from a profile and its inventory; [`generate::edits_for`];
//! - [`validate`]: JSON schema + SPEC.md rules, errors with file and JSON pointer;
//! - [`registry`]: spec files of /etc/cdi and /var/run/cdi, resolution of names to edits;
//! - [`scan`]: the validating JSON scanner that finds each device's text for a start's lazy reading;
//! - [`write`]: atomic spec file writes (JSON or YAML).

pub mod error;
pub mod generate;
pub mod name;
pub mod registry;
pub mod scan;
pub mod spec;
pub mod typed;
pub mod validate;
pub mod version;
pub mod write;

pub use error::CdiError;
pub use generate::{DeviceNameStrategy, GenerateOptions, edits_for, generate};
pub use name::{Kind, QualifiedName};
pub use registry::{DEFAULT_SPEC_DIRS, Registry};
pub use spec::{
    ContainerEdits, Device as CdiDevice, DeviceNode as CdiDeviceNode, Hook as CdiHook, Mount as CdiMount, Spec,
};
pub use validate::Format;
