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

/// A UDP datagram from `src_ip` (at `src_mac`) to the shared address's port 7, for `dst_mac`.
fn spoofed_datagram(dst_mac: [u8; 6], src_mac: [u8; 6], src_ip: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[..4].copy_from_slice(&[0x45, 0, 0, 32]);
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src_ip);
    ip[16..20].copy_from_slice(&[10, 77, 0, 1]);
    let sum = ip
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    // Source port 40000 to port 7, length 12, no checksum (allowed over IPv4), 4 bytes.
    f.extend_from_slice(&[0x9c, 0x40, 0, 7, 0, 12, 0, 0, b'f', b'l', b'o', b'o']);
    f.resize(60, 0);
    f
}

/// A flood of datagrams from 240 spoofed on-link sources nobody answers ARP for: every echo
/// waits for a neighbour the program never notes. The core reads the program's neighbour map
/// (a system call each) for at most 16 waiting hops a millisecond, however many sources there
/// are, and a real client's echo still comes back meanwhile. Bounded: 2,400 frames, 3 s.
#[test]
fn a_flood_of_spoofed_sources_leaves_the_neighbour_reads_bounded() {
    if !require_root("a_flood_of_spoofed_sources_leaves_the_neighbour_reads_bounded") {
        return;
    }
    let net = net(1);
    let served = serve_on(
        &net,
        |b| b.cores(1).addr("10.77.0.1/24").share_kernel_addrs(true),
        |_| async {
            // On the shared address itself (serve_on's runtime owns 10.77.0.3 as well).
            let u = corelane::net::UdpSocket::bind("10.77.0.1:7")
                .await
                .expect("udp bind");
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = u.recv_from(&mut buf).await {
                let _ = u.send_to(&buf[..n], from).await;
            }
        },
    )
    .expect("a runtime on the shared address");
    let dst = net
        .server_ns()
        .mac(net.server_if())
        .expect("the server's hardware address");
    // The port echoes before the flood (the neighbour of a real client resolves).
    net.client_ns()
        .run(|| udp_echo(at(7)))
        .expect("the client")
        .expect("an echo before the flood");
    let link = RawLink::open(net.client_ns(), net.client_if()).expect("a raw link");
    let start = Instant::now();
    let flood = std::thread::spawn(move || {
        let mut sent = 0u32;
        'out: for round in 0..10u8 {
            for host in 10..250u8 {
                if start.elapsed() > Duration::from_secs(3) {
                    break 'out;
                }
                let f = spoofed_datagram(dst, [2, 0xf1, 0, 0, round, host], [10, 77, 0, host]);
                if link.send(&f).is_ok() {
                    sent += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(100));
    let during = net.client_ns().run(|| udp_echo(at(7))).expect("the client");
    let sent = flood.join().expect("the flood");
    // The waiting replies give up (3 s) before the run ends.
    std::thread::sleep(Duration::from_secs(3));
    served.stop.stop();
    let report = served.thread.join().expect("the server").expect("its run");
    let elapsed_ms = start.elapsed().as_millis() as u64;
    assert!(sent > 1000, "only {sent} spoofed datagrams went out");
    during.expect("an echo to a real client during the flood");
    let reads: u64 = report.cores.iter().map(|c| c.stats.neighbour_reads).sum();
    assert!(reads > 0, "the waiting hops were looked up: {report:?}");
    assert!(
        reads <= 16 * (elapsed_ms + 1),
        "{reads} neighbour reads in {elapsed_ms} ms: more than 16 a millisecond"
    );
    eprintln!(
        "{sent} spoofed datagrams; {reads} neighbour reads in {elapsed_ms} ms; core CPU {:?}",
        report
            .cores
            .iter()
            .map(|c| c.stats.cpu_time)
            .collect::<Vec<_>>()
    );
}
