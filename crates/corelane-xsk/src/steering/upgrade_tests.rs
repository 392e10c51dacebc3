//! Tests of `steering/upgrade.rs`: the program handed from one owner to another.

use super::*;
use crate::{Proto, XskQueue};
use corelane_frame::FrameIo;
use corelane_testnet::VethPair;
use std::collections::VecDeque;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

fn xdp_attached(net: &VethPair) -> bool {
    net.server_ns()
        .ip(&["-d", "link", "show", "dev", net.server_if()])
        .unwrap()
        .contains("prog/xdp")
}

#[test]
fn an_adopted_program_stays_attached_and_steers_after_its_first_owner_is_gone() {
    if !corelane_testnet::require_root("an_adopted_program_stays_attached") {
        return;
    }
    let lab = crate::lab_tests::lab(94);
    let (net, mut first) = (&lab.net, lab.steering);
    let ifname = net.server_if();
    first.own_port(Proto::Udp, 9000).unwrap();
    let share = first.share().unwrap();
    assert_eq!(share.maps.len(), MAPS.len());
    let mut second = Steering::adopt(ifname, share).unwrap();
    assert_eq!(second.mode(), first.mode());
    drop(first);
    assert!(
        xdp_attached(net),
        "the second owner's link keeps the program"
    );

    // The maps the first owner filled steer for the second one's socket.
    let mut q = XskQueue::open(ifname, 0, &crate::lab_tests::small()).unwrap();
    second.register(0, q.fd()).unwrap();
    let server = lab.server;
    net.client_ns()
        .run(move || {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.send_to(b"adopted", (server, 9000)).unwrap();
        })
        .unwrap();
    let mut got = VecDeque::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.is_empty() && Instant::now() < deadline {
        q.wait(100).unwrap();
        q.recv(&mut got, 8);
    }
    assert_eq!(got.len(), 1);
    assert!(q.bytes(&got[0]).ends_with(b"adopted"));
    assert!(second.counters().unwrap().steered >= 1);
    // And it can hand the program on again.
    let again = second.share().unwrap();
    assert_eq!(again.maps.len(), MAPS.len());
    drop(again);

    drop(q);
    drop(second);
    assert!(
        !xdp_attached(net),
        "the last owner gone, the program is detached"
    );
}
