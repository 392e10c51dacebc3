//! A SYN flood against a corelane listener: spoofed SYNs from random sources for a bounded
//! time while a real client keeps connecting. The listener's SYN queue fills with the flood,
//! SYN cookies take over, every real connection completes and echoes, the flow table stays
//! bounded by the backlog and the process's memory does not grow with the flood. A short
//! slice of the `synflood` benchmark.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::echo_once;

use corelane::StackStats;
use corelane_testnet::{VethPair, require_root};

const CORELANE: &str = "10.84.0.3";
const BACKLOG: usize = 64;

/// Resident memory of this process, KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn a_syn_flood_leaves_the_listener_serving_with_bounded_memory() -> Result<(), String> {
    if !require_root("syn flood") {
        return Ok(());
    }
    let net = VethPair::builder()
        .server_addr("10.84.0.1/24")
        .client_addr("10.84.0.2/24")
        .build()
        .map_err(|e| e.to_string())?;
    let seen: Arc<Mutex<Vec<StackStats>>> = Arc::default();
    let (ready_tx, ready_rx) = mpsc::channel();
    let samples = seen.clone();
    let one = common::one_core(net.server_if(), CORELANE);
    let builder = move || one().backlog(BACKLOG);
    let (stop, server) = common::serve_in(net.server_ns(), builder, move |rt| {
        let ready_tx = Mutex::new(ready_tx);
        let samples = Mutex::new(samples);
        rt.run(|_| {
            let ready = ready_tx.lock().map(|t| t.clone()).ok();
            let samples = samples.lock().map(|s| s.clone()).ok();
            async move {
                let l = corelane::net::TcpListener::bind(7)
                    .await
                    .map_err(|e| e.to_string());
                if let Some(t) = ready {
                    let _ = t.send(l.as_ref().map(|_| ()).map_err(Clone::clone));
                }
                let (Ok(l), Some(samples)) = (l, samples) else {
                    return;
                };
                // Every 20 ms, what the stack holds.
                tokio::task::spawn_local(async move {
                    loop {
                        if let (Some(s), Ok(mut v)) = (corelane::core_stats(), samples.lock()) {
                            v.push(s.stack);
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                });
                while let Ok((s, _)) = l.accept().await {
                    tokio::task::spawn_local(common::echo_stream(s));
                }
            }
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    })?;
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the server did not start")??;
    let addr: SocketAddr = format!("{CORELANE}:7").parse().map_err(|_| "addr")?;
    let target = format!("{CORELANE}:7").parse().map_err(|_| "addr")?;
    net.client_ns()
        .run(move || echo_once(addr))
        .map_err(|e| e.to_string())??;
    let rss_before = rss_kib();
    // Bounded: at most 3 seconds and 2 million SYNs; stopped once the client is done. Ten real
    // connections during it, one every 50 ms.
    let (report, tries) = common::flood_and_connect(
        &net,
        target,
        2_000_000,
        Duration::from_secs(3),
        Duration::from_millis(200),
    )?;
    let (took, failures): (Vec<_>, Vec<_>) = tries.into_iter().partition(Result::is_ok);
    let took: Vec<Duration> = took.into_iter().flatten().collect();
    let rss_after = rss_kib();
    // After the flood the listener still serves.
    let after = net.client_ns().run(move || echo_once(addr));
    std::thread::sleep(Duration::from_millis(50));
    stop.stop();
    server.join().map_err(|e| e.to_string())???;
    let samples = seen.lock().map_err(|_| "poisoned")?.clone();
    let max_flows = samples.iter().map(|s| s.flows).max().unwrap_or(0);
    let last = samples.last().cloned().unwrap_or_default();
    eprintln!(
        "flood: {} SYNs in {:?} ({:.0}/s, {} refused); connects during it: {:?}; flows at most {max_flows}; cookies sent {}, SYNs dropped {}; RSS {rss_before} -> {rss_after} KiB",
        report.sent,
        report.elapsed,
        report.rate(),
        report.refused,
        took,
        last.tcp.cookies_sent,
        last.syn_dropped,
    );
    assert!(failures.is_empty(), "real connections failed: {failures:?}");
    assert_eq!(took.len(), 10);
    after
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("after the flood: {e}"))?;
    assert!(report.sent >= 20_000, "the flood sent only {report:?}");
    // The flood filled the SYN queue and was answered with cookies, which hold nothing.
    assert!(
        last.tcp.cookies_sent >= 10_000,
        "cookies sent: {}",
        last.tcp.cookies_sent
    );
    assert!(
        max_flows <= BACKLOG as u64 + 16,
        "{max_flows} flows held for a backlog of {BACKLOG}"
    );
    assert!(
        rss_after < rss_before + 32 * 1024,
        "memory grew from {rss_before} to {rss_after} KiB"
    );
    Ok(())
}
