//! Errors of the `Cluster` port. Each names the object so that a log line says what to fix.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ClusterError {
    /// Compare-and-swap lost: someone wrote the object since it was read. Not a failure:
    /// re-read and decide again.
    #[error("{kind} {key}: conflict, the object changed since it was read")]
    Conflict { kind: String, key: String },
    #[error("{kind} {key} not found")]
    NotFound { kind: String, key: String },
    #[error("{kind} {key} already exists")]
    AlreadyExists { kind: String, key: String },
    #[error("{kind} {key} is invalid: {message}")]
    Invalid {
        kind: String,
        key: String,
        message: String,
    },
    /// 429: the request was refused for now — an eviction a PodDisruptionBudget does not allow
    /// yet, or an API server that is throttling or still starting. Retry later.
    #[error("{kind} {key}: refused for now (429 Too Many Requests): {message}")]
    TooManyRequests {
        kind: String,
        key: String,
        message: String,
    },
    /// RBAC or admission refused the request: a configuration problem, not worth a fast retry.
    #[error("{kind} {key}: forbidden: {message}")]
    Forbidden {
        kind: String,
        key: String,
        message: String,
    },
    /// Timeouts, 5xx, dropped connections: retry with backoff.
    #[error("{kind} {key}: transient API error: {message}")]
    Transient {
        kind: String,
        key: String,
        message: String,
    },
    #[error("{kind} {key}: decoding failed: {message}")]
    Decode {
        kind: String,
        key: String,
        message: String,
    },
}

impl ClusterError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, ClusterError::Conflict { .. })
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, ClusterError::NotFound { .. })
    }

    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClusterError::Transient { .. } | ClusterError::TooManyRequests { .. }
        )
    }
}
