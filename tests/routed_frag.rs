//! Fragments on the routed network: 8 KiB and 60 KiB UDP datagrams and large pings cross the
//! router in fragments both ways (IPv4 and IPv6), and a flood of fragments that never complete
//! leaves reassembly's memory bounded while a canary keeps echoing.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use common::*;
use corelane_testnet::{RoutedNet, SynFlood, require_root};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const S: corelane_testnet::Side = RoutedNet::SERVER_SIDE;

fn start_udp_echo(net: &RoutedNet) -> Echo {
    let args = [
        "--addr".to_string(),
        format!("{}/24", S.free_v4),
        "--addr".into(),
        format!("{}/64", S.free_v6),
        "--cores".into(),
        "1".into(),
        "--port".into(),
        "9".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Echo::start_in(net.server_ns(), net.server_if(), "udp_echo", &args)
}

/// Sends `data` to `dst` from the client namespace until the same comes back (at most 10
/// tries); returns whether it did.
fn udp_round_trip(net: &RoutedNet, dst: SocketAddr, data: Vec<u8>) -> Result<bool> {
    Ok(net.client_ns().run(move || -> std::io::Result<bool> {
        let s = UdpSocket::bind(if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        let mut buf = vec![0u8; 65536];
        for _ in 0..10 {
            s.send_to(&data, dst)?;
            if let Ok((n, from)) = s.recv_from(&mut buf)
                && from == dst
                && buf[..n] == data[..]
            {
                return Ok(true);
            }
        }
        Ok(false)
    })??)
}

/// A counter from the `ip:` line the examples print at exit.
fn ip_counter(out: &str, name: &str) -> Option<u64> {
    let line = out.lines().find(|l| l.starts_with("ip: "))?;
    let at = line.find(name)?;
    line[..at]
        .trim_end()
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn udp_datagrams_and_pings_cross_the_router_in_fragments_both_ways() -> Result {
    if !require_root("routed: fragments") {
        return Ok(());
    }
    let net = RoutedNet::builder().build()?;
    let echo = start_udp_echo(&net);
    for addr in [S.free_v4, S.free_v6] {
        let dst = SocketAddr::new(addr.parse()?, 9);
        for size in [8 * 1024, 60 * 1024] {
            let data = payload(size, size as u64);
            assert!(
                udp_round_trip(&net, dst, data)?,
                "{size} bytes to {dst} and back"
            );
        }
        // A ping of 8000 bytes: the request and the reply both travel in fragments.
        let out = net
            .client_ns()
            .command("ping")
            .args(["-c1", "-W3", "-s8000", addr])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(" 1 received"), "ping -s8000 {addr}: {text}");
    }
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    let reassembled = ip_counter(&out, "datagrams reassembled").ok_or(out.clone())?;
    let sent = ip_counter(&out, "datagrams sent as fragments").ok_or(out.clone())?;
    assert!(reassembled >= 6 && sent >= 6, "{out}");
    Ok(())
}

#[test]
fn a_flood_of_incomplete_fragments_leaves_memory_bounded_and_the_canary_alive() -> Result {
    if !require_root("routed: fragment flood") {
        return Ok(());
    }
    let net = RoutedNet::builder().build()?;
    let echo = start_udp_echo(&net);
    let target: std::net::SocketAddrV4 = format!("{}:9", S.free_v4).parse()?;
    let mac = net.server_ns().mac(net.server_if())?;
    // From the router's side of the server link, spoofed sources: middle pieces of
    // datagrams that never complete, 1 KiB each.
    let flood = SynFlood::builder(target, mac)
        .fragments(1024)
        .sources("10.81.1.0".parse()?, 24)
        .limit(200_000, Duration::from_secs(3))
        .start(net.router_ns(), net.router_server_if())?;
    let mut canaries = 0;
    while canaries < 5 {
        let data = payload(8 * 1024, canaries);
        assert!(
            udp_round_trip(&net, SocketAddr::V4(target), data)?,
            "canary {canaries} during the flood"
        );
        canaries += 1;
    }
    let sent = flood.join()?;
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    let fragments = ip_counter(&out, "fragments in").ok_or(out.clone())?;
    let evicted = ip_counter(&out, "evicted").ok_or(out.clone())?;
    println!(
        "flood: {} fragments sent, {fragments} received, {evicted} evicted",
        sent.sent
    );
    assert!(fragments > 10_000, "the flood reached the stack:\n{out}");
    // Each spoofed fragment starts a datagram that never completes: past the table's 1024
    // datagrams, each new one evicts the least recently used (never the canary in progress).
    assert!(evicted > fragments / 2, "memory stayed bounded:\n{out}");
    Ok(())
}
