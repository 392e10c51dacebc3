//! The load generator: request/response, bulk and connect loads over kernel or corelane sockets,
//! with a time limit on every step.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::spawn_local;

use crate::cases::{CHUNK, CONNECT_CONNS, ECHO, Kind, SINK, SOURCE};

// ----- load phases --------------------------------------------------------------------------

pub(crate) const WARM: u8 = 0;
pub(crate) const MEASURE: u8 = 1;
pub(crate) const STOP: u8 = 2;
/// Before the load generator's first connection: the warm-up starts when one is up, so a
/// client runtime slow to start (a cold machine) does not eat into the measured time.
pub(crate) const START: u8 = 3;

/// Says the load generator is up: its first connection (or exchange) went through.
fn started(phase: &AtomicU8) {
    let _ = phase.compare_exchange(START, WARM, Ordering::SeqCst, Ordering::SeqCst);
}

/// What one load generator measured.
#[derive(Debug, Default)]
pub(crate) struct ClientOut {
    pub(crate) ops: u64,
    pub(crate) bytes: u64,
    pub(crate) lat_ns: Vec<u32>,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
}

impl ClientOut {
    pub(crate) fn merge(&mut self, o: ClientOut) {
        self.ops += o.ops;
        self.bytes += o.bytes;
        self.lat_ns.extend(o.lat_ns);
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    pub(crate) fn error(&mut self, what: &str, e: impl std::fmt::Display) {
        self.errors += 1;
        self.first_error
            .get_or_insert_with(|| format!("{what}: {e}"));
    }
}

/// The sockets a load generator or server runs on.
pub(crate) trait Net: 'static {
    type S: AsyncRead + AsyncWrite + Unpin + 'static;
    fn connect(addr: SocketAddr) -> impl Future<Output = io::Result<Self::S>>;
    /// Closes with a reset, as load generators measuring connection rates do (no TIME_WAIT).
    fn reset(s: Self::S);
}

pub(crate) struct Kernel;

impl Net for Kernel {
    type S = tokio::net::TcpStream;
    async fn connect(addr: SocketAddr) -> io::Result<Self::S> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }
    fn reset(s: Self::S) {
        let _ = s.set_zero_linger();
    }
}

pub(crate) struct Corelane;

impl Net for Corelane {
    type S = corelane::net::TcpStream;
    async fn connect(addr: SocketAddr) -> io::Result<Self::S> {
        corelane::net::TcpStream::connect(addr).await
    }
    fn reset(s: Self::S) {
        s.abort();
    }
}

/// `f` with a time limit; the error names the step that ran out of time.
pub(crate) async fn timed<T>(
    limit: Duration,
    step: &str,
    f: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| io::Error::new(e.kind(), format!("{step}: {e}"))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{step}: no answer in {limit:?}"),
        )),
    }
}

pub(crate) async fn connect_retry<N: Net>(addr: SocketAddr) -> io::Result<N::S> {
    let mut last = None;
    for _ in 0..100 {
        match tokio::time::timeout(Duration::from_secs(1), N::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = Some(e),
            Err(_) => last = Some(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(last.unwrap_or_else(|| io::Error::other("no connection")))
}

/// Runs `kind`'s load against `addr` until the phase says stop.
pub(crate) async fn load<N: Net>(kind: Kind, addr: SocketAddr, phase: Arc<AtomicU8>) -> ClientOut {
    let step = Duration::from_secs(3);
    let tasks = match kind {
        Kind::Rr { conns, .. } => conns,
        Kind::Connect => CONNECT_CONNS,
        _ => 1,
    };
    let mut handles = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let phase = phase.clone();
        handles.push(spawn_local(async move {
            let mut out = ClientOut::default();
            let measuring = || phase.load(Ordering::Relaxed) == MEASURE;
            let stopped = || phase.load(Ordering::Relaxed) == STOP;
            let port = match kind {
                Kind::BulkIn => SINK,
                Kind::BulkOut => SOURCE,
                _ => ECHO,
            };
            let addr = SocketAddr::new(addr.ip(), port);
            if kind == Kind::Connect {
                let mut b = [0u8; 1];
                while !stopped() {
                    let t = Instant::now();
                    let r = async {
                        let mut s = timed(step, "connect", N::connect(addr)).await?;
                        timed(step, "request", s.write_all(b"x")).await?;
                        timed(step, "response", s.read_exact(&mut b)).await?;
                        N::reset(s);
                        io::Result::Ok(())
                    }
                    .await;
                    if r.is_ok() {
                        started(&phase);
                    }
                    match r {
                        Ok(()) if measuring() => {
                            out.ops += 1;
                            out.lat_ns
                                .push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                        }
                        Ok(()) => {}
                        Err(e) => out.error("connect, exchange, reset", e),
                    }
                }
                return out;
            }
            let s = match connect_retry::<N>(addr).await {
                Ok(s) => s,
                Err(e) => {
                    out.error("connect", e);
                    return out;
                }
            };
            started(&phase);
            if let Err(e) = stream_load::<N>(kind, s, step, &phase, &mut out).await {
                out.error("load", e);
            }
            out
        }));
    }
    let mut total = ClientOut::default();
    for h in handles {
        match h.await {
            Ok(o) => total.merge(o),
            Err(e) => total.error("load task", e),
        }
    }
    total
}

/// One connection's share of a request/response or bulk case, until the phase says stop.
pub(crate) async fn stream_load<N: Net>(
    kind: Kind,
    mut s: N::S,
    step: Duration,
    phase: &AtomicU8,
    out: &mut ClientOut,
) -> io::Result<()> {
    let measuring = || phase.load(Ordering::Relaxed) == MEASURE;
    let stopped = || phase.load(Ordering::Relaxed) == STOP;
    let mut buf = vec![0u8; CHUNK];
    match kind {
        Kind::Rr { size, .. } => {
            let msg = vec![0x42u8; size];
            while !stopped() {
                let t = Instant::now();
                timed(step, "request", s.write_all(&msg)).await?;
                timed(step, "response", s.read_exact(&mut buf[..size])).await?;
                if measuring() {
                    out.ops += 1;
                    out.bytes += size as u64;
                    out.lat_ns
                        .push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                }
            }
        }
        Kind::BulkIn => {
            buf.fill(0x5a);
            while !stopped() {
                let n = timed(step, "send", s.write(&buf)).await?;
                if measuring() {
                    out.bytes += n as u64;
                }
            }
            let _ = s.shutdown().await;
        }
        Kind::BulkOut => {
            while !stopped() {
                match timed(step, "receive", s.read(&mut buf)).await? {
                    0 => return Err(io::Error::other("receive: the server closed")),
                    n if measuring() => out.bytes += n as u64,
                    _ => {}
                }
            }
            N::reset(s);
        }
        // Connections are opened by the caller; HTTP's load is wrk, not this generator.
        Kind::Connect | Kind::Http { .. } => {}
    }
    Ok(())
}

// ----- servers ------------------------------------------------------------------------------
