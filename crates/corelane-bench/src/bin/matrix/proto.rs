//! The matrix's workloads: what the kernel client asks for, and how the kernel's and
//! corelane's servers answer.
//!
//! The client opens with a 24-byte request (operation, rounds, bytes up and down per round).
//! Every byte either side sends is the endless stream `pattern()[i % PATTERN]` from offset 0,
//! so each side checks what it got against a hash it can compute. `Stream` sends up and down
//! at once and ends with the server's SHA-256 of what it received; `Echo` writes back what it
//! reads until the client's FIN; `Rpc` runs rounds of a request of `up` bytes answered by
//! `down` bytes, then the same trailer.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const PATTERN: usize = 1 << 20;

/// Print each corelane connection's counters when it ends (`--conn-stats`).
pub(crate) static CONN_STATS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
const CHUNK: usize = 256 * 1024;

const STREAM: u8 = 1;
const ECHO: u8 = 2;
const RPC: u8 = 3;

/// The pattern every side sends, 1 MiB repeated.
fn pattern() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| {
        (0..PATTERN)
            .map(|i| (i.wrapping_mul(31) ^ (i >> 9)) as u8)
            .collect()
    })
}

/// The longest run of the stream starting at `off`, at most `max` bytes.
fn slice(off: usize, max: usize) -> &'static [u8] {
    let at = off % PATTERN;
    &pattern()[at..PATTERN.min(at + max)]
}

/// SHA-256 of the stream's first `len` bytes.
fn hash_of(len: usize) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut off = 0;
    while off < len {
        let s = slice(off, len - off);
        h.update(s);
        off += s.len();
    }
    h.finalize().into()
}

/// A workload of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) enum Work {
    /// The server sends, the client receives.
    Send,
    /// The client sends, the server receives.
    Receive,
    /// The client writes and reads the echo back at once.
    Echo,
    /// Requests of 16 KiB answered by 16 KiB, one at a time.
    Rpc16k,
    /// Requests of 1 MiB answered by 1 MiB, one at a time.
    Rpc1m,
    /// Both send at once.
    Both,
}

impl Work {
    pub(crate) const ALL: [Work; 6] = [
        Work::Send,
        Work::Receive,
        Work::Echo,
        Work::Rpc16k,
        Work::Rpc1m,
        Work::Both,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Work::Send => "send",
            Work::Receive => "receive",
            Work::Echo => "echo",
            Work::Rpc16k => "rpc-16k",
            Work::Rpc1m => "rpc-1m",
            Work::Both => "both",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Work, String> {
        Work::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown workload {s:?} (one of {})",
                    Work::ALL.map(Work::name).join(", ")
                )
            })
    }

    /// The request for about `total` bytes moved (both directions together for the
    /// two-way workloads' rounds; each way for the others).
    fn request(self, total: usize) -> Request {
        let t = total as u64;
        let rpc = |size: u64| Request {
            op: RPC,
            rounds: (t / (2 * size)).max(1) as u32,
            up: size,
            down: size,
        };
        match self {
            Work::Send => Request::stream(0, t),
            Work::Receive => Request::stream(t, 0),
            Work::Both => Request::stream(t, t),
            Work::Echo => Request {
                op: ECHO,
                rounds: 1,
                up: t,
                down: t,
            },
            Work::Rpc16k => rpc(16 << 10),
            Work::Rpc1m => rpc(1 << 20),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Request {
    op: u8,
    rounds: u32,
    up: u64,
    down: u64,
}

impl Request {
    fn stream(up: u64, down: u64) -> Request {
        Request {
            op: STREAM,
            rounds: 1,
            up,
            down,
        }
    }

    fn encode(self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[0] = self.op;
        b[4..8].copy_from_slice(&self.rounds.to_be_bytes());
        b[8..16].copy_from_slice(&self.up.to_be_bytes());
        b[16..24].copy_from_slice(&self.down.to_be_bytes());
        b
    }

    fn decode(b: &[u8; 24]) -> std::io::Result<Request> {
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let r = Request {
            op: b[0],
            rounds: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            up: u64_at(8),
            down: u64_at(16),
        };
        if !matches!(r.op, STREAM | ECHO | RPC) || r.up > 1 << 34 || r.down > 1 << 34 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad request {r:?}"),
            ));
        }
        Ok(r)
    }

    /// Bytes the client sends, and receives before the trailer.
    fn totals(self) -> (u64, u64) {
        let r = u64::from(self.rounds);
        (self.up * r, self.down * r)
    }
}

/// The kernel server's side of one connection; returns its TCP_INFO retransmissions.
pub(crate) fn serve_kernel(mut s: TcpStream) -> std::io::Result<u64> {
    let mut b = [0u8; 24];
    s.read_exact(&mut b)?;
    let req = Request::decode(&b)?;
    let mut buf = vec![0u8; CHUNK];
    match req.op {
        ECHO => loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n])?;
        },
        STREAM => {
            let mut w = s.try_clone()?;
            let writer = std::thread::spawn(move || write_from(&mut w, 0, req.down as usize));
            let mut h = Sha256::new();
            read_hashing(&mut s, &mut h, req.up as usize, &mut buf)?;
            writer
                .join()
                .map_err(|_| std::io::Error::other("writer panicked"))??;
            s.write_all(&h.finalize())?;
        }
        _ => {
            let mut h = Sha256::new();
            for r in 0..req.rounds as usize {
                read_hashing(&mut s, &mut h, req.up as usize, &mut buf)?;
                write_from(&mut s, r * req.down as usize, req.down as usize)?;
            }
            s.write_all(&h.finalize())?;
        }
    }
    s.shutdown(Shutdown::Write)?;
    while s.read(&mut buf)? > 0 {}
    Ok(corelane_bench::sys::tcp_retrans(&s).map_or(0, |r| r.0))
}

/// Reads exactly `len` bytes into `h`.
fn read_hashing(
    s: &mut impl Read,
    h: &mut Sha256,
    len: usize,
    buf: &mut [u8],
) -> std::io::Result<()> {
    let mut left = len;
    while left > 0 {
        let want = left.min(buf.len());
        let n = s.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        h.update(&buf[..n]);
        left -= n;
    }
    Ok(())
}

/// Writes the stream's bytes `[off, off + len)`.
fn write_from(s: &mut impl Write, off: usize, len: usize) -> std::io::Result<()> {
    let mut at = off;
    while at < off + len {
        let c = slice(at, (off + len - at).min(CHUNK));
        s.write_all(c)?;
        at += c.len();
    }
    Ok(())
}

/// corelane's server side of one connection; returns the retransmitted segments.
pub(crate) async fn serve_corelane(mut s: corelane::net::TcpStream) -> std::io::Result<u64> {
    let mut b = [0u8; 24];
    s.read_exact(&mut b).await?;
    let req = Request::decode(&b)?;
    let mut buf = vec![0u8; CHUNK];
    match req.op {
        ECHO => loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).await?;
        },
        STREAM => {
            let mut h = Sha256::new();
            {
                let (mut r, mut w) = s.split();
                let (got, sent) = tokio::join!(
                    read_hashing_async(&mut r, &mut h, req.up as usize, &mut buf),
                    write_from_async(&mut w, 0, req.down as usize)
                );
                got?;
                sent?;
            }
            s.write_all(&h.finalize()).await?;
        }
        _ => {
            let mut h = Sha256::new();
            for r in 0..req.rounds as usize {
                read_hashing_async(&mut s, &mut h, req.up as usize, &mut buf).await?;
                write_from_async(&mut s, r * req.down as usize, req.down as usize).await?;
            }
            s.write_all(&h.finalize()).await?;
        }
    }
    s.shutdown().await?;
    while s.read(&mut buf).await? > 0 {}
    if CONN_STATS.load(std::sync::atomic::Ordering::Relaxed)
        && let Ok(i) = s.info()
    {
        eprintln!("corelane connection: {:?}", i.stats);
    }
    Ok(s.info().map_or(0, |i| i.stats.retrans_segs))
}

async fn read_hashing_async(
    s: &mut (impl AsyncRead + Unpin),
    h: &mut Sha256,
    len: usize,
    buf: &mut [u8],
) -> std::io::Result<()> {
    let mut left = len;
    while left > 0 {
        let want = left.min(buf.len());
        let n = s.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        h.update(&buf[..n]);
        left -= n;
    }
    Ok(())
}

async fn write_from_async(
    s: &mut (impl AsyncWrite + Unpin),
    off: usize,
    len: usize,
) -> std::io::Result<()> {
    let mut at = off;
    while at < off + len {
        let c = slice(at, (off + len - at).min(CHUNK));
        s.write_all(c).await?;
        at += c.len();
    }
    Ok(())
}

/// The longest time between two steps of progress (a read or write that moved bytes), from
/// either of the client's threads.
struct Progress(Mutex<(Instant, Duration)>);

impl Progress {
    fn new() -> Progress {
        Progress(Mutex::new((Instant::now(), Duration::ZERO)))
    }

    fn tick(&self) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        g.1 = g.1.max(now - g.0);
        g.0 = now;
    }

    fn worst(&self) -> Duration {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

/// What the client measured of one transfer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Measured {
    /// Bytes both ways, payload only.
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    pub(crate) stall_ms: f64,
    /// The client's own retransmitted segments (TCP_INFO).
    pub(crate) client_retrans: u64,
}

/// Runs `work` of about `total` bytes against the server at `addr` from a kernel client;
/// fails on any byte out of place or a read or write stuck longer than `timeout`.
pub(crate) fn client(
    addr: SocketAddr,
    work: Work,
    total: usize,
    timeout: Duration,
) -> Result<Measured, String> {
    let req = work.request(total);
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let start = Instant::now();
    let io = |e: std::io::Error| format!("after {:.1} s: {e}", start.elapsed().as_secs_f64());
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    s.write_all(&req.encode()).map_err(io)?;
    let progress = Progress::new();
    let (up, down) = req.totals();
    let mut buf = vec![0u8; CHUNK];
    let got = match req.op {
        ECHO | STREAM => std::thread::scope(|sc| -> Result<Vec<u8>, String> {
            let mut w = s.try_clone().map_err(io)?;
            let progress = &progress;
            let writer = sc.spawn(move || -> std::io::Result<()> {
                let mut at = 0;
                while at < up as usize {
                    let c = slice(at, up as usize - at);
                    w.write_all(c)?;
                    progress.tick();
                    at += c.len();
                }
                w.shutdown(Shutdown::Write)
            });
            let mut h = Sha256::new();
            let mut rest = Vec::new();
            let mut n_down = 0u64;
            loop {
                let n = s.read(&mut buf).map_err(io)?;
                if n == 0 {
                    break;
                }
                progress.tick();
                let body = (down - n_down).min(n as u64) as usize;
                h.update(&buf[..body]);
                n_down += body as u64;
                rest.extend_from_slice(&buf[body..n]);
                if rest.len() > 64 {
                    return Err(format!("{} bytes more than asked for", rest.len()));
                }
            }
            writer
                .join()
                .map_err(|_| "the writer panicked".to_string())?
                .map_err(io)?;
            if n_down != down || <[u8; 32]>::from(h.finalize()) != hash_of(down as usize) {
                return Err(format!("{n_down} of {down} bytes back, or changed"));
            }
            Ok(rest)
        })?,
        _ => {
            let mut h = Sha256::new();
            for r in 0..req.rounds as usize {
                write_from(&mut s, r * req.up as usize, req.up as usize).map_err(io)?;
                progress.tick();
                let mut left = req.down as usize;
                while left > 0 {
                    let n = s.read(&mut buf[..left.min(CHUNK)]).map_err(io)?;
                    if n == 0 {
                        return Err(format!("closed in round {r}"));
                    }
                    progress.tick();
                    h.update(&buf[..n]);
                    left -= n;
                }
            }
            if <[u8; 32]>::from(h.finalize()) != hash_of(down as usize) {
                return Err("the replies came back changed".into());
            }
            s.shutdown(Shutdown::Write).map_err(io)?;
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).map_err(io)?;
            rest
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    // An echo has no trailer; the others end with the server's hash of what it received.
    if req.op != ECHO && got[..] != hash_of(up as usize) {
        return Err(format!(
            "the server's hash of the {up} bytes it received does not match ({} bytes)",
            got.len()
        ));
    }
    if req.op == ECHO && !got.is_empty() {
        return Err("the echo came back longer".into());
    }
    Ok(Measured {
        bytes: up + down,
        seconds,
        stall_ms: progress.worst().as_secs_f64() * 1e3,
        client_retrans: corelane_bench::sys::tcp_retrans(&s).map_or(0, |r| r.0),
    })
}
