//! Owned addresses change while the runtime runs: an added address answers at once (TCP and
//! ping), a removed one no longer does, and the runtime holds up to 64.

mod common;

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use corelane::Runtime;
use corelane::net::TcpListener;
use corelane_testnet::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn cidr(s: &str) -> Result<corelane::Cidr> {
    Ok(s.parse()?)
}

#[test]
fn addresses_added_at_run_time_answer_and_removed_ones_stop() -> Result {
    if !require_root("addresses at run time") {
        return Ok(());
    }
    let net = net(1);
    let served = serve_on(
        &net,
        |b| b.cores(1),
        |_| async {
            let l = TcpListener::bind(7).await.expect("listen");
            while let Ok((mut s, _)) = l.accept().await {
                tokio::task::spawn_local(async move {
                    let mut b = [0u8; 64];
                    while let Ok(n @ 1..) = s.read(&mut b).await {
                        if s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        },
    )?;
    let (addrs, stop, server) = (served.addrs, served.stop, served.thread);
    let echo_to = |ip: &str| -> Result<bool> {
        let to = SocketAddr::new(ip.parse()?, 7);
        Ok(net.client_ns().run(move || {
            TcpStream::connect_timeout(&to, Duration::from_secs(2))
                .and_then(|mut s| {
                    use std::io::{Read, Write};
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    s.write_all(b"hello")?;
                    let mut b = [0u8; 5];
                    s.read_exact(&mut b)?;
                    Ok(&b == b"hello")
                })
                .unwrap_or(false)
        })?)
    };
    // Until the core's listener binds, port 7 is closed and refused, as a kernel's is before
    // `listen`: wait for it (`connect` retries a refusal).
    let first = SocketAddr::new(SERVER_V4.parse()?, 7);
    net.client_ns().run(move || connect(first).map(drop))??;
    assert!(echo_to(SERVER_V4)?, "the address it started with");
    addrs.add(cidr("10.77.0.10/24")?)?;
    assert!(
        echo_to("10.77.0.10")?,
        "an address added while running answers TCP"
    );
    let ping = net
        .client_ns()
        .exec("ping", &["-c1", "-W2", "10.77.0.10"])?;
    assert!(ping.contains("1 received"), "and ping: {ping}");
    // Up to 64 in all; the 65th is refused with the reason.
    for i in 0..62 {
        addrs.add(cidr(&format!("10.77.0.{}/24", 100 + i))?)?;
    }
    assert_eq!(addrs.list().len(), 64);
    let e = addrs
        .add(cidr("10.77.0.200/24")?)
        .err()
        .ok_or("a 65th address")?;
    assert!(e.to_string().contains("at most 64"), "{e}");
    assert!(echo_to("10.77.0.161")?, "the 64th answers");
    // Removed: its frames go to the kernel, which does not hold it.
    assert!(addrs.remove(SERVER_V4.parse::<IpAddr>()?)?);
    assert!(
        !addrs.remove(SERVER_V4.parse::<IpAddr>()?)?,
        "removed once only"
    );
    net.client_ns()
        .ip(&["neigh", "flush", "dev", net.client_if()])?;
    assert!(!echo_to(SERVER_V4)?, "a removed address no longer answers");
    assert!(echo_to("10.77.0.10")?, "the others still do");
    stop.stop();
    server.join()??;
    Ok(())
}

#[test]
fn an_owned_ipv6_address_joins_its_solicited_node_group_on_the_interface() -> Result {
    if !require_root("solicited-node multicast") {
        return Ok(());
    }
    let net = net(1);
    let ifname = net.server_if().to_string();
    let maddr = |net: &corelane_testnet::VethPair| {
        net.server_ns()
            .ip(&["maddr", "show", "dev", net.server_if()])
            .unwrap_or_default()
    };
    let group = "33:33:ff:00:00:03";
    assert!(!maddr(&net).contains(group), "not joined before");
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let server = net
        .server_ns()
        .spawn(move || -> std::result::Result<(), String> {
            let rt = Runtime::builder(&ifname)
                .addr("fd00:77::3/64")
                .cores(1)
                .build()
                .map_err(|e| e.to_string())?;
            let _ = tx.send(());
            let _ = go_rx.recv_timeout(Duration::from_secs(20));
            drop(rt);
            Ok(())
        })?;
    rx.recv_timeout(Duration::from_secs(20))?;
    let joined = maddr(&net);
    let _ = go_tx.send(());
    server.join()??;
    assert!(
        joined.contains(group),
        "joined while the runtime lives:\n{joined}"
    );
    assert!(!maddr(&net).contains(group), "left when it is dropped");
    Ok(())
}

/// The core threads keep no capability (they parse the wire); an IPv6 address taken from a
/// task on one still joins its solicited-node group (`CAP_NET_ADMIN`) and a port bound there
/// still reaches the XDP program's map: the runtime's privileged thread does both for it.
#[test]
fn a_task_on_a_core_without_capabilities_takes_an_ipv6_address_and_a_port() -> Result {
    if !require_root("a task takes an address") {
        return Ok(());
    }
    let net = net(1);
    let ifname = net.server_if().to_string();
    let (tx, rx) = std::sync::mpsc::channel::<std::result::Result<u64, String>>();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let server = net
        .server_ns()
        .spawn(move || -> std::result::Result<(), String> {
            let rt = Runtime::builder(&ifname)
                .addr("fd00:77::3/64")
                .cores(1)
                .build()
                .map_err(|e| e.to_string())?;
            let addrs = rt.addr_handle();
            let _ = stop_tx.send(rt.stop_handle());
            let tx = std::sync::Mutex::new(tx);
            rt.run(move |_| {
                let addrs = addrs.clone();
                let tx = tx.lock().unwrap().clone();
                async move {
                    // This thread's effective capabilities, then the changes.
                    let caps = std::fs::read_to_string("/proc/thread-self/status")
                        .ok()
                        .and_then(|s| {
                            s.lines()
                                .find_map(|l| l.strip_prefix("CapEff:"))
                                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                        })
                        .unwrap_or(u64::MAX);
                    let took = addrs
                        .add("fd00:77::10/64")
                        .map_err(|e| e.to_string())
                        .map(|()| caps);
                    let l = TcpListener::bind(8080).await;
                    let bound = l.as_ref().map(|_| ()).map_err(|e| e.to_string());
                    let _ = tx.send(took.and_then(|c| bound.map(|()| c)));
                    // Held (and accepting) until the runtime stops.
                    if let Ok(l) = l {
                        while l.accept().await.is_ok() {}
                    }
                }
            })
            .map_err(|e| e.to_string())?;
            Ok(())
        })?;
    let stop = stop_rx.recv_timeout(Duration::from_secs(20))?;
    let caps = rx.recv_timeout(Duration::from_secs(20))??;
    assert_eq!(caps, 0, "a core thread keeps no capability");
    let maddr = net
        .server_ns()
        .ip(&["maddr", "show", "dev", net.server_if()])?;
    assert!(maddr.contains("33:33:ff:00:00:10"), "{maddr}");
    // The address answers (the stack has it from its next turn).
    let to = SocketAddr::new("fd00:77::10".parse()?, 8080);
    let connected = net
        .client_ns()
        .run(move || TcpStream::connect_timeout(&to, Duration::from_secs(3)).is_ok())?;
    assert!(connected, "connect to the address and port the task took");
    stop.stop();
    server.join()??;
    Ok(())
}

#[test]
fn listeners_bind_as_tokio_binds_and_port_0_is_the_same_on_every_core() -> Result {
    if !require_root("bind forms") {
        return Ok(());
    }
    let net = net(2);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let tx = std::sync::Mutex::new(tx);
    let served = serve_on(
        &net,
        |b| b.cores(2),
        move |core| {
            let tx = tx.lock().expect("lock").clone();
            async move {
                let auto = TcpListener::bind("0.0.0.0:0").await.expect("port 0");
                let on = TcpListener::bind(("10.77.0.3".parse::<IpAddr>().expect("ip"), 7101))
                    .await
                    .expect("an owned address");
                let foreign = TcpListener::bind("10.77.0.99:7102")
                    .await
                    .err()
                    .map(|e| e.kind());
                let _ = tx.send(format!(
                    "core {} auto {} on {} foreign {foreign:?}",
                    core.index,
                    auto.local_addr().expect("addr").port(),
                    on.local_addr().expect("addr")
                ));
                loop {
                    tokio::select! {
                        r = auto.accept() => if let Ok((s, _)) = r { drop(s) } else { break },
                        r = on.accept() => if let Ok((s, _)) = r { drop(s) } else { break },
                    }
                }
            }
        },
    )?;
    let (stop, server) = (served.stop, served.thread);
    let lines = [
        rx.recv_timeout(Duration::from_secs(20))?,
        rx.recv_timeout(Duration::from_secs(20))?,
    ];
    let port = |l: &str| {
        l.split(" auto ")
            .nth(1)?
            .split(' ')
            .next()?
            .parse::<u16>()
            .ok()
    };
    let (a, b) = (port(&lines[0]), port(&lines[1]));
    assert!(
        a.is_some() && a == b,
        "the same picked port on both cores: {lines:?}"
    );
    for l in &lines {
        assert!(l.contains("on 10.77.0.3:7101"), "{l}");
        assert!(l.contains("foreign Some(AddrNotAvailable)"), "{l}");
    }
    let picked = a.ok_or("a port")?;
    let to = SocketAddr::from(([10, 77, 0, 3], picked));
    let ok = net
        .client_ns()
        .run(move || TcpStream::connect_timeout(&to, Duration::from_secs(3)).is_ok())?;
    assert!(ok, "the picked port accepts");
    stop.stop();
    server.join()??;
    Ok(())
}
