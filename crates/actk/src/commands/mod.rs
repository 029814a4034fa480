pub mod cdi;
pub mod config;
pub mod info;
pub mod list;
pub mod runtime;
pub mod system;
