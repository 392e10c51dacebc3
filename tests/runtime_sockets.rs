//! The runtime's socket API driven from this test process (its threads enter the server
//! namespace): corelane connecting out to kernel servers, replies crossing cores; a full backlog;
//! wake-one accept.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use corelane::net::{TcpListener, TcpStream};
use corelane::{RunReport, Runtime};
use corelane_testnet::{VethPair, require_root};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Builds a runtime on the server end of `net` (owning 10.77.0.3) and runs `f` on every core,
/// from a thread inside the server namespace.
fn serve<F, Fut>(net: &VethPair, backlog: usize, f: F) -> corelane_testnet::NsThread<RunReport>
where
    F: Fn(corelane::CoreInfo) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let ifname = net.server_if().to_string();
    net.server_ns()
        .spawn(move || {
            let rt = Runtime::builder(&ifname)
                .addr("10.77.0.3/24")
                .backlog(backlog)
                .build()
                .expect("runtime");
            rt.run(f).expect("run")
        })
        .expect("server thread")
}

/// Waits (on the core) until the test thread says it is done (a watch channel, no polling).
async fn until(done: &mut watch::Receiver<bool>) {
    let _ = done.wait_for(|d| *d).await;
}

fn kernel_echo_server(listener: std::net::TcpListener) {
    for s in listener.incoming() {
        let Ok(mut s) = s else { break };
        std::thread::spawn(move || {
            let mut r = s.try_clone().unwrap();
            let _ = std::io::copy(&mut r, &mut s);
        });
    }
}

#[test]
fn runtime_corelane_clients_reach_kernel_servers_both_ways_from_both_cores() {
    if !require_root("runtime_corelane_client") {
        return;
    }
    let net = net(2);
    // Kernel servers in the peer namespace: an echo on 9000, a 1 MiB source on 9001.
    let (echo_l, source_l) = net
        .client_ns()
        .run(|| {
            (
                std::net::TcpListener::bind("10.77.0.2:9000").unwrap(),
                std::net::TcpListener::bind("10.77.0.2:9001").unwrap(),
            )
        })
        .unwrap();
    std::thread::spawn(move || kernel_echo_server(echo_l));
    let source_data = payload(1 << 20, 99);
    let want_source = sha256(&source_data);
    std::thread::spawn(move || {
        for s in source_l.incoming() {
            let Ok(mut s) = s else { break };
            let d = source_data.clone();
            std::thread::spawn(move || {
                let _ = s.write_all(&d);
            });
        }
    });
    let verified = Arc::new(AtomicUsize::new(0));
    let v = verified.clone();
    let server = serve(&net, 256, move |core| {
        let v = v.clone();
        async move {
            let mut tasks = Vec::new();
            for i in 0..10 {
                let v = v.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    // corelane sends, the kernel echoes, corelane checks.
                    let to: SocketAddr = "10.77.0.2:9000".parse().unwrap();
                    let mut s =
                        tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(to))
                            .await
                            .expect("connect in time")
                            .expect("connect");
                    assert_eq!(s.peer_addr().unwrap(), to);
                    assert_eq!(s.local_addr().unwrap().ip().to_string(), SERVER_V4);
                    let data = payload(256 * 1024, (core.index * 100 + i) as u64);
                    let (mut r, mut w) = s.into_split();
                    let d = data.clone();
                    let writer = tokio::task::spawn_local(async move {
                        w.write_all(&d).await.unwrap();
                        w
                    });
                    let mut back = vec![0u8; data.len()];
                    r.read_exact(&mut back).await.unwrap();
                    drop(writer.await.unwrap());
                    if back == data {
                        v.fetch_add(1, Ordering::SeqCst);
                    }
                    // The kernel sends, corelane receives to the end.
                    s = TcpStream::connect("10.77.0.2:9001").await.unwrap();
                    let mut got = Vec::new();
                    s.read_to_end(&mut got).await.unwrap();
                    if sha256(&got) == want_source {
                        v.fetch_add(1, Ordering::SeqCst);
                    }
                }));
            }
            for t in tasks {
                t.await.expect("client task");
            }
        }
    });
    let report = server.join().expect("server");
    assert_eq!(
        verified.load(Ordering::SeqCst),
        40,
        "20 echoes and 20 downloads verified"
    );
    assert!(report.frames_balanced(), "{report:?}");
    let handed: u64 = report.cores.iter().map(|c| c.stats.stack.handed_off).sum();
    assert!(
        handed > 0,
        "replies to 40 connections never landed on the other core's queue: {report:?}"
    );
    for c in &report.cores {
        // What taking a handed-over frame in costs (copy into this core's UMEM, classify).
        println!(
            "core {}: {} frames handed out, {} taken in at {:.0} ns each; protocol {:.0} ns/frame",
            c.stats.core,
            c.stats.stack.handed_off,
            c.stats.pipeline.handoff_in.items,
            c.stats.pipeline.handoff_in.ns_per_item(),
            c.stats.pipeline.protocol.ns_per_item()
        );
    }
    let injected: u64 = report
        .cores
        .iter()
        .map(|c| c.stats.device.rx_injected)
        .sum();
    assert_eq!(
        injected, handed,
        "every handed-off frame was taken in by its core"
    );
    assert_no_xdp(&net);
}

#[test]
fn runtime_full_backlog_never_resets_and_harms_nothing_else() {
    if !require_root("runtime_full_backlog") {
        return;
    }
    let net = net(1);
    let (done, d) = watch::channel(false);
    let server = serve(&net, 4, move |_core| {
        let mut d = d.clone();
        async move {
            // Port 7000 never accepts; port 7 echoes.
            let stuck = TcpListener::bind(7000).await.unwrap();
            let echo = TcpListener::bind(7).await.unwrap();
            tokio::task::spawn_local(async move {
                while let Ok((mut s, _)) = echo.accept().await {
                    tokio::task::spawn_local(async move {
                        let mut b = vec![0u8; 65536];
                        while let Ok(n @ 1..) = s.read(&mut b).await {
                            if s.write_all(&b[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            });
            until(&mut d).await;
            drop(stuck);
        }
    });
    let stuck: SocketAddr = format!("{SERVER_V4}:7000").parse().unwrap();
    let results: Vec<std::io::Result<std::net::TcpStream>> = net
        .client_ns()
        .run(move || {
            // Resolve ARP first so the 10 SYNs go out together.
            let _ = connect(format!("{SERVER_V4}:7").parse().unwrap());
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..10)
                    .map(|_| {
                        s.spawn(move || {
                            std::net::TcpStream::connect_timeout(
                                &stuck,
                                Duration::from_millis(1500),
                            )
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        })
        .unwrap();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused))
        .count();
    // Four fill the SYN backlog; SYNs past it get SYN cookies while the accept queue has room
    // (their handshakes complete on the client, the server keeps nothing until the ACK), and
    // once the accept queue is full they are dropped: never refused.
    assert!(ok >= 4, "the backlog of 4 is filled: {results:?}");
    assert_eq!(
        refused, 0,
        "SYNs past the backlog are answered with cookies or dropped, not reset"
    );
    // The other port is unharmed.
    let echoed = net
        .client_ns()
        .run(|| {
            tcp_echo(
                format!("{SERVER_V4}:7").parse().unwrap(),
                &payload(100_000, 5),
            )
        })
        .unwrap()
        .expect("echo on the other port");
    assert_eq!(echoed, (sha256(&payload(100_000, 5)), 100_000));
    done.send_replace(true);
    let report = server.join().unwrap();
    let st = report.cores[0].stats.stack;
    assert!(st.syn_dropped + st.tcp.cookies_sent >= 6, "{report:?}");
    assert!(report.frames_balanced());
}

#[test]
fn runtime_each_connection_wakes_exactly_one_of_many_waiting_accepts() {
    if !require_root("runtime_wake_one_accept") {
        return;
    }
    let net = net(1);
    let (done, d) = watch::channel(false);
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    let server = serve(&net, 256, move |_core| {
        let (mut d, a) = (d.clone(), a.clone());
        async move {
            let l = Rc::new(TcpListener::bind(7).await.unwrap());
            for _ in 0..50 {
                let (l, a) = (l.clone(), a.clone());
                tokio::task::spawn_local(async move {
                    while let Ok((s, _)) = l.accept().await {
                        a.fetch_add(1, Ordering::SeqCst);
                        drop(s);
                    }
                });
            }
            until(&mut d).await;
            let s = corelane::core_stats().unwrap();
            assert_eq!(
                s.stack.accept_wakeups, 20,
                "one wake-up per connection: {s:?}"
            );
            assert_eq!(s.accept_spurious, 0, "a woken accept found nothing: {s:?}");
        }
    });
    net.client_ns()
        .run(|| {
            for _ in 0..20 {
                let s = connect(format!("{SERVER_V4}:7").parse().unwrap()).unwrap();
                // One connection at a time: wait until it was accepted.
                let mut b = [0u8; 1];
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = (&s).read(&mut b);
            }
        })
        .unwrap();
    done.send_replace(true);
    let report = server
        .join()
        .expect("server (a failed assertion on the core ends it)");
    assert_eq!(accepted.load(Ordering::SeqCst), 20);
    assert!(report.frames_balanced());
}

#[test]
fn runtime_stream_options_abort_and_connected_udp() {
    if !require_root("runtime_stream_options") {
        return;
    }
    let net = net(1);
    let (tcp_l, udp_s) = net
        .client_ns()
        .run(|| {
            (
                std::net::TcpListener::bind("10.77.0.2:9100").unwrap(),
                std::net::UdpSocket::bind("10.77.0.2:9101").unwrap(),
            )
        })
        .unwrap();
    // A kernel UDP echo.
    std::thread::spawn(move || {
        let mut b = [0u8; 2048];
        while let Ok((n, from)) = udp_s.recv_from(&mut b) {
            let _ = udp_s.send_to(&b[..n], from);
        }
    });
    // The kernel side of the TCP connection: reads until corelane aborts it.
    let peer = std::thread::spawn(move || {
        let (mut s, _) = tcp_l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let end = loop {
            let mut b = [0u8; 64];
            match s.read(&mut b) {
                Ok(0) => break Ok(()),
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) => break Err(e.kind()),
            }
        };
        (got, end)
    });
    let server = serve(&net, 256, |_core| async move {
        let s = TcpStream::connect("10.77.0.2:9100").await.unwrap();
        assert!(s.nodelay().unwrap(), "nodelay is the default");
        s.set_nodelay(false).unwrap();
        assert!(!s.nodelay().unwrap());
        s.set_keepalive(Some(Duration::from_secs(1))).unwrap();
        let (r, mut w) = s.into_split();
        w.write_all(b"before abort").await.unwrap();
        let s = r.reunite(w).expect("halves of one stream");
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.abort();
        // An abort closes at once (the reset goes out on the next turn).
        assert_eq!(s.state().unwrap().to_string(), "CLOSED");

        let u = corelane::net::UdpSocket::bind(0).await.unwrap();
        assert!(u.local_port() >= 49152, "an ephemeral port");
        assert!(
            u.send(b"x").await.is_err(),
            "send before connect is refused"
        );
        assert_eq!(u.local_addr().unwrap().ip().to_string(), "0.0.0.0");
        u.connect("10.77.0.2:9101").await.unwrap();
        // Connected: the owned address its datagrams leave from, as the kernel reports it.
        assert_eq!(
            u.local_addr().unwrap(),
            format!("10.77.0.3:{}", u.local_port()).parse().unwrap()
        );
        let mut b = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                // The first datagram may wait for ARP; resend until the echo comes.
                u.send(b"connected udp").await.unwrap();
                if let Ok(r) =
                    tokio::time::timeout(Duration::from_millis(300), u.recv(&mut b)).await
                {
                    break r.unwrap();
                }
            }
        })
        .await
        .expect("UDP echo in time");
        assert_eq!(&b[..n], b"connected udp");
    });
    let report = server.join().expect("server");
    let (got, end) = peer.join().unwrap();
    assert_eq!(got, b"before abort");
    assert_eq!(
        end,
        Err(std::io::ErrorKind::ConnectionReset),
        "abort sends RST"
    );
    assert!(report.frames_balanced());
}

#[test]
fn runtime_congestion_is_chosen_on_the_builder_and_per_stream() {
    if !require_root("runtime_congestion") {
        return;
    }
    let net = net(1);
    let listener = net
        .client_ns()
        .run(|| std::net::TcpListener::bind("10.77.0.2:9102").unwrap())
        .unwrap();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let served = serve_on(
        &net,
        |b| b.cores(1).congestion(corelane::Congestion::NewReno),
        move |_core| {
            let tx = tx.clone();
            async move {
                let s = TcpStream::connect("10.77.0.2:9102").await.unwrap();
                let first = s.info().unwrap().congestion;
                s.set_congestion(corelane::Congestion::Cubic).unwrap();
                let then = s.info().unwrap().congestion;
                let _ = tx.send((first, then));
            }
        },
    )
    .unwrap();
    let (first, then) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(first, corelane::Congestion::NewReno, "the builder's choice");
    assert_eq!(then, corelane::Congestion::Cubic, "the stream's own choice");
    served.stop.stop();
    served.thread.join().unwrap().unwrap();
    peer.join().unwrap();
}

#[test]
fn runtime_tasks_reach_the_runtime_s_own_address_on_every_core_without_the_wire() {
    if !require_root("runtime_own_address") {
        return;
    }
    let net = net(2);
    let server = serve(&net, 256, |core| async move {
        // Each core's listener and UDP echo; each core's client connects to the runtime's own
        // address, as a service calling itself does.
        let l = TcpListener::bind(7200).await.unwrap();
        tokio::task::spawn_local(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::task::spawn_local(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let data = payload(256 * 1024, core.index as u64);
        let s = TcpStream::connect("10.77.0.3:7200").await.unwrap();
        assert_eq!(s.peer_addr().unwrap().ip().to_string(), "10.77.0.3");
        let (mut r, mut w) = s.into_split();
        let sent = data.clone();
        let writer = tokio::task::spawn_local(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), r.read_to_end(&mut back))
            .await
            .expect("the echo in time")
            .unwrap();
        writer.await.unwrap();
        assert!(back == data, "core {}: the echo differs", core.index);
        let u = corelane::net::UdpSocket::bind(7300 + core.index as u16)
            .await
            .unwrap();
        let to = format!("10.77.0.3:{}", 7300 + core.index);
        u.send_to(b"to myself", to.parse::<SocketAddr>().unwrap())
            .await
            .unwrap();
        let mut b = [0u8; 64];
        let (n, from) = tokio::time::timeout(Duration::from_secs(5), u.recv_from(&mut b))
            .await
            .expect("the datagram in time")
            .unwrap();
        assert_eq!((&b[..n], from.to_string()), (&b"to myself"[..], to));
    });
    let report = server.join().expect("server");
    assert!(report.frames_balanced());
    for c in &report.cores {
        assert!(c.stats.device.looped > 100, "{:?}", c.stats.device);
    }
}
