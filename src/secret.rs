//! A value that must never reach a log, an event, a status or an error text.

use std::fmt;

/// Holds secret material (private keys, bootstrap tokens, join secrets). `Debug` and `Display`
/// print a placeholder so that a stray `{:?}` cannot leak it; read it with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret value. Call sites are few and greppable on purpose.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_never_shows_the_value() {
        let s = Secret::new("abcdef.0123456789abcdef");
        assert!(!format!("{s:?}").contains("0123456789"));
        assert!(!format!("{s}").contains("0123456789"));
        assert_eq!(s.expose(), "abcdef.0123456789abcdef");
    }
}
