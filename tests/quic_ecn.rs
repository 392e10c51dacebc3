//! ECN on QUIC (RFC 9000 section 13.4) end to end, as root: quinn on the kernel's UDP (which
//! marks its datagrams ECT(0) and reads the marks of those it receives) and a corelane server,
//! through a router that marks 2% of the ECN-capable frames each way Congestion Experienced
//! and drops none.
//!
//! quinn keeps marking only while the ACKs it gets count its marks (ECN validation): frames
//! the router marked toward the server show that corelane's ACKs counted them, and quinn's
//! congestion events with nothing lost show that corelane read the CE marks off the frames and
//! reported them. Frames marked toward the client show that corelane's own datagrams leave
//! ECN-capable (quinn's ACKs counted them in turn).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::quic::{certificate, pattern};
use common::*;
use corelane_rt::quic::{Endpoint, VarInt};
use corelane_testnet::{Loss, require_root};

const CLIENT: &str = "10.84.0.2";
const CORELANE: &str = "10.84.0.3";
const PORT: u16 = 4433;
/// Each way: about 3,000 datagrams, so 2% marks about 60 (none at all: e^-60).
const N: usize = 4 << 20;

#[test]
fn quinn_and_corelane_keep_ecn_through_a_marking_router_and_answer_its_marks() {
    if !require_root("quic_ecn: a marking router") {
        return;
    }
    let net = lossy_path("10.84.0.1", CLIENT);
    net.set_mark(Loss::percent(2.0), Loss::percent(2.0))
        .expect("marking");
    let (server_config, roots) = certificate().expect("certificate");
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let (stop, thread) = serve_in(net.server_ns(), one_core_on(&net, CORELANE), move |rt| {
        rt.run(move |_| {
            let (config, done) = (server_config.clone(), d2.clone());
            async move {
                let Ok(endpoint) = Endpoint::server(config, format!("{CORELANE}:{PORT}")) else {
                    return;
                };
                while !done.load(Ordering::SeqCst) {
                    let next = tokio::time::timeout(Duration::from_millis(50), endpoint.accept());
                    let Ok(Some(incoming)) = next.await else {
                        continue;
                    };
                    tokio::task::spawn_local(async move {
                        let Ok(conn) = incoming.await else { return };
                        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                            tokio::task::spawn_local(async move {
                                let _ = tokio::io::copy(&mut recv, &mut send).await;
                                let _ = tokio::io::AsyncWriteExt::shutdown(&mut send).await;
                            });
                        }
                    });
                }
                endpoint.close(VarInt::from_u32(0), b"");
            }
        })
    })
    .expect("corelane server");
    let to: SocketAddr = format!("{CORELANE}:{PORT}").parse().expect("address");
    let got = net
        .client_ns()
        .run(move || -> Result<(bool, quinn::ConnectionStats), String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let bind: SocketAddr = format!("{CLIENT}:0").parse().map_err(|e| format!("{e}"))?;
                let (endpoint, conn) = common::quic::connect(bind, to, roots).await?;
                let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
                let data = pattern(7, N);
                let sent = data.clone();
                let writer = tokio::spawn(async move {
                    send.write_all(&sent).await.map_err(|e| e.to_string())?;
                    send.finish().map_err(|e| e.to_string())
                });
                let back = tokio::time::timeout(Duration::from_secs(60), recv.read_to_end(N))
                    .await
                    .map_err(|_| "the echo timed out".to_string())?
                    .map_err(|e| e.to_string())?;
                writer.await.map_err(|e| e.to_string())??;
                let stats = conn.stats();
                conn.close(VarInt::from_u32(0), b"");
                endpoint.wait_idle().await;
                Ok((back == data, stats))
            })
        })
        .expect("client namespace");
    done.store(true, Ordering::SeqCst);
    let counters = net.counters().expect("counters");
    stop.stop();
    let _ = thread.join();
    let (whole, stats) = got.expect("the client's run");
    assert!(whole, "the stream came back whole");
    assert_eq!(
        counters.dropped_to_server + counters.dropped_to_client,
        0,
        "nothing dropped: {counters:?}"
    );
    // quinn's datagrams stayed ECN-capable throughout (about 60 marks expected): its
    // validation of corelane's ACKs held.
    assert!(
        counters.marked_to_server > 10,
        "quinn's datagrams toward corelane were marked: {counters:?}"
    );
    // corelane's datagrams were ECN-capable too.
    assert!(
        counters.marked_to_client > 10,
        "corelane's datagrams toward quinn were marked: {counters:?}"
    );
    // The marks on quinn's datagrams came back to it in corelane's ACKs, and it slowed down:
    // congestion with nothing lost.
    assert_eq!(stats.path.lost_packets, 0, "{stats:?}");
    assert!(
        stats.path.congestion_events > 0,
        "quinn answered the marks corelane reported: {stats:?}"
    );
}
