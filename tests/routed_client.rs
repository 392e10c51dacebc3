//! corelane's own clients on a routed network: connecting out through the router to kernel
//! servers (IPv4 and IPv6, routes read from the kernel), giving up on a dead address within the
//! configured SYN retries, and freeing a connection whose peer vanished after its user timeout.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use corelane::net::{TcpListener, TcpStream};
use corelane::{Runtime, StackConfig};
use corelane_testnet::{RoutedNet, require_root};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const S: corelane_testnet::Side = RoutedNet::SERVER_SIDE;
const C: corelane_testnet::Side = RoutedNet::CLIENT_SIDE;

/// A runtime on interface `ifname` owning the server side's free v4 and v6 addresses, with
/// `stack`.
fn runtime(ifname: &str, stack: StackConfig) -> std::result::Result<Runtime, String> {
    Runtime::builder(ifname)
        .addr(format!("{}/24", S.free_v4))
        .addr(format!("{}/64", S.free_v6))
        .cores(1)
        .stack(stack)
        .build()
        .map_err(|e| e.to_string())
}

#[test]
fn corelane_clients_connect_through_the_router_and_give_up_on_a_dead_address_in_time() -> Result {
    if !require_root("routed: corelane clients") {
        return Ok(());
    }
    let net = RoutedNet::builder().build()?;
    let listeners = net.client_ns().run(|| -> std::io::Result<_> {
        Ok([
            std::net::TcpListener::bind(format!("{}:7000", C.host_v4))?,
            std::net::TcpListener::bind(format!("[{}]:7000", C.host_v6))?,
        ])
    })??;
    for l in listeners {
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { break };
                std::thread::spawn(move || {
                    let mut r = s.try_clone().expect("clone");
                    let _ = std::io::copy(&mut r, &mut s);
                });
            }
        });
    }
    // The router refuses two ports with ICMP: one as a closed port (a hard error), one as an
    // unreachable host (a soft error).
    net.router_ns().exec(
        "nft",
        &["add table inet rej; \
           add chain inet rej forward { type filter hook forward priority 0; }; \
           add rule inet rej forward tcp dport 7001 reject with icmpx type port-unreachable; \
           add rule inet rej forward tcp dport 7002 reject with icmpx type host-unreachable"],
    )?;
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    let o = out.clone();
    let ifname = net.server_if().to_string();
    let mut stack = StackConfig::default();
    // Three SYNs at most: at 0, 200 ms and 600 ms; the attempt fails at 1.4 s.
    stack.tcp.syn_retries = 2;
    stack.tcp.rto_initial = Duration::from_millis(200);
    let report = net.server_ns().run(move || {
        runtime(&ifname, stack)?
            .run(move |_core| {
                let o = o.clone();
                async move {
                    let say = |s: String| o.lock().expect("lock").push(s);
                    for host in [C.host_v4, C.host_v6] {
                        let to = SocketAddr::new(host.parse().expect("ip"), 7000);
                        let r = async {
                            let mut s = TcpStream::connect(to).await?;
                            let data = payload(64 * 1024, 3);
                            s.write_all(&data).await?;
                            let mut back = vec![0u8; data.len()];
                            s.read_exact(&mut back).await?;
                            std::io::Result::Ok(back == data)
                        };
                        match tokio::time::timeout(Duration::from_secs(20), r).await {
                            Ok(Ok(true)) => say(format!("echoed {host}")),
                            other => say(format!("echo {host} failed: {other:?}")),
                        }
                    }
                    for host in [C.host_v4, C.host_v6] {
                        for port in [7001, 7002] {
                            let to = SocketAddr::new(host.parse().expect("ip"), port);
                            let t = Instant::now();
                            let r = TcpStream::connect(to).await;
                            let kind = r.err().map(|e| e.kind());
                            say(format!(
                                "{to}: {kind:?} after {} ms",
                                t.elapsed().as_millis()
                            ));
                        }
                    }
                    // On the client's subnet, but nobody is there: the router's ARP gets no
                    // answer, the SYNs none either.
                    let dead: SocketAddr = "10.81.2.99:7000".parse().expect("addr");
                    let t = Instant::now();
                    match TcpStream::connect(dead).await {
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => say(format!(
                            "dead timed out after {} ms",
                            t.elapsed().as_millis()
                        )),
                        other => say(format!("dead: {other:?}")),
                    }
                    // tokio's timeout cuts a connect short, and the attempt is dropped with it.
                    let t = Instant::now();
                    let cut =
                        tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(dead))
                            .await
                            .is_err();
                    say(format!("cut {cut} after {} ms", t.elapsed().as_millis()));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let flows = corelane::core_stats().map_or(u64::MAX, |s| s.stack.flows);
                    say(format!("flows left {flows}"));
                }
            })
            .map_err(|e| e.to_string())
    })??;
    let out = out.lock().map_err(|_| "lock")?.clone();
    let text = out.join("\n");
    assert!(text.contains(&format!("echoed {}", C.host_v4)), "{text}");
    assert!(text.contains(&format!("echoed {}", C.host_v6)), "{text}");
    // The attempt ended by the retries above (1.4 s; printed, not asserted: no timing
    // assertions), with the error a timeout gives.
    assert!(
        out.iter().any(|l| l.starts_with("dead timed out after ")),
        "the dead connect did not time out:\n{text}"
    );
    assert!(text.contains("cut true"), "{text}");
    // ICMP errors reach the connection: port unreachable refuses it, host unreachable is
    // what the timeout reports.
    for host in [C.host_v4.to_string(), format!("[{}]", C.host_v6)] {
        // Only the ICMP error can refuse it: the rule answers SYNs with nothing else.
        let refused = format!("{host}:7001: Some(ConnectionRefused)");
        assert!(text.contains(&refused), "{refused}:\n{text}");
        let unreachable = format!("{host}:7002: Some(HostUnreachable)");
        assert!(text.contains(&unreachable), "{unreachable}:\n{text}");
    }
    assert!(
        text.contains("flows left 0"),
        "every attempt freed its flow:\n{text}"
    );
    assert!(report.frames_balanced(), "{report:?}");
    Ok(())
}

#[test]
fn a_vanished_peers_connection_is_reset_and_freed_after_the_user_timeout() -> Result {
    if !require_root("routed: user timeout") {
        return Ok(());
    }
    let net = RoutedNet::builder().build()?;
    let ifname = net.server_if().to_string();
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    let o = out.clone();
    let server = net.server_ns().spawn(move || {
        runtime(&ifname, StackConfig::default())?
            .run(move |_core| {
                let o = o.clone();
                async move {
                    let say = |s: String| o.lock().expect("lock").push(s);
                    let l = TcpListener::bind(7100).await.expect("listen");
                    l.set_accept_options(None, Some(Duration::from_secs(2)))
                        .expect("options");
                    let before = corelane::core_stats().map_or(u64::MAX, |s| s.stack.flows);
                    let (mut s, _) = l.accept().await.expect("accept");
                    say(format!("user timeout {:?}", s.user_timeout().ok()));
                    let chunk = vec![7u8; 16 * 1024];
                    let t = Instant::now();
                    let end = loop {
                        // The peer reads until the router goes dark; then nothing is acknowledged.
                        if let Err(e) = s.write_all(&chunk).await {
                            break e;
                        }
                        if t.elapsed() > Duration::from_secs(60) {
                            break std::io::Error::other("never ended");
                        }
                    };
                    say(format!("ended {:?}", end.kind()));
                    drop(s);
                    drop(l);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let after = corelane::core_stats().map_or(u64::MAX, |s| s.stack.flows);
                    say(format!("flows {before} -> {after}"));
                }
            })
            .map_err(|e| e.to_string())
    })?;
    let dst = SocketAddr::new(S.free_v4.parse()?, 7100);
    let got = net.client_ns().run(move || -> std::io::Result<usize> {
        let mut s = connect(dst)?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0;
        while got < 1 << 20 {
            got += s.read(&mut buf)?;
        }
        // Keep the socket: the peer does not close, it vanishes.
        std::mem::forget(s);
        Ok(got)
    })??;
    assert!(got >= 1 << 20);
    // The path dies: the router forwards nothing more.
    net.router_ns().exec(
        "nft",
        &[
            "add table inet dark; add chain inet dark forward { type filter hook forward priority 0; policy drop; }",
        ],
    )?;
    let report = server.join()??;
    let out = out.lock().map_err(|_| "lock")?.join("\n");
    assert!(out.contains("user timeout Some(2s)"), "{out}");
    assert!(out.contains("ended TimedOut"), "{out}");
    assert!(
        out.contains("flows 0 -> 0"),
        "the connection was freed:\n{out}"
    );
    assert!(report.frames_balanced(), "{report:?}");
    let _ = std::io::stdout().flush();
    Ok(())
}
