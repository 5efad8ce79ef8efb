//! See docs/architecture.md.
pub mod verified;
