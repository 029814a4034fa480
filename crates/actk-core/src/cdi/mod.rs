//! CDI: the spec model, generation from an inventory, version rules, validation, and the
//! registry of spec files in the spec directories (CNCF container-device-interface SPEC.md).

pub mod error;
pub mod generate;
pub mod name;
pub mod spec;
pub mod validate;
pub mod version;

pub use error::CdiError;
pub use name::{Kind, QualifiedName};
pub use spec::{ContainerEdits, Device as CdiDevice, DeviceNode as CdiDeviceNode, Hook as CdiHook, Mount as CdiMount, Spec};
