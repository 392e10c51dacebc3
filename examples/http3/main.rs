//! An HTTP/3 server: the `h3` crate, unmodified, serving over corelane's QUIC on every core
//! (`corelane::quic` and its `h3` glue).
//!
//! ```text
//! ip netns exec NS target/release/examples/http3 --iface IF --addr 10.77.0.3/24 \
//!     --cert-out /tmp/http3.pem
//! # from the peer namespace, with any HTTP/3 client, trusting /tmp/http3.pem for "localhost":
//! python3 scripts/h3client.py --ca /tmp/http3.pem https://10.77.0.3:4433/
//! # or a certificate of your own:
//! http3 ... --tls-cert cert.pem --tls-key key.pem
//! ```
//!
//! The routes are the `http` example's: `GET /` answers with a short text naming the core;
//! `GET /bytes/N` answers with N bytes; `POST /echo` answers with the request body. Without
//! `--tls-cert` and `--tls-key`, a self-signed certificate for `localhost` (and the served
//! addresses) is made at start: a lab default, which the server says when it starts.

#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use clap::Parser;
use corelane::quic::{Endpoint, ServerConfig, TransportConfig, VarInt};
use http::{Method, Request, Response, StatusCode};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Parser, Debug)]
#[command(about = "HTTP/3 (h3) served by corelane's QUIC over AF_XDP, on every core")]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// The PEM certificate chain to serve (with --tls-key). Without both, a self-signed
    /// certificate is made at start (a lab default).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Write the self-signed certificate made at start here (PEM), for clients to trust.
    #[arg(long)]
    cert_out: Option<PathBuf>,
}

fn main() -> ExitCode {
    common::exit("http3", run(Args::parse()))
}

type Stream = h3::server::RequestStream<corelane::quic::h3::BidiStream<Bytes>, Bytes>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Answers one request on its stream.
async fn handle(core: usize, req: Request<()>, mut stream: Stream) -> Result<(), BoxError> {
    let path = req.uri().path().to_string();
    let (status, body) = match (req.method(), path.as_str()) {
        (&Method::GET, "/") => (
            StatusCode::OK,
            Bytes::from(format!("hello from corelane core {core}\n")),
        ),
        (&Method::GET, p) if p.starts_with("/bytes/") => match p[7..].parse::<usize>() {
            Ok(n) if n <= 64 << 20 => (StatusCode::OK, Bytes::from(vec![b'x'; n])),
            _ => (
                StatusCode::BAD_REQUEST,
                Bytes::from_static(b"want /bytes/N with N up to 64 MiB\n"),
            ),
        },
        (&Method::POST, "/echo") => {
            let mut body = BytesMut::new();
            while let Some(mut chunk) = stream.recv_data().await? {
                if body.len() + chunk.remaining() > 64 << 20 {
                    return Err("request body over 64 MiB".into());
                }
                while chunk.has_remaining() {
                    let c = chunk.chunk();
                    body.extend_from_slice(c);
                    let n = c.len();
                    chunk.advance(n);
                }
            }
            (StatusCode::OK, body.freeze())
        }
        _ => (StatusCode::NOT_FOUND, Bytes::from_static(b"not found\n")),
    };
    let resp = Response::builder()
        .status(status)
        .header("content-length", body.len())
        .body(())?;
    stream.send_response(resp).await?;
    // Sent in pieces of 64 KiB: each waits for the stream's flow control, not the whole body.
    let mut body = body;
    while !body.is_empty() {
        let piece = body.split_to(body.len().min(64 << 10));
        stream.send_data(piece).await?;
    }
    stream.finish().await?;
    Ok(())
}

/// One connection: every request on its own task, until the client closes or shutdown asks
/// for a GOAWAY.
async fn serve_conn(core: usize, incoming: corelane::quic::Incoming) {
    // A handshake that fails is the client's business.
    let Ok(conn) = incoming.await else { return };
    let Ok(mut h3) =
        h3::server::Connection::<_, Bytes>::new(corelane::quic::h3::Connection::new(conn)).await
    else {
        return;
    };
    loop {
        tokio::select! {
            got = h3.accept() => match got {
                Ok(Some(resolver)) => {
                    tokio::task::spawn_local(async move {
                        if let Ok((req, stream)) = resolver.resolve_request().await {
                            // A client that goes away mid-request is its own business.
                            let _ = handle(core, req, stream).await;
                        }
                    });
                }
                Ok(None) | Err(_) => return,
            },
            _ = corelane::shutdown_requested() => {
                // Requests already taken finish; the client opens no new ones.
                let _ = h3.shutdown(0).await;
                while let Ok(Some(_)) = h3.accept().await {}
                return;
            }
        }
    }
}

/// The certificate chain and key to serve: the files given, or a self-signed pair made now.
fn certificate(
    args: &Args,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Box<dyn std::error::Error>> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Ok(pem_pair(cert, key)?),
        (None, None) => {
            let mut names = vec!["localhost".to_string()];
            names.extend(args.common.addrs.iter().map(|a| a.addr().to_string()));
            let ck = rcgen::generate_simple_self_signed(names)?;
            if let Some(out) = &args.cert_out {
                std::fs::write(out, ck.cert.pem())
                    .map_err(|e| format!("--cert-out {}: {e}", out.display()))?;
            }
            println!(
                "http3: a self-signed certificate made at start, to be served (a lab default; \
                 give --tls-cert and --tls-key for a real one){}",
                match &args.cert_out {
                    Some(p) => format!(", written to {}", p.display()),
                    None => String::new(),
                }
            );
            let key = PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
            Ok((vec![ck.cert.der().clone()], key))
        }
        _ => Err("a certificate of your own needs both --tls-cert and --tls-key".into()),
    }
}

fn pem_pair(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    Ok((chain, key))
}

/// The QUIC server config: TLS 1.3 with ALPN `h3`, room for 100 requests at once per
/// connection.
fn server_config(args: &Args) -> Result<ServerConfig, Box<dyn std::error::Error>> {
    let (chain, key) = certificate(args)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.max_early_data_size = 0;
    let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut cfg = ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = TransportConfig::default();
    transport.max_concurrent_bidi_streams(VarInt::from_u32(100));
    cfg.transport_config(Arc::new(transport));
    Ok(cfg)
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let port = args.common.port_or(4433);
    let cfg = server_config(&args)?;
    common::serve(
        "http3",
        &args.common,
        &format!("HTTP/3 on UDP port {port}"),
        move || {
            let cfg = cfg.clone();
            async move { Endpoint::server(cfg, port) }
        },
        move |core, endpoint| async move {
            let idx = core.index;
            loop {
                tokio::select! {
                    got = endpoint.accept() => match got {
                        Some(incoming) => {
                            tokio::task::spawn_local(serve_conn(idx, incoming));
                        }
                        None => break,
                    },
                    _ = corelane::shutdown_requested() => break,
                }
            }
            // Connections finish their requests (their tasks hold the endpoint's driver).
            endpoint.wait_idle().await;
        },
    )
}
