//! The Prometheus endpoint: a plain HTTP/1.1 server on the kernel's network stack, on its own
//! thread, answering `GET /metrics` from the published statistics file (the cores are never
//! asked for anything).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Error;

/// The endpoint's thread; dropping it stops the thread.
#[derive(Debug)]
pub(crate) struct Metrics {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Metrics {
    /// Binds `addr` and serves the statistics at `path` from a thread, which first runs
    /// `unprivileged` (the host's: it drops the thread's capabilities, since the endpoint
    /// reads a file and answers on a bound socket).
    pub(crate) fn serve(
        addr: SocketAddr,
        path: &Path,
        unprivileged: fn(),
    ) -> Result<Metrics, Error> {
        let listener = TcpListener::bind(addr).map_err(|source| Error::Os {
            what: format!(
                "metrics endpoint {addr} (give a free address on the kernel's stack, e.g. \
                 127.0.0.1:9464)"
            ),
            source,
        })?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, path) = (stop.clone(), path.to_path_buf());
        let thread = std::thread::Builder::new()
            .name("corelane-metrics".into())
            .spawn(move || {
                unprivileged();
                accept_loop(&listener, &path, &flag)
            })?;
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

/// Requests answered at once, each on its own thread; a connection past these is closed.
const MAX_AT_ONCE: usize = 8;
/// Of those, from one peer address: a client that keeps reconnecting (or trickles on many
/// connections) holds at most these, and a scraper from another address is still answered.
const MAX_PER_PEER: usize = 2;
/// The most one request may take from accept to answer, however its client trickles.
const DEADLINE: Duration = Duration::from_secs(2);

fn accept_loop(listener: &TcpListener, path: &Path, stop: &AtomicBool) {
    let busy = Arc::new(AtomicUsize::new(0));
    let peers: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, from)) => {
                // A slow client holds one of these for at most DEADLINE, never the endpoint.
                let ip = from.ip();
                {
                    let mut p = crate::lock::lock(&peers);
                    let mine = p.entry(ip).or_insert(0);
                    if *mine >= MAX_PER_PEER || busy.load(Ordering::SeqCst) >= MAX_AT_ONCE {
                        if *mine == 0 {
                            p.remove(&ip);
                        }
                        continue;
                    }
                    *mine += 1;
                    busy.fetch_add(1, Ordering::SeqCst);
                }
                let (busy, peers, path) = (busy.clone(), peers.clone(), path.to_path_buf());
                let done = move || {
                    let mut p = crate::lock::lock(&peers);
                    if let Some(n) = p.get_mut(&ip) {
                        *n -= 1;
                        if *n == 0 {
                            p.remove(&ip);
                        }
                    }
                    busy.fetch_sub(1, Ordering::SeqCst);
                };
                let done = Arc::new(Mutex::new(Some(done)));
                let finish = done.clone();
                let spawned = std::thread::Builder::new()
                    .name("corelane-metrics-req".into())
                    .spawn(move || {
                        let stats = corelane_stat::Stats::open(&path).ok();
                        if let Err(e) = answer(s, stats.as_ref()) {
                            tracing::debug!("metrics: {e}");
                        }
                        if let Some(f) = crate::lock::lock(&finish).take() {
                            f();
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!("metrics: a request's thread: {e}");
                    if let Some(f) = crate::lock::lock(&done).take() {
                        f();
                    }
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

/// Reads one request (at most 8 KiB, within `DEADLINE` in all) and answers it.
fn answer(mut s: TcpStream, stats: Option<&corelane_stat::Stats>) -> io::Result<()> {
    let until = Instant::now() + DEADLINE;
    let left = || {
        until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "request too slow"))
    };
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(DEADLINE))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        s.set_read_timeout(Some(left()?))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn from(ip: [u8; 4], to: SocketAddr) -> io::Result<TcpStream> {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        sock.bind(&SocketAddr::from((ip, 0)).into())?;
        sock.connect(&to.into())?;
        Ok(sock.into())
    }

    #[test]
    fn a_peer_holding_every_slot_it_can_leaves_a_scraper_from_elsewhere_answered() -> io::Result<()>
    {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let m = Metrics::serve(addr, Path::new("/nonexistent/corelane-stats"), || {})
            .map_err(|e| io::Error::other(e.to_string()))?;
        // One address opens a connection per slot and sends nothing: each would hold its
        // slot for the whole deadline.
        let hogs: Vec<TcpStream> = (0..MAX_AT_ONCE)
            .map(|_| from([127, 0, 0, 1], addr))
            .collect::<io::Result<_>>()?;
        std::thread::sleep(Duration::from_millis(200));
        // A scraper from another address is answered meanwhile.
        let mut s = from([127, 0, 0, 2], addr)?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
        drop(hogs);
        drop(m);
        Ok(())
    }

    #[test]
    fn an_address_in_use_is_the_os_s_error_with_the_fix() -> io::Result<()> {
        let taken = TcpListener::bind("127.0.0.1:0")?;
        let addr = taken.local_addr()?;
        match Metrics::serve(addr, Path::new("/nonexistent/corelane-stats"), || {}) {
            Err(Error::Os { what, source }) => {
                assert_eq!(source.kind(), io::ErrorKind::AddrInUse);
                assert!(what.contains(&addr.to_string()) && what.contains("free address"));
            }
            other => panic!("{other:?}"),
        }
        Ok(())
    }
}
