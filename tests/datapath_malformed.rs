//! Frames from the wire that are truncated, corrupted or plain garbage are counted and dropped;
//! the server keeps serving and loses nothing.

mod common;

use common::*;
use corelane_testnet::craft::{self, Ip4, RawLink, Tcp};
use corelane_testnet::require_root;

/// Ethernet + IPv4 + a TCP segment to port 7 whose checksum is wrong.
fn tcp_frame_bad_checksum(dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    let mut ip = Ip4::new([10, 77, 0, 2].into(), [10, 77, 0, 3].into());
    ip.id = 1;
    let t = Tcp {
        sport: 40000,
        dport: 7,
        seq: 1,
        flags: craft::ACK,
        window: 0x2000,
        payload: payload.to_vec(),
        ..Tcp::default()
    };
    let mut f = craft::tcp4(dst, src, &ip, &t);
    f[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&[0xde, 0xad]);
    f
}

/// Sends `frame`, waiting while the link's queue is full.
fn send(raw: &RawLink, frame: &[u8]) {
    loop {
        match raw.send(frame) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("send: {e}"),
        }
    }
}

#[test]
fn datapath_malformed_frames_and_a_garbage_flood_are_counted_and_survived() {
    if !require_root("datapath_malformed_frames") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let server_mac = net.server_ns().mac(net.server_if()).unwrap();
    let client_mac = net.client_ns().mac(net.client_if()).unwrap();
    let raw = RawLink::open(net.client_ns(), net.client_if()).unwrap();
    // A bad TCP checksum to the owned address and port: steered, then dropped by classify.
    for _ in 0..10 {
        send(
            &raw,
            &tcp_frame_bad_checksum(server_mac, client_mac, b"corrupt"),
        );
    }
    // IPv4 header truncated after the Ethernet header: malformed at XDP.
    let mut short = Vec::from(&server_mac[..]);
    short.extend_from_slice(&client_mac);
    short.extend_from_slice(&[0x08, 0x00, 0x45, 0x00]);
    for _ in 0..10 {
        send(&raw, &short);
    }
    // TCP header cut short on an owned address: malformed at XDP.
    let cut = tcp_frame_bad_checksum(server_mac, client_mac, b"");
    for _ in 0..10 {
        send(&raw, &cut[..14 + 20 + 8]);
    }
    // A flood of garbage IPv4 frames at the owned address.
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let good = tcp_frame_bad_checksum(server_mac, client_mac, &[0u8; 64]);
    for i in 0..50_000 {
        let mut f = good.clone();
        for b in f.iter_mut().skip(14 + 20) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        // Keep the address and port so the frames are steered; vary the length.
        f[14 + 22] = 0;
        f[14 + 23] = 7;
        f.truncate(14 + 20 + 20 + (i % 64));
        send(&raw, &f);
    }

    // Still serving, byte for byte.
    assert_echoes(&net, format!("{SERVER_V4}:7").parse().unwrap(), 2 << 20, 11);

    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert!(device_counter(&out, "bad checksum") >= 10, "{out}");
    assert!(xdp_counter(&out, "malformed") >= 20, "{out}");
}
