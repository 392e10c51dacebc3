//! corelane's TCP through a router that drops 10% of the data frames, with the kernel's TCP
//! receiving: a short slice of `lossy --loss 10`. At that rate a recovery's window is a few
//! segments and the whole of it is often lost, retransmission included; the engine probes
//! such a silent flight (`TcpConfig::recovery_probe`) instead of waiting for the
//! retransmission timer and its doubling. Every byte must arrive intact, the probes must have
//! run on the real path, and what is sent again must be what the router dropped.

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use common::{payload, sha256 as sha};
use corelane::TcpStats;
use corelane_testnet::{Loss, require_root};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KERNEL: &str = "10.84.0.1";
const CLIENT: &str = "10.84.0.2";
const CORELANE: &str = "10.84.0.3";
const N: usize = 16 << 20;

#[test]
fn a_ten_percent_loss_path_is_crossed_with_probes_rather_than_timeouts() {
    if !require_root("tcp through a router dropping 10%") {
        return;
    }
    let net = common::lossy_path(KERNEL, CLIENT);
    net.set_rate(Some(500), Some(500)).expect("rate");
    let (tx, rx) = mpsc::channel::<Result<TcpStats, String>>();
    let builder = common::one_core_on(&net, CORELANE);
    let served = common::serve_reporting(net.server_ns(), builder, tx, |tx| async move {
        let l = corelane::net::TcpListener::bind(5030).await.expect("bind");
        let r = async {
            let (mut s, _) = l.accept().await?;
            s.write_all(&payload(N, 17)).await?;
            s.shutdown().await?;
            let _ = s.read(&mut [0u8; 16]).await?;
            Ok::<_, std::io::Error>(s.info()?.stats)
        }
        .await;
        let _ = tx.send(r.map_err(|e| format!("send: {e}")));
    })
    .expect("corelane");
    let addr: SocketAddr = format!("{CORELANE}:5030").parse().expect("address");
    net.set_loss(Loss::NONE, Loss::percent(10.0)).expect("loss");
    let got = net
        .client_ns()
        .run(move || common::download(addr))
        .expect("client");
    let sent = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a report")
        .expect("corelane sent");
    let c = net.counters().expect("counters");
    served.end();
    eprintln!("{sent:?}\n{c:?}");
    assert_eq!(got.len(), N);
    assert!(
        sha(&got) == sha(&payload(N, 17)),
        "corelane's bytes arrived changed"
    );
    // About 12,000 data frames, 10% of them dropped.
    assert!(c.dropped_to_client > 600, "{c:?}");
    // Silent flights in recovery were probed (5 to 11 times a transfer here, against 1 to 3
    // timeouts; `lossy --loss 10` measures what that does to stalls and goodput).
    assert!(sent.recovery_probes > 0, "{sent:?}");
    // Only what was dropped is sent again (and a probe now and then).
    assert!(
        sent.retrans_segs <= c.dropped_to_client + sent.recovery_probes + sent.tail_probes,
        "{} retransmissions for {c:?}",
        sent.retrans_segs
    );
}
