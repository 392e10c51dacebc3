//! Helpers of `tests/shared_address.rs`: the kernel's addresses on the test network, a kernel
//! echo listener in a namespace, and clients of corelane's and the kernel's ports.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::{payload, sha256, tcp_echo};

/// The kernel's address on the server end (from `common::net`).
pub const KERNEL: &str = "10.77.0.1";
/// The kernel's address on the client end.
pub const CLIENT: &str = "10.77.0.2";

pub fn at(port: u16) -> SocketAddr {
    SocketAddr::new(KERNEL.parse().unwrap(), port)
}

/// A kernel echo listener in namespace `ns` at `addr` (an sshd stands for it), serving until
/// `stop`; counts the connections it served.
pub struct KernelEcho {
    served: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<corelane_testnet::NsThread<()>>,
}

impl KernelEcho {
    pub fn start(ns: &corelane_testnet::Netns, addr: SocketAddr) -> KernelEcho {
        let served = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (served.clone(), stop.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = ns
            .spawn(move || {
                let l = TcpListener::bind(addr).expect("kernel listener");
                l.set_nonblocking(true).unwrap();
                tx.send(()).unwrap();
                while !st.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((mut c, _)) => {
                            c.set_nonblocking(false).unwrap();
                            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                            let s = s.clone();
                            std::thread::spawn(move || {
                                let mut b = [0u8; 4096];
                                while let Ok(n @ 1..) = c.read(&mut b) {
                                    if c.write_all(&b[..n]).is_err() {
                                        return;
                                    }
                                }
                                s.fetch_add(1, Ordering::Relaxed);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
            .expect("spawn in namespace");
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the kernel listener binds");
        KernelEcho {
            served,
            stop,
            thread: Some(thread),
        }
    }

    /// The connections served, once `want` have been or 5 s have passed (a connection counts
    /// once its client's end has closed, which may come after the client's last read).
    pub fn served(&self, want: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.served.load(Ordering::Relaxed) < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.served.load(Ordering::Relaxed)
    }
}

impl Drop for KernelEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One echo exchange of `len` bytes through `addr`; Err says what failed.
pub fn exchange(addr: SocketAddr, len: usize, seed: u64) -> Result<(), String> {
    let data = payload(len, seed);
    let (got, n) = tcp_echo(addr, &data).map_err(|e| format!("{addr}: {e}"))?;
    if n != len || got != sha256(&data) {
        return Err(format!("{addr}: echoed {n} of {len} bytes, or other bytes"));
    }
    Ok(())
}

/// `rounds` exchanges on each of `threads` threads in namespace `ns` to `addr`; the failures.
pub fn load(
    ns: &corelane_testnet::Netns,
    addr: SocketAddr,
    threads: u64,
    rounds: u64,
) -> Vec<corelane_testnet::NsThread<Vec<String>>> {
    (0..threads)
        .map(|t| {
            ns.spawn(move || {
                (0..rounds)
                    .filter_map(|i| {
                        exchange(addr, 1 + (i as usize * 997) % 20_000, t * 1000 + i).err()
                    })
                    .collect()
            })
            .expect("spawn load")
        })
        .collect()
}

pub fn failures(threads: Vec<corelane_testnet::NsThread<Vec<String>>>) -> Vec<String> {
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("load thread"))
        .collect()
}

pub fn assert_clean_exit_of(name: &str, status: std::process::ExitStatus, out: &str) {
    assert!(status.success(), "{name} failed ({status}):\n{out}");
    assert!(out.contains("XDP program detached"), "{out}");
}

/// A datagram to `to` and its echo, from `to`; up to five tries a second apart.
pub fn udp_echo(to: SocketAddr) -> std::io::Result<()> {
    let u = std::net::UdpSocket::bind((CLIENT, 0))?;
    u.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut b = [0u8; 64];
    for i in 0..5u8 {
        u.send_to(&[b'u', i], to)?;
        if let Ok((n, from)) = u.recv_from(&mut b) {
            if from != to || b[..n] != [b'u', i] {
                return Err(std::io::Error::other(format!("{n} bytes from {from}")));
            }
            return Ok(());
        }
    }
    Err(std::io::ErrorKind::TimedOut.into())
}

/// GET / over HTTP/1.1; the response's head and body.
pub fn http_get(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Whether the kernel of the server's namespace can bind TCP `port` of its address now (what
/// a kernel server starting there would get).
pub fn kernel_binds(net: &corelane_testnet::VethPair, port: u16) -> Result<(), std::io::ErrorKind> {
    net.server_ns()
        .run(move || TcpListener::bind(at(port)).map(drop))
        .expect("the server namespace")
        .map_err(|e| e.kind())
}
