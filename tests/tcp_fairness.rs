//! corelane's CUBIC shares a bottleneck with the kernel's: one corelane flow and one kernel
//! flow from the server end to a kernel client through a 200 Mbit/s token bucket, for a few
//! seconds. Neither may starve the other. A short slice of the `fairness` benchmark (which
//! runs 20 s per scenario and reports Jain's index).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corelane::Runtime;
use corelane_testnet::{LossyPath, require_root};
use tokio::io::AsyncWriteExt;

const KERNEL: &str = "10.87.0.1";
const CORELANE: &str = "10.87.0.3";

/// Reads from `addr` for `secs` seconds (the first one left out); returns the bytes read.
fn drain(addr: &str, secs: u64) -> Result<u64, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut buf = vec![0u8; 256 * 1024];
    let mut counted = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        match s.read(&mut buf) {
            Ok(0) => return Err(format!("{addr} closed")),
            Ok(n) if start.elapsed() >= Duration::from_secs(1) => counted += n as u64,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(format!("{addr}: {e}")),
        }
    }
    Ok(counted)
}

#[test]
fn corelane_and_the_kernel_share_a_bottleneck() -> Result<(), String> {
    if !require_root("tcp fairness") {
        return Ok(());
    }
    let net = LossyPath::builder()
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr("10.87.0.2/24")
        .build()
        .map_err(|e| e.to_string())?;
    net.set_rate(None, Some(200)).map_err(|e| e.to_string())?;
    let l = net
        .server_ns()
        .run(|| TcpListener::bind((KERNEL, 5030)))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    // The kernel flow runs CUBIC as corelane's does, whatever the machine's default (BBR on
    // some, which takes most of a shallow bottleneck from any loss-based flow).
    corelane_testnet::sockopt::set_congestion(&l, "cubic")?;
    net.server_ns()
        .spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let buf = vec![1u8; 64 * 1024];
                while s.write_all(&buf).is_ok() {}
            }
        })
        .map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = mpsc::channel();
    let ifname = net.server_if().to_string();
    let server = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let rt = Runtime::builder(&ifname)
                .addr(format!("{CORELANE}/24"))
                .cpus(vec![0])
                .build()
                .map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            rt.run(|_| async {
                let Ok(l) = corelane::net::TcpListener::bind(5030).await else {
                    return;
                };
                if let Ok((mut s, _)) = l.accept().await {
                    let buf = vec![2u8; 64 * 1024];
                    while s.write_all(&buf).await.is_ok() {}
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let stop = stop_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the runtime did not start")?;
    std::thread::sleep(Duration::from_millis(200));
    let k = net
        .client_ns()
        .spawn(|| drain(&format!("{KERNEL}:5030"), 5))
        .map_err(|e| e.to_string())?;
    let c = net
        .client_ns()
        .run(|| drain(&format!("{CORELANE}:5030"), 5))
        .map_err(|e| e.to_string())?;
    let k = k.join().map_err(|e| e.to_string())?;
    stop.stop();
    server.join().map_err(|e| e.to_string())??;
    let (k, c) = (k?, c?);
    let share = c as f64 / (k + c) as f64;
    eprintln!(
        "kernel {:.1} Mbit/s, corelane {:.1} Mbit/s: corelane's share {share:.2}",
        k as f64 * 8.0 / 4e6,
        c as f64 * 8.0 / 4e6
    );
    // Fair is 0.5; either side under a fifth of the link is starved.
    assert!(
        (0.2..=0.8).contains(&share),
        "corelane's share {share:.2} ({c} bytes against the kernel's {k})"
    );
    Ok(())
}
