//! The Prometheus endpoint: a plain HTTP/1.1 server on the kernel's network stack, on its own
//! thread, answering `GET /metrics` from the published statistics file (the cores are never
//! asked for anything).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Error;

/// The endpoint's thread; dropping it stops the thread.
#[derive(Debug)]
pub(crate) struct Metrics {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Metrics {
    /// Binds `addr` and serves the statistics at `path` from a thread.
    pub(crate) fn serve(addr: SocketAddr, path: &Path) -> Result<Metrics, Error> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            Error::Config(format!(
                "metrics endpoint {addr}: {e} (give a free address on the kernel's stack, e.g. \
                 127.0.0.1:9464)"
            ))
        })?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, path) = (stop.clone(), path.to_path_buf());
        let thread = std::thread::Builder::new()
            .name("corelane-metrics".into())
            .spawn(move || accept_loop(&listener, &path, &flag))?;
        tracing::info!("metrics at http://{addr}/metrics");
        Ok(Metrics {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, path: &Path, stop: &AtomicBool) {
    // The endpoint reads a file and answers on a bound socket: it needs no capability.
    let _ = corelane_xsk::retain_caps(&[]);
    let mut stats: Option<corelane_stat::Stats> = None;
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                if stats.is_none() {
                    stats = corelane_stat::Stats::open(path).ok();
                }
                if let Err(e) = answer(s, stats.as_ref()) {
                    tracing::debug!("metrics: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!("metrics: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Reads one request (bounded in size and time) and answers it.
fn answer(mut s: TcpStream, stats: Option<&corelane_stat::Stats>) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&req);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, kind, body) = match (method, target, stats) {
        ("GET", "/metrics", Some(st)) => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            corelane_stat::prometheus(st),
        ),
        ("GET", "/metrics", None) => (
            "503 Service Unavailable",
            "text/plain",
            "the statistics file is not there yet\n".to_string(),
        ),
        ("GET", _, _) => ("404 Not Found", "text/plain", "try /metrics\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_string(),
        ),
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}
