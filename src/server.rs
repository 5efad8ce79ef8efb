//! The controller's small HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the process
//! runs), `/readyz` (the controller's watches delivered their first lists).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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

/// Serve until the listener fails. Requests are tiny GETs; anything else gets 404/405.
pub async fn serve<S: Status>(listener: TcpListener, status: Arc<S>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let status = status.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), handle(stream, status)).await;
        });
    }
}

async fn handle<S: Status>(mut stream: TcpStream, status: Arc<S>) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await?;
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (code, ctype, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            status.metrics(),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") if status.ready() => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") => (
            "503 Service Unavailable",
            "text/plain",
            "not ready\n".to_string(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {code}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
