//! Lifecycle traces over OTLP (issue 9): an in-process OTLP receiver (gRPC: a tonic server
//! implementing the collector's TraceService; HTTP/protobuf: a small HTTP/1.1 server decoding
//! the same message), kpssh's real exporter pointed at it by the standard `OTEL_EXPORTER_OTLP_*`
//! settings, and a cold then a warm join (S13, S16) and their releases (S23) driven in the
//! simulation world on tokio's paused clock. The exporter and the receiver run on a separate
//! real-clock runtime, so the paused clock of the simulation never fires their timeouts.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpssh::api::{HostState, NodeClaim};
use kpssh::k8s::Cluster;
use kpssh::provider::Config;
use kpssh::sim::SimHost;
use kpssh::sim::world::{World, node_claim};
use kpssh::telemetry::otlp::Settings;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MINUTE: Duration = Duration::from_secs(60);

type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

#[derive(Clone, Default)]
struct Receiver {
    got: Received,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.got
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The real-clock side: a runtime for the receiver and the exporter's gRPC channel.
fn real_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn grpc_receiver(got: Received) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver { got }))
            .serve_with_incoming(incoming)
            .await;
    });
    addr
}

/// OTLP/HTTP with protobuf bodies: POST /v1/traces, keep-alive, 200 with an empty response.
async fn http_receiver(got: Received) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let got = got.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(end) = find(&buf, b"\r\n\r\n") else {
                        let mut chunk = [0u8; 8192];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        let mut chunk = [0u8; 8192];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buf[end + 4..end + 4 + len].to_vec();
                    buf.drain(..end + 4 + len);
                    let ok = head.starts_with("POST /v1/traces ")
                        && head.to_ascii_lowercase().contains("application/x-protobuf");
                    let status = match ExportTraceServiceRequest::decode(body.as_slice()) {
                        Ok(req) if ok => {
                            got.lock().unwrap_or_else(|p| p.into_inner()).push(req);
                            "200 OK"
                        }
                        _ => "400 Bad Request",
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
                    );
                    if conn.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn settings(vars: &[(&str, String)]) -> Settings {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    Settings::from_lookup(|k| map.get(k).cloned())
        .expect("valid settings")
        .expect("an endpoint is configured")
}

async fn wait_state(w: &World, host: &str, state: HostState) {
    let ok = w
        .until(3 * MINUTE, || async {
            w.host(host).await.is_some_and(|h| h.state() == state)
        })
        .await;
    assert!(ok, "{host} never reached {state}: {:?}", w.host(host).await);
}

/// One claim on host `h`: InUse, Initialized, then deleted and released back to Available.
async fn claim_and_release(w: &World, name: &str) {
    let mut nc = node_claim(name, "pool", "1", "1Gi");
    nc.metadata.labels = Some(BTreeMap::from([(
        "karpenter.sh/nodepool".to_string(),
        "default".to_string(),
    )]));
    w.cluster.create(&nc).await.expect("nodeclaim");
    wait_state(w, "h", HostState::InUse).await;
    let initialized = w
        .until(3 * MINUTE, || async {
            w.cluster
                .get::<NodeClaim>(None, name)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.status)
                .is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Initialized" && c.status == "True")
                })
        })
        .await;
    assert!(initialized, "{name} never Initialized");
    w.cluster
        .delete::<NodeClaim>(None, name, None)
        .await
        .expect("delete");
    wait_state(w, "h", HostState::Available).await;
    let gone = w
        .until(3 * MINUTE, || async {
            w.cluster
                .get::<NodeClaim>(None, name)
                .await
                .ok()
                .flatten()
                .is_none()
        })
        .await;
    assert!(gone, "{name} finalizer never removed");
}

/// The simulation on a paused current-thread runtime, with kpssh's spans going to `provider`.
fn drive_sim(provider: &opentelemetry_sdk::trace::SdkTracerProvider, warm_too: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("paused runtime");
    tracing::subscriber::with_default(kpssh::telemetry::subscriber(provider), || {
        rt.block_on(async {
            let w = World::start(Config::default(), 11).await.expect("world");
            w.add_profile_and_class("p", "pool")
                .await
                .expect("profile and class");
            w.add_host("h", "small", SimHost::new("10.90.0.1", 4, 8_000_000))
                .await
                .expect("host");
            wait_state(&w, "h", HostState::Available).await;
            claim_and_release(&w, "nc-cold").await;
            if warm_too {
                claim_and_release(&w, "nc-warm").await;
            }
            w.stop().await;
        });
    });
}

/// Flush and collect every span the receiver got (bounded wait).
fn collect(provider: &opentelemetry_sdk::trace::SdkTracerProvider, got: &Received) -> Vec<Span> {
    provider.force_flush().expect("flush");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let spans: Vec<Span> = got
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flat_map(|r| r.resource_spans.iter())
            .flat_map(|r| r.scope_spans.iter())
            .flat_map(|s| s.spans.iter().cloned())
            .collect();
        if !spans.is_empty() || std::time::Instant::now() > deadline {
            return spans;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn attr(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.clone())
}

fn attr_str(span: &Span, key: &str) -> Option<String> {
    match attr(span, key)? {
        AnyValue::StringValue(s) => Some(s),
        _ => None,
    }
}

fn attr_int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key)? {
        AnyValue::IntValue(i) => Some(i),
        _ => None,
    }
}

fn attr_bool(span: &Span, key: &str) -> Option<bool> {
    match attr(span, key)? {
        AnyValue::BoolValue(b) => Some(b),
        _ => None,
    }
}

/// The lifecycle root of NodeClaim `name`.
fn lifecycle<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "nodeclaim.lifecycle")
        .filter(|s| attr_str(s, "nodeclaim").as_deref() == Some(name))
        .collect();
    assert_eq!(roots.len(), 1, "one lifecycle trace for {name}");
    let root = roots[0];
    assert!(
        root.parent_span_id.is_empty(),
        "the lifecycle is a root span"
    );
    root
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id)
        .collect()
}

fn child<'a>(spans: &'a [Span], parent: &Span, name: &str) -> &'a Span {
    let found: Vec<&Span> = children(spans, parent)
        .into_iter()
        .filter(|s| s.name == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{name} under {}: {:?}",
        parent.name,
        children(spans, parent)
            .iter()
            .map(|s| &s.name)
            .collect::<Vec<_>>()
    );
    found[0]
}

/// A phase span with its `ssh.exec` child, both successful with exit code 0.
fn assert_phase(spans: &[Span], root: &Span, phase: &str) {
    let p = child(spans, root, phase);
    assert_eq!(attr_str(p, "phase").as_deref(), Some(phase));
    assert_eq!(attr_str(p, "outcome").as_deref(), Some("success"));
    assert_eq!(attr_int(p, "exit_code"), Some(0));
    assert!(
        attr_int(p, "duration_ms").is_some(),
        "{phase} has a duration"
    );
    let exec = child(spans, p, "ssh.exec");
    assert_eq!(attr_int(exec, "exit_code"), Some(0));
    assert_eq!(attr_str(exec, "host").as_deref(), Some("kpssh-system/h"));
    assert!(exec.start_time_unix_nano >= p.start_time_unix_nano);
    assert!(exec.end_time_unix_nano <= p.end_time_unix_nano);
}

fn assert_lifecycle(spans: &[Span], name: &str, warm: bool) {
    let root = lifecycle(spans, name);
    assert_eq!(attr_str(root, "host").as_deref(), Some("kpssh-system/h"));
    assert_eq!(attr_str(root, "class").as_deref(), Some("small"));
    assert_eq!(attr_str(root, "nodepool").as_deref(), Some("default"));
    assert_eq!(attr_bool(root, "warm"), Some(warm), "{name} warm");
    assert_eq!(attr_bool(root, "resumed"), Some(false));
    assert_eq!(attr_str(root, "outcome").as_deref(), Some("Released"));
    assert!(
        attr_int(root, "duration_ms").is_some_and(|d| d > 0),
        "{:?}",
        attr(root, "duration_ms")
    );
    for step in ["claim", "registered", "initialized", "drain", "released"] {
        let s = child(spans, root, step);
        assert!(
            s.start_time_unix_nano >= root.start_time_unix_nano
                && s.end_time_unix_nano <= root.end_time_unix_nano,
            "{step} inside the lifecycle"
        );
    }
    assert_eq!(
        attr_str(child(spans, root, "drain"), "outcome").as_deref(),
        Some("success")
    );
    if warm {
        assert!(
            children(spans, root).iter().all(|s| s.name != "install"),
            "a warm join skips install (S16)"
        );
    } else {
        assert_phase(spans, root, "install");
    }
    assert_phase(spans, root, "join");
    assert_phase(spans, root, "leave");
    // Start order of the steps follows the lifecycle.
    let order: Vec<&str> = {
        let mut c = children(spans, root);
        c.sort_by_key(|s| s.start_time_unix_nano);
        c.iter().map(|s| s.name.as_str()).collect()
    };
    let pos = |n: &str| order.iter().position(|x| *x == n).expect("step");
    assert!(pos("claim") < pos("join"), "{order:?}");
    assert!(pos("join") < pos("registered"), "{order:?}");
    assert!(pos("registered") <= pos("initialized"), "{order:?}");
    assert!(pos("initialized") < pos("drain"), "{order:?}");
    assert!(pos("drain") < pos("leave"), "{order:?}");
    assert!(pos("leave") < pos("released"), "{order:?}");
}

#[test]
fn s13_s16_otlp_grpc_span_tree_of_a_cold_and_a_warm_join() {
    let real = real_runtime();
    let got = Received::default();
    let addr = real.block_on(grpc_receiver(got.clone()));
    let s = settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
    ]);
    // The gRPC channel's worker runs on the real-clock runtime.
    let provider = {
        let _in = real.enter();
        s.provider().expect("exporter")
    };
    drive_sim(&provider, true);
    let spans = collect(&provider, &got);
    assert_lifecycle(&spans, "nc-cold", false);
    assert_lifecycle(&spans, "nc-warm", true);
    let cold = lifecycle(&spans, "nc-cold");
    let warm = lifecycle(&spans, "nc-warm");
    assert_ne!(cold.trace_id, warm.trace_id, "one trace per lifecycle");
    // Probes are traces of their own, with an ssh.probe child.
    let probe = spans
        .iter()
        .find(|s| s.name == "probe" && attr_str(s, "outcome").as_deref() == Some("ok"))
        .expect("a probe span");
    assert!(probe.parent_span_id.is_empty());
    assert_eq!(attr_str(probe, "class").as_deref(), Some("small"));
    let ssh = child(&spans, probe, "ssh.probe");
    assert_eq!(attr_str(ssh, "outcome").as_deref(), Some("success"));
    // The service is named in the resource.
    let named = got
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .flat_map(|r| r.resource_spans.iter())
        .filter_map(|r| r.resource.as_ref())
        .flat_map(|r| r.attributes.iter())
        .any(|kv| {
            kv.key == "service.name"
                && kv.value.as_ref().and_then(|v| v.value.clone())
                    == Some(AnyValue::StringValue("kpssh".into()))
        });
    assert!(named, "service.name=kpssh");
    let _ = provider.shutdown();
}

#[test]
fn s13_otlp_http_protobuf_exports_the_same_tree() {
    let real = real_runtime();
    let got = Received::default();
    let addr = real.block_on(http_receiver(got.clone()));
    let s = settings(&[
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("http://{addr}/v1/traces"),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
    ]);
    let provider = s.provider().expect("exporter");
    drive_sim(&provider, false);
    let spans = collect(&provider, &got);
    assert_lifecycle(&spans, "nc-cold", false);
    let _ = provider.shutdown();
}
