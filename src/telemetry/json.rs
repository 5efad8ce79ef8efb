//! JSON log lines carrying the OpenTelemetry trace and span id of the span they were written
//! in, so that a log line can be found from a trace and the other way round:
//!
//! `{"timestamp","level","target","fields":{"message",…},"spans":[{"name",…}],"trace_id","span_id"}`

use std::io::Write;

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The layer: one line per event, written with `make_writer`.
pub fn layer<W>(make_writer: W) -> JsonLayer<W>
where
    W: for<'w> MakeWriter<'w> + 'static,
{
    JsonLayer {
        make_writer,
        dispatch: std::sync::OnceLock::new(),
    }
}

pub struct JsonLayer<W> {
    make_writer: W,
    /// The subscriber this layer is part of: inside a callback the thread's default dispatcher
    /// is not reachable (re-entrancy guard), so the OpenTelemetry context is read through this.
    dispatch: std::sync::OnceLock<tracing::dispatcher::WeakDispatch>,
}

/// A span's fields as recorded so far.
struct SpanFields(Map<String, Value>);

struct Collect<'a>(&'a mut Map<String, Value>);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            Value::String(format!("{value:?}")),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
}

impl<S, W> Layer<S> for JsonLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Map::new();
        attrs.record(&mut Collect(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<SpanFields>()
        {
            values.record(&mut Collect(&mut fields.0));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Map::new();
        event.record(&mut Collect(&mut fields));
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            jiff::Timestamp::now().to_string().into(),
        );
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        line.insert("fields".into(), Value::Object(fields));
        if let Some(leaf) = ctx.event_span(event) {
            // Ids first: reading the OpenTelemetry context locks the span's extensions.
            let dispatch = self.dispatch.get().and_then(|d| d.upgrade());
            if let Some((trace, span)) = dispatch.and_then(|d| otel_ids(&leaf.id(), &d)) {
                line.insert("trace_id".into(), trace.into());
                line.insert("span_id".into(), span.into());
            }
            let spans: Vec<Value> = leaf
                .scope()
                .from_root()
                .map(|s| {
                    let mut m = s
                        .extensions()
                        .get::<SpanFields>()
                        .map(|f| f.0.clone())
                        .unwrap_or_default();
                    m.insert("name".into(), s.name().into());
                    Value::Object(m)
                })
                .collect();
            line.insert("spans".into(), Value::Array(spans));
        }
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        let _ = self.make_writer.make_writer().write_all(text.as_bytes());
    }
}

/// The OpenTelemetry trace and span id of a span, when the OpenTelemetry layer is installed.
fn otel_ids(id: &Id, dispatch: &tracing::Dispatch) -> Option<(String, String)> {
    let cx = tracing_opentelemetry::get_otel_context(id, dispatch)?;
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    #[test]
    fn log_lines_carry_the_trace_id_of_their_span() {
        use opentelemetry::trace::TracerProvider as _;
        let provider = super::super::otlp::local_provider();
        let buf = Buf::default();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(layer(buf.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("probe", host = "pool/a");
            let _g = span.enter();
            tracing::info!(outcome = "success", "probed");
        });
        tracing::subscriber::with_default(
            tracing_subscriber::registry().with(layer(buf.clone())),
            || {
                tracing::info!("outside");
            },
        );
        let text = String::from_utf8(buf.0.lock().expect("buf").clone()).expect("utf8");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        let first = &lines[0];
        assert_eq!(first["fields"]["message"], "probed");
        assert_eq!(first["fields"]["outcome"], "success");
        assert_eq!(first["spans"][0]["name"], "probe");
        assert_eq!(first["spans"][0]["host"], "pool/a");
        let trace = first["trace_id"].as_str().expect("trace id");
        assert_eq!(trace.len(), 32);
        assert_ne!(trace, "00000000000000000000000000000000");
        assert_eq!(first["span_id"].as_str().map(str::len), Some(16));
        assert!(lines[1].get("trace_id").is_none(), "no span, no trace id");
    }
}
