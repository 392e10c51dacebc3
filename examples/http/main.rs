//! An HTTP/1.1 and HTTP/2 (h2c) server: hyper, unmodified, serving on corelane streams through
//! tokio's traits, on every core.
//!
//! ```text
//! ip netns exec NS target/release/examples/http --iface IF --addr 10.77.0.3/24 --port 8080
//! curl http://10.77.0.3:8080/            # from the peer namespace
//! curl --http2-prior-knowledge http://10.77.0.3:8080/
//! # HTTPS, HTTP/2 by ALPN, with the test certificate:
//! http ... --tls-cert examples/http/tls/cert.pem --tls-key examples/http/tls/key.pem
//! curl --cacert examples/http/tls/cert.pem https://10.77.0.3:8080/
//! ```
//!
//! `GET /` answers with a short text naming the core; `GET /bytes/N` answers with N bytes;
//! `POST /echo` answers with the request body. A client that takes more than 10 s to send a
//! request's headers is disconnected (`--header-timeout`).

#[path = "../common/mod.rs"]
mod common;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use corelane::net::TcpListener;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::{TlsAcceptor, rustls};

#[derive(Parser, Debug)]
#[command(about = "HTTP/1.1 and HTTP/2 (hyper) served by corelane over AF_XDP, on every core")]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// Seconds a client may take to send a request's headers before it is disconnected.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key): HTTP/2 or HTTP/1.1 by
    /// ALPN. A test pair is in examples/http/tls/.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
}

fn main() -> ExitCode {
    common::exit("http", run(Args::parse()))
}

async fn handle(core: usize, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let resp = match (req.method(), path.as_str()) {
        (&Method::GET, "/") => Response::new(Full::new(Bytes::from(format!(
            "hello from corelane core {core}\n"
        )))),
        (&Method::GET, p) if p.starts_with("/bytes/") => match p[7..].parse::<usize>() {
            Ok(n) if n <= 64 << 20 => Response::new(Full::new(Bytes::from(vec![b'x'; n]))),
            _ => status(
                StatusCode::BAD_REQUEST,
                "want /bytes/N with N up to 64 MiB\n",
            ),
        },
        (&Method::POST, "/echo") => match req.into_body().collect().await {
            Ok(b) => Response::new(Full::new(b.to_bytes())),
            Err(_) => status(StatusCode::BAD_REQUEST, "bad body\n"),
        },
        _ => status(StatusCode::NOT_FOUND, "not found\n"),
    };
    Ok(resp)
}

fn status(code: StatusCode, msg: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(msg.as_bytes())));
    *r.status_mut() = code;
    r
}

/// One connection: HTTP/1.1, or HTTP/2 when the client's first bytes are its preface (h2c
/// with prior knowledge, or after TLS negotiated `h2` by ALPN). A client that sends its
/// headers slower than `header_timeout` is cut off: a thousand trickling clients cannot hold
/// the server's connections.
async fn serve_http<I>(io: I, core: usize, header_timeout: Duration)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let svc = service_fn(move |req| handle(core, req));
    let mut http = auto::Builder::new(common::LocalExec);
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    http.http2().timer(TokioTimer::new());
    let conn = http.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    // A client that goes away mid-request is its own business. When a graceful shutdown
    // begins, an idle keep-alive connection is closed (a FIN) and one in the middle of a
    // request finishes it first.
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = corelane::shutdown_requested() => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// The TLS side of HTTPS from a PEM certificate chain and key: HTTP/2 or HTTP/1.1 by ALPN.
fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, Box<dyn std::error::Error>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let port = args.common.port_or(8080);
    // hyper's timer runs on the core's tokio executor.
    let header_timeout = Duration::try_from_secs_f64(args.header_timeout)
        .map_err(|e| format!("--header-timeout {}: {e}", args.header_timeout))?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some(tls_acceptor(c, k)?),
        (None, None) => None,
        _ => return Err("HTTPS needs both --tls-cert and --tls-key".into()),
    };
    let what = match tls {
        Some(_) => format!("HTTPS on port {port}"),
        None => format!("port {port}"),
    };
    common::serve(
        "http",
        &args.common,
        &what,
        || TcpListener::bind(port),
        move |core, listener| {
            let tls = tls.clone();
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (idx, tls) = (core.index, tls.clone());
                    tokio::task::spawn_local(async move {
                        match tls {
                            // A handshake that fails is the client's business.
                            Some(tls) => {
                                if let Ok(s) = tls.accept(stream).await {
                                    serve_http(s, idx, header_timeout).await;
                                }
                            }
                            None => serve_http(stream, idx, header_timeout).await,
                        }
                    });
                }
            }
        },
    )
}
