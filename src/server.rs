//! The controller's small HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the process
//! runs), `/readyz` (the controller's watches delivered their first lists).
//!
//! HTTP/1.1 through hyper: a request split across TCP reads, keep-alive, pipelining and HEAD
//! are hyper's to get right (the hand-written parser before it read one `read()` per request
//! and misrouted a request that arrived in two segments).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// What the endpoint reports.
pub trait Status: Send + Sync + 'static {
    fn metrics(&self) -> String;
    fn ready(&self) -> bool;
}

/// Flag flipped once the controller is up.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A connection lives at most this long: a scraper that holds one open does not pin a task
/// forever, and a client that sends half a request and stalls is dropped.
const CONNECTION_LIMIT: Duration = Duration::from_secs(10);
/// Time allowed for a request's headers to arrive.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serve until the listener fails. GET and HEAD of the three paths; other paths get 404,
/// other methods 405.
pub async fn serve<S: Status>(listener: TcpListener, status: Arc<S>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let status = status.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_LIMIT, serve_connection(stream, status)).await;
        });
    }
}

/// One connection, any number of requests on it.
pub async fn serve_connection<S, IO>(io: IO, status: Arc<S>) -> Result<(), hyper::Error>
where
    S: Status,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let status = status.clone();
        async move { Ok::<_, Infallible>(respond(&req, status.as_ref())) }
    });
    http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // Responses carry no Date header: nothing here is cacheable, and the bytes of a
        // response stay the same for the same status (tests compare them).
        .auto_date_header(false)
        .serve_connection(TokioIo::new(io), service)
        .await
}

fn respond<S: Status + ?Sized, B>(req: &Request<B>, status: &S) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        // A 405 names the methods that are allowed (RFC 9110 §15.5.6).
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = text(StatusCode::OK, &status.metrics());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if status.ready() => text(StatusCode::OK, "ok\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(code: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed {
        ready: bool,
    }

    impl Status for Fixed {
        fn metrics(&self) -> String {
            "kpssh_up 1\n".into()
        }
        fn ready(&self) -> bool {
            self.ready
        }
    }

    /// The connection, fed by a mock that hands the request over in the pieces given and
    /// expects exactly `response` back.
    async fn exchange(pieces: &[&str], response: &str, ready: bool) {
        let mut io = tokio_test::io::Builder::new();
        for p in pieces {
            io.read(p.as_bytes());
        }
        io.write(response.as_bytes());
        serve_connection(io.build(), Arc::new(Fixed { ready }))
            .await
            .expect("the connection ends cleanly");
    }

    #[tokio::test]
    async fn a_request_split_across_reads_is_answered_as_one() {
        exchange(
            &[
                "GET /met",
                "rics HTTP/1.1\r\nHost: x\r\n",
                "Connection: close\r\n\r\n",
            ],
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\
             connection: close\r\ncontent-length: 11\r\n\r\nkpssh_up 1\n",
            true,
        )
        .await;
    }

    #[tokio::test]
    async fn head_gets_the_headers_without_the_body() {
        exchange(
            &["HEAD /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"],
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\
             content-length: 3\r\n\r\n",
            true,
        )
        .await;
    }

    #[tokio::test]
    async fn readyz_is_503_until_ready_and_other_paths_404() {
        exchange(
            &["GET /readyz HTTP/1.1\r\nConnection: close\r\n\r\n"],
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
             connection: close\r\ncontent-length: 10\r\n\r\nnot ready\n",
            false,
        )
        .await;
        exchange(
            &["GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n"],
            "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\n\
             connection: close\r\ncontent-length: 10\r\n\r\nnot found\n",
            true,
        )
        .await;
    }

    #[tokio::test]
    async fn other_methods_get_405_with_allow() {
        exchange(
            &["DELETE /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"],
            "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: text/plain\r\nallow: GET, HEAD\r\n\
             connection: close\r\ncontent-length: 19\r\n\r\nmethod not allowed\n",
            true,
        )
        .await;
    }

    #[tokio::test]
    async fn two_requests_on_one_connection_are_both_answered() {
        let (mut client, server) = tokio::io::duplex(4096);
        let conn = tokio::spawn(serve_connection(server, Arc::new(Fixed { ready: true })));
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        client
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .expect("first request");
        let mut first = [0u8; 256];
        let n = client.read(&mut first).await.expect("first response");
        let first = String::from_utf8_lossy(&first[..n]).to_string();
        assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
        assert!(!first.contains("connection: close"), "kept alive: {first}");
        client
            .write_all(b"GET /readyz HTTP/1.1\r\nConnection: close\r\n\r\n")
            .await
            .expect("second request");
        let mut second = String::new();
        client
            .read_to_string(&mut second)
            .await
            .expect("second response");
        assert!(second.starts_with("HTTP/1.1 200 OK\r\n"), "{second}");
        assert!(second.ends_with("\r\n\r\nok\n"), "{second}");
        conn.await
            .expect("joined")
            .expect("the connection ends cleanly");
    }
}
