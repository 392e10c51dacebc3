//! The routed network forwards between its two subnets, v4 and v6, and its far hop's MTU makes
//! the router ask a large packet's sender to shrink.

use std::net::{TcpListener, TcpStream};

use corelane_testnet::{RoutedNet, require_root};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

#[test]
fn the_client_reaches_the_server_subnet_only_through_the_router() -> Result {
    if !require_root("routed network") {
        return Ok(());
    }
    let net = RoutedNet::builder().far_mtu(1280).build()?;
    let (s, c) = (RoutedNet::SERVER_SIDE, RoutedNet::CLIENT_SIDE);
    // Different subnets: the server's kernel reaches the client through its default route.
    let route = net.server_ns().ip(&["route", "get", c.host_v4])?;
    assert!(route.contains(&format!("via {}", s.router_v4)), "{route}");
    for dst in [s.host_v4, s.host_v6] {
        let out = net.client_ns().exec("ping", &["-c1", "-W5", dst])?;
        assert!(out.contains("1 received"), "ping {dst}: {out}");
    }
    // A 1400-byte packet without DF shrinks silently; with DF (ping -M do) the router refuses
    // it at the 1280-byte hop and says so.
    let big = net
        .server_ns()
        .command("ping")
        .args(["-c1", "-W5", "-s1372", "-M", "do", c.host_v4])
        .output()?;
    let said =
        String::from_utf8_lossy(&big.stdout).into_owned() + &String::from_utf8_lossy(&big.stderr);
    assert!(
        said.contains("mtu = 1280") || said.contains("Frag needed") || said.contains("too long"),
        "a DF packet over the far MTU is refused: {said}"
    );
    let big6 = net
        .server_ns()
        .command("ping")
        .args(["-c1", "-W5", "-s1352", "-M", "do", c.host_v6])
        .output()?;
    let said =
        String::from_utf8_lossy(&big6.stdout).into_owned() + &String::from_utf8_lossy(&big6.stderr);
    assert!(
        said.contains("mtu = 1280") || said.contains("Packet too big") || said.contains("too long"),
        "an IPv6 packet over the far MTU is refused: {said}"
    );
    // TCP through the router, both families.
    for (bind, dst) in [
        (format!("{}:5001", s.host_v4), format!("{}:5001", s.host_v4)),
        (
            format!("[{}]:5002", s.host_v6),
            format!("[{}]:5002", s.host_v6),
        ),
    ] {
        let server = net.server_ns().spawn(move || -> std::io::Result<String> {
            let l = TcpListener::bind(bind)?;
            let (_, peer) = l.accept()?;
            Ok(peer.ip().to_string())
        })?;
        std::thread::sleep(std::time::Duration::from_millis(50));
        net.client_ns()
            .run(move || TcpStream::connect(dst).map(|_| ()))??;
        let peer = server.join()??;
        assert!(
            peer == c.host_v4 || peer == c.host_v6,
            "the server sees the client's own address: {peer}"
        );
    }
    Ok(())
}

#[test]
fn many_client_addresses_are_added_and_routed() -> Result {
    if !require_root("routed network, many clients") {
        return Ok(());
    }
    let net = RoutedNet::builder().build()?;
    let addrs = net.add_client_v4(300)?;
    assert_eq!(addrs.len(), 300);
    let last = addrs[299].to_string();
    let out = net.server_ns().exec("ping", &["-c1", "-W5", &last])?;
    assert!(out.contains("1 received"), "ping {last}: {out}");
    Ok(())
}
