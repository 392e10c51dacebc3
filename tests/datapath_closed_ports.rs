//! The host that owns an address answers for all of its ports: a kernel client connecting to a
//! port of a corelane address that nothing listens on is refused at once (a reset the XDP
//! program builds and sends back), over IPv4 and IPv6, while the port that is served still
//! echoes. Before, the SYN went to the kernel, which does not hold the address, and the client
//! waited for its connect timeout. A UDP datagram to such a port is answered with ICMP port
//! unreachable by the same program, so a connected kernel UDP socket's next `recv` fails with
//! ECONNREFUSED, while a served UDP port still echoes. While the server runs, the program hands
//! such frames to its stack, which answers through the AF_XDP transmit path: a default veth
//! peer (no XDP program, GRO off) receives that, where the program's own XDP_TX answers reach
//! only a peer running an XDP program (the keeper's answers after a crash: `tests/crash.rs`).

mod common;

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{SERVER_V4, SERVER_V6, net, serve_on};
use corelane::net::TcpListener;
use corelane_testnet::require_root;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[test]
fn a_connect_to_a_closed_port_of_an_owned_address_is_refused_at_once() -> Result {
    if !require_root("resets for closed ports") {
        return Ok(());
    }
    // The client's veth is a default one (no XDP program, GRO off), as a container's is: the
    // program's own answers (XDP_TX) would never reach it; the stack's do.
    let net = net(1);
    let served = serve_on(
        &net,
        |b| b.cores(1).addr("fd00:77::3/64"),
        |_| async {
            let u = corelane::net::UdpSocket::bind(7).await.expect("udp bind");
            tokio::task::spawn_local(async move {
                let mut buf = [0u8; 2048];
                while let Ok((n, from)) = u.recv_from(&mut buf).await {
                    let _ = u.send_to(&buf[..n], from).await;
                }
            });
            let l = TcpListener::bind(7).await.expect("listen");
            while let Ok((s, _)) = l.accept().await {
                tokio::task::spawn_local(common::echo_stream(s));
            }
        },
    )?;
    let connect = |ip: &str, port: u16| -> Result<std::io::Result<()>> {
        let to = SocketAddr::new(ip.parse()?, port);
        Ok(net.client_ns().run(move || {
            // Retried briefly while the neighbour entry resolves; a refusal ends it at once.
            let mut last = Err(std::io::Error::from(ErrorKind::TimedOut));
            for _ in 0..3 {
                last = TcpStream::connect_timeout(&to, Duration::from_secs(3)).map(drop);
                if !matches!(&last, Err(e) if e.kind() == ErrorKind::TimedOut) {
                    break;
                }
            }
            last
        })?)
    };
    for ip in [SERVER_V4, SERVER_V6] {
        // The listener binds once the core runs, a moment after the runtime is built; until
        // then port 7 is closed too and refused, as a kernel's is before `listen`.
        let mut served_port = connect(ip, 7)?;
        for _ in 0..50 {
            if served_port.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            served_port = connect(ip, 7)?;
        }
        assert!(
            served_port.is_ok(),
            "{ip}: the served port accepts: {served_port:?}"
        );
        for port in [9, 80, 50_000] {
            let r = connect(ip, port)?;
            assert!(
                matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
                "{ip} port {port}: {r:?}"
            );
        }
    }
    // UDP: the served port echoes; a closed one is refused (ICMP port unreachable).
    let udp = |ip: &str, port: u16| -> Result<std::io::Result<Vec<u8>>> {
        let to = SocketAddr::new(ip.parse()?, port);
        Ok(net.client_ns().run(move || {
            let any: SocketAddr = if to.is_ipv4() {
                "0.0.0.0:0".parse().expect("any")
            } else {
                "[::]:0".parse().expect("any")
            };
            let s = std::net::UdpSocket::bind(any)?;
            s.connect(to)?;
            s.set_read_timeout(Some(Duration::from_millis(500)))?;
            // Resent a few times while the neighbour entry resolves; a refusal ends it.
            let mut last = Err(std::io::Error::from(ErrorKind::TimedOut));
            for _ in 0..6 {
                s.send(b"are you there")?;
                let mut buf = [0u8; 64];
                last = s.recv(&mut buf).map(|n| buf[..n].to_vec());
                if !matches!(&last, Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock))
                {
                    break;
                }
            }
            last
        })?)
    };
    for ip in [SERVER_V4, SERVER_V6] {
        let echoed = udp(ip, 7)?;
        assert!(
            matches!(&echoed, Ok(b) if b == b"are you there"),
            "{ip}: the served UDP port echoes: {echoed:?}"
        );
        for port in [9, 53, 50_000] {
            let r = udp(ip, port)?;
            assert!(
                matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
                "{ip} UDP port {port}: {r:?}"
            );
        }
    }
    served.stop.stop();
    let report = served.thread.join()??;
    assert!(
        report.xdp.closed_port_resets >= 6,
        "the program answered them: {:?}",
        report.xdp
    );
    assert!(
        report.xdp.port_unreachables >= 6,
        "the program answered the datagrams: {:?}",
        report.xdp
    );
    Ok(())
}

/// A flood of datagrams to closed ports gets at most the rate limit's answers (a burst of 50,
/// then one per millisecond on each CPU); the rest are dropped and counted, and the served
/// port keeps answering.
#[test]
fn a_flood_to_closed_udp_ports_is_answered_at_the_rate_limit() -> Result {
    if !require_root("ICMP rate limit for closed UDP ports") {
        return Ok(());
    }
    let net = net(1);
    let served = serve_on(
        &net,
        |b| b.cores(1),
        |_| async {
            let u = corelane::net::UdpSocket::bind(7).await.expect("udp bind");
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = u.recv_from(&mut buf).await {
                let _ = u.send_to(&buf[..n], from).await;
            }
        },
    )?;
    const FLOOD: u64 = 20_000;
    let to: SocketAddr = format!("{SERVER_V4}:9").parse()?;
    let served_port: SocketAddr = format!("{SERVER_V4}:7").parse()?;
    let (sent, took) = net
        .client_ns()
        .run(move || -> std::io::Result<(u64, Duration)> {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            // One echo first, so the neighbour entry is resolved and the runtime is up.
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            let mut buf = [0u8; 64];
            let mut up = false;
            for _ in 0..50 {
                s.send_to(b"hello", served_port)?;
                if s.recv_from(&mut buf).is_ok() {
                    up = true;
                    break;
                }
            }
            if !up {
                return Err(std::io::Error::other("the served UDP port never echoed"));
            }
            let t = std::time::Instant::now();
            let mut sent = 0;
            for _ in 0..FLOOD {
                // An unconnected socket: the answers do not fail the sends.
                if s.send_to(b"flood", to).is_ok() {
                    sent += 1;
                }
            }
            Ok((sent, t.elapsed()))
        })??;
    std::thread::sleep(Duration::from_millis(200));
    served.stop.stop();
    let report = served.thread.join()??;
    let x = report.xdp;
    eprintln!("{sent} datagrams in {took:?}: {x:?}");
    // Two CPUs may each spend a burst and refill one per millisecond while the flood lasts.
    let bound = 2 * (50 + took.as_millis() as u64 + 200);
    assert!(
        x.port_unreachables <= bound,
        "{} answers to {sent} datagrams in {took:?} (bound {bound})",
        x.port_unreachables
    );
    assert!(x.port_unreachables >= 50, "answered: {x:?}");
    assert!(
        x.port_unreachables + x.unreachables_limited >= sent / 2,
        "the datagrams that arrived were answered or counted as limited: {x:?}"
    );
    Ok(())
}

/// The other way round: a corelane UDP socket connected to a kernel host's closed port. The
/// kernel answers with ICMP port unreachable; the program steers it to the core, the stack
/// gives it to the socket that sent the datagram, and its next `recv` fails with
/// `ConnectionRefused`, as a kernel socket's does (before, it waited for ever), over IPv4
/// and IPv6.
#[test]
fn a_corelane_socket_connected_to_a_closed_kernel_port_is_refused() -> Result {
    if !require_root("ICMP port unreachable to a corelane socket") {
        return Ok(());
    }
    let net = net(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let served = serve_on(
        &net,
        |b| b.cores(1).addr("fd00:77::3/64"),
        move |_| {
            let tx = tx.clone();
            async move {
                for peer in ["10.77.0.2:9", "[fd00:77::2]:9"] {
                    let got = refused(peer).await;
                    let _ = tx.send((peer, got));
                }
            }
        },
    )?;
    for _ in 0..2 {
        let (peer, got) = rx.recv_timeout(Duration::from_secs(30))?;
        assert!(
            matches!(&got, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
            "{peer}: {got:?}"
        );
    }
    served.stop.stop();
    served.thread.join()??;
    Ok(())
}

/// What a connected socket's `recv` says after datagrams to `peer`, resent while the
/// neighbour resolves (bounded: 20 tries, 200 ms each).
async fn refused(peer: &str) -> std::io::Result<usize> {
    let s = corelane::net::UdpSocket::bind(0).await?;
    s.connect(peer).await?;
    let mut buf = [0u8; 64];
    for _ in 0..20 {
        s.send(b"anyone?").await?;
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(200), s.recv(&mut buf)).await {
            return r;
        }
    }
    Err(ErrorKind::TimedOut.into())
}
