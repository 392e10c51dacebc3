//! The two HTTP/3 servers, with one handler: h3 over corelane's QUIC on a corelane core, and
//! h3 over quinn on tokio and the kernel's UDP (GSO and GRO as quinn uses them), each on CPU 0
//! of the server's namespace.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A self-signed certificate for "localhost": the server's QUIC config, and its DER for
/// clients to trust.
pub(crate) fn certificate() -> Result<
    (
        quinn_proto::ServerConfig,
        rustls::pki_types::CertificateDer<'static>,
    ),
    BoxError,
> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_no_client_auth()
    .with_single_cert(vec![cert.clone()], key)?;
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut cfg = quinn_proto::ServerConfig::with_crypto(Arc::new(crypto));
    let mut t = quinn_proto::TransportConfig::default();
    t.max_concurrent_bidi_streams(quinn_proto::VarInt::from_u32(256));
    cfg.transport_config(Arc::new(t));
    Ok((cfg, cert))
}

/// One HTTP/3 connection, the same code over either QUIC: `GET /` a short text,
/// `GET /bytes/N` N bytes (up to 256 MiB).
async fn serve_conn<C>(conn: C)
where
    C: h3::quic::Connection<Bytes> + 'static,
    <C as h3::quic::OpenStreams<Bytes>>::BidiStream: 'static,
{
    let Ok(mut h3) = h3::server::Connection::<C, Bytes>::new(conn).await else {
        return;
    };
    while let Ok(Some(resolver)) = h3.accept().await {
        tokio::task::spawn_local(async move {
            let _ = answer(resolver).await;
        });
    }
}

async fn answer<C>(resolver: h3::server::RequestResolver<C, Bytes>) -> Result<(), BoxError>
where
    C: h3::quic::Connection<Bytes>,
{
    let (req, mut stream) = resolver.resolve_request().await?;
    let path = req.uri().path();
    let n = match path.strip_prefix("/bytes/") {
        Some(n) => n.parse::<usize>().ok().filter(|&n| n <= 256 << 20),
        None => None,
    };
    let (status, body) = match (path, n) {
        ("/", _) => (200, Bytes::from_static(b"hello from the h3 server\n")),
        (_, Some(n)) => (200, Bytes::from(vec![b'x'; n])),
        _ => (404, Bytes::from_static(b"not found\n")),
    };
    let resp = http::Response::builder()
        .status(status)
        .header("content-length", body.len())
        .body(())?;
    stream.send_response(resp).await?;
    let mut body = body;
    while body.has_remaining() {
        let piece = body.split_to(body.len().min(256 << 10));
        stream.send_data(piece).await?;
    }
    stream.finish().await?;
    Ok(())
}

/// A server running on a thread of the server's namespace until stopped.
pub(crate) struct Server {
    stop: Box<dyn FnOnce() + Send>,
    thread: corelane_testnet::NsThread<Result<(), String>>,
}

impl Server {
    pub(crate) fn stop(self) {
        (self.stop)();
        if let Ok(Err(e)) = self.thread.join() {
            eprintln!("h3compare: server: {e}");
        }
    }
}

/// h3 over corelane's QUIC: a one-core runtime (CPU 0) on `ifname` owning `cidr`, serving
/// UDP `port`.
pub(crate) fn corelane(
    ns: &corelane_testnet::Netns,
    ifname: &str,
    cidr: &str,
    port: u16,
    cfg: quinn_proto::ServerConfig,
) -> Result<Server, String> {
    use std::sync::mpsc;
    let ifname = ifname.to_string();
    let addr: corelane::Cidr = cidr.parse().map_err(|e| format!("{e}"))?;
    let (stop_tx, stop_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let thread = ns
        .spawn(move || -> Result<(), String> {
            let rt = corelane::Runtime::builder(&ifname)
                .addr(addr)
                .cpus(vec![0])
                .build()
                .map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            let ready = std::sync::Mutex::new(Some(ready_tx));
            rt.run(|_| {
                let ready = ready.lock().ok().and_then(|mut r| r.take());
                let cfg = cfg.clone();
                async move {
                    let ep =
                        corelane_rt::quic::Endpoint::server(cfg, port).map_err(|e| e.to_string());
                    if let Some(t) = ready {
                        let _ = t.send(ep.as_ref().map(|_| ()).map_err(Clone::clone));
                    }
                    let Ok(ep) = ep else { return };
                    while let Some(incoming) = ep.accept().await {
                        tokio::task::spawn_local(async move {
                            if let Ok(c) = incoming.await {
                                serve_conn(corelane_rt::quic::h3::Connection::new(c)).await;
                            }
                        });
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let Ok(stop) = stop_rx.recv_timeout(Duration::from_secs(10)) else {
        return Err(match thread.join() {
            Ok(Err(e)) => format!("the corelane server did not start: {e}"),
            _ => "the corelane server did not start".into(),
        });
    };
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the corelane server did not start")??;
    Ok(Server {
        stop: Box::new(move || stop.stop()),
        thread,
    })
}

/// h3 over quinn on a tokio current-thread runtime pinned to CPU 0, on the kernel's UDP at
/// `addr`.
pub(crate) fn quinn(
    ns: &corelane_testnet::Netns,
    addr: std::net::SocketAddr,
    cfg: quinn_proto::ServerConfig,
) -> Result<Server, String> {
    use std::sync::mpsc;
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = ns
        .spawn(move || -> Result<(), String> {
            corelane_bench::pin(0);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                let ep = rt_bind(cfg, addr);
                let _ = ready_tx.send(ep.as_ref().map(|_| ()).map_err(Clone::clone));
                let ep = ep?;
                let accept = async {
                    while let Some(incoming) = ep.accept().await {
                        tokio::task::spawn_local(async move {
                            if let Ok(c) = incoming.await {
                                serve_conn(h3_quinn::Connection::new(c)).await;
                            }
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stop_rx => {}
                }
                ep.close(0u32.into(), b"");
                Ok(())
            })
        })
        .map_err(|e| e.to_string())?;
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the quinn server did not start")??;
    Ok(Server {
        stop: Box::new(move || {
            let _ = stop_tx.send(());
        }),
        thread,
    })
}

fn rt_bind(
    cfg: quinn_proto::ServerConfig,
    addr: std::net::SocketAddr,
) -> Result<quinn::Endpoint, String> {
    quinn::Endpoint::server(cfg, addr).map_err(|e| format!("quinn server on {addr}: {e}"))
}
