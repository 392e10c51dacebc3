//! The datapath end to end, as root: the echo example on one end of a veth pair, the kernel's
//! TCP/IP stack on the other. Each test makes its own namespaces and removes them.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::Duration;

use common::*;
use corelane_testnet::require_root;

fn v4(port: u16) -> SocketAddr {
    format!("{SERVER_V4}:{port}").parse().unwrap()
}

fn v6(port: u16) -> SocketAddr {
    format!("[{SERVER_V6}]:{port}").parse().unwrap()
}

#[test]
fn datapath_tcp_echo_64_mib_comes_back_byte_for_byte() {
    if !require_root("datapath_tcp_echo_64_mib") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let out = echo.output();
    assert!(out.contains("XDP program attached in native mode"), "{out}");
    assert!(out.contains("copy mode"), "{out}");
    let link = net.server_link().unwrap();
    assert!(
        link.contains("xdp") && link.contains("corelane_steer"),
        "{link}"
    );

    assert_echoes(&net, v4(7), 64 << 20, 1);

    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert_no_xdp(&net);
}

#[test]
fn datapath_200_concurrent_connections_each_echo_64_kib() {
    if !require_root("datapath_200_concurrent_connections") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let results = net
        .client_ns()
        .run(|| {
            // Open all 200 first, so they are concurrent, then echo on each from its own thread.
            let conns: Vec<_> = (0..200).map(|_| connect(v4(7)).expect("connect")).collect();
            let handles: Vec<_> = conns
                .into_iter()
                .enumerate()
                .map(|(i, mut s)| {
                    std::thread::spawn(move || {
                        let data = payload(64 * 1024, i as u64 + 7);
                        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                        let mut r = s.try_clone().unwrap();
                        let rd = std::thread::spawn(move || {
                            let mut back = vec![0u8; 64 * 1024];
                            r.read_exact(&mut back).map(|_| back)
                        });
                        s.write_all(&data).unwrap();
                        let back = rd.join().unwrap().expect("read echo");
                        back == data
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<bool>>()
        })
        .unwrap();
    assert_eq!(results.len(), 200);
    assert_eq!(results.iter().filter(|ok| **ok).count(), 200);
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert!(out.contains("200 accepted"), "{out}");
}

#[test]
fn datapath_udp_echo() {
    if !require_root("datapath_udp_echo") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let echoed = net
        .client_ns()
        .run(|| {
            let s = UdpSocket::bind("10.77.0.2:0").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let mut ok = 0;
            let mut buf = [0u8; 2048];
            for i in 0..100u32 {
                let msg = payload(100 + i as usize * 13, u64::from(i));
                // The first datagram may wait on ARP; retry each a few times.
                for _ in 0..5 {
                    s.send_to(&msg, v4(7)).unwrap();
                    if let Ok((n, from)) = s.recv_from(&mut buf)
                        && from == v4(7)
                        && buf[..n] == msg[..]
                    {
                        ok += 1;
                        break;
                    }
                }
            }
            ok
        })
        .unwrap();
    assert_eq!(echoed, 100);
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
}

#[test]
fn datapath_ipv6_tcp_and_udp_echo() {
    if !require_root("datapath_ipv6_echo") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24", "--addr", "fd00:77::3/64"]);
    assert_echoes(&net, v6(7), 4 << 20, 3);
    let udp_ok = net
        .client_ns()
        .run(|| {
            let s = UdpSocket::bind("[fd00:77::2]:0").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let mut buf = [0u8; 256];
            (0..5).any(|_| {
                s.send_to(b"over ipv6", v6(7)).unwrap();
                matches!(s.recv_from(&mut buf), Ok((9, _))) && &buf[..9] == b"over ipv6"
            })
        })
        .unwrap();
    assert!(udp_ok, "no UDP echo over IPv6");
    // The client learned corelane's IPv6 address by NDP, answered by the stack.
    let neigh = net
        .client_ns()
        .ip(&["-6", "neigh", "show", SERVER_V6])
        .unwrap();
    assert!(neigh.contains("lladdr"), "no neighbour entry: {neigh}");
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
}

#[test]
fn datapath_kernel_services_on_the_same_veth_keep_working() {
    if !require_root("datapath_kernel_services") {
        return;
    }
    let net = net(1);
    // Kernel listeners in the server namespace: on corelane's port but the kernel's address,
    // and on a port corelane does not own.
    let ready = std::sync::Arc::new(std::sync::Barrier::new(2));
    let r2 = ready.clone();
    let kernel = net
        .server_ns()
        .spawn(move || {
            let a = TcpListener::bind("10.77.0.1:7").unwrap();
            let b = TcpListener::bind("10.77.0.1:5001").unwrap();
            r2.wait();
            let mut served = 0;
            for l in [a, b] {
                let (mut s, _) = l.accept().unwrap();
                s.write_all(b"kernel").unwrap();
                served += 1;
            }
            served
        })
        .unwrap();
    ready.wait();
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);

    let ping = net
        .client_ns()
        .exec("ping", &["-c", "3", "-i", "0.2", "-W", "2", "10.77.0.1"])
        .expect("ping the kernel's address");
    assert!(ping.contains(" 0% packet loss"), "{ping}");

    let greetings = net
        .client_ns()
        .run(|| {
            ["10.77.0.1:7", "10.77.0.1:5001"]
                .iter()
                .map(|a| {
                    let mut s = connect(a.parse().unwrap()).unwrap();
                    let mut g = String::new();
                    s.read_to_string(&mut g).unwrap();
                    g
                })
                .collect::<Vec<_>>()
        })
        .unwrap();
    assert_eq!(greetings, vec!["kernel", "kernel"]);
    assert_eq!(kernel.join().unwrap(), 2);

    // And corelane still serves its own address meanwhile.
    assert_echoes(&net, v4(7), 1 << 20, 9);
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert!(
        xdp_counter(&out, "passed") > 0,
        "the XDP program passed nothing:\n{out}"
    );
}

#[test]
fn datapath_arp_is_answered_by_the_stack() {
    if !require_root("datapath_arp") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let link = net.server_link().unwrap();
    let mac = link
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("server MAC")
        .to_string();
    // The kernel does not hold 10.77.0.3, so only corelane can answer ARP for it.
    net.client_ns()
        .exec("ping", &["-c", "1", "-W", "1", SERVER_V4])
        .ok();
    let neigh = net.client_ns().ip(&["neigh", "show", SERVER_V4]).unwrap();
    assert!(
        neigh.contains(&mac),
        "ARP for {SERVER_V4} unanswered: `{neigh}` (want {mac})"
    );
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
}

#[test]
fn datapath_stop_detaches_everything() {
    if !require_root("datapath_stop_detaches") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    // Leave a connection open across the stop.
    let held = net
        .client_ns()
        .run(|| {
            let mut s = connect(v4(7)).unwrap();
            s.write_all(b"still here").unwrap();
            let mut b = [0u8; 10];
            s.read_exact(&mut b).unwrap();
            s
        })
        .unwrap();
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert_no_xdp(&net);
    drop(held);
}

#[test]
fn datapath_every_queue_of_a_multi_queue_veth_is_served() {
    if !require_root("datapath_multi_queue") {
        return;
    }
    let net = net(2);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let out = echo.output();
    assert!(out.contains("native mode"), "{out}");
    assert!(
        out.contains("lane 0: queue 0 -> protocol and application on CPU 0")
            && out.contains("lane 1: queue 1 -> protocol and application on CPU 1"),
        "{out}"
    );
    // Each kernel socket picks its transmit queue at random, so 60 connections land on both.
    let ok = net
        .client_ns()
        .run(|| {
            (0..60)
                .filter(|&i| {
                    let data = payload(32 * 1024, 100 + i);
                    let want = sha256(&data);
                    matches!(tcp_echo(v4(7), &data), Ok((got, _)) if got == want)
                })
                .count()
        })
        .unwrap();
    assert_eq!(ok, 60);
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert_eq!(
        xdp_counter(&out, "no-socket"),
        0,
        "frames fell through to the kernel:\n{out}"
    );
    let total = out.lines().find(|l| l.starts_with("frames:")).unwrap();
    assert!(
        total.starts_with("frames: 8192 total"),
        "two UMEMs of 4096: {total}"
    );
}
