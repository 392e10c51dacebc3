//! The bench of the unit tests that need the real datapath: a veth pair between two
//! namespaces, the program attached to the server's end and owning the server's address, the
//! client's neighbour entry for it set (nothing on the server's side answers ARP), and the
//! test's thread inside the server's namespace.

use std::net::Ipv4Addr;

use corelane_testnet::VethPair;

use crate::{AttachMode, Steering, XskConfig, ZeroCopy};

pub(crate) struct Lab {
    pub(crate) net: VethPair,
    pub(crate) steering: Steering,
    /// 10.`subnet`.0.1
    pub(crate) server: Ipv4Addr,
    /// 10.`subnet`.0.2
    pub(crate) client: Ipv4Addr,
}

/// The bench on 10.`subnet`.0.0/24 (each test its own subnet).
pub(crate) fn lab(subnet: u8) -> Lab {
    let server = Ipv4Addr::new(10, subnet, 0, 1);
    let client = Ipv4Addr::new(10, subnet, 0, 2);
    let net = VethPair::builder()
        .server_addr(&format!("{server}/24"))
        .client_addr(&format!("{client}/24"))
        .build()
        .unwrap();
    let mac = net.server_ns().mac(net.server_if()).unwrap();
    let lladdr = mac.map(|b| format!("{b:02x}")).join(":");
    let to = server.to_string();
    net.client_ns()
        .ip(&[
            "neigh",
            "replace",
            &to,
            "lladdr",
            &lladdr,
            "dev",
            net.client_if(),
        ])
        .unwrap();
    net.server_ns().enter_current_thread().unwrap();
    let mut steering = Steering::attach(net.server_if(), AttachMode::Auto).unwrap();
    steering.own_addr(server.into()).unwrap();
    Lab {
        net,
        steering,
        server,
        client,
    }
}

/// A queue's sizes for a test: 256 frames, rings of 64, copy mode.
pub(crate) fn small() -> XskConfig {
    XskConfig {
        frames: 256,
        ring_size: 64,
        zero_copy: ZeroCopy::Off,
        ..XskConfig::default()
    }
}

/// An untagged IPv4 UDP frame turned back to where it came from: addresses and ports swapped
/// (both checksums stay right: the sums are over the same words).
pub(crate) fn turn_around(f: &mut [u8]) {
    for (a, b, n) in [(0, 6, 6), (26, 30, 4), (34, 36, 2)] {
        for k in 0..n {
            f.swap(a + k, b + k);
        }
    }
}
