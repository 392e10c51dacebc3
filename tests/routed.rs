//! corelane on a routed network: clients in another subnet, behind a Linux router, reach a
//! corelane server (TCP, UDP, ping; IPv4 and IPv6) with the gateway from the command line or
//! from the kernel's routes, and corelane clients reach kernel servers through it.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use common::*;
use corelane_testnet::{RoutedNet, require_root};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const S: corelane_testnet::Side = RoutedNet::SERVER_SIDE;

fn addr_args() -> Vec<String> {
    vec![
        "--addr".into(),
        format!("{}/24", S.free_v4),
        "--addr".into(),
        format!("{}/64", S.free_v6),
        "--cores".into(),
        "1".into(),
    ]
}

/// `ping -c1` from `ns` to `dst` got its reply.
fn pings(ns: &corelane_testnet::Netns, dst: &str) -> Result<bool> {
    let out = ns
        .command("ping")
        .args(["-c2", "-W3", "-i0.5", dst])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.contains(" received") && !text.contains(" 0 received"))
}

#[test]
fn a_server_behind_a_router_answers_tcp_udp_and_ping_with_the_gateway_it_was_given() -> Result {
    if !require_root("routed: server with --gateway") {
        return Ok(());
    }
    // The server's kernel has no default route: only --gateway can take replies back.
    let net = RoutedNet::builder().server_routes(false).build()?;
    let mut args = addr_args();
    args.extend(
        [
            "--gateway",
            S.router_v4,
            "--gateway",
            S.router_v6,
            "--port",
            "7",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let echo = Echo::start_in(net.server_ns(), net.server_if(), "echo", &args);
    let out = echo.output();
    assert!(
        out.contains(&format!(
            "routes: default via {}, default via {}",
            S.router_v4, S.router_v6
        )),
        "the routes in use are printed:\n{out}"
    );
    for dst in [
        SocketAddr::new(S.free_v4.parse()?, 7),
        SocketAddr::new(S.free_v6.parse()?, 7),
    ] {
        let data = payload(256 * 1024, 5);
        let want = sha256(&data);
        let (got, n) = net.client_ns().run(move || tcp_echo(dst, &data))??;
        assert_eq!(
            (n, got),
            (256 * 1024, want),
            "echo through the router to {dst}"
        );
    }
    // UDP too (echo serves both on its port), through the gateway it was given.
    for dst in [
        SocketAddr::new(S.free_v4.parse()?, 7),
        SocketAddr::new(S.free_v6.parse()?, 7),
    ] {
        let got = net.client_ns().run(move || -> std::io::Result<bool> {
            let s = UdpSocket::bind(if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
            s.set_read_timeout(Some(Duration::from_millis(500)))?;
            let mut buf = [0u8; 64];
            for _ in 0..10 {
                s.send_to(b"via the gateway", dst)?;
                if let Ok((n, _)) = s.recv_from(&mut buf) {
                    return Ok(&buf[..n] == b"via the gateway");
                }
            }
            Ok(false)
        })??;
        assert!(got, "UDP echo from {dst} through the router");
    }
    // Ping through the router, and on the link from the router itself.
    for dst in [S.free_v4, S.free_v6] {
        assert!(
            pings(net.client_ns(), dst)?,
            "ping {dst} through the router"
        );
        assert!(pings(net.router_ns(), dst)?, "ping {dst} on the link");
    }
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    Ok(())
}

#[test]
fn a_udp_server_uses_the_kernels_routes_when_given_none() -> Result {
    if !require_root("routed: UDP with the kernel's routes") {
        return Ok(());
    }
    let net = RoutedNet::builder().build()?;
    let mut args = addr_args();
    args.extend(["--port", "9"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let echo = Echo::start_in(net.server_ns(), net.server_if(), "udp_echo", &args);
    let out = echo.output();
    assert!(
        out.contains(&format!("default via {}", S.router_v4))
            && out.contains(&format!("default via {}", S.router_v6)),
        "the kernel's default routes are read and printed:\n{out}"
    );
    for (bind, dst) in [
        ("0.0.0.0:0", SocketAddr::new(S.free_v4.parse()?, 9)),
        ("[::]:0", SocketAddr::new(S.free_v6.parse()?, 9)),
    ] {
        let got = net.client_ns().run(move || -> std::io::Result<usize> {
            let s = UdpSocket::bind(bind)?;
            s.set_read_timeout(Some(Duration::from_millis(500)))?;
            let msg = b"through the router";
            let mut buf = [0u8; 64];
            // The first datagram may wait for the gateway's address: resend until answered.
            for _ in 0..20 {
                s.send_to(msg, dst)?;
                if let Ok((n, _)) = s.recv_from(&mut buf) {
                    return Ok(n);
                }
            }
            Ok(0)
        })??;
        assert_eq!(got, 18, "UDP echo from {dst} through the router");
    }
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    Ok(())
}

#[test]
fn a_full_size_flow_across_a_1280_byte_hop_finds_the_path_mtu() -> Result {
    if !require_root("routed: path MTU discovery") {
        return Ok(());
    }
    // The client announces a 1460-byte MSS; the router's hop toward it carries 1280 bytes.
    let net = RoutedNet::builder().far_mtu(1280).build()?;
    let mut args = addr_args();
    args.extend(["--port", "7"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let echo = Echo::start_in(net.server_ns(), net.server_if(), "echo", &args);
    for dst in [
        SocketAddr::new(S.free_v4.parse()?, 7),
        SocketAddr::new(S.free_v6.parse()?, 7),
    ] {
        let data = payload(1 << 20, 11);
        let want = sha256(&data);
        let (got, n) = net.client_ns().run(move || tcp_echo(dst, &data))??;
        assert_eq!(
            (n, got),
            (1 << 20, want),
            "1 MiB echoed through the hop to {dst}"
        );
    }
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    let updates = out
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("retransmitted")?;
            let (_, rest) = rest.split_once("), ")?;
            rest.split_once(" path MTU updates")?.0.parse::<u64>().ok()
        })
        .ok_or_else(|| format!("no tcp line:\n{out}"))?;
    assert!(updates >= 2, "one update per family at least:\n{out}");
    Ok(())
}
