//! Discovery: reading a host root into an [`crate::inventory::Inventory`], driven by profiles.
