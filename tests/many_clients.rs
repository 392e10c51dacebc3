//! Five thousand client addresses on the link at once: each holds a TCP connection to the
//! echo server and gets a UDP answer, so the server's neighbour table holds thousands of
//! peers without forgetting the ones still in use.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use common::*;
use corelane_testnet::{VethPair, require_root};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const CLIENTS: u32 = 5000;

/// Lets this process hold `n` open files, within its hard limit.
fn allow_files(n: u64) -> std::io::Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a valid rlimit struct into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_max < n {
        return Err(std::io::Error::other(format!(
            "this test needs {n} open files and the hard limit is {}",
            lim.rlim_max
        )));
    }
    lim.rlim_cur = lim.rlim_cur.max(n);
    // SAFETY: setrlimit reads a valid rlimit struct; it changes only this process's limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn five_thousand_client_addresses_hold_connections_and_get_udp_answers() -> Result {
    if !require_root("5000 client addresses") {
        return Ok(());
    }
    allow_files(u64::from(CLIENTS) + 1024)?;
    let net = VethPair::builder()
        .server_addr("10.78.0.1/16")
        .client_addr("10.78.0.2/16")
        .build()?;
    let addrs: Vec<Ipv4Addr> = (0..CLIENTS)
        .map(|i| Ipv4Addr::new(10, 78, 1 + (i / 250) as u8, 1 + (i % 250) as u8))
        .collect();
    let batch: String = addrs
        .iter()
        .map(|a| format!("addr add {a}/16 dev {}\n", net.client_if()))
        .collect();
    net.client_ns().ip_batch(&batch)?;
    let echo = Echo::start(
        &net,
        &["--addr", "10.78.0.3/16", "--port", "7", "--cores", "1"],
    );
    let server = SocketAddr::from(([10, 78, 0, 3], 7));
    let report = net
        .client_ns()
        .run(move || -> std::io::Result<(usize, usize)> {
            let mut conns = Vec::with_capacity(addrs.len());
            for a in &addrs {
                let s = socket2_connect(*a, server)?;
                conns.push(s);
            }
            // Every connection is alive: one byte each way on each.
            let mut echoed = 0;
            for s in &mut conns {
                s.write_all(b"x")?;
                let mut b = [0u8; 1];
                s.read_exact(&mut b)?;
                echoed += usize::from(b[0] == b'x');
            }
            // A UDP answer to each address.
            let mut answered = 0;
            for a in &addrs {
                let u = UdpSocket::bind((*a, 0))?;
                u.set_read_timeout(Some(Duration::from_millis(500)))?;
                let mut b = [0u8; 8];
                for _ in 0..5 {
                    u.send_to(b"ping", server)?;
                    if let Ok((4, _)) = u.recv_from(&mut b) {
                        answered += 1;
                        break;
                    }
                }
            }
            drop(conns);
            Ok((echoed, answered))
        })??;
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert_eq!(
        report,
        (CLIENTS as usize, CLIENTS as usize),
        "(echoed, answered):\n{out}"
    );
    // Every client's address was learnt and kept (none forgotten to make room).
    let known: u64 = out
        .lines()
        .find(|l| l.starts_with("ip: "))
        .and_then(|l| l.split("; ").last()?.split(' ').next()?.parse().ok())
        .ok_or_else(|| format!("no neighbour count:\n{out}"))?;
    assert!(
        known >= u64::from(CLIENTS),
        "{known} neighbours known:\n{out}"
    );
    Ok(())
}

/// A TCP connection from source address `from` to `to`.
fn socket2_connect(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    // std has no bind-before-connect: do it with libc on a raw socket, then hand it over.
    use std::os::fd::FromRawFd;
    // SAFETY: socket() has no memory effects; the fd is owned by the TcpStream below or closed.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket this function owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let sin = |a: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let local = sin(from, 0);
    // SAFETY: `local` is a valid sockaddr_in of `len` bytes for the duration of the call.
    if unsafe { libc::bind(fd, (&raw const local).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let SocketAddr::V4(to) = to else {
        return Err(std::io::Error::other("IPv4 only"));
    };
    let remote = sin(*to.ip(), to.port());
    // SAFETY: as above.
    if unsafe { libc::connect(fd, (&raw const remote).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(stream)
}
