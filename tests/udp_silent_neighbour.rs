//! A UDP service's replies while an on-link attacker sends datagrams from a source address
//! nobody answers ARP for: the reply to it waits for its next hop, and must hold no other.
//! Before, the socket's one send queue held every reply behind it for the 3 s the silent hop
//! had to answer, so one spoofed datagram every few seconds stalled a DNS or QUIC service.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::*;
use corelane_testnet::require_root;

#[test]
fn replies_never_wait_behind_one_to_a_source_nobody_answers_arp_for() {
    if !require_root("replies_never_wait_behind_one_to_a_source_nobody_answers_arp_for") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let server: SocketAddr = format!("{SERVER_V4}:7").parse().expect("an address");
    // The client's side of the link answers no ARP request (arp_ignore 8): the server learns
    // the client from the client's own requests, and 10.77.0.200, an address the client's
    // side sends from too, it never learns. (No flood: one datagram a second, 4 in all.)
    let ns = net.client_ns();
    ns.command("sysctl")
        .args([
            "-qw",
            &format!("net.ipv4.conf.{}.arp_ignore=8", net.client_if()),
        ])
        .status()
        .expect("sysctl");
    ns.ip(&["addr", "add", "10.77.0.200/32", "dev", net.client_if()])
        .expect("the attacker's address");
    let rtts = ns
        .run(move || {
            let s = UdpSocket::bind("10.77.0.2:0").expect("the client");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let attacker = UdpSocket::bind("10.77.0.200:0").expect("the attacker");
            let mut buf = [0u8; 256];
            // The server learns where the client is before the test starts.
            s.send_to(b"hello", server).expect("send");
            s.recv_from(&mut buf).expect("the first echo");
            let mut rtts = Vec::new();
            for i in 0..40u32 {
                if i % 10 == 0 {
                    attacker.send_to(b"spoofed", server).expect("send");
                }
                let msg = i.to_be_bytes();
                let t = Instant::now();
                s.send_to(&msg, server).expect("send");
                match s.recv_from(&mut buf) {
                    Ok((n, from)) if from == server && buf[..n] == msg => {
                        rtts.push(t.elapsed());
                    }
                    other => panic!("request {i}: {other:?}"),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            rtts
        })
        .expect("the client's thread");
    let worst = rtts.iter().max().copied().unwrap_or_default();
    let mut sorted = rtts.clone();
    sorted.sort();
    println!(
        "40 round trips beside a silent source: median {:?}, worst {worst:?}",
        sorted[sorted.len() / 2]
    );
    // A reply held behind the silent hop's waited its 3 s; an ordinary round trip here takes
    // well under a millisecond (the bound leaves room for a busy machine).
    assert!(
        worst < Duration::from_millis(500),
        "a reply waited {worst:?} behind one to a silent next hop: {rtts:?}"
    );
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
}
