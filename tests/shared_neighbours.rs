//! How corelane learns the neighbours of an address it shares with the kernel: the kernel takes
//! the ARP answers to corelane's requests, and the XDP program notes what a reply says. A
//! request says only what its sender claims, from any source: before, one forged ARP request
//! naming the client's address with another hardware address moved corelane's replies there.

mod common;
mod shared;

use std::time::{Duration, Instant};

use common::*;
use corelane_testnet::craft::RawLink;
use corelane_testnet::require_root;
use shared::*;

/// An ARP request from `sender_ip` at `sender_mac` for `target` (broadcast).
fn arp_request(sender_mac: [u8; 6], sender_ip: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&sender_mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&sender_mac);
    f.extend_from_slice(&sender_ip);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f.resize(60, 0);
    f
}

#[test]
fn a_forged_arp_request_does_not_move_a_shared_address_s_replies() {
    if !require_root("a_forged_arp_request_does_not_move_a_shared_address_s_replies") {
        return;
    }
    let net = net(1);
    let server = Echo::start(&net, &["--addr", "10.77.0.1/24", "--shared", "--port", "7"]);
    // From the client's side of the link, all along (one frame a millisecond, 3 s at most):
    // "10.77.0.2 is at 02:de:ad:be:ef:01", asked of the shared address.
    let link = RawLink::open(net.client_ns(), net.client_if()).expect("a raw link");
    let forged = arp_request(
        [2, 0xde, 0xad, 0xbe, 0xef, 1],
        [10, 77, 0, 2],
        [10, 77, 0, 1],
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let forger = std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(3);
        let mut sent = 0u32;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < end {
            if link.send(&forged).is_ok() {
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(100));
    // corelane's UDP replies need the client's hardware address: asked for, answered by the
    // client's kernel, noted; the forged requests are not.
    let echoed = net.client_ns().run(|| udp_echo(at(7))).expect("the client");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = forger.join().expect("the forger");
    assert!(sent > 50, "only {sent} forged requests went out");
    echoed.expect("a UDP echo from the shared address while its neighbour is forged");
    let (status, out) = server.stop();
    assert_clean_exit_of("echo", status, &out);
}
