//! Tests of `steering_upgrade.rs`: the program handed from one owner to another.

use super::*;
use crate::{AttachMode, Proto, XskConfig, XskQueue, ZeroCopy};
use corelane_frame::FrameIo;
use corelane_testnet::VethPair;
use std::collections::VecDeque;
use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 94, 0, 1);

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
    let net = VethPair::builder()
        .server_addr("10.94.0.1/24")
        .client_addr("10.94.0.2/24")
        .build()
        .unwrap();
    let mac = net.server_ns().mac(net.server_if()).unwrap();
    let lladdr = mac.map(|b| format!("{b:02x}")).join(":");
    net.client_ns()
        .ip(&[
            "neigh",
            "replace",
            "10.94.0.1",
            "lladdr",
            &lladdr,
            "dev",
            net.client_if(),
        ])
        .unwrap();
    let ifname = net.server_if();
    net.server_ns().enter_current_thread().unwrap();
    let mut first = Steering::attach(ifname, AttachMode::Auto).unwrap();
    first.own_addr(SERVER.into()).unwrap();
    first.own_port(Proto::Udp, 9000).unwrap();
    let share = first.share().unwrap();
    assert_eq!(share.maps.len(), MAPS.len());
    let mut second = Steering::adopt(ifname, share).unwrap();
    assert_eq!(second.mode(), first.mode());
    drop(first);
    assert!(
        xdp_attached(&net),
        "the second owner's link keeps the program"
    );

    // The maps the first owner filled steer for the second one's socket.
    let config = XskConfig {
        frames: 64,
        ring_size: 16,
        zero_copy: ZeroCopy::Off,
        ..XskConfig::default()
    };
    let mut q = XskQueue::open(ifname, 0, &config).unwrap();
    second.register(0, q.fd()).unwrap();
    net.client_ns()
        .run(|| {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.send_to(b"adopted", (SERVER, 9000)).unwrap();
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
        !xdp_attached(&net),
        "the last owner gone, the program is detached"
    );
}
