//! QUIC on the wire, as root: a corelane endpoint on one end of a veth pair (through the XDP
//! program, an AF_XDP socket and the runtime), quinn on the kernel's UDP on the other: the peer
//! nobody here wrote, both ways round.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::quic::{certificate, pattern};
use common::*;
use corelane_rt::quic::{ConnectionError, Endpoint, VarInt};
use corelane_testnet::require_root;
use tokio::io::AsyncWriteExt;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const KERNEL: &str = "10.77.0.2";
const PORT: u16 = 4433;

/// Runs `f` on one corelane core serving the veth pair's server end, to its end.
fn on_corelane<T, F, Fut>(net: &corelane_testnet::VethPair, f: F) -> Result<T>
where
    T: Send + 'static,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    on_corelane_at(net.server_ns(), net.server_if(), SERVER_V4, 1, f)
}

/// Runs `f` on `cores` corelane cores serving `ifname` in `ns` at `addr/24`, to their end;
/// what the last core to end returned.
fn on_corelane_at<T, F, Fut>(
    ns: &corelane_testnet::Netns,
    ifname: &str,
    addr: &str,
    cores: usize,
    f: F,
) -> Result<T>
where
    T: Send + 'static,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    let (ifname, addr) = (ifname.to_string(), addr.to_string());
    let got = ns.run(move || -> std::result::Result<T, String> {
        let rt = corelane::Runtime::builder(&ifname)
            .addr(format!("{addr}/24"))
            .cores(cores)
            .build()
            .map_err(|e| e.to_string())?;
        let out = Arc::new(std::sync::Mutex::new(None));
        let slot = out.clone();
        rt.run(move |_| {
            let slot = slot.clone();
            let fut = f();
            async move {
                let v = fut.await;
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
            }
        })
        .map_err(|e| e.to_string())?;
        let v = out.lock().unwrap_or_else(|p| p.into_inner()).take();
        v.ok_or_else(|| "the core's future did not finish".to_string())
    })??;
    Ok(got)
}

/// The server side: every bidirectional stream of the first connection whose handshake
/// completes echoed; returns how that connection ended, as the server saw it. (Attempts the
/// client gave up on before the port was bound end in their handshake, and are passed over.)
async fn echo_one_connection(endpoint: Endpoint) -> String {
    let conn = loop {
        let Some(incoming) = endpoint.accept().await else {
            return "no connection".into();
        };
        if let Ok(c) = incoming.await {
            break c;
        }
    };
    let mut echoes = Vec::new();
    let why = loop {
        match conn.accept_bi().await {
            Ok((mut send, mut recv)) => echoes.push(tokio::task::spawn_local(async move {
                let _ = tokio::io::copy(&mut recv, &mut send).await;
                let _ = send.shutdown().await;
            })),
            Err(e) => break e,
        }
    };
    for e in echoes {
        let _ = e.await;
    }
    match why {
        ConnectionError::ApplicationClosed(c) => format!("closed {}", c.error_code),
        other => format!("lost: {other}"),
    }
}

#[test]
fn quinn_on_the_kernel_gets_its_streams_echoed_by_a_corelane_server() -> Result {
    if !require_root("quic_wire: quinn client, corelane server") {
        return Ok(());
    }
    let net = net(1);
    let (server_config, roots) = certificate()?;
    std::thread::scope(|scope| -> Result {
        let server = scope.spawn(|| {
            on_corelane(&net, move || {
                let config = server_config.clone();
                async move {
                    match Endpoint::server(config, format!("{SERVER_V4}:{PORT}")) {
                        Ok(e) => echo_one_connection(e).await,
                        Err(e) => format!("bind: {e}"),
                    }
                }
            })
            .map_err(|e| e.to_string())
        });
        let to: SocketAddr = format!("{SERVER_V4}:{PORT}").parse()?;
        let client =
            net.client_ns()
                .run(move || -> std::result::Result<Vec<bool>, String> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?;
                    rt.block_on(async move {
                        let mut endpoint = quinn::Endpoint::client(
                            format!("{KERNEL}:0")
                                .parse()
                                .map_err(|e: std::net::AddrParseError| e.to_string())?,
                        )
                        .map_err(|e| e.to_string())?;
                        let config = quinn::ClientConfig::with_root_certificates(Arc::new(roots))
                            .map_err(|e| e.to_string())?;
                        endpoint.set_default_client_config(config);
                        // The server binds its port once its core runs: until then, no answer.
                        let mut conn = None;
                        for _ in 0..40 {
                            let c = endpoint
                                .connect(to, "localhost")
                                .map_err(|e| e.to_string())?;
                            match tokio::time::timeout(Duration::from_millis(500), c).await {
                                Ok(Ok(c)) => {
                                    conn = Some(c);
                                    break;
                                }
                                _ => tokio::time::sleep(Duration::from_millis(100)).await,
                            }
                        }
                        let conn = conn.ok_or("no handshake with the corelane server")?;
                        let mut same = Vec::new();
                        for (seed, len) in [(1u8, 1000usize), (2, 1_000_000)] {
                            let (mut send, mut recv) =
                                conn.open_bi().await.map_err(|e| e.to_string())?;
                            let data = pattern(seed, len);
                            let sent = data.clone();
                            let writer = tokio::spawn(async move {
                                send.write_all(&sent).await?;
                                send.finish()?;
                                std::io::Result::Ok(())
                            });
                            let read = tokio::time::timeout(
                                Duration::from_secs(30),
                                recv.read_to_end(4 << 20),
                            )
                            .await;
                            let wrote = writer.await;
                            same.push(
                                matches!(read, Ok(Ok(ref back)) if *back == data)
                                    && matches!(wrote, Ok(Ok(()))),
                            );
                        }
                        conn.close(VarInt::from_u32(9), b"done");
                        endpoint.wait_idle().await;
                        Ok(same)
                    })
                })??;
        let seen = server.join().map_err(|_| "the server thread panicked")??;
        assert_eq!(
            client,
            vec![true, true],
            "quinn got every stream back whole"
        );
        assert_eq!(
            seen, "closed 9",
            "the corelane server saw quinn's close with its code"
        );
        Ok(())
    })
}

#[test]
fn a_corelane_client_gets_its_streams_echoed_by_quinn_on_the_kernel() -> Result {
    if !require_root("quic_wire: corelane client, quinn server") {
        return Ok(());
    }
    let net = net(1);
    let (server_config, roots) = certificate()?;
    let at: SocketAddr = format!("{KERNEL}:{PORT}").parse()?;
    std::thread::scope(|scope| -> Result {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        // quinn's server on the kernel's UDP, in the client namespace: every bidirectional
        // stream of one connection echoed; how the connection ended.
        let kernel = scope.spawn(|| {
            net.client_ns()
                .run(move || -> std::result::Result<String, String> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?;
                    rt.block_on(async move {
                        let endpoint = quinn::Endpoint::server(server_config, at)
                            .map_err(|e| e.to_string())?;
                        let _ = ready_tx.send(());
                        let incoming =
                            tokio::time::timeout(Duration::from_secs(30), endpoint.accept())
                                .await
                                .map_err(|_| "no connection came")?
                                .ok_or("the endpoint closed")?;
                        let conn = incoming.await.map_err(|e| e.to_string())?;
                        let why = loop {
                            match conn.accept_bi().await {
                                Ok((mut send, mut recv)) => {
                                    tokio::spawn(async move {
                                        let _ = tokio::io::copy(&mut recv, &mut send).await;
                                        let _ = send.finish();
                                    });
                                }
                                Err(e) => break e,
                            }
                        };
                        endpoint.wait_idle().await;
                        Ok(match why {
                            quinn::ConnectionError::ApplicationClosed(c) => {
                                format!("closed {}", c.error_code)
                            }
                            other => format!("lost: {other}"),
                        })
                    })
                })
        });
        ready_rx.recv_timeout(Duration::from_secs(10))?;
        let client_config = quinn::ClientConfig::with_root_certificates(Arc::new(roots))?;
        let same = on_corelane(&net, move || {
            let config = client_config.clone();
            async move {
                let endpoint =
                    Endpoint::client(format!("{SERVER_V4}:0")).map_err(|e| format!("bind: {e}"))?;
                endpoint.set_default_client_config(config);
                let conn = endpoint
                    .connect(at, "localhost")
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                let mut same = Vec::new();
                for (seed, len) in [(5u8, 3000usize), (6, 1_500_000)] {
                    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
                    let data = pattern(seed, len);
                    let sent = data.clone();
                    let writer = tokio::task::spawn_local(async move {
                        send.write_all(&sent).await?;
                        send.shutdown().await
                    });
                    let mut back = Vec::new();
                    let read = tokio::io::AsyncReadExt::read_to_end(&mut recv, &mut back).await;
                    let wrote = writer.await;
                    same.push(read.is_ok() && matches!(wrote, Ok(Ok(()))) && back == data);
                }
                conn.close(VarInt::from_u32(11), b"done");
                endpoint.wait_idle().await;
                std::result::Result::<Vec<bool>, String>::Ok(same)
            }
        })??;
        let seen = kernel
            .join()
            .map_err(|_| "the kernel server panicked")???;
        assert_eq!(
            same,
            vec![true, true],
            "corelane got every stream back whole"
        );
        assert_eq!(
            seen, "closed 11",
            "quinn saw corelane's close with its code"
        );
        Ok(())
    })
}

#[test]
fn quinn_through_five_percent_loss_both_ways_gets_its_streams_echoed_whole() -> Result {
    if !require_root("quic_wire: through loss") {
        return Ok(());
    }
    const KERNEL_SERVER: &str = "10.89.0.1";
    const CLIENT: &str = "10.89.0.2";
    const CORELANE: &str = "10.89.0.3";
    let net = lossy_path(KERNEL_SERVER, CLIENT);
    net.set_loss(
        corelane_testnet::Loss::percent(5.0),
        corelane_testnet::Loss::percent(5.0),
    )?;
    let (server_config, roots) = certificate()?;
    std::thread::scope(|scope| -> Result {
        let server = scope.spawn(|| {
            on_corelane_at(net.server_ns(), net.server_if(), CORELANE, 1, move || {
                let config = server_config.clone();
                async move {
                    match Endpoint::server(config, format!("{CORELANE}:{PORT}")) {
                        Ok(e) => echo_one_connection(e).await,
                        Err(e) => format!("bind: {e}"),
                    }
                }
            })
            .map_err(|e| e.to_string())
        });
        let to: SocketAddr = format!("{CORELANE}:{PORT}").parse()?;
        let client =
            net.client_ns()
                .run(move || -> std::result::Result<Vec<bool>, String> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?;
                    rt.block_on(async move {
                        let bind: SocketAddr = format!("{CLIENT}:0")
                            .parse()
                            .map_err(|e: std::net::AddrParseError| e.to_string())?;
                        let mut endpoint =
                            quinn::Endpoint::client(bind).map_err(|e| e.to_string())?;
                        let config = quinn::ClientConfig::with_root_certificates(Arc::new(roots))
                            .map_err(|e| e.to_string())?;
                        endpoint.set_default_client_config(config);
                        let mut conn = None;
                        for _ in 0..5 {
                            let c = endpoint
                                .connect(to, "localhost")
                                .map_err(|e| e.to_string())?;
                            if let Ok(Ok(c)) =
                                tokio::time::timeout(Duration::from_secs(10), c).await
                            {
                                conn = Some(c);
                                break;
                            }
                        }
                        let conn = conn.ok_or("no handshake through the lossy path")?;
                        let mut same = Vec::new();
                        // One large stream and twenty small ones, all at once.
                        let mut tasks = Vec::new();
                        for (seed, len) in
                            std::iter::once((0u8, 1usize << 20)).chain((1..=20u8).map(|s| (s, 500)))
                        {
                            let conn = conn.clone();
                            tasks.push(tokio::spawn(async move {
                                let Ok((mut send, mut recv)) = conn.open_bi().await else {
                                    return false;
                                };
                                let data = pattern(seed, len);
                                let sent = data.clone();
                                let writer = tokio::spawn(async move {
                                    send.write_all(&sent).await?;
                                    send.finish()?;
                                    std::io::Result::Ok(())
                                });
                                let read = tokio::time::timeout(
                                    Duration::from_secs(60),
                                    recv.read_to_end(4 << 20),
                                )
                                .await;
                                let wrote = writer.await;
                                matches!(read, Ok(Ok(ref back)) if *back == data)
                                    && matches!(wrote, Ok(Ok(())))
                            }));
                        }
                        for t in tasks {
                            same.push(t.await.unwrap_or(false));
                        }
                        conn.close(VarInt::from_u32(3), b"done");
                        endpoint.wait_idle().await;
                        Ok(same)
                    })
                })??;
        let seen = server.join().map_err(|_| "the server thread panicked")??;
        assert_eq!(
            client,
            vec![true; 21],
            "every stream came back whole through the loss"
        );
        // The close itself may be lost: the server then ends by its idle timeout.
        assert!(
            seen == "closed 3" || seen.starts_with("lost: timed out"),
            "the server's end: {seen}"
        );
        Ok(())
    })
}

#[test]
fn eight_quinn_clients_are_served_by_the_endpoints_of_two_cores() -> Result {
    if !require_root("quic_wire: two cores") {
        return Ok(());
    }
    let net = net(2);
    let (server_config, roots) = certificate()?;
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|scope| -> Result {
        let (served2, done2) = (served.clone(), done.clone());
        let net = &net;
        let server = scope.spawn(move || {
            // Every core binds the port: each serves the connections its queue receives.
            on_corelane_at(net.server_ns(), net.server_if(), SERVER_V4, 2, move || {
                let (config, served, done) =
                    (server_config.clone(), served2.clone(), done2.clone());
                async move {
                    let Ok(endpoint) = Endpoint::server(config, format!("{SERVER_V4}:{PORT}"))
                    else {
                        return;
                    };
                    while !done.load(std::sync::atomic::Ordering::SeqCst) {
                        let next =
                            tokio::time::timeout(Duration::from_millis(50), endpoint.accept());
                        let Ok(Some(incoming)) = next.await else {
                            continue;
                        };
                        let served = served.clone();
                        tokio::task::spawn_local(async move {
                            let Ok(conn) = incoming.await else { return };
                            served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                                tokio::task::spawn_local(async move {
                                    let _ = tokio::io::copy(&mut recv, &mut send).await;
                                    let _ = send.shutdown().await;
                                });
                            }
                        });
                    }
                    endpoint.close(VarInt::from_u32(0), b"");
                }
            })
            .map_err(|e| e.to_string())
        });
        let to: SocketAddr = format!("{SERVER_V4}:{PORT}").parse()?;
        let echoed = net
            .client_ns()
            .run(move || -> std::result::Result<usize, String> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async move {
                    let config = quinn::ClientConfig::with_root_certificates(Arc::new(roots))
                        .map_err(|e| e.to_string())?;
                    // Eight clients, each its own UDP port (its own four-tuple, so its own
                    // queue as the veth's hash picks it).
                    let mut clients = Vec::new();
                    for c in 0..8u8 {
                        let config = config.clone();
                        clients.push(tokio::spawn(async move {
                            let bind: SocketAddr = format!("{KERNEL}:0").parse().ok()?;
                            let mut endpoint = quinn::Endpoint::client(bind).ok()?;
                            endpoint.set_default_client_config(config);
                            let mut conn = None;
                            for _ in 0..5 {
                                let attempt = endpoint.connect(to, "localhost").ok()?;
                                if let Ok(Ok(c)) =
                                    tokio::time::timeout(Duration::from_secs(10), attempt).await
                                {
                                    conn = Some(c);
                                    break;
                                }
                            }
                            let conn = conn?;
                            let (mut send, mut recv) = conn.open_bi().await.ok()?;
                            let data = pattern(c, 100_000);
                            send.write_all(&data).await.ok()?;
                            send.finish().ok()?;
                            let back = tokio::time::timeout(
                                Duration::from_secs(30),
                                recv.read_to_end(1 << 20),
                            )
                            .await
                            .ok()?
                            .ok()?;
                            conn.close(VarInt::from_u32(0), b"");
                            endpoint.wait_idle().await;
                            (back == data).then_some(())
                        }));
                    }
                    let mut echoed = 0;
                    for c in clients {
                        echoed += usize::from(matches!(c.await, Ok(Some(()))));
                    }
                    Ok(echoed)
                })
            });
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        server.join().map_err(|_| "the server thread panicked")??;
        assert_eq!(echoed??, 8, "every client's stream came back whole");
        assert_eq!(
            served.load(std::sync::atomic::Ordering::SeqCst),
            8,
            "the two cores' endpoints served eight connections between them"
        );
        Ok(())
    })
}
