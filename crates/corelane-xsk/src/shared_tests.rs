//! Tests of shared.rs: the kernel's socket tables read, and placeholders held and refused.

use super::*;
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, UdpSocket};

#[test]
fn the_kernel_s_tables_are_read_in_both_families() {
    let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   \
             uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 \
             00:00000000 00000000     0        0 12345 1 0 100 0 0 10 0\n   1: \
             0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0 \
             0 777 1\n";
    let v = parse_table(t, Proto::Tcp);
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].local, "127.0.0.1:8080".parse().unwrap());
    assert!(v[0].listening);
    assert_eq!(v[0].inode, 12345);
    assert_eq!(v[1].local, "127.0.0.1:50000".parse().unwrap());
    assert!(!v[1].listening);
    let t6 = "header\n 0: 00000000000000000000000001000000:0016 \
              00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 \
              00000000 0 0 99 1\n";
    let v = parse_table(t6, Proto::Tcp);
    assert_eq!(v[0].local, SocketAddr::new(Ipv6Addr::LOCALHOST.into(), 22));
    assert!(parse_table("header\n 0: nonsense\n", Proto::Udp).is_empty());
}

#[test]
fn a_port_a_kernel_socket_holds_is_refused_naming_its_process() {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let at = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let e = hold(&at, Proto::Tcp, port).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::KernelPort(_)), "{msg}");
    assert!(
        msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    assert!(msg.contains("listens on"), "{msg}");
    drop(l);
    // Freed: held now, and the kernel cannot hand the port out while it is.
    let held = hold(&at, Proto::Tcp, port).unwrap();
    assert!(TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err());
    // Another placeholder (an upgrade's new process) binds it too.
    let again = hold(&at, Proto::Tcp, port).unwrap();
    drop((held, again));
    assert!(TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok());
}

#[test]
fn a_udp_placeholder_keeps_a_kernel_socket_off_its_port() {
    let u = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = u.local_addr().unwrap().port();
    let at = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let msg = hold(&at, Proto::Udp, port).unwrap_err().to_string();
    assert!(msg.contains("is bound to"), "{msg}");
    drop(u);
    let held = hold(&at, Proto::Udp, port).unwrap();
    assert!(UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_err());
    drop(held);
}

/// Sharing and unsharing an address again and again: its placeholders go with it each time,
/// where they stayed until their ports were released (a cycle of `addr`/`unaddr` requests grew
/// the process's descriptors without bound).
#[test]
fn an_address_shared_and_unshared_again_and_again_holds_its_placeholders_once() {
    let probe = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let mut s = SharedPorts::default();
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    for _ in 0..50 {
        s.add(lo, [(Proto::Udp, port)].into_iter()).unwrap();
        assert_eq!(s.placeholders(), 1);
        s.remove(lo);
        assert_eq!(s.placeholders(), 0);
    }
    // Held on two addresses: unsharing one leaves the other's.
    let lo2 = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    s.add(lo, [(Proto::Udp, port)].into_iter()).unwrap();
    s.add(lo2, [(Proto::Udp, port)].into_iter()).unwrap();
    assert_eq!(s.placeholders(), 2);
    s.remove(lo);
    assert_eq!(s.placeholders(), 1);
    // A kernel socket cannot take the port on the address still shared.
    assert!(UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 2), port)).is_err());
    s.release(Proto::Udp, port);
    assert_eq!(s.placeholders(), 0);
}

/// Holding more ports than the soft descriptor limit allows: it is raised to the hard limit and
/// every port is held (before, the bind failed with "Too many open files" and nothing said
/// which limit). Run in a child process of this test binary: the limit is the process's.
#[test]
#[allow(unsafe_code)] // getrlimit(2) and setrlimit(2), in the child process alone.
fn placeholders_past_the_soft_descriptor_limit_raise_it() {
    const CHILD: &str = "CORELANE_PLACEHOLDER_LIMIT_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "shared::tests::placeholders_past_the_soft_descriptor_limit_raise_it",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(text.contains("held 64 past a soft limit of"), "{text}");
        return;
    }
    // Free ports, found before the limit is lowered (the probes would hit it).
    let ports: Vec<u16> = (0..64)
        .map(|_| {
            let probe = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            probe.local_addr().unwrap().port()
        })
        .collect();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid rlimit, in this child process alone.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let low = libc::rlimit {
            rlim_cur: open + 8,
            rlim_max: lim.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &low), 0);
    }
    let lo = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let mut held = Vec::new();
    for port in ports {
        held.extend(hold(&lo, Proto::Udp, port).unwrap());
    }
    println!("held {} past a soft limit of {}", held.len(), open + 8);
}
