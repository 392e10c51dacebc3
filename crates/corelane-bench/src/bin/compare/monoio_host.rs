//! The thread-per-core io_uring peer: a monoio server, one runtime per server CPU with
//! SO_REUSEPORT listeners, serving the same three ports the same way as the others (owned
//! buffers, as io_uring wants them). monoio rather than glommio: monoio builds from crates.io
//! alone on stable Rust with no system library, and its io_uring driver runs on this kernel,
//! so one of the two was enough to stand for the thread-per-core io_uring design.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use corelane_bench::pin;
use corelane_testnet::VethPair;
use monoio::buf::IoBuf;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{ListenerOpts, TcpListener, TcpStream};

use crate::cases::{CHUNK, ECHO, KERNEL_SERVER, SINK};
use crate::hosts::{Server, join_all, wait_ready};

async fn serve(port: u16, mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut buf = vec![0u8; CHUNK];
    match port {
        ECHO => loop {
            let (r, b) = s.read(buf).await;
            let n = match r {
                Ok(n @ 1..) => n,
                _ => return,
            };
            let (r, slice) = s.write_all(b.slice(..n)).await;
            buf = slice.into_inner();
            if r.is_err() {
                return;
            }
        },
        SINK => loop {
            let (r, b) = s.read(buf).await;
            buf = b;
            if !matches!(r, Ok(1..)) {
                return;
            }
        },
        _ => {
            buf.fill(0xa5);
            loop {
                let (r, b) = s.write_all(buf).await;
                buf = b;
                if r.is_err() {
                    return;
                }
            }
        }
    }
}

pub(crate) fn monoio_server(net: &VethPair, cpus: &[usize]) -> Result<Server, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let cpus = cpus.to_vec();
    let n = cpus.len();
    let flag = stop.clone();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let mut threads = Vec::new();
            for cpu in cpus {
                let (ready, stop) = (ready_tx.clone(), flag.clone());
                threads.push(std::thread::spawn(move || {
                    pin(cpu);
                    let rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
                        .enable_timer()
                        .build();
                    let mut rt = match rt {
                        Ok(rt) => rt,
                        Err(e) => return drop(ready.send(Err(format!("io_uring: {e}")))),
                    };
                    rt.block_on(async move {
                        let opts = ListenerOpts::new().reuse_port(true).backlog(1024);
                        for port in [ECHO, SINK, crate::cases::SOURCE] {
                            let addr = SocketAddr::from(([0, 0, 0, 0], port));
                            let l = match TcpListener::bind_with_config(addr, &opts) {
                                Ok(l) => l,
                                Err(e) => {
                                    let _ = ready.send(Err(format!("port {port}: {e}")));
                                    return;
                                }
                            };
                            // The accept loop looks at the stop flag between waits, so
                            // the listener is closed when the server stops (a runtime that
                            // ends does not drop the tasks it spawned).
                            let stop = stop.clone();
                            monoio::spawn(async move {
                                while !stop.load(Ordering::Relaxed) {
                                    let wait = Duration::from_millis(20);
                                    match monoio::time::timeout(wait, l.accept()).await {
                                        Ok(Ok((s, _))) => drop(monoio::spawn(serve(port, s))),
                                        Ok(Err(_)) => return,
                                        Err(_) => {}
                                    }
                                }
                            });
                        }
                        let _ = ready.send(Ok(()));
                        while !stop.load(Ordering::Relaxed) {
                            monoio::time::sleep(Duration::from_millis(20)).await;
                        }
                        // Let the accept loops see the flag and close their listeners.
                        monoio::time::sleep(Duration::from_millis(50)).await;
                    });
                }));
            }
            join_all(threads, "monoio")
        })
        .map_err(|e| e.to_string())?;
    wait_ready(&ready_rx, n, "monoio")?;
    Ok(Server::threaded(
        move || stop.store(true, Ordering::Relaxed),
        thread,
        KERNEL_SERVER,
    ))
}
