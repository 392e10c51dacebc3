//! The attack scripts (`corelane_testnet::attacks`) against the echo example on a veth pair: an
//! attacker on the client's link who knows a connection's four-tuple sends blind resets, SYNs
//! and data, data with forged ACKs, a forged source MAC, a guessed SYN cookie, ICMP "too big"
//! quoting a sequence not in flight, an off-link neighbour advertisement moving the client to
//! another MAC, and probes the IP IDs. The connection must survive every
//! blind attack, forged data must never reach the application, and the controls (a reset at
//! exactly the next sequence) must work, which shows the forged frames reach the server. The
//! same scripts against the kernel, side by side: `cargo run --release -p corelane-bench --bin
//! attacks` (docs/results/attacks.md).

mod common;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use common::*;
use corelane_testnet::attacks::{neighbour_advert, run_all};
use corelane_testnet::require_root;

#[test]
fn attacks_on_a_connection_fail_and_the_controls_work() {
    if !require_root("attacks_on_a_connection_fail_and_the_controls_work") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(
        &net,
        &[
            "--addr",
            "10.77.0.3/24",
            "--addr",
            "fd00:77::3/64",
            "--cores",
            "1",
        ],
    );
    let target = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 3), 7);
    let mut out = run_all(
        &net,
        target,
        Ipv4Addr::new(10, 77, 0, 2),
        Ipv4Addr::new(10, 77, 0, 9),
    )
    .expect("the scripts run");
    let v6: Ipv6Addr = SERVER_V6.parse().unwrap();
    out.extend(
        neighbour_advert(
            &net,
            SocketAddrV6::new(v6, 7, 0, 0),
            "fd00:77::2".parse().unwrap(),
        )
        .expect("the NA script runs"),
    );
    let table: String = out.iter().map(|o| format!("{o:?}\n")).collect();
    eprintln!("{table}");
    let find = |name: &str| {
        out.iter()
            .find(|o| o.attack.starts_with(name))
            .unwrap_or_else(|| panic!("no attack {name:?} in\n{table}"))
    };
    for o in &out {
        assert_ne!(o.injected, Some(true), "forged data delivered: {o:?}");
        if !o.attack.contains("(control)") && o.survived.is_some() {
            assert_eq!(o.survived, Some(true), "{o:?}");
        }
    }
    // The control: a reset at exactly the next sequence ends the connection.
    assert_eq!(find("RST at exactly").survived, Some(false), "{table}");
    assert_eq!(find("blind RST, sequence outside").answer, "nothing");
    assert_eq!(
        find("blind RST, in the window").answer,
        "1 ACK",
        "challenge ACK"
    );
    assert_eq!(find("blind SYN").answer, "1 ACK", "challenge ACK");
    assert_eq!(find("ACK to the listener").answer, "1 RST");
    let icmp = find("ICMP too big (MTU 576) quoting a sequence not in flight");
    assert!(
        icmp.largest_segment.is_some_and(|n| n > 576),
        "the path MTU was lowered: {icmp:?}"
    );
    let ids = find("fragmented echo requests");
    assert_eq!(ids.answer, "8 of 8 replies", "{ids:?}");
    assert_eq!(ids.shared_ids, Some(false), "{ids:?}");
    let na = find("IPv6: unsolicited NA");
    assert_eq!(
        na.survived,
        Some(true),
        "an off-link NA moved the client: {na:?}"
    );
    echo.stop();
}
