//! OTLP trace export configured by the standard environment variables:
//!
//! - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as given) or `OTEL_EXPORTER_OTLP_ENDPOINT`
//!   (HTTP gets `/v1/traces` appended, gRPC uses it as given); neither set → no export;
//! - `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` or
//!   `http/protobuf` (the specification's default);
//! - `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn export off;
//! - headers, timeout and compression variables are read by the exporter itself;
//!   `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` by the SDK (service name default `kpssh`).
//!
//! The exporter talks plaintext (a collector next to the controller); TLS is not built in.

use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

use super::TelemetryError;

pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
pub const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Grpc,
    HttpProtobuf,
}

/// Where and how spans are exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The full traces URL (HTTP: including `/v1/traces`).
    pub endpoint: String,
    pub wire: Wire,
}

impl Settings {
    pub fn from_env() -> Result<Option<Settings>, TelemetryError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The same rules over any variable source (tests pass a map).
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, TelemetryError> {
        let set = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let (var, value) = match (set(TRACES_PROTOCOL), set(PROTOCOL)) {
            (Some(v), _) => (TRACES_PROTOCOL, Some(v)),
            (None, Some(v)) => (PROTOCOL, Some(v)),
            (None, None) => (PROTOCOL, None),
        };
        let wire = match value.as_deref() {
            None | Some("http/protobuf") => Wire::HttpProtobuf,
            Some("grpc") => Wire::Grpc,
            Some(other) => {
                return Err(TelemetryError::Protocol {
                    var,
                    value: other.to_string(),
                });
            }
        };
        let endpoint = match (set(TRACES_ENDPOINT), set(ENDPOINT)) {
            (Some(e), _) => e,
            (None, Some(base)) => match wire {
                Wire::Grpc => base,
                Wire::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
            },
            (None, None) => return Ok(None),
        };
        Ok(Some(Settings { endpoint, wire }))
    }

    /// A provider with a batch exporter to this endpoint. Must be called inside a tokio
    /// runtime (the gRPC channel's worker runs there).
    pub fn provider(&self) -> Result<SdkTracerProvider, TelemetryError> {
        let err =
            |e: opentelemetry_otlp::ExporterBuildError| TelemetryError::Exporter(e.to_string());
        let exporter = match self.wire {
            Wire::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(self.endpoint.clone())
                .build()
                .map_err(err)?,
            Wire::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(self.endpoint.clone())
                .build()
                .map_err(err)?,
        };
        Ok(SdkTracerProvider::builder()
            .with_resource(resource())
            .with_batch_exporter(exporter)
            .build())
    }
}

/// A provider that exports nothing: spans still get trace ids for the logs.
pub fn local_provider() -> SdkTracerProvider {
    SdkTracerProvider::builder()
        .with_resource(resource())
        .build()
}

fn resource() -> Resource {
    let builder = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        builder.build()
    } else {
        builder.with_service_name("kpssh").build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Settings>, TelemetryError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn no_endpoint_means_no_export() {
        assert_eq!(settings(&[]).expect("ok"), None);
        assert_eq!(settings(&[(PROTOCOL, "grpc")]).expect("ok"), None);
    }

    #[test]
    fn http_appends_the_signal_path_to_the_generic_endpoint_only() {
        let s = settings(&[(ENDPOINT, "http://collector:4318/")]).expect("ok");
        assert_eq!(
            s,
            Some(Settings {
                endpoint: "http://collector:4318/v1/traces".into(),
                wire: Wire::HttpProtobuf
            })
        );
        let s = settings(&[
            (ENDPOINT, "http://ignored:4318"),
            (TRACES_ENDPOINT, "http://collector:4318/custom"),
        ])
        .expect("ok");
        assert_eq!(
            s.map(|s| s.endpoint).as_deref(),
            Some("http://collector:4318/custom")
        );
    }

    #[test]
    fn grpc_uses_the_endpoint_as_given_and_signal_protocol_wins() {
        let s = settings(&[
            (ENDPOINT, "http://collector:4317"),
            (PROTOCOL, "http/protobuf"),
            (TRACES_PROTOCOL, "grpc"),
        ])
        .expect("ok")
        .expect("some");
        assert_eq!(s.wire, Wire::Grpc);
        assert_eq!(s.endpoint, "http://collector:4317");
    }

    #[test]
    fn unsupported_protocol_and_disabled_sdk() {
        let e = settings(&[(ENDPOINT, "http://c:4318"), (PROTOCOL, "http/json")]);
        assert!(matches!(e, Err(TelemetryError::Protocol { .. })));
        let s = settings(&[(ENDPOINT, "http://c:4318"), ("OTEL_SDK_DISABLED", "true")]);
        assert_eq!(s.expect("ok"), None);
        let s = settings(&[
            (ENDPOINT, "http://c:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ]);
        assert_eq!(s.expect("ok"), None);
    }
}
