//! An upgrade between two real processes, with every layer below the runtime: the old process
//! (this test) offers both queues of a two-queue veth and shares the program over a unix
//! socket (`send_handover`); the new one (this test binary run again, inside the server's
//! namespace) adopts the program, joins each queue, and registers its sockets as generation 1.
//! Datagrams then go to the new process on both queues while the old one sends its own; the
//! old one drains, leaves and exits its part; the new one serves on alone, with the program
//! still attached by its link, and ends holding every frame of both UMEMs.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use corelane_testnet::{NsThread, VethPair, require_root};
use corelane_xsk::grant::{
    accept, listen_at, open_connection, recv_message, send_message, set_read_deadline,
};
use corelane_xsk::{
    AttachMode, Frame, FrameIo, Handover, Proto, Steering, UpgradePhase, XskConfig, XskFrame,
    XskQueue, ZeroCopy, recv_handover, send_handover,
};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 95, 0, 1);
const PORT: u16 = 9000;
const TEST: &str = "a_queue_and_its_program_pass_to_another_process_under_traffic";
/// Set in the new process: the unix socket the old one listens on.
const CHILD: &str = "CORELANE_TEST_UPGRADE_SOCKET";

fn turn_around(f: &mut [u8]) {
    for (a, b, n) in [(0, 6, 6), (26, 30, 4), (34, 36, 2)] {
        for k in 0..n {
            f.swap(a + k, b + k);
        }
    }
}

/// Echoes what waits on `q`'s RX ring; returns how many.
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

/// The client, from `port`: `n` requests `"{tag}NN"` one at a time, each waiting for its echo (3 s at
/// most); then waits until `extra` datagrams of the old process's own ("oNN") have come.
/// Returns the echoes and the old process's datagrams it saw.
fn client(
    net: &VethPair,
    port: u16,
    tag: char,
    n: usize,
    extra: usize,
) -> NsThread<(usize, usize)> {
    net.client_ns()
        .spawn(move || {
            let s = UdpSocket::bind(("0.0.0.0", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let (mut echoed, mut old) = (0, 0);
            let mut buf = [0u8; 64];
            'requests: for k in 0..n {
                let want = format!("{tag}{k:02}");
                s.send_to(want.as_bytes(), (SERVER, PORT)).unwrap();
                loop {
                    let Ok(m) = s.recv(&mut buf) else {
                        break 'requests;
                    };
                    if buf[0] == b'o' {
                        old += 1;
                    } else if buf[..m] == *want.as_bytes() {
                        echoed += 1;
                        break;
                    }
                }
            }
            while old < extra && s.recv(&mut buf).is_ok() {
                old += usize::from(buf[0] == b'o');
            }
            (echoed, old)
        })
        .unwrap()
}

/// The new process: adopts, joins, registers, echoes until told to finish, then reports its
/// frames.
fn new_process(sock: &Path, ifname: &str) {
    let conn = open_connection(sock).unwrap();
    let mut h: Handover = recv_handover(conn.as_fd()).unwrap();
    let mut steering = Steering::adopt(ifname, h.steering.unwrap()).unwrap();
    let mut qs = Vec::new();
    for offer in h.queues.drain(..) {
        let q = XskQueue::join_upgrade(ifname, offer).unwrap();
        steering.register_in(1, q.queue_id(), q.fd()).unwrap();
        qs.push(q);
    }
    send_message(conn.as_raw_fd(), "joined", None).unwrap();
    set_read_deadline(&conn, Some(Duration::from_millis(1))).unwrap();
    let mut echoed = vec![0; qs.len()];
    loop {
        for (q, n) in qs.iter_mut().zip(&mut echoed) {
            *n += echo(q);
            q.complete().unwrap();
        }
        match recv_message(conn.as_raw_fd()) {
            Ok(Some((text, _))) if text == "finish" => break,
            Ok(Some((text, _))) => panic!("unexpected {text:?}"),
            Ok(None) => panic!("the old process closed the connection early"),
            Err(_) => {}
        }
    }
    let report: Vec<String> = qs
        .iter_mut()
        .zip(&echoed)
        .map(|(q, n)| {
            q.complete().unwrap();
            let c = q.counts();
            format!(
                "queue {} echoed {n} away {} sum {} total {} phase {:?}",
                q.queue_id(),
                c.away,
                c.sum(),
                c.total,
                q.upgrade_phase()
            )
        })
        .collect();
    let report = report.join("; ");
    send_message(conn.as_raw_fd(), &report, None).unwrap();
}

#[test]
fn a_queue_and_its_program_pass_to_another_process_under_traffic() {
    if let Some(sock) = std::env::var_os(CHILD) {
        let ifname = std::env::var("CORELANE_TEST_UPGRADE_IFNAME").unwrap();
        new_process(Path::new(&sock), &ifname);
        return;
    }
    if !require_root(TEST) {
        return;
    }
    let net = VethPair::builder()
        .server_addr("10.95.0.1/24")
        .client_addr("10.95.0.2/24")
        .queues(2)
        .build()
        .unwrap();
    let mac = net.server_ns().mac(net.server_if()).unwrap();
    let lladdr = mac.map(|b| format!("{b:02x}")).join(":");
    net.client_ns()
        .ip(&[
            "neigh",
            "replace",
            "10.95.0.1",
            "lladdr",
            &lladdr,
            "dev",
            net.client_if(),
        ])
        .unwrap();
    let ifname = net.server_if().to_string();
    net.server_ns().enter_current_thread().unwrap();
    let mut steering = Steering::attach(&ifname, AttachMode::Auto).unwrap();
    steering.own_addr(SERVER.into()).unwrap();
    steering.own_port(Proto::Udp, PORT).unwrap();
    let config = XskConfig {
        frames: 256,
        ring_size: 64,
        zero_copy: ZeroCopy::Off,
        ..XskConfig::default()
    };
    let mut a0 = XskQueue::open(&ifname, 0, &config).unwrap();
    let mut a1 = XskQueue::open(&ifname, 1, &config).unwrap();
    steering.register(0, a0.fd()).unwrap();
    steering.register(1, a1.fd()).unwrap();
    let pump = |qs: &mut [&mut XskQueue], until: &[&NsThread<(usize, usize)>]| {
        while !until.iter().all(|c| c.is_finished()) {
            for q in qs.iter_mut() {
                echo(q);
                q.complete().unwrap();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    };

    // A client port whose datagrams arrive on each queue (the veth picks the queue by the
    // flow's hash); the first one to queue 0 is kept, turned around, as the shape of the old
    // process's own datagrams.
    let mut ports: [Option<u16>; 2] = [None, None];
    let mut template = Vec::new();
    for port in 40000..40200 {
        if ports.iter().all(Option::is_some) {
            break;
        }
        net.client_ns()
            .run(move || {
                let s = UdpSocket::bind(("0.0.0.0", port)).unwrap();
                s.send_to(b"t00", (SERVER, PORT)).unwrap();
            })
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        'wait: while Instant::now() < deadline {
            for (k, q) in [&mut a0, &mut a1].into_iter().enumerate() {
                let mut got = VecDeque::new();
                q.recv(&mut got, 1);
                if let Some(f) = got.front() {
                    if k == 0 && template.is_empty() {
                        template.extend_from_slice(q.bytes(f));
                        turn_around(&mut template);
                    }
                    ports[k] = ports[k].or(Some(port));
                    q.release(&mut got.drain(..).collect());
                    break 'wait;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let [Some(p0), Some(p1)] = ports else {
        panic!("no client port reached each queue: {ports:?}");
    };

    // The old process alone: 5 echoes on each queue.
    let (c0, c1) = (client(&net, p0, 'p', 5, 0), client(&net, p1, 'q', 5, 0));
    pump(&mut [&mut a0, &mut a1], &[&c0, &c1]);
    assert_eq!((c0.join().unwrap(), c1.join().unwrap()), ((5, 0), (5, 0)));

    // The new process, started inside the server's namespace, is handed the program and the
    // queue.
    let dir = std::env::temp_dir().join(format!("corelane-upgrade-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("upgrade.sock");
    let listener = listen_at(&path, Duration::from_millis(50), 0o600).unwrap();
    let exe = std::env::current_exe().unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", net.server_ns().name()])
        .arg(&exe)
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD, &path)
        .env("CORELANE_TEST_UPGRADE_IFNAME", &ifname)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let conn: OwnedFd = loop {
        if let Some(c) = accept(&listener).unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline, "the new process never connected");
    };
    let h = Handover {
        steering: Some(steering.share().unwrap()),
        queues: vec![a0.offer_upgrade().unwrap(), a1.offer_upgrade().unwrap()],
    };
    send_handover(conn.as_fd(), &h).unwrap();
    drop(h);
    set_read_deadline(&conn, Some(Duration::from_millis(1))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        a0.complete().unwrap();
        a1.complete().unwrap();
        match recv_message(conn.as_raw_fd()) {
            Ok(Some((text, _))) if text == "joined" => break,
            Ok(Some((text, _))) => panic!("unexpected {text:?}"),
            Ok(None) => panic!("the new process closed the connection"),
            Err(_) => assert!(Instant::now() < deadline, "the new process never joined"),
        }
    }
    assert_eq!(a0.upgrade_phase(), Some(UpgradePhase::Handed));
    assert_eq!(a1.upgrade_phase(), Some(UpgradePhase::Handed));

    // Everything to the new generation; the old process sends 10 datagrams of its own meanwhile.
    steering.set_upgrade(1, true).unwrap();
    let spawned = Instant::now();
    let (c0, c1) = (client(&net, p0, 'n', 40, 10), client(&net, p1, 'm', 40, 0));
    let mut sent = 0;
    while !(c0.is_finished() && c1.is_finished()) {
        a0.complete().unwrap();
        a1.complete().unwrap();
        // Once the client's socket is surely up, one every few milliseconds.
        let due = spawned.elapsed().as_millis() / 5;
        if spawned.elapsed() > Duration::from_millis(100) && sent < 10 && due > sent as u128 {
            let mut f = Vec::new();
            if a0.alloc(&mut f, 1) == 1 {
                let b = a0.bytes_mut(&mut f[0], template.len());
                b.copy_from_slice(&template);
                b[40..42].fill(0);
                b[42..].copy_from_slice(format!("o{sent:02}").as_bytes());
                sent += a0.send(&mut f).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        (c0.join().unwrap(), c1.join().unwrap()),
        ((40, 10), (40, 0)),
        "echoes by the new process, datagrams of the old"
    );

    // The old process leaves both queues and lets go of the program; the new one's link
    // keeps it.
    let deadline = Instant::now() + Duration::from_secs(5);
    for a in [&mut a0, &mut a1] {
        while !a.leave_upgrade().unwrap() {
            a.complete().unwrap();
            assert!(
                Instant::now() < deadline,
                "the old process could not leave: {:?}",
                a.counts()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    drop(a0);
    drop(a1);
    drop(steering);
    let attached = || {
        net.server_ns()
            .ip(&["-d", "link", "show", "dev", &ifname])
            .unwrap()
            .contains("prog/xdp")
    };
    assert!(attached(), "the new process holds the program");
    let (c0, c1) = (client(&net, p0, 'z', 100, 0), client(&net, p1, 'y', 100, 0));
    assert_eq!(
        (c0.join().unwrap(), c1.join().unwrap()),
        ((100, 0), (100, 0)),
        "the new process serves alone"
    );
    send_message(conn.as_raw_fd(), "finish", None).unwrap();
    set_read_deadline(&conn, Some(Duration::from_secs(5))).unwrap();
    let (report, _) = recv_message(conn.as_raw_fd()).unwrap().unwrap();
    assert_eq!(
        report,
        "queue 0 echoed 140 away 0 sum 256 total 256 phase None; \
         queue 1 echoed 140 away 0 sum 256 total 256 phase None",
        "the new process's frames, the upgrade over on both queues"
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the new process failed");
    assert!(!attached(), "the last holder gone, the program is detached");
    let _ = std::fs::remove_dir_all(&dir);
}
