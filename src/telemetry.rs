//! Logging: JSON lines on stderr, level from `RUST_LOG` (default `info`). Secrets never reach
//! here: every message built from host output or API objects is redacted at its source.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A second init (tests) is not an error worth failing for.
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_current_span(true)
        .try_init();
}
