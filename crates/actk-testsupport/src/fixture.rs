//! Fixture host roots (owner: fixtures helper).
