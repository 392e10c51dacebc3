//! An HTTP/1.1 and HTTP/2 (h2c) server: hyper, unmodified, serving on corelane streams through
//! tokio's traits, on every core.
//!
//! ```text
//! ip netns exec NS target/release/examples/http --iface IF --addr 10.77.0.3/24 --port 8080
//! curl http://10.77.0.3:8080/            # from the peer namespace
//! curl --http2-prior-knowledge http://10.77.0.3:8080/
//! ```
//!
//! `GET /` answers with a short text naming the core; `GET /bytes/N` answers with N bytes;
//! `POST /echo` answers with the request body. A client that takes more than 10 s to send a
//! request's headers is disconnected (`--header-timeout`).

#[path = "../common/mod.rs"]
mod common;

use std::convert::Infallible;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Parser;
use corelane::net::TcpListener;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;

/// hyper's executor for the tasks of an HTTP/2 connection: on this core, with `spawn_local`
/// (a corelane stream is not `Send`, so neither are they).
#[derive(Clone, Copy, Debug)]
struct LocalExec;

impl<F: std::future::Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

#[derive(Parser, Debug)]
#[command(about = "HTTP/1.1 and HTTP/2 (hyper) served by corelane over AF_XDP, on every core")]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// Seconds a client may take to send a request's headers before it is disconnected.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
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

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let port = args.common.port_or(8080);
    // hyper's timer runs on the core's tokio executor.
    let header_timeout = std::time::Duration::try_from_secs_f64(args.header_timeout)
        .map_err(|e| format!("--header-timeout {}: {e}", args.header_timeout))?;
    common::serve(
        "http",
        &args.common,
        &format!("port {port}"),
        || TcpListener::bind(port),
        move |core, listener| async move {
            while let Ok((stream, _)) = listener.accept().await {
                let idx = core.index;
                tokio::task::spawn_local(async move {
                    let svc = service_fn(move |req| handle(idx, req));
                    // A client that sends its headers slower than --header-timeout is cut
                    // off: a thousand trickling clients cannot hold the server's connections.
                    // HTTP/1.1, or HTTP/2 when the client's first bytes are its preface
                    // (h2c with prior knowledge; behind TLS, ALPN would choose).
                    let mut http = auto::Builder::new(LocalExec);
                    http.http1()
                        .timer(TokioTimer::new())
                        .header_read_timeout(header_timeout);
                    http.http2().timer(TokioTimer::new());
                    let conn = http.serve_connection(TokioIo::new(stream), svc);
                    tokio::pin!(conn);
                    // A client that goes away mid-request is its own business. When a
                    // graceful shutdown begins, an idle keep-alive connection is closed (a
                    // FIN) and one in the middle of a request finishes it first.
                    tokio::select! {
                        _ = conn.as_mut() => return,
                        _ = corelane::shutdown_requested() => conn.as_mut().graceful_shutdown(),
                    }
                    let _ = conn.await;
                });
            }
        },
    )
}
