//! ECN (RFC 3168) end to end with the kernel's TCP as the peer: a router that marks a share of
//! the ECN-capable frames Congestion Experienced, and drops none. The kernel client asks for
//! ECN (`net.ipv4.tcp_ecn = 1` in its namespace) and corelane accepts, as it does by default.
//! corelane sends 8 MiB to the kernel client: the kernel echoes the marks and corelane reduces
//! its window with nothing lost and nothing resent; the kernel client sends 8 MiB to corelane:
//! corelane sees the marks and echoes them. Every byte arrives intact both ways.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::mpsc;
use std::time::Duration;

use common::{payload, sha256 as sha};
use corelane::TcpStats;
use corelane_testnet::{Loss, require_root};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KERNEL: &str = "10.83.0.1";
const CLIENT: &str = "10.83.0.2";
const CORELANE: &str = "10.83.0.3";
const N: usize = 8 << 20;

fn data() -> Vec<u8> {
    payload(N, 151)
}

/// What the corelane side reports for each of its two connections.
#[derive(Debug)]
enum Report {
    Sent(TcpStats),
    Received {
        hash: [u8; 32],
        len: usize,
        stats: TcpStats,
    },
    Failed(String),
    Listening,
}

fn addr(port: u16) -> SocketAddr {
    format!("{CORELANE}:{port}").parse().expect("address")
}

#[test]
fn corelane_and_the_kernel_negotiate_ecn_and_act_on_marks_instead_of_losses() {
    if !require_root("tcp ecn through a marking router") {
        return;
    }
    let net = common::lossy_path(KERNEL, CLIENT);
    net.client_ns()
        .exec("sysctl", &["-qw", "net.ipv4.tcp_ecn=1"])
        .expect("the kernel client asks for ECN");
    net.set_mark(Loss::percent(2.0), Loss::percent(2.0))
        .expect("marking");
    let (tx, rx) = mpsc::channel::<Report>();
    let builder = common::one_core_on(&net, CORELANE);
    let served = common::serve_reporting(net.server_ns(), builder, tx, |tx| {
        async move {
            let up = corelane::net::TcpListener::bind(5021).await.expect("bind");
            let down = corelane::net::TcpListener::bind(5020).await.expect("bind");
            // Connect only now: a SYN before the port is steered gets no answer, and
            // the kernel sends it again without asking for ECN (its fallback).
            let _ = tx.send(Report::Listening);
            let tx2 = tx.clone();
            let upload = tokio::task::spawn_local(async move {
                let r = async {
                    let (mut s, _) = up.accept().await?;
                    let mut v = Vec::with_capacity(N);
                    s.read_to_end(&mut v).await?;
                    s.shutdown().await?;
                    Ok::<_, std::io::Error>((v, s.info()?.stats))
                }
                .await;
                let _ = tx2.send(match r {
                    Ok((v, stats)) => Report::Received {
                        hash: sha(&v),
                        len: v.len(),
                        stats,
                    },
                    Err(e) => Report::Failed(format!("receive: {e}")),
                });
            });
            let r = async {
                let (mut s, _) = down.accept().await?;
                s.write_all(&data()).await?;
                s.shutdown().await?;
                let _ = s.read(&mut [0u8; 16]).await?;
                Ok::<_, std::io::Error>(s.info()?.stats)
            }
            .await;
            let _ = tx.send(match r {
                Ok(stats) => Report::Sent(stats),
                Err(e) => Report::Failed(format!("send: {e}")),
            });
            let _ = upload.await;
        }
    })
    .expect("corelane");
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(10)),
        Ok(Report::Listening)
    ));
    let got = net
        .client_ns()
        .run(|| common::download(addr(5020)))
        .expect("download");
    assert_eq!(got.len(), N);
    assert!(
        sha(&got) == sha(&data()),
        "corelane's bytes arrived changed"
    );
    net.client_ns()
        .run(|| {
            let mut s = common::connect_patiently(addr(5021));
            s.write_all(&data()).expect("send");
            s.shutdown(Shutdown::Write).expect("shutdown");
            let _ = s.read(&mut [0u8; 16]);
        })
        .expect("upload");
    let mut sent = None;
    let mut received = None;
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(60)).expect("a report") {
            Report::Sent(stats) => sent = Some(stats),
            Report::Received { hash, len, stats } => received = Some((hash, len, stats)),
            Report::Failed(e) => panic!("{e}"),
            Report::Listening => unreachable!("said once"),
        }
    }
    let c = net.counters().expect("counters");
    served.end();
    let sent = sent.expect("sent");
    let (hash, len, got_stats) = received.expect("received");
    assert_eq!(len, N);
    assert!(hash == sha(&data()), "the kernel's bytes arrived changed");
    assert_eq!((c.dropped_to_client, c.dropped_to_server), (0, 0), "{c:?}");
    // corelane's data was ECN-capable and marked; the kernel echoed the marks and corelane
    // reduced its window for them, with nothing to resend.
    assert!(c.marked_to_client > 10, "{c:?}");
    assert!(sent.ecn_reductions > 0, "{sent:?}");
    assert_eq!(
        (sent.fast_recoveries, sent.rto_expiries),
        (0, 0),
        "{sent:?}"
    );
    // The kernel's data was ECN-capable too, and corelane saw its marks.
    assert!(c.marked_to_server > 10, "{c:?}");
    assert!(got_stats.ecn_ce > 0, "{got_stats:?}");
}
