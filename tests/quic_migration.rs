//! QUIC connections that outlive their path and their server, as root, with quinn on the
//! kernel's UDP as the client (the peer nobody here wrote):
//!
//! - a client that rebinds its port mid-transfer (a NAT rebinding, a migration) keeps its
//!   connection on a server of two cores, whichever core's queue its new port lands on: the
//!   server's connection IDs name the core that holds the connection, and the core that
//!   receives a datagram hands it there; its streams and an unreliable datagram come back;
//! - a client whose server restarted (the old process gone without a word) is told so at once
//!   by a stateless reset from the new process, instead of waiting out its idle timeout.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::quic::{certificate, pattern};
use common::*;
use corelane_rt::quic::{Endpoint, VarInt};
use corelane_testnet::require_root;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const KERNEL: &str = "10.77.0.2";
const PORT: u16 = 4433;

/// An echo server on every one of `cores` cores of the veth pair's server end (every
/// bidirectional stream of every connection echoed) until `done`; the run's report.
fn echo_server(
    net: &corelane_testnet::VethPair,
    cores: usize,
    config: quinn::ServerConfig,
    done: Arc<AtomicBool>,
) -> std::result::Result<corelane::RunReport, String> {
    let ifname = net.server_if().to_string();
    net.server_ns()
        .run(move || {
            let rt = corelane::Runtime::builder(&ifname)
                .addr(format!("{SERVER_V4}/24"))
                .cores(cores)
                .build()
                .map_err(|e| e.to_string())?;
            rt.run(move |_| {
                let (config, done) = (config.clone(), done.clone());
                async move {
                    let Ok(endpoint) = Endpoint::server(config, format!("{SERVER_V4}:{PORT}"))
                    else {
                        return;
                    };
                    while !done.load(Ordering::SeqCst) {
                        let next =
                            tokio::time::timeout(Duration::from_millis(50), endpoint.accept());
                        let Ok(Some(incoming)) = next.await else {
                            continue;
                        };
                        tokio::task::spawn_local(async move {
                            let Ok(conn) = incoming.await else { return };
                            // Datagrams: each sent back doubled.
                            let dgrams = conn.clone();
                            tokio::task::spawn_local(async move {
                                while let Ok(d) = dgrams.read_datagram().await {
                                    let _ = dgrams.send_datagram([&d[..], &d[..]].concat().into());
                                }
                            });
                            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                                tokio::task::spawn_local(async move {
                                    let _ = tokio::io::copy(&mut recv, &mut send).await;
                                    let _ = tokio::io::AsyncWriteExt::shutdown(&mut send).await;
                                });
                            }
                        });
                    }
                    // Closed, not waited for: an attempt the client gave up on while the
                    // cores came up would hold the wait for its idle timeout.
                    endpoint.close(VarInt::from_u32(0), b"");
                }
            })
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?
}

/// A quinn client endpoint on the kernel's side, trusting `roots`, connected to the server
/// (retried while the server's cores come up).
async fn connect(
    roots: rustls::RootCertStore,
) -> std::result::Result<(quinn::Endpoint, quinn::Connection), String> {
    let bind: SocketAddr = format!("{KERNEL}:0").parse().map_err(|e| format!("{e}"))?;
    let to: SocketAddr = format!("{SERVER_V4}:{PORT}")
        .parse()
        .map_err(|e| format!("{e}"))?;
    common::quic::connect(bind, to, roots).await
}

/// Runs `f` on a current-thread tokio runtime in the client's namespace.
fn on_kernel<T, F, Fut>(net: &corelane_testnet::VethPair, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::result::Result<T, String>>,
{
    let got = net.client_ns().run(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(f())
    })??;
    Ok(got)
}

/// Rebinds per client: each new port is a new draw of the veth's queue, so with four clients
/// the chance that no rebinding lands on the other core is 2^-16.
const REBINDS: usize = 4;
const CLIENTS: u8 = 4;
const STREAM: usize = 1_000_000;

#[test]
fn a_quinn_client_that_rebinds_its_port_mid_transfer_keeps_its_connection_on_two_cores() -> Result {
    if !require_root("quic_migration: rebinding") {
        return Ok(());
    }
    let net = net(2);
    let (server_config, roots) = certificate()?;
    let done = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| -> Result {
        let net = &net;
        let d = done.clone();
        let server = scope.spawn(move || echo_server(net, 2, server_config, d));
        let client = on_kernel(net, move || async move {
            let mut tasks = Vec::new();
            for c in 0..CLIENTS {
                let roots = roots.clone();
                tasks.push(tokio::spawn(async move {
                    let (endpoint, conn) = connect(roots).await?;
                    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
                    let data = pattern(c, STREAM);
                    let reader = tokio::spawn(async move {
                        tokio::time::timeout(Duration::from_secs(60), recv.read_to_end(STREAM))
                            .await
                            .map_err(|_| "the echo timed out".to_string())?
                            .map_err(|e| e.to_string())
                    });
                    // The stream in REBINDS + 1 parts, a new port before each part after
                    // the first: the connection moves while bytes are in flight both ways.
                    let mut ports = vec![endpoint.local_addr().map_err(|e| e.to_string())?.port()];
                    let part = STREAM / (REBINDS + 1) + 1;
                    for (i, chunk) in data.chunks(part).enumerate() {
                        if i > 0 {
                            let socket = std::net::UdpSocket::bind(format!("{KERNEL}:0"))
                                .map_err(|e| e.to_string())?;
                            ports.push(socket.local_addr().map_err(|e| e.to_string())?.port());
                            endpoint.rebind(socket).map_err(|e| e.to_string())?;
                        }
                        send.write_all(chunk).await.map_err(|e| e.to_string())?;
                        // Let the server see the new path before the next move.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    send.finish().map_err(|e| e.to_string())?;
                    let back = reader.await.map_err(|e| e.to_string())??;
                    // The connection still carries a stream after the last move.
                    let (mut s2, mut r2) = conn.open_bi().await.map_err(|e| e.to_string())?;
                    s2.write_all(b"after").await.map_err(|e| e.to_string())?;
                    s2.finish().map_err(|e| e.to_string())?;
                    let after = r2.read_to_end(100).await.map_err(|e| e.to_string())?;
                    // An unreliable datagram on the moved connection comes back doubled (sent
                    // again until one does: the wire may lose one).
                    let ping = format!("dgram {c}");
                    let mut dgram_back = false;
                    for _ in 0..20 {
                        conn.send_datagram(ping.clone().into_bytes().into())
                            .map_err(|e| e.to_string())?;
                        let wait = tokio::time::timeout(
                            std::time::Duration::from_millis(200),
                            conn.read_datagram(),
                        );
                        if let Ok(Ok(d)) = wait.await {
                            dgram_back = d[..] == *format!("{ping}{ping}").as_bytes();
                            break;
                        }
                    }
                    conn.close(VarInt::from_u32(0), b"");
                    endpoint.wait_idle().await;
                    Ok::<_, String>((back == data && after == b"after" && dgram_back, ports))
                }));
            }
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.map_err(|e| e.to_string())?);
            }
            Ok(out)
        });
        done.store(true, Ordering::SeqCst);
        let report = server.join().map_err(|_| "the server thread panicked")??;
        let client = client?;
        for (i, r) in client.iter().enumerate() {
            match r {
                Ok((whole, ports)) => {
                    assert!(
                        whole,
                        "client {i}: its streams came back whole, and its datagram doubled"
                    );
                    let distinct: std::collections::HashSet<_> = ports.iter().collect();
                    assert_eq!(distinct.len(), REBINDS + 1, "client {i} moved: {ports:?}");
                }
                Err(e) => panic!("client {i}: {e}"),
            }
        }
        let steered: Vec<u64> = report
            .cores
            .iter()
            .map(|c| c.stats.stack.udp.steered)
            .collect();
        assert!(
            steered.iter().sum::<u64>() > 0,
            "some rebinding landed on the other core and was handed over: {steered:?}"
        );
        let dropped: u64 = report
            .cores
            .iter()
            .map(|c| c.stats.stack.handoff_dropped)
            .sum();
        assert_eq!(dropped, 0, "no handoff dropped");
        assert!(
            report.frames_balanced(),
            "every frame back: {:?}",
            report.frames()
        );
        Ok(())
    })
}

#[test]
fn a_quinn_client_is_reset_at_once_by_the_server_that_restarted_under_it() -> Result {
    if !require_root("quic_migration: stateless reset") {
        return Ok(());
    }
    let net = net(1);
    let (server_config, roots) = certificate()?;
    // The first process: serves one connection, then ends without a word to its client (as a
    // crash would: the endpoint is left, not closed).
    let crash = Arc::new(AtomicBool::new(false));
    let up = Arc::new(Mutex::new(None::<Instant>));
    std::thread::scope(|scope| -> Result {
        let net = &net;
        let (c2, config) = (crash.clone(), server_config.clone());
        let first = scope.spawn(move || {
            let ifname = net.server_if().to_string();
            net.server_ns()
                .run(move || -> std::result::Result<(), String> {
                    let rt = corelane::Runtime::builder(&ifname)
                        .addr(format!("{SERVER_V4}/24"))
                        .build()
                        .map_err(|e| e.to_string())?;
                    rt.run(move |_| {
                        let (config, crash) = (config.clone(), c2.clone());
                        async move {
                            let Ok(endpoint) =
                                Endpoint::server(config, format!("{SERVER_V4}:{PORT}"))
                            else {
                                return;
                            };
                            let keep = endpoint.clone();
                            tokio::task::spawn_local(async move {
                                while let Some(incoming) = endpoint.accept().await {
                                    let Ok(conn) = incoming.await else { continue };
                                    while let Ok((mut s, mut r)) = conn.accept_bi().await {
                                        let _ = tokio::io::copy(&mut r, &mut s).await;
                                        let _ = tokio::io::AsyncWriteExt::shutdown(&mut s).await;
                                    }
                                }
                            });
                            while !crash.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            // Never closed: its connections are not told.
                            std::mem::forget(keep);
                        }
                    })
                    .map_err(|e| e.to_string())?;
                    Ok(())
                })
                .map_err(|e| e.to_string())?
        });
        let (c3, up2) = (crash.clone(), up.clone());
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let client = scope.spawn(move || {
            on_kernel(net, move || async move {
                let (endpoint, conn) = connect(roots).await?;
                let (mut s, mut r) = conn.open_bi().await.map_err(|e| e.to_string())?;
                s.write_all(b"before").await.map_err(|e| e.to_string())?;
                s.finish().map_err(|e| e.to_string())?;
                let back = r.read_to_end(100).await.map_err(|e| e.to_string())?;
                if back != b"before" {
                    return Err(format!("the first echo came back as {back:?}"));
                }
                // The server goes; the next one comes up on the same address and port.
                c3.store(true, Ordering::SeqCst);
                let _ = tx.send(());
                let deadline = Instant::now() + Duration::from_secs(30);
                while up2.lock().map_err(|e| e.to_string())?.is_none() {
                    if Instant::now() > deadline {
                        return Err("the second server never came up".into());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                // The client speaks on its old connection: the new process has no such
                // connection, and its answer must end it.
                let sent = Instant::now();
                let (mut s, _r) = conn.open_bi().await.map_err(|e| e.to_string())?;
                let _ = s.write_all(b"anyone there?").await;
                let why = tokio::time::timeout(Duration::from_secs(20), conn.closed())
                    .await
                    .map_err(|_| "the connection was not ended within 20 s".to_string())?;
                let took = sent.elapsed();
                endpoint.close(VarInt::from_u32(0), b"");
                Ok::<_, String>((why, took))
            })
            .map_err(|e| e.to_string())
        });
        let _ = rx.recv_timeout(Duration::from_secs(60));
        first.join().map_err(|_| "the first server panicked")??;
        // The second process on the same host (the same restart key), with its own endpoint.
        let done = Arc::new(AtomicBool::new(false));
        let (d2, up3) = (done.clone(), up.clone());
        let ifname = net.server_if().to_string();
        let second = scope.spawn(move || {
            net.server_ns()
                .run(move || -> std::result::Result<(), String> {
                    let rt = corelane::Runtime::builder(&ifname)
                        .addr(format!("{SERVER_V4}/24"))
                        .build()
                        .map_err(|e| e.to_string())?;
                    rt.run(move |_| {
                        let (config, done, up) = (server_config.clone(), d2.clone(), up3.clone());
                        async move {
                            let Ok(endpoint) =
                                Endpoint::server(config, format!("{SERVER_V4}:{PORT}"))
                            else {
                                return;
                            };
                            *up.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                            while !done.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            endpoint.close(VarInt::from_u32(0), b"");
                        }
                    })
                    .map_err(|e| e.to_string())?;
                    Ok(())
                })
                .map_err(|e| e.to_string())?
        });
        let got = client.join().map_err(|_| "the client panicked");
        done.store(true, Ordering::SeqCst);
        second.join().map_err(|_| "the second server panicked")??;
        let (why, took) = got??;
        // A reset, not the idle timeout's TimedOut: the new process recognised the last
        // one's connection ID and answered in words the client checks (its reset token).
        assert!(
            matches!(why, quinn::ConnectionError::Reset),
            "the client was told its connection is gone by a stateless reset: {why:?}"
        );
        eprintln!("quic_migration: the reset came {took:?} after the client spoke");
        Ok(())
    })
}
