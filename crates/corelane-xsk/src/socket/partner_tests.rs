//! Tests of `partner.rs`: an upgrade of one queue on a veth, with traffic through both
//! processes' sockets before, during and after the hand-over.

use super::*;
use crate::{PendingJoin, Proto, UpgradePhase, XskFrame, frames_in_two_hands};
use corelane_frame::{Frame, FrameIo};
use corelane_testnet::craft::{
    Ip4, RawLink, SYN, Tcp, icmp4, quote_tcp4, tcp4, tcp4_with_ip_options, tcp6,
};
use corelane_testnet::{NsThread, VethPair};
use std::collections::{BTreeSet, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 92, 0, 1);
const PORT: u16 = 9000;

use crate::lab_tests::turn_around;

/// Echoes every datagram waiting on `q`'s RX ring back out in its own frame; returns how many.
fn echo(q: &mut XskQueue) -> usize {
    let mut got = VecDeque::new();
    q.recv(&mut got, 64);
    let mut out: Vec<XskFrame> = got.into_iter().collect();
    for f in &mut out {
        let len = f.len();
        turn_around(q.bytes_mut(f, len));
    }
    let n = out.len();
    q.send(&mut out).unwrap();
    n
}

/// A datagram from the server to the client, as `template` (a turned-around request) with
/// payload `payload` (the same length) and no UDP checksum.
fn datagram(q: &mut XskQueue, template: &[u8], payload: &[u8]) -> bool {
    let mut f = Vec::new();
    if q.alloc(&mut f, 1) == 0 {
        return false;
    }
    let b = q.bytes_mut(&mut f[0], template.len());
    b.copy_from_slice(template);
    b[40..42].fill(0);
    b[42..].copy_from_slice(payload);
    q.send(&mut f).unwrap() == 1
}

/// The client's port (the old process's own datagrams go to it too).
const CLIENT_PORT: u16 = 40000;

/// The client: sends `n` requests `"{tag}NN"` one at a time, each waiting for its echo, and
/// keeps every datagram it receives; then waits (up to 3 s each) until `extra` of them came
/// from the old process ("oNN").
fn client(net: &VethPair, tag: char, n: usize, extra: usize) -> NsThread<Vec<String>> {
    net.client_ns()
        .spawn(move || {
            let s = UdpSocket::bind(("0.0.0.0", CLIENT_PORT)).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
                .unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 64];
            for k in 0..n {
                let want = format!("{tag}{k:02}");
                s.send_to(want.as_bytes(), (SERVER, PORT)).unwrap();
                loop {
                    let Ok(m) = s.recv(&mut buf) else {
                        return seen;
                    };
                    let got = String::from_utf8_lossy(&buf[..m]).to_string();
                    seen.push(got.clone());
                    if got == want {
                        break;
                    }
                }
            }
            let old = |seen: &Vec<String>| seen.iter().filter(|s| s.starts_with('o')).count();
            while old(&seen) < extra
                && let Ok(m) = s.recv(&mut buf)
            {
                seen.push(String::from_utf8_lossy(&buf[..m]).to_string());
            }
            seen
        })
        .unwrap()
}

/// Turns both queues until `until` is done.
fn pump<T>(
    until: NsThread<T>,
    qs: &mut [&mut XskQueue],
    mut each: impl FnMut(&mut [&mut XskQueue]),
) -> T {
    while !until.is_finished() {
        for q in qs.iter_mut() {
            echo(q);
            q.complete().unwrap();
        }
        each(qs);
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    until.join().unwrap()
}

fn names(tag: char, n: usize) -> BTreeSet<String> {
    (0..n).map(|k| format!("{tag}{k:02}")).collect()
}

/// The lab on 10.92.0.0/24 with UDP `PORT` and TCP 80 owned, and the old process's queue
/// registered in generation 0.
fn lab() -> (crate::lab_tests::Lab, XskQueue) {
    let mut lab = crate::lab_tests::lab(92);
    lab.steering.own_port(Proto::Udp, PORT).unwrap();
    lab.steering.own_port(Proto::Tcp, 80).unwrap();
    let a = XskQueue::open(lab.net.server_if(), 0, &crate::lab_tests::small()).unwrap();
    lab.steering.register(0, a.fd()).unwrap();
    (lab, a)
}

/// The new process joins `a`'s queue (on its own thread, as it would in its own process)
/// while the old one turns; the old one hands the rings over on a turn.
fn join(net: &VethPair, a: &mut XskQueue) -> XskQueue {
    join_turning(net, a, |a| {
        a.complete().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
    })
}

/// [`join`], with `turn` as the old process's turns meanwhile.
fn join_turning(net: &VethPair, a: &mut XskQueue, mut turn: impl FnMut(&mut XskQueue)) -> XskQueue {
    let offer = a.offer_upgrade().unwrap();
    assert_eq!(a.upgrade_phase(), Some(UpgradePhase::Offered));
    let joining = net
        .server_ns()
        .spawn({
            let ifname = net.server_if().to_string();
            move || XskQueue::join_upgrade(&ifname, offer)
        })
        .unwrap();
    while !joining.is_finished() {
        turn(a);
    }
    let b = joining.join().unwrap().unwrap();
    assert_eq!(a.upgrade_phase(), Some(UpgradePhase::Handed));
    assert!(!a.owns_rings && b.owns_rings);
    b
}

#[test]
fn a_queue_is_handed_to_a_new_process_under_traffic_and_every_frame_comes_home() {
    if !corelane_testnet::require_root("a_queue_is_handed_to_a_new_process") {
        return;
    }
    let (lab, mut a) = lab();
    let (net, mut steering) = (&lab.net, lab.steering);

    // The old process alone; one of its answers is kept as the shape of the datagrams it goes
    // on sending for its established flows.
    let seen = pump(client(net, 'p', 10, 0), &mut [&mut a], |_| {});
    assert_eq!(
        seen.iter().cloned().collect::<BTreeSet<_>>(),
        names('p', 10)
    );
    let mut template = Vec::new();
    {
        net.client_ns()
            .run(|| {
                let s = UdpSocket::bind(("0.0.0.0", CLIENT_PORT)).unwrap();
                s.send_to(b"t00", (SERVER, PORT)).unwrap();
            })
            .unwrap();
        let mut got = VecDeque::new();
        while got.is_empty() {
            a.wait(100).unwrap();
            a.recv(&mut got, 1);
        }
        let f = got.pop_front().unwrap();
        template.extend_from_slice(a.bytes(&f));
        turn_around(&mut template);
        a.release(&mut vec![f]);
    }

    let mut b = join(net, &mut a);
    // The old process keeps no frame back for a fill ring it no longer fills, whatever its
    // batch tuner asks: its free frames are to send from (kept back, they left it none).
    assert_eq!(a.set_fill_target(1024), 0);
    assert_eq!(a.fill_target(), 0);

    // New flows to the new process while the old one goes on sending for its own: every
    // request answered, every one of the old one's datagrams delivered. The frames the old
    // process posted before the hand-over arrive on the new one's RX ring.
    steering.register(0, b.fd()).unwrap();
    let mut k = 0u8;
    let seen = pump(client(net, 'n', 90, 30), &mut [&mut a, &mut b], |qs| {
        // Once the client's socket is up (its first request has come in).
        let up = qs[1].stats().rx_frames > 0;
        if up && k < 30 && datagram(qs[0], &template, format!("o{k:02}").as_bytes()) {
            k += 1;
        }
    });
    let got: BTreeSet<String> = seen.into_iter().collect();
    let mut want = names('n', 90);
    want.extend(names('o', 30));
    assert_eq!(got, want);

    // Steered back to the old process for a while: it now receives into frames the new one
    // posted, answers in place, and the completions reach it through the new one.
    steering.register(0, a.fd()).unwrap();
    let seen = pump(client(net, 'r', 20, 0), &mut [&mut a, &mut b], |_| {});
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('r', 20));

    // Nothing more for the old process: it drains, leaves, and the new one takes every frame.
    steering.register(0, b.fd()).unwrap();
    let mut left = false;
    for _ in 0..2000 {
        for q in [&mut a, &mut b] {
            echo(q);
            q.complete().unwrap();
        }
        if a.leave_upgrade().unwrap() {
            left = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(left, "the old process could not leave: {:?}", a.counts());
    assert_eq!(a.upgrade_phase(), Some(UpgradePhase::Left));
    let old = a.counts();
    assert_eq!(
        (old.free, old.in_use, old.tx, old.away),
        (0, 0, 0, 256),
        "{old:?}"
    );
    drop(a);

    // The new process serves on alone; once the fill ring has cycled, every frame is its own.
    let seen = pump(client(net, 'z', 70, 0), &mut [&mut b], |_| {});
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('z', 70));
    b.complete().unwrap();
    let c = b.counts();
    assert_eq!(c.away, 0, "{c:?}");
    assert_eq!(c.sum(), 256);
    assert!(b.pool.ledger().verify().is_ok());
}

/// The source ports of the TCP segments (IPv4, with or without IP options, or IPv6) each
/// queue receives, and of IPv4 ICMP errors the destination port of the segment they quote,
/// until `want` have come (3 s at most).
fn tcp_sources(qs: &mut [&mut XskQueue], want: usize) -> Vec<Vec<u16>> {
    let mut seen = vec![Vec::new(); qs.len()];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while seen.iter().map(Vec::len).sum::<usize>() < want && std::time::Instant::now() < deadline {
        for (q, seen) in qs.iter_mut().zip(&mut seen) {
            let mut got = VecDeque::new();
            q.recv(&mut got, 64);
            for f in &got {
                let b = q.bytes(f);
                let tcp = match (b.get(12..14), b.get(14), b.get(20), b.get(23)) {
                    (Some([0x08, 0x00]), Some(v), _, Some(6)) => 14 + usize::from(v & 15) * 4,
                    (Some([0x86, 0xdd]), _, Some(6), _) => 54,
                    // ICMP: its header, the quoted IP header, the quoted source port.
                    (Some([0x08, 0x00]), Some(0x45), _, Some(1)) => 14 + 20 + 8 + 20 + 2,
                    _ => continue,
                };
                if let Some(p) = b.get(tcp..tcp + 2) {
                    seen.push(u16::from_be_bytes([p[0], p[1]]));
                }
            }
            q.release(&mut got.into_iter().collect());
            q.complete().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    seen
}

#[test]
fn tcp_connections_the_old_process_keeps_stay_with_it_and_the_rest_go_to_the_new_one() {
    if !corelane_testnet::require_root("tcp_connections_the_old_process_keeps") {
        return;
    }
    let (lab, mut a) = lab();
    let (net, mut steering) = (&lab.net, lab.steering);
    let mut b = join(net, &mut a);
    steering.register_in(1, 0, b.fd()).unwrap();
    let client = lab.client;
    let kept = std::net::SocketAddr::from((client, 40001));
    steering.keep_flow(kept, 80, 0).unwrap();
    steering.set_upgrade(1, true).unwrap();
    let server_mac = net.server_ns().mac(net.server_if()).unwrap();
    let client_mac = net.client_ns().mac(net.client_if()).unwrap();
    let link = RawLink::open(net.client_ns(), net.client_if()).unwrap();
    let t = |sport: u16| Tcp {
        sport,
        dport: 80,
        seq: 1,
        flags: SYN,
        window: 1000,
        ..Tcp::default()
    };
    let syn = |sport: u16| tcp4(server_mac, client_mac, &Ip4::new(client, SERVER), &t(sport));
    // IPv6, and IPv4 with IP options: the program reads the connection from other offsets.
    let (server6, client6): (Ipv6Addr, Ipv6Addr) =
        ("fd00:92::1".parse().unwrap(), "fd00:92::2".parse().unwrap());
    steering.own_addr(server6.into()).unwrap();
    steering
        .keep_flow(std::net::SocketAddr::from((client6, 40001)), 80, 0)
        .unwrap();
    let syn6 = |sport: u16| tcp6(server_mac, client_mac, client6, server6, &t(sport));
    let opts = |sport: u16| {
        let ip = Ip4::new(client, SERVER);
        tcp4_with_ip_options(server_mac, client_mac, &ip, &t(sport), &[1, 1, 1, 0])
    };
    // The kept connections to the old process; new ones, and the kept one's peer port to
    // another local port, to the new process.
    for frame in [syn(40001), syn(40002), syn(40001), syn(40003)] {
        link.send(&frame).unwrap();
    }
    let seen = tcp_sources(&mut [&mut a, &mut b], 4);
    assert_eq!(seen, [vec![40001, 40001], vec![40002, 40003]]);
    for frame in [syn6(40001), syn6(40002), opts(40001), opts(40005)] {
        link.send(&frame).unwrap();
    }
    let seen = tcp_sources(&mut [&mut a, &mut b], 4);
    assert_eq!(
        seen,
        [vec![40001, 40001], vec![40002, 40005]],
        "IPv6 and IP options"
    );
    // An ICMP error quoting a segment the kept connection sent (a path-MTU update) goes with
    // it; one quoting another connection's, to the new process.
    let quoting = |peer_port: u16| {
        let sent = Tcp {
            sport: 80,
            dport: peer_port,
            seq: 1,
            window: 1000,
            ..Tcp::default()
        };
        let quote = quote_tcp4(&Ip4::new(SERVER, client), &sent, 1400);
        // Fragmentation needed, next-hop MTU 1280.
        icmp4(
            server_mac,
            client_mac,
            &Ip4::new(client, SERVER),
            3,
            4,
            [0, 0, 5, 0],
            &quote,
        )
    };
    for frame in [quoting(40001), quoting(40007)] {
        link.send(&frame).unwrap();
    }
    let seen = tcp_sources(&mut [&mut a, &mut b], 2);
    assert_eq!(seen, [vec![40001], vec![40007]], "ICMP errors");
    // The split over: everything to the new process.
    steering.set_upgrade(1, false).unwrap();
    link.send(&syn(40001)).unwrap();
    assert_eq!(tcp_sources(&mut [&mut a, &mut b], 1), [vec![], vec![40001]]);
    // Split again, the connection forgotten: the new process's.
    steering.set_upgrade(1, true).unwrap();
    steering.forget_flow(kept, 80).unwrap();
    link.send(&syn(40001)).unwrap();
    assert_eq!(tcp_sources(&mut [&mut a, &mut b], 1), [vec![], vec![40001]]);
    // And the old generation's socket still answers for generation 0 when it is current.
    steering.set_upgrade(0, false).unwrap();
    link.send(&syn(40004)).unwrap();
    assert_eq!(tcp_sources(&mut [&mut a, &mut b], 1), [vec![40004], vec![]]);
}

#[test]
fn a_new_process_the_old_one_does_not_answer_withdraws_and_the_old_one_serves_on() {
    if !corelane_testnet::require_root("a_new_process_the_old_one_does_not_answer") {
        return;
    }
    let (lab, mut a) = lab();
    let net = &lab.net;
    // The old process does not turn meanwhile: the new one gives up, and the phase is back.
    let offer = a.offer_upgrade().unwrap();
    let e = XskQueue::join_upgrade(net.server_if(), offer).unwrap_err();
    assert!(e.to_string().contains("did not hand it over"), "{e}");
    assert_eq!(a.upgrade_phase(), Some(UpgradePhase::Offered));
    a.complete().unwrap();
    assert!(a.owns_rings, "nothing was handed over");
    let seen = pump(client(net, 'w', 10, 0), &mut [&mut a], |_| {});
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('w', 10));
    // An offer nobody took is made again, and the next new process gets the queue.
    let b = join(net, &mut a);
    assert_eq!(b.upgrade_phase(), Some(UpgradePhase::Handed));
}

#[test]
fn the_old_process_takes_its_queue_back_from_a_new_one_that_died() {
    if !corelane_testnet::require_root("the_old_process_takes_its_queue_back") {
        return;
    }
    let (lab, mut a) = lab();
    let (net, mut steering) = (&lab.net, lab.steering);
    let mut b = join(net, &mut a);
    steering.register(0, b.fd()).unwrap();
    let seen = pump(client(net, 'n', 40, 0), &mut [&mut a, &mut b], |_| {});
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('n', 40));
    // The new process dies with frames in its hands: received and never released.
    let unanswered = client(net, 'x', 1, 0);
    let mut held = VecDeque::new();
    while !unanswered.is_finished() {
        b.recv(&mut held, 64);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!held.is_empty());
    drop(b);
    drop(held);
    // The old process takes the queue back at once (the new one's queue said, as it went,
    // that it touches nothing more) and is steered to again.
    assert_eq!(a.upgrade_phase(), Some(UpgradePhase::Aborted));
    let Ok(CallOff::Reclaimed(taken)) = a.call_off_upgrade(false) else {
        panic!("not taken back: {:?}", a.upgrade_phase());
    };
    assert!(taken >= 1, "{taken}");
    assert_eq!(a.upgrade_phase(), None);
    steering.register(0, a.fd()).unwrap();
    // It serves on; once the fill ring has cycled every frame is its own, each in one place.
    let seen = pump(client(net, 'k', 80, 0), &mut [&mut a], |_| {});
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('k', 80));
    a.complete().unwrap();
    let c = a.counts();
    assert_eq!((c.away, c.sum()), (0, 256), "{c:?}");
    assert!(a.pool.ledger().verify().is_ok());
}

/// A flood of `n` datagrams from the client, as fast as its kernel sends them (the answers
/// are not read).
/// Datagrams to the queue until `stop` is set, `n` at most: a flood that lasts as long as
/// the test needs it, however slow the build under test turns.
fn flood(
    net: &VethPair,
    n: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> NsThread<()> {
    net.client_ns()
        .spawn(move || {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            for k in 0..n {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let _ = s.send_to(&(k as u32).to_be_bytes(), (SERVER, PORT));
            }
        })
        .unwrap()
}

#[test]
fn a_hand_over_in_the_middle_of_a_flood_loses_no_frame() {
    if !corelane_testnet::require_root("a_hand_over_in_the_middle_of_a_flood") {
        return;
    }
    let (lab, mut a) = lab();
    let (net, mut steering) = (&lab.net, lab.steering);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = flood(net, 5_000_000, stop.clone());
    // Frames fly both ways while the queue is offered, joined, handed over, and steered to
    // the new socket, back to the old one, and to the new one again.
    let turn = |qs: &mut [&mut XskQueue]| {
        for q in qs.iter_mut() {
            echo(q);
            q.complete().unwrap();
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while a.stats().rx_frames < 2000 && !f.is_finished() {
        turn(&mut [&mut a]);
    }
    let mut b = join_turning(net, &mut a, |a| turn(&mut [a]));
    let mut steps = [b.fd(), a.fd(), b.fd()].into_iter();
    let mut next_at = 0;
    let mut done_at = None;
    while !f.is_finished() && std::time::Instant::now() < deadline {
        let seen = a.stats().rx_frames + b.stats().rx_frames;
        if seen >= next_at {
            match steps.next() {
                Some(fd) => {
                    steering.register(0, fd).unwrap();
                    next_at = seen + 300;
                }
                // The last change made: 300 frames more under it, then the flood ends.
                None if done_at.is_none() => done_at = Some(seen + 300),
                None => {}
            }
        }
        if done_at.is_some_and(|d| seen >= d) {
            break;
        }
        turn(&mut [&mut a, &mut b]);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    f.join().unwrap();
    // What was still on its way is received before the frames are counted.
    for _ in 0..200 {
        turn(&mut [&mut a, &mut b]);
    }
    assert_eq!(
        steps.count(),
        0,
        "every change of socket made under the flood"
    );
    assert!(
        b.stats().rx_frames > 0 && a.stats().rx_frames > 2000,
        "both received: {:?} {:?}",
        a.stats(),
        b.stats()
    );
    // Settle, then the old process leaves and the new one answers every request.
    steering.register(0, b.fd()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        turn(&mut [&mut a, &mut b]);
        if a.leave_upgrade().unwrap() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{:?}", a.counts());
    }
    drop(a);
    let seen = pump(client(net, 'q', 100, 0), &mut [&mut b], |_| {});
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('q', 100));
    b.complete().unwrap();
    let c = b.counts();
    assert_eq!((c.away, c.in_use, c.sum()), (0, 0, 256), "{c:?}");
    assert!(b.pool.ledger().verify().is_ok());
}

/// One frame of junk from `q` (60 bytes to no one: the client's kernel drops it), left in
/// flight: sent, its completion not yet read.
fn send_junk(q: &mut XskQueue) {
    let mut f = Vec::new();
    assert_eq!(q.alloc(&mut f, 1), 1);
    q.bytes_mut(&mut f[0], 60).fill(0);
    assert_eq!(q.send(&mut f).unwrap(), 1);
}

#[test]
fn an_upgrade_called_off_while_the_new_process_lives_waits_for_it_to_stand_down() {
    if !corelane_testnet::require_root("an_upgrade_called_off_while_the_new_process_lives") {
        return;
    }
    let (lab, mut a) = lab();
    let net = &lab.net;
    let mut b = join(net, &mut a);
    assert_eq!(frames_in_two_hands(&a, &b), Vec::<usize>::new());
    // The new process fills and completes for both while the old one serves; after every
    // turn, each frame is in one place.
    let seen = pump(client(net, 'c', 20, 0), &mut [&mut a, &mut b], one_place);
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('c', 20));
    // The new process has a send in flight when the old one calls the upgrade off (it did
    // not say `joined` in time): the rings stay the new one's.
    send_junk(&mut b);
    assert_eq!(a.call_off_upgrade(false).unwrap(), CallOff::Waiting);
    assert_eq!(a.upgrade_phase(), Some(UpgradePhase::Aborting));
    assert!(!a.owns_rings);
    // Its next turn stops it filling and sending, but its send is not complete yet: it has not
    // stood down, and the old process still waits (a frame the kernel reads is never free).
    b.stand_down();
    assert!(!b.upgrade_called_off());
    assert_eq!(a.call_off_upgrade(false).unwrap(), CallOff::Waiting);
    assert!(!b.may_send());
    let mut none = Vec::new();
    assert_eq!(
        b.alloc(&mut none, 1),
        0,
        "no frame for a process standing down"
    );
    // Its send completes on its next turn: it stands down and says so.
    for _ in 0..1000 {
        b.complete().unwrap();
        if b.upgrade_called_off() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(b.upgrade_called_off(), "{:?}", b.counts());
    assert_eq!(frames_in_two_hands(&a, &b), Vec::<usize>::new());
    assert_eq!(a.upgrade_phase(), Some(UpgradePhase::Aborted));
    let Ok(CallOff::Reclaimed(_)) = a.call_off_upgrade(false) else {
        panic!("not taken back: {:?}", a.upgrade_phase());
    };
    assert!(a.owns_rings && a.upgrade_phase().is_none());
    // The new process lives on and turns, and touches nothing: the old one serves every
    // request, and once the fill ring has cycled every frame is its own, each in one place.
    assert_eq!(frames_in_two_hands(&a, &b), Vec::<usize>::new());
    let seen = pump(client(net, 'k', 80, 0), &mut [&mut a, &mut b], one_place);
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('k', 80));
    let mut got = VecDeque::new();
    assert_eq!((b.recv(&mut got, 64), b.complete().unwrap()), (0, 0));
    a.complete().unwrap();
    let c = a.counts();
    assert_eq!((c.away, c.sum()), (0, 256), "{c:?}");
    assert!(a.pool.ledger().verify().is_ok());
}

#[test]
fn an_upgrade_called_off_before_the_new_process_took_the_rings_ends_at_once() {
    if !corelane_testnet::require_root("an_upgrade_called_off_before_the_new_process_took") {
        return;
    }
    let (lab, mut a) = lab();
    let net = &lab.net;
    // The new process bound its socket (its `build`) and has not started its cores yet.
    let offer = a.offer_upgrade().unwrap();
    let ifname = net.server_if().to_string();
    let pending = net
        .server_ns()
        .run(move || PendingJoin::bind(&ifname, offer))
        .unwrap()
        .unwrap();
    // The old process still fills meanwhile, and serves.
    let seen = pump(client(net, 'p', 10, 0), &mut [&mut a], |_| {});
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('p', 10));
    assert!(a.owns_rings);
    // Called off: the queue is the old process's at once, and the new one cannot take it.
    assert_eq!(a.call_off_upgrade(false).unwrap(), CallOff::Reclaimed(0));
    let e = net
        .server_ns()
        .run(move || pending.take_over().map(|_| ()))
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("called the upgrade off"), "{e}");
    let seen = pump(client(net, 'q', 10, 0), &mut [&mut a], |_| {});
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('q', 10));
    // A later upgrade is offered afresh.
    let b = join(net, &mut a);
    assert_eq!(b.upgrade_phase(), Some(UpgradePhase::Handed));
}

/// After a turn of both: no frame in both processes' hands.
fn one_place(qs: &mut [&mut XskQueue]) {
    let both = frames_in_two_hands(qs[0], qs[1]);
    assert!(both.is_empty(), "frames in two hands: {both:?}");
}

#[test]
fn the_ledgers_see_a_queue_taken_back_while_the_new_process_still_holds_it() {
    if !corelane_testnet::require_root("the_ledgers_see_a_queue_taken_back") {
        return;
    }
    let (lab, mut a) = lab();
    let net = &lab.net;
    let mut b = join(net, &mut a);
    let seen = pump(client(net, 'r', 10, 0), &mut [&mut a, &mut b], one_place);
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), names('r', 10));
    // What a call-off did before it waited for the new process: the queue taken back at once
    // while the new process lives with frames in its hands (its free frames, the ring it
    // fills). The two ledgers show it.
    a.reclaim_upgrade().unwrap();
    let both = frames_in_two_hands(&a, &b);
    assert!(!both.is_empty(), "{:?} {:?}", a.counts(), b.counts());
}
