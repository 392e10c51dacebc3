//! The per-core cap on TCP buffer memory on a real runtime: eight kernel clients each download
//! 2 MiB from a corelane server whose core may hold 128 KiB of TCP buffers. Writers past the
//! cap wait and are woken as buffers are given back; every byte arrives intact, the buffers
//! never hold more than the cap, and the refusals are counted.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::{payload, sha256};
use corelane_testnet::{VethPair, require_root};
use tokio::io::AsyncWriteExt;

const CORELANE: &str = "10.87.0.3";
const CAP: usize = 128 * 1024;
const N: usize = 2 << 20;
const CLIENTS: usize = 8;

fn data() -> Vec<u8> {
    payload(N, 7)
}

#[test]
fn a_core_under_a_memory_cap_serves_every_client_within_it() {
    if !require_root("tcp memory cap") {
        return;
    }
    let net = VethPair::builder()
        .server_addr("10.87.0.1/24")
        .client_addr("10.87.0.2/24")
        .build()
        .expect("veth pair");
    // (most bytes held, refusals), sampled by the server every millisecond.
    let seen: Arc<Mutex<(u64, u64)>> = Arc::default();
    let (ready_tx, ready_rx) = mpsc::channel();
    let samples = seen.clone();
    let one = common::one_core(net.server_if(), CORELANE);
    let builder = move || one().tcp_memory_limit(CAP);
    let (stop, server) = common::serve_in(net.server_ns(), builder, move |rt| {
        let ready_tx = Mutex::new(ready_tx);
        let samples = Mutex::new(samples);
        rt.run(|_| {
            let ready = ready_tx.lock().expect("lock").clone();
            let samples = samples.lock().expect("lock").clone();
            async move {
                let l = corelane::net::TcpListener::bind(9).await.expect("bind");
                let _ = ready.send(());
                tokio::task::spawn_local(async move {
                    loop {
                        if let (Some(s), Ok(mut v)) = (corelane::core_stats(), samples.lock()) {
                            v.0 = v.0.max(s.stack.tcp_mem);
                            v.1 = s.stack.tcp_mem_limited;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                });
                let payload = std::rc::Rc::new(data());
                while let Ok((mut s, _)) = l.accept().await {
                    let payload = payload.clone();
                    tokio::task::spawn_local(async move {
                        let _ = s.write_all(&payload).await;
                        let _ = s.shutdown().await;
                    });
                }
            }
        })
        .expect("run");
    })
    .expect("server");
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("listening");
    let want = sha256(&data());
    let got = net
        .client_ns()
        .run(|| {
            let threads: Vec<_> = (0..CLIENTS)
                .map(|_| {
                    std::thread::spawn(|| {
                        let mut s = TcpStream::connect((CORELANE, 9)).expect("connect");
                        s.set_read_timeout(Some(Duration::from_secs(30)))
                            .expect("timeout");
                        let mut v = Vec::with_capacity(N);
                        s.read_to_end(&mut v).expect("receive");
                        sha256(&v)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("client"))
                .collect::<Vec<_>>()
        })
        .expect("clients");
    std::thread::sleep(Duration::from_millis(20));
    stop.stop();
    server.join().expect("server thread").expect("server");
    assert_eq!(got.len(), CLIENTS);
    assert!(got.iter().all(|h| *h == want), "a download arrived changed");
    let (most, limited) = *seen.lock().expect("lock");
    eprintln!("most held {most} bytes under a cap of {CAP}; {limited} refusals");
    assert!(most > 0, "the buffers were never sampled holding anything");
    assert!(
        most <= CAP as u64,
        "the buffers held {most} bytes, over {CAP}"
    );
    assert!(
        limited > 0,
        "eight 2 MiB writers were never held back by {CAP} bytes"
    );
}
