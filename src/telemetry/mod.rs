//! Logs and traces. Logs are JSON lines on stderr (level from `RUST_LOG`, else the Go provider's `LOG_LEVEL`, default `info`), each
//! carrying the trace and span id of the span it was written in. Traces go out over OTLP when
//! the standard `OTEL_EXPORTER_OTLP_*` variables name an endpoint ([`otlp`]); otherwise spans
//! are still created (so log lines can be correlated) but not exported.
//!
//! Secrets never reach here: every message built from host output or API objects is redacted
//! at its source, and span attributes carry names, states and numbers only.

pub mod core_metrics;
pub mod json;
pub mod lifecycle;
pub mod otlp;

pub use lifecycle::Lifecycles;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Instrumentation scope of every kpssh span.
pub const SCOPE: &str = "kpssh";

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("{var}={value:?} is not supported (use grpc or http/protobuf)")]
    Protocol { var: &'static str, value: String },
}

/// Keeps the tracer provider alive; [`Telemetry::shutdown`] flushes what is still buffered.
pub struct Telemetry {
    provider: SdkTracerProvider,
    exporting: bool,
}

impl Telemetry {
    /// True when spans leave the process (an OTLP endpoint is configured).
    pub fn exporting(&self) -> bool {
        self.exporting
    }

    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Flush buffered spans and stop the exporter. Blocks up to the exporter's timeout, so it
    /// runs on a blocking thread and never stalls the runtime that drives the exporter.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let flushed = tokio::task::spawn_blocking(move || {
            let _ = provider.force_flush();
            provider.shutdown()
        })
        .await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("kpssh: trace flush on shutdown failed: {e}"),
            Err(e) => eprintln!("kpssh: trace flush on shutdown failed: {e}"),
        }
    }
}

/// A tracer provider from the environment: exporting over OTLP when configured, else a local
/// one that only mints ids for the logs.
pub fn provider_from_env() -> Result<(SdkTracerProvider, bool), TelemetryError> {
    match otlp::Settings::from_env()? {
        Some(settings) => Ok((settings.provider()?, true)),
        None => Ok((otlp::local_provider(), false)),
    }
}

/// Install the global subscriber: env filter, JSON logs with trace ids, and the OpenTelemetry
/// layer feeding `provider`.
pub fn init() -> Result<Telemetry, TelemetryError> {
    let (provider, exporting) = provider_from_env()?;
    // RUST_LOG, else the Go provider's LOG_LEVEL (debug, info, error), else info.
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| {
            std::env::var("LOG_LEVEL")
                .map_err(|_| ())
                .and_then(|l| EnvFilter::try_new(l.trim()).map_err(|_| ()))
        })
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let tracer = provider.tracer(SCOPE);
    // A second init (tests) is not an error worth failing for.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .with(json::layer(std::io::stderr))
        .try_init();
    Ok(Telemetry {
        provider,
        exporting,
    })
}

/// A subscriber exporting to `provider` (tests and tools that install it scoped).
pub fn subscriber(provider: &SdkTracerProvider) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::registry()
        .with(EnvFilter::new("info"))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer(SCOPE)))
}
