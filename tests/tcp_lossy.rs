//! corelane's TCP engine through a lossy router, against the kernel's TCP on the other end:
//! a short slice of the `lossy` benchmark. Both directions lose 3% of their frames; the data
//! direction duplicates 1% and reorders 2% (1% the other way). corelane sends 8 MiB to a
//! kernel client, and receives 8 MiB from a kernel server over a connection it opens itself
//! (so its own next-hop resolution, SACK generation and reassembly are on the path too).
//! Every byte must arrive intact, and the sender must retransmit about what the router
//! dropped, not go back N.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::sync::mpsc;
use std::time::Duration;

use corelane::Runtime;
use corelane_testnet::{Loss, require_root};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KERNEL: &str = "10.82.0.1";
const CLIENT: &str = "10.82.0.2";
const CORELANE: &str = "10.82.0.3";
const N: usize = 8 << 20;

fn data() -> Vec<u8> {
    (0..N)
        .map(|i| (i.wrapping_mul(131) ^ (i >> 11)) as u8)
        .collect()
}

fn sha(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// What the corelane side reports.
#[derive(Debug)]
enum Report {
    Sent { retrans_segs: u64 },
    Received { hash: [u8; 32], len: usize },
    Failed(String),
}

#[test]
fn corelane_tcp_delivers_every_byte_both_ways_through_loss_duplication_and_reordering() {
    if !require_root("tcp through a lossy router") {
        return;
    }
    let net = common::lossy_path(KERNEL, CLIENT);
    net.set_rate(Some(500), Some(500)).expect("rate");
    // The kernel server corelane connects to, in the client namespace.
    let kernel_server = net
        .client_ns()
        .spawn(|| {
            let l = TcpListener::bind((CLIENT, 5011)).expect("listen");
            let (mut s, _) = l.accept().expect("accept");
            s.write_all(&data()).expect("send");
            s.shutdown(Shutdown::Write).expect("shutdown");
            let _ = s.read(&mut [0u8; 16]);
        })
        .expect("kernel server");
    let (tx, rx) = mpsc::channel::<Report>();
    let (stop_tx, stop_rx) = mpsc::channel();
    let ifname = net.server_if().to_string();
    let server = net
        .server_ns()
        .spawn(move || {
            let rt = Runtime::builder(&ifname)
                .addr(format!("{CORELANE}/24"))
                .cpus(vec![0])
                .build()
                .expect("runtime");
            let _ = stop_tx.send(rt.stop_handle());
            let tx = std::sync::Mutex::new(tx);
            rt.run(|_| {
                let tx = tx.lock().expect("lock").clone();
                async move {
                    let l = corelane::net::TcpListener::bind(5010).await.expect("bind");
                    let tx2 = tx.clone();
                    let download = tokio::task::spawn_local(async move {
                        let r = async {
                            let mut s =
                                corelane::net::TcpStream::connect(format!("{CLIENT}:5011")).await?;
                            let mut v = Vec::with_capacity(N);
                            s.read_to_end(&mut v).await?;
                            Ok::<_, std::io::Error>(v)
                        }
                        .await;
                        let _ = tx2.send(match r {
                            Ok(v) => Report::Received {
                                hash: sha(&v),
                                len: v.len(),
                            },
                            Err(e) => Report::Failed(format!("receive: {e}")),
                        });
                    });
                    if let Ok((mut s, _)) = l.accept().await {
                        let r = async {
                            s.write_all(&data()).await?;
                            s.shutdown().await?;
                            let _ = s.read(&mut [0u8; 16]).await?;
                            s.info()
                        }
                        .await;
                        let _ = tx.send(match r {
                            Ok(i) => Report::Sent {
                                retrans_segs: i.stats.retrans_segs,
                            },
                            Err(e) => Report::Failed(format!("send: {e}")),
                        });
                    }
                    // The download may take longer than the upload (a lost SYN costs a second):
                    // the core must not stop before it reports.
                    let _ = download.await;
                }
            })
            .expect("run");
        })
        .expect("corelane");
    let stop = stop_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("started");
    net.set_loss(Loss::percent(3.0), Loss::percent(3.0))
        .expect("loss");
    net.set_duplicate(Loss::NONE, Loss::percent(1.0))
        .expect("duplication");
    net.set_reorder(
        Loss::percent(1.0),
        Loss::percent(2.0),
        Duration::from_micros(300),
    )
    .expect("reordering");
    // The kernel client of corelane's server.
    let got = net
        .client_ns()
        .run(|| common::download(format!("{CORELANE}:5010").parse().expect("address")))
        .expect("client");
    assert_eq!(got.len(), N);
    assert!(
        sha(&got) == sha(&data()),
        "corelane's bytes arrived changed"
    );
    let mut sent = None;
    let mut received = None;
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(60)).expect("a report") {
            Report::Sent { retrans_segs } => sent = Some(retrans_segs),
            Report::Received { hash, len } => received = Some((hash, len)),
            Report::Failed(e) => panic!("{e}"),
        }
    }
    let c = net.counters().expect("counters");
    stop.stop();
    server.join().expect("corelane thread");
    kernel_server.join().expect("kernel server");
    let (hash, len) = received.expect("received");
    assert_eq!(len, N);
    assert!(hash == sha(&data()), "the kernel's bytes arrived changed");
    // Both transfers crossed the router at once, so its drop counter toward the client holds
    // corelane's data frames and the ACKs corelane sent the kernel server: retransmissions
    // stay near that, far from the thousands of a go-back-N.
    let retrans = sent.expect("sent");
    assert!(c.dropped_to_client > 50, "{c:?}");
    assert!(
        c.reordered_to_client > 20 && c.reorder_released > 20,
        "{c:?}"
    );
    // A reordered frame may be resent before it arrives; RACK's window keeps that to a part.
    assert!(
        retrans <= 2 * c.dropped_to_client + c.reordered_to_client + 50,
        "{retrans} retransmissions for {c:?}"
    );
}
