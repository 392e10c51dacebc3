//! Port 0 on the kernel's own address (`Builder::share_kernel_addrs`): the port corelane picks
//! may be one a kernel socket holds, which corelane cannot take (`AddrInUse`, naming the
//! socket); a bind of port 0 passes such ports and picks another, for TCP listeners (the same
//! port on every core) and for UDP sockets (a port of the core's own). The kernel's sockets
//! keep their ports and are served by the kernel throughout.

mod common;
mod shared;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use common::*;
use corelane_testnet::{NsThread, VethPair, require_root};
use shared::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a core's binds of port 0 gave: their ports, or the error.
type Binds = Result<Vec<u16>, String>;
/// The thread a runtime runs on, and its report.
type RunThread = NsThread<Result<corelane::RunReport, String>>;

/// A runtime of `cores` cores on the server end, sharing the kernel's address, each core
/// running `serve(ports, done)` until `done`; the thread it runs on.
fn shared_runtime<Fut>(
    net: &VethPair,
    cores: usize,
    serve: impl Fn(Sender<Binds>, Arc<AtomicBool>) -> Fut + Send + Sync + 'static,
) -> (Receiver<Binds>, Arc<AtomicBool>, RunThread)
where
    Fut: Future<Output = ()> + 'static,
{
    let ifname = net.server_if().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let core_done = done.clone();
    let runtime = net
        .server_ns()
        .spawn(move || {
            let rt = corelane::Runtime::builder(&ifname)
                .addr("10.77.0.1/24")
                .share_kernel_addrs(true)
                .cores(cores)
                .build()
                .map_err(|e| e.to_string())?;
            rt.run(|_| serve(tx.clone(), core_done.clone()))
                .map_err(|e| e.to_string())
        })
        .expect("spawn the runtime");
    (rx, done, runtime)
}

/// What each of `cores` cores sent: the ports it bound.
fn ports_of(
    rx: &std::sync::mpsc::Receiver<Result<Vec<u16>, String>>,
    cores: usize,
) -> Vec<Vec<u16>> {
    (0..cores)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(30))
                .expect("each core's binds")
                .expect("port 0 bound")
        })
        .collect()
}

#[test]
fn a_listener_on_port_zero_passes_the_ports_kernel_sockets_hold() {
    if !require_root("shared address, TCP port 0") {
        return;
    }
    let net = net(2);
    // The first two ports port 0 would pick are the kernel's.
    let first = KernelEcho::start(net.server_ns(), at(20_000));
    let second = KernelEcho::start(net.server_ns(), at(20_001));
    let (rx, done, runtime) = shared_runtime(&net, 2, |tx, done| async move {
        let l = match corelane::net::TcpListener::bind(0).await {
            Ok(l) => l,
            Err(e) => return tx.send(Err(e.to_string())).unwrap(),
        };
        tx.send(Ok(vec![l.local_addr().unwrap().port()])).unwrap();
        while !done.load(Ordering::Relaxed) {
            let wait = Duration::from_millis(50);
            let Ok(Ok((mut s, _))) = tokio::time::timeout(wait, l.accept()).await else {
                continue;
            };
            tokio::task::spawn_local(async move {
                let mut b = [0u8; 4096];
                while let Ok(n @ 1..) = s.read(&mut b).await {
                    if s.write_all(&b[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    // Both cores on the same port, the first one no kernel socket holds.
    assert_eq!(ports_of(&rx, 2), [[20_002], [20_002]]);
    let client = net.client_ns();
    for seed in 0..4 {
        client
            .run(move || exchange(at(20_002), 3000, seed))
            .unwrap()
            .expect("corelane serves the port it picked");
        for kernel in [20_000, 20_001] {
            client
                .run(move || exchange(at(kernel), 3000, seed))
                .unwrap()
                .expect("the kernel keeps its ports");
        }
    }
    done.store(true, Ordering::Relaxed);
    let report = runtime.join().expect("runtime thread").expect("the run");
    assert!(report.frames_balanced(), "{report:?}");
    assert_eq!((first.served(4), second.served(4)), (4, 4));
}

#[test]
fn a_udp_socket_on_port_zero_passes_the_ports_kernel_sockets_hold() {
    if !require_root("shared address, UDP port 0") {
        return;
    }
    let net = net(1);
    // A quarter of the ports a one-core runtime draws UDP's port 0 from (the ephemeral
    // range), held by the kernel: 24 binds that took the first draw would each have met one
    // with a chance of 1 in 4 (all 24 missing them: 1 in 1,000).
    let kernel_held = |p: u16| p.is_multiple_of(4);
    let held: Vec<std::net::UdpSocket> = net
        .server_ns()
        .run(move || {
            (corelane_stack::EPHEMERAL_START..=u16::MAX)
                .filter(|&p| kernel_held(p))
                .map(|p| std::net::UdpSocket::bind(at(p)).expect("a kernel UDP socket"))
                .collect()
        })
        .expect("the server namespace");
    assert_eq!(
        held.len(),
        (65_536 - corelane_stack::EPHEMERAL_START as usize) / 4
    );
    let (rx, done, runtime) = shared_runtime(&net, 1, |tx, done| async move {
        let mut socks = Vec::new();
        for _ in 0..24 {
            match corelane::net::UdpSocket::bind(0).await {
                Ok(s) => socks.push(s),
                Err(e) => return tx.send(Err(e.to_string())).unwrap(),
            }
        }
        tx.send(Ok(socks.iter().map(|s| s.local_port()).collect()))
            .unwrap();
        for s in socks {
            let done = done.clone();
            tokio::task::spawn_local(async move {
                let mut b = [0u8; 64];
                while !done.load(Ordering::Relaxed) {
                    let wait = Duration::from_millis(50);
                    if let Ok(Ok((n, from))) = tokio::time::timeout(wait, s.recv_from(&mut b)).await
                    {
                        let _ = s.send_to(&b[..n], from).await;
                    }
                }
            });
        }
        while !done.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let ports = ports_of(&rx, 1).remove(0);
    assert_eq!(ports.len(), 24);
    let taken: Vec<u16> = ports.iter().copied().filter(|&p| kernel_held(p)).collect();
    assert!(
        taken.is_empty(),
        "ports the kernel holds: {taken:?} of {ports:?}"
    );
    for &p in &ports {
        net.client_ns()
            .run(move || udp_echo(SocketAddr::new(KERNEL.parse().unwrap(), p)))
            .unwrap()
            .unwrap_or_else(|e| panic!("port {p} served: {e}"));
    }
    done.store(true, Ordering::Relaxed);
    let report = runtime.join().expect("runtime thread").expect("the run");
    assert!(report.frames_balanced(), "{report:?}");
    drop(held);
}
