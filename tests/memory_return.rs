//! Memory comes back after load: 100 kernel peers that send to the echo server and never read
//! fill its connections' buffers; once they are gone, the server's resident memory returns
//! close to where it was before them.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use corelane_testnet::require_root;

fn rss_kib(pid: u32) -> Result<u64, String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no VmRSS".to_string())
}

/// The resident memory once it stops moving (or after `most`).
fn settled(pid: u32, most: Duration) -> Result<u64, String> {
    let deadline = Instant::now() + most;
    let mut last = rss_kib(pid)?;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = rss_kib(pid)?;
        if now.abs_diff(last) < 256 || Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}

#[test]
fn memory_returns_after_peers_that_never_read_are_gone() -> Result<(), String> {
    if !require_root("memory_return") {
        return Ok(());
    }
    let net = net(1);
    let server = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let pid = server.pid();
    let before = settled(pid, Duration::from_secs(5))?;
    let addr: SocketAddr = format!("{SERVER_V4}:7").parse().map_err(|_| "addr")?;
    const PEERS: usize = 100;
    let peers = net
        .client_ns()
        .run(move || -> std::io::Result<Vec<TcpStream>> {
            let mut held = Vec::new();
            for _ in 0..PEERS {
                let s = connect(addr)?;
                s.set_nonblocking(true)?;
                held.push(s);
            }
            // Each sends until the server stops taking more: its echo is never read, so the
            // server's send buffer fills, then its receive window closes.
            let chunk = vec![0x5au8; 64 << 10];
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut open = [true; PEERS];
            while open.iter().any(|o| *o) && Instant::now() < deadline {
                let mut moved = false;
                for (s, o) in held.iter_mut().zip(open.iter_mut()).filter(|(_, o)| **o) {
                    match s.write(&chunk) {
                        Ok(n) if n > 0 => moved = true,
                        Ok(_) => *o = false,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => *o = false,
                    }
                }
                if !moved {
                    std::thread::sleep(Duration::from_millis(100));
                    // Still nothing after a pause: the windows are shut.
                    if held
                        .iter_mut()
                        .zip(open.iter())
                        .filter(|(_, o)| **o)
                        .all(|(s, _)| matches!(s.write(&chunk), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock))
                    {
                        break;
                    }
                }
            }
            Ok(held)
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let peak = settled(pid, Duration::from_secs(10))?;
    drop(peers);
    let after = settled(pid, Duration::from_secs(15))?;
    let (status, log) = server.stop();
    eprintln!(
        "server RSS: {before} KiB before, {peak} KiB with {PEERS} peers that never read, {after} KiB after they left"
    );
    assert!(status.success(), "{log}");
    assert!(
        peak > before + 20 * 1024,
        "the load did not hold memory ({before} -> {peak} KiB): the test measures nothing"
    );
    assert!(
        after < before + (peak - before) / 5,
        "memory held after the peers left: {before} KiB before, {peak} KiB at the peak, {after} KiB after"
    );
    Ok(())
}
