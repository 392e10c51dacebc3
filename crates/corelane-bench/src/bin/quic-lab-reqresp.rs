//! corelane's own cost per QUIC request, without the kernel: two corelane QUIC endpoints (a
//! client and a server) in `corelane::lab`, one core over the in-memory queue (their
//! datagrams loop back inside the device, checksums computed and verified, every packet
//! encrypted and decrypted as on the wire). Each request is a bidirectional stream, as an
//! HTTP/3 request is: the client opens it, writes 100 B and finishes; the server reads it whole
//! and writes it back. All connections at once (1, 16, 64), each one request at a time. Next to
//! it, in the same run and on the same thread, the same tasks over quinn on tokio and the
//! kernel's loopback UDP (127.0.0.1). Prints ns per request per side (the run's time over the
//! requests answered, halved: client and server each do one side's work, on one core).
//!
//! ```sh
//! cargo run --release -p corelane-bench --bin quic-lab-reqresp            # the table
//! cargo run --release -p corelane-bench --bin quic-lab-reqresp -- --quick # fewer requests
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// Bytes of each request (and of its answer).
const SIZE: usize = 100;

/// `conns` connections' requests, `rounds` each, every stream opened by `open` on its
/// connection; the server side is running already. Returns ns per request per side.
async fn exchange<C, S, R, O, OF>(conns: Vec<C>, open: O, rounds: usize) -> Result<f64>
where
    C: 'static,
    S: AsyncWrite + Unpin + 'static,
    R: AsyncRead + Unpin + 'static,
    O: Fn(Arc<C>) -> OF + Clone + 'static,
    OF: Future<Output = std::io::Result<(S, R)>>,
{
    let n = conns.len();
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for conn in conns {
        let (conn, open) = (Arc::new(conn), open.clone());
        tasks.push(tokio::task::spawn_local(async move {
            let req = [7u8; SIZE];
            let mut back = Vec::with_capacity(SIZE);
            for _ in 0..rounds {
                let (mut send, mut recv) = open(conn.clone()).await?;
                send.write_all(&req).await?;
                send.shutdown().await?;
                back.clear();
                recv.read_to_end(&mut back).await?;
                if back.len() != SIZE {
                    return Err(std::io::Error::other(format!("{} bytes back", back.len())));
                }
            }
            Ok::<_, std::io::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(t.elapsed().as_nanos() as f64 / (rounds * n) as f64 / 2.0)
}

/// The server's side of one stream: read whole, written back, finished.
async fn echo<S: AsyncWrite + Unpin, R: AsyncRead + Unpin>(mut send: S, mut recv: R) {
    let mut b = Vec::with_capacity(SIZE);
    if recv.read_to_end(&mut b).await.is_ok() && send.write_all(&b).await.is_ok() {
        let _ = send.shutdown().await;
    }
}

/// A certificate for "localhost": quinn-proto's server config with it, and the roots a
/// client trusts it by.
fn certificate() -> Result<(quinn::ServerConfig, rustls::RootCertStore)> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let server = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    Ok((server, roots))
}

fn corelane_row(n: usize, requests: usize) -> Result<f64> {
    use corelane_rt::quic::{ClientConfig, Endpoint};
    let (server_config, roots) = certificate()?;
    let client_config = ClientConfig::with_root_certificates(Arc::new(roots))?;
    corelane_rt::lab::Lab::new().seed(7).run(async move {
        let server = Endpoint::server(server_config, "127.0.0.1:4433")?;
        let at = server.local_addr()?;
        let accepting = server.clone();
        tokio::task::spawn_local(async move {
            while let Some(incoming) = accepting.accept().await {
                tokio::task::spawn_local(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((send, recv)) = conn.accept_bi().await {
                        tokio::task::spawn_local(echo(send, recv));
                    }
                });
            }
        });
        let client = Endpoint::client("127.0.0.1:0")?;
        client.set_default_client_config(client_config);
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(client.connect(at, "localhost")?.await?);
        }
        let open = |c: Arc<corelane_rt::quic::Connection>| async move {
            c.open_bi().await.map_err(std::io::Error::from)
        };
        let ns = exchange(conns, open, requests.div_ceil(n)).await?;
        server.close(0u32.into(), b"");
        Ok::<_, Box<dyn std::error::Error>>(ns)
    })?
}

fn quinn_row(n: usize, requests: usize) -> Result<f64> {
    let (server_config, roots) = certificate()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let any: SocketAddr = "127.0.0.1:0".parse()?;
        let server = quinn::Endpoint::server(server_config, any)?;
        let at = server.local_addr()?;
        let accepting = server.clone();
        tokio::task::spawn_local(async move {
            while let Some(incoming) = accepting.accept().await {
                tokio::task::spawn_local(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((send, recv)) = conn.accept_bi().await {
                        tokio::task::spawn_local(echo(send, recv));
                    }
                });
            }
        });
        let mut client = quinn::Endpoint::client(any)?;
        client.set_default_client_config(quinn::ClientConfig::with_root_certificates(Arc::new(
            roots,
        ))?);
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(client.connect(at, "localhost")?.await?);
        }
        let open = |c: Arc<quinn::Connection>| async move {
            c.open_bi().await.map_err(std::io::Error::from)
        };
        let ns = exchange(conns, open, requests.div_ceil(n)).await?;
        server.close(0u32.into(), b"");
        Ok(ns)
    })
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let requests = if quick { 5_000 } else { 100_000 };
    // One core, as corelane's lanes run: the kernel's softirq work for loopback runs on the
    // same CPU, in the sending system call.
    if let Some(id) = core_affinity::get_core_ids().and_then(|ids| ids.into_iter().next()) {
        core_affinity::set_for_current(id);
    }
    println!("connections  corelane ns  quinn+kernel ns  ratio   (per {SIZE} B request, per side)");
    for n in [1usize, 16, 64] {
        let c = corelane_row(n, requests)?;
        let k = quinn_row(n, requests)?;
        println!("{n:>11}  {c:>11.0}  {k:>15.0}  {:>5.2}x", c / k);
    }
    Ok(())
}
