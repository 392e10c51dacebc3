//! The load: h3 over quinn on the kernel's UDP, on one tokio thread pinned to the client's
//! CPU, in a closed loop (each connection one request at a time).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use corelane_bench::h3::{BoxError, client_endpoint, get_len as get, open};

/// What one measured run did.
#[derive(Debug, Default, Clone)]
pub(crate) struct Got {
    /// Requests answered whole (or handshakes done, for the handshake case).
    pub(crate) done: u64,
    /// Body bytes received.
    pub(crate) bytes: u64,
    /// Each request's time, in microseconds.
    pub(crate) lat_us: Vec<u32>,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
}

impl Got {
    fn add(&mut self, o: Got) {
        self.done += o.done;
        self.bytes += o.bytes;
        self.lat_us.extend(o.lat_us);
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    fn error(&mut self, e: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }

    /// The `q` quantile of the request times, in microseconds.
    pub(crate) fn quantile_us(&self, q: f64) -> f64 {
        if self.lat_us.is_empty() {
            return 0.0;
        }
        let mut v = self.lat_us.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 - 1.0) * q).round() as usize;
        f64::from(v[i.min(v.len() - 1)])
    }
}

/// What to load the server with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Load {
    /// `conns` connections, each `GET path` in turn.
    Requests { conns: usize, body: usize },
    /// `conns` loops of a new connection, one `GET /`, and its close.
    Handshakes { conns: usize },
}

/// Runs `load` against `to` for `warmup` and then `seconds`, on the calling thread (a tokio
/// runtime of its own); what the measured part did.
pub(crate) fn run(
    to: SocketAddr,
    cert: rustls::pki_types::CertificateDer<'static>,
    load: Load,
    warmup: Duration,
    seconds: Duration,
) -> Result<Got, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let any: SocketAddr = "0.0.0.0:0".parse().map_err(|e| format!("{e}"))?;
        let ep = client_endpoint(&cert, any).map_err(|e| e.to_string())?;
        let start = Instant::now() + warmup;
        let end = start + seconds;
        let (conns, path) = match load {
            Load::Requests { conns, body } => (conns, format!("/bytes/{body}")),
            Load::Handshakes { conns } => (conns, "/".to_string()),
        };
        let mut tasks = Vec::new();
        for _ in 0..conns {
            let (ep, path) = (ep.clone(), path.clone());
            tasks.push(tokio::task::spawn_local(async move {
                let mut got = Got::default();
                match load {
                    Load::Requests { .. } => {
                        let (_conn, mut send) = match open(&ep, to).await {
                            Ok(c) => c,
                            Err(e) => {
                                got.error(e);
                                return got;
                            }
                        };
                        while Instant::now() < end {
                            let t = Instant::now();
                            match get(&mut send, &path).await {
                                Ok(n) if t >= start => {
                                    got.done += 1;
                                    got.bytes += n;
                                    got.lat_us
                                        .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                                }
                                Ok(_) => {}
                                Err(e) => {
                                    got.error(e);
                                    break;
                                }
                            }
                        }
                    }
                    Load::Handshakes { .. } => {
                        while Instant::now() < end {
                            let t = Instant::now();
                            let r = async {
                                let (conn, mut send) = open(&ep, to).await?;
                                let n = get(&mut send, &path).await?;
                                // H3_NO_ERROR.
                                conn.close(0x100u32.into(), b"");
                                Ok::<_, BoxError>(n)
                            }
                            .await;
                            match r {
                                Ok(n) if t >= start => {
                                    got.done += 1;
                                    got.bytes += n;
                                    got.lat_us
                                        .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                                }
                                Ok(_) => {}
                                Err(e) => got.error(e),
                            }
                        }
                    }
                }
                got
            }));
        }
        let mut all = Got::default();
        for t in tasks {
            match t.await {
                Ok(g) => all.add(g),
                Err(e) => all.error(e),
            }
        }
        ep.close(0x100u32.into(), b"");
        let _ = tokio::time::timeout(Duration::from_secs(2), ep.wait_idle()).await;
        Ok(all)
    })
}
