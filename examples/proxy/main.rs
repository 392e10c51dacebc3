//! An HTTP reverse proxy: hyper serves the clients on corelane streams, and every request goes
//! on to one upstream through hyper-util's pooled `Client` over corelane connections
//! (`corelane::net::Connector`), one client per core so that each core keeps its own pool.
//! Upgrades pass through: a WebSocket (or any `Connection: upgrade` request) is forwarded, and
//! once the upstream answers `101 Switching Protocols` the two upgraded streams are joined.
//!
//! ```text
//! ip netns exec NS target/release/examples/proxy --iface IF --addr 10.77.0.3/24 \
//!     --upstream 10.77.0.2:8000
//! curl http://10.77.0.3:8080/            # from the peer namespace: the upstream answers
//! ```
//!
//! What a proxy adds: `x-forwarded-for` with the client's address, and a `502` in words when
//! the upstream cannot be reached. Hop-by-hop headers other than the upgrade's are dropped
//! (RFC 9110 section 7.6.1).

#[path = "../common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Parser;
use corelane::net::TcpListener;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Parser, Debug)]
#[command(about = "An HTTP reverse proxy (hyper, hyper-util's pooled client) on corelane")]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// The upstream server, an address and port (names are not resolved).
    #[arg(long)]
    upstream: SocketAddr,
}

type Body = BoxBody<Bytes, hyper::Error>;
type Upstream = Client<corelane::net::Connector, Incoming>;

fn main() -> ExitCode {
    common::exit("proxy", run(Args::parse()))
}

/// The headers of one hop only (RFC 9110 section 7.6.1); `upgrade` and `connection` stay on
/// an upgrade, which needs them on the next hop too.
const HOP_BY_HOP: [&str; 6] = [
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "proxy-authorization",
];

fn is_upgrade(headers: &hyper::HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get(header::CONNECTION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("upgrade"))
}

fn bad_gateway(why: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(format!("the upstream failed: {why}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r
}

async fn forward(
    client: Upstream,
    upstream: SocketAddr,
    peer: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, hyper::Error> {
    let upgrading = is_upgrade(req.headers());
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let uri = match format!("http://{upstream}{path}").parse() {
        Ok(u) => u,
        Err(e) => return Ok(bad_gateway(format!("a request for {path}: {e}"))),
    };
    // The client's side of an upgrade, taken before the request goes on.
    let client_side = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    parts.uri = uri;
    for h in HOP_BY_HOP {
        parts.headers.remove(h);
    }
    if !upgrading {
        parts.headers.remove(header::CONNECTION);
        parts.headers.remove(header::UPGRADE);
    }
    if let Ok(v) = HeaderValue::from_str(&peer.ip().to_string()) {
        parts.headers.append("x-forwarded-for", v);
    }
    let mut res = match client.request(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(e) => return Ok(bad_gateway(e.to_string())),
    };
    if let (Some(client_side), StatusCode::SWITCHING_PROTOCOLS) = (client_side, res.status()) {
        let upstream_side = hyper::upgrade::on(&mut res);
        tokio::spawn(async move {
            match tokio::try_join!(client_side, upstream_side) {
                Ok((a, b)) => {
                    let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                }
                Err(e) => eprintln!("proxy: an upgrade did not complete: {e}"),
            }
        });
    }
    let (parts, body) = res.into_parts();
    Ok(Response::from_parts(parts, body.boxed()))
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let port = args.common.port_or(8080);
    let upstream = args.upstream;
    common::serve(
        "proxy",
        &args.common,
        &format!("proxying port {port} to {upstream}"),
        || TcpListener::bind(port),
        move |_core, listener| async move {
            // One pool per core: its connections stay on the core that made them.
            let client: Upstream =
                Client::builder(TokioExecutor::new()).build(corelane::net::Connector::new());
            while let Ok((stream, peer)) = listener.accept().await {
                let client = client.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        forward(client.clone(), upstream, peer, req)
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades();
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = corelane::shutdown_requested() => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
        },
    )
}
