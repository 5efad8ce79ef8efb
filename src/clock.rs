//! Injected time.
