//! The hosts of a run: the kernel (tokio) and corelane servers, and the load generator's
//! threads on either stack.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corelane::Runtime;
use corelane_bench::pin;
use corelane_testnet::VethPair;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::spawn_local;

use crate::cases::{
    CHUNK, CORELANE_CLIENT, CORELANE_SERVER, ECHO, HTTP, HTTP_BODY, KERNEL_SERVER, Kind, SINK,
    SOURCE,
};
use crate::load::{ClientOut, Corelane, Kernel, load};

/// Serves one accepted connection by the port it came in on.
pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(port: u16, mut s: S) {
    if port == HTTP {
        return serve_http(s).await;
    }
    let mut buf = vec![0u8; CHUNK];
    match port {
        ECHO => {
            while let Ok(n @ 1..) = s.read(&mut buf).await {
                if s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
        SINK => while let Ok(1..) = s.read(&mut buf).await {},
        _ => {
            buf.fill(0xa5);
            while s.write_all(&buf).await.is_ok() {}
        }
    }
}

/// HTTP/1.1 with hyper, as the http example serves it: every request is answered with
/// [`HTTP_BODY`].
async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(s: S) {
    use hyper::service::service_fn;
    let svc = service_fn(|_req: hyper::Request<hyper::body::Incoming>| async {
        Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(HTTP_BODY.as_bytes()),
        )))
    });
    // A client that goes away mid-request is its own business.
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
        .await;
}

/// A server running in its namespace, and how to stop it.
pub(crate) struct Server {
    /// Stops the server and waits for it.
    stop: Box<dyn FnOnce() -> Result<(), String> + Send>,
    pub(crate) addr: &'static str,
}

impl Server {
    /// A server run by `thread`, which `stop` tells to end.
    pub(crate) fn threaded(
        stop: impl FnOnce() + Send + 'static,
        thread: corelane_testnet::NsThread<Result<(), String>>,
        addr: &'static str,
    ) -> Server {
        Server {
            stop: Box::new(move || {
                stop();
                thread.join().map_err(|e| e.to_string())?
            }),
            addr,
        }
    }

    /// A server in a child process, which `stop` ends and waits for.
    pub(crate) fn process(
        stop: impl FnOnce() -> Result<(), String> + Send + 'static,
        addr: &'static str,
    ) -> Server {
        Server {
            stop: Box::new(stop),
            addr,
        }
    }

    pub(crate) fn stop(self) -> Result<(), String> {
        (self.stop)()
    }
}

/// Joins a server's per-CPU threads.
pub(crate) fn join_all(
    threads: Vec<std::thread::JoinHandle<()>>,
    what: &str,
) -> Result<(), String> {
    for t in threads {
        t.join()
            .map_err(|_| format!("a {what} server thread panicked"))?;
    }
    Ok(())
}

/// Waits until `n` server threads say they listen (or one says why it could not).
pub(crate) fn wait_ready(
    rx: &std::sync::mpsc::Receiver<Result<(), String>>,
    n: usize,
    what: &str,
) -> Result<(), String> {
    for _ in 0..n {
        rx.recv_timeout(Duration::from_secs(10))
            .map_err(|_| format!("the {what} server did not start"))??;
    }
    Ok(())
}

/// The C epoll server (`c/epoll_server.c`, built by build.rs), one thread per server CPU.
pub(crate) fn epoll_server(net: &VethPair, cpus: &[usize]) -> Result<Server, String> {
    use std::io::BufRead;
    let exe = concat!(env!("OUT_DIR"), "/epoll_server");
    let mut cmd = net.server_ns().command(exe);
    cmd.args([ECHO, SINK, SOURCE].map(|p| p.to_string()))
        .args(cpus.iter().map(|c| c.to_string()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("starting {exe}: {e}"))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err("the epoll server did not start (see above)".into());
    }
    Ok(Server::process(
        move || {
            let _ = child.kill();
            child.wait().map(|_| ()).map_err(|e| e.to_string())
        },
        KERNEL_SERVER,
    ))
}

pub(crate) fn kernel_server(net: &VethPair, cpus: &[usize]) -> Result<Server, String> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let cpus = cpus.to_vec();
    let n = cpus.len();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let mut threads = Vec::new();
            for cpu in cpus {
                let (ready, mut stop) = (ready_tx.clone(), stop_rx.clone());
                threads.push(std::thread::spawn(move || {
                    pin(cpu);
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => return drop(ready.send(Err(e.to_string()))),
                    };
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async move {
                        let mut listeners = Vec::new();
                        for port in [ECHO, SINK, SOURCE, HTTP] {
                            match reuseport_listener(port) {
                                Ok(l) => listeners.push((port, l)),
                                Err(e) => {
                                    let _ = ready.send(Err(format!("port {port}: {e}")));
                                    return;
                                }
                            }
                        }
                        for (port, l) in listeners {
                            spawn_local(async move {
                                while let Ok((s, _)) = l.accept().await {
                                    let _ = s.set_nodelay(true);
                                    spawn_local(serve(port, s));
                                }
                            });
                        }
                        let _ = ready.send(Ok(()));
                        let _ = stop.wait_for(|s| *s).await;
                    });
                }));
            }
            join_all(threads, "kernel")
        })
        .map_err(|e| e.to_string())?;
    wait_ready(&ready_rx, n, "kernel")?;
    Ok(Server::threaded(
        move || {
            let _ = stop_tx.send(true);
        },
        thread,
        KERNEL_SERVER,
    ))
}

pub(crate) fn reuseport_listener(port: u16) -> io::Result<tokio::net::TcpListener> {
    let s = tokio::net::TcpSocket::new_v4()?;
    s.set_reuseport(true)?;
    s.set_reuseaddr(true)?;
    s.bind(SocketAddr::from(([0, 0, 0, 0], port)))?;
    s.listen(1024)
}

pub(crate) fn corelane_server(
    net: &VethPair,
    cpus: &[usize],
    knobs: crate::runs::Knobs,
) -> Result<Server, String> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let ifname = net.server_if().to_string();
    let cpus = cpus.to_vec();
    let n = cpus.len();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let rt = Runtime::builder(&ifname)
                .addr(format!("{CORELANE_SERVER}/24"))
                .cpus(cpus)
                .poll_mode(knobs.poll)
                .publish_stats(knobs.publish)
                .adaptive_batch(knobs.adaptive_batch)
                .xsk(corelane::XskConfig {
                    tx_checksum_offload: knobs.tx_checksum_offload,
                    ..corelane::XskConfig::default()
                })
                .build()
                .map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            let ready_tx = Mutex::new(ready_tx);
            rt.run(|_core| {
                let ready = ready_tx.lock().ok().map(|t| t.clone());
                async move {
                    let mut bound = Ok(Vec::new());
                    for p in [ECHO, SINK, SOURCE, HTTP] {
                        match corelane::net::TcpListener::bind(p).await {
                            Ok(l) => {
                                if let Ok(v) = &mut bound {
                                    v.push((p, l));
                                }
                            }
                            Err(e) => {
                                bound = Err(format!("port {p}: {e}"));
                                break;
                            }
                        }
                    }
                    let ok = bound.as_ref().map(|_| ()).map_err(Clone::clone);
                    if let Some(t) = ready {
                        let _ = t.send(ok);
                    }
                    let Ok(listeners) = bound else { return };
                    let mut tasks = Vec::new();
                    for (port, l) in listeners {
                        tasks.push(spawn_local(async move {
                            while let Ok((s, _)) = l.accept().await {
                                spawn_local(serve(port, s));
                            }
                        }));
                    }
                    for t in tasks {
                        let _ = t.await;
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let Ok(stop) = stop_rx.recv_timeout(Duration::from_secs(10)) else {
        return Err(match thread.join() {
            Ok(Err(e)) => e,
            _ => "the corelane server did not start".to_string(),
        });
    };
    wait_ready(&ready_rx, n, "corelane")?;
    Ok(Server::threaded(
        move || stop.stop(),
        thread,
        CORELANE_SERVER,
    ))
}

// ----- clients ------------------------------------------------------------------------------

pub(crate) fn kernel_client(
    net: &VethPair,
    cpu: usize,
    kind: Kind,
    addr: SocketAddr,
    phase: Arc<AtomicU8>,
) -> Result<corelane_testnet::NsThread<Result<ClientOut, String>>, String> {
    net.client_ns()
        .spawn(move || {
            pin(cpu);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let local = tokio::task::LocalSet::new();
            Ok(local.block_on(&rt, load::<Kernel>(kind, addr, phase)))
        })
        .map_err(|e| e.to_string())
}

pub(crate) fn corelane_client(
    net: &VethPair,
    cpu: usize,
    kind: Kind,
    addr: SocketAddr,
    phase: Arc<AtomicU8>,
) -> Result<corelane_testnet::NsThread<Result<ClientOut, String>>, String> {
    let ifname = net.client_if().to_string();
    net.client_ns()
        .spawn(move || {
            let rt = Runtime::builder(&ifname)
                .addr(format!("{CORELANE_CLIENT}/24"))
                .cpus(vec![cpu])
                .build()
                .map_err(|e| format!("corelane client: {e}"))?;
            let result = Arc::new(Mutex::new(None));
            let r = result.clone();
            rt.run(move |_| {
                let (r, phase) = (r.clone(), phase.clone());
                async move {
                    let out = load::<Corelane>(kind, addr, phase).await;
                    if let Ok(mut g) = r.lock() {
                        *g = Some(out);
                    }
                }
            })
            .map_err(|e| format!("corelane client: {e}"))?;
            let out = result.lock().map_err(|_| "poisoned")?.take();
            out.ok_or_else(|| "the corelane client returned nothing".to_string())
        })
        .map_err(|e| e.to_string())
}

// ----- CPU accounting -----------------------------------------------------------------------
