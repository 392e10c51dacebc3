//! Packet capture from the fast path: `corelane-stat capture` during a real exchange writes a
//! pcapng file that `tcpdump -r` reads, holding exactly the segments the kernel peer saw
//! (captured on its side by tcpdump at the same time), each connection's segments in order
//! each way, with correct checksums; the filter keeps the other port's traffic out.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use corelane_testnet::require_root;

/// Waits (up to 20 s) for `child` to print a line holding `word` on its standard error;
/// returns a thread that collects the rest.
fn started(child: &mut Child, word: &str) -> Result<JoinHandle<String>, String> {
    let err = child.stderr.take().ok_or("no stderr")?;
    let (tx, rx) = mpsc::channel();
    let word = word.to_string();
    let rest = std::thread::spawn(move || {
        let mut all = String::new();
        let mut told = false;
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if !told && line.contains(&word) {
                let _ = tx.send(());
                told = true;
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => Ok(rest),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "did not start within 20 s: {}",
                rest.join().unwrap_or_default()
            ))
        }
    }
}

fn interrupt(child: &mut Child, stderr: JoinHandle<String>) -> Result<(), String> {
    // SAFETY: kill(2) on a child this test started and has not reaped.
    let r = unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    if r != 0 {
        return Err(format!("SIGINT: {}", std::io::Error::last_os_error()));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            let err = stderr.join().unwrap_or_default();
            if !st.success() {
                return Err(format!("exited with {st}: {err}"));
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    Err("did not end within 10 s of SIGINT".into())
}

/// The TCP segments of a capture as `tcpdump -r` prints them (absolute sequence numbers, no
/// times), split by direction: (from the client, from the server). Fails on a checksum
/// tcpdump finds wrong.
fn segments(file: &Path, server: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let out = std::process::Command::new("tcpdump")
        .args([
            "-r",
            file.to_str().ok_or("path")?,
            "-nn",
            "-S",
            "-t",
            "-vv",
            "tcp",
        ])
        .output()
        .map_err(|e| format!("tcpdump: {e} (install it: apt-get install tcpdump)"))?;
    if !out.status.success() {
        return Err(format!(
            "tcpdump -r {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // -vv prints each packet on two lines: the IP header, then the TCP header with the
    // checksum's verdict.
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    for line in text.lines().filter(|l| l.starts_with("    ")) {
        let line = line.trim();
        if !line.contains("(correct)") {
            return Err(format!(
                "{}: a bad or unchecked checksum: {line}",
                file.display()
            ));
        }
        // The verdict's checksum value differs in nothing but is left out with the options
        // (timestamps are the same bytes on both sides, kept).
        if line.starts_with(&format!("{server}.")) {
            from_server.push(line.to_string());
        } else {
            from_client.push(line.to_string());
        }
    }
    Ok((from_client, from_server))
}

/// Segment lines grouped by the client's address and port, which is the line's word `word`
/// (0 for the client's segments, 2 for the server's).
fn by_flow(lines: &[String], word: usize) -> BTreeMap<String, Vec<String>> {
    let mut flows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines {
        let key = line
            .split_whitespace()
            .nth(word)
            .unwrap_or("")
            .trim_end_matches(':');
        flows.entry(key.to_string()).or_default().push(line.clone());
    }
    flows
}

/// The same connections with the same segments in the same order, or where they differ first.
fn same_flows(
    ours: &BTreeMap<String, Vec<String>>,
    theirs: &BTreeMap<String, Vec<String>>,
    what: &str,
) -> Result<(), String> {
    let keys = |m: &BTreeMap<String, Vec<String>>| m.keys().cloned().collect::<Vec<_>>();
    if keys(ours) != keys(theirs) {
        return Err(format!(
            "{what}: connections differ: corelane {:?}, peer {:?}",
            keys(ours),
            keys(theirs)
        ));
    }
    for (flow, a) in ours {
        let b = &theirs[flow];
        if a != b {
            let at = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            return Err(format!(
                "{what}: connection {flow}: {} segments in corelane's capture, {} in the peer's; \
                 first difference at {at}:\n  corelane: {:?}\n  peer:     {:?}",
                a.len(),
                b.len(),
                a.get(at),
                b.get(at)
            ));
        }
    }
    Ok(())
}

#[test]
fn operate_capture_holds_what_the_peer_saw() -> Result<(), String> {
    if !require_root("operate_capture") {
        return Ok(());
    }
    let bin = workspace_bin("corelane-stat")?;
    let net = net(2);
    let server = Echo::start(&net, &["--addr", "10.77.0.3/24", "--cores", "2"]);
    let dir = std::env::temp_dir().join(format!("corelane-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let ours = dir.join("corelane.pcapng");
    let theirs = dir.join("peer.pcap");

    // The peer's view: tcpdump on the client's end of the veth.
    let mut peer = net
        .client_ns()
        .command("tcpdump")
        .args(["-i", net.client_if(), "-nn", "-U", "-s", "0", "-w"])
        .arg(&theirs)
        .args(["tcp", "port", "7"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("tcpdump: {e}"))?;
    // corelane's view, TCP port 7 only.
    let mut capture = net
        .server_ns()
        .command(bin.to_str().ok_or("path")?)
        .args(["--iface", net.server_if(), "capture", "-w"])
        .arg(&ours)
        .args(["--port", "7", "--proto", "tcp", "--seconds", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("corelane-stat capture: {e}"))?;
    // Both say when they see every frame (tcpdump: "listening on", corelane-stat:
    // "capturing on"); the exchange starts after both did.
    let peer_err = started(&mut peer, "listening on").map_err(|e| format!("tcpdump: {e}"))?;
    let ours_err =
        started(&mut capture, "capturing on").map_err(|e| format!("corelane-stat capture: {e}"))?;

    // Four connections (both cores), each three echoed messages of different sizes and a
    // close; UDP on port 7 and TCP on port 9 (discard: refused) are filtered out.
    let addr: SocketAddr = format!("{SERVER_V4}:7").parse().map_err(|_| "addr")?;
    net.client_ns()
        .run(move || -> std::io::Result<()> {
            for c in 0..4u64 {
                let mut s = connect(addr)?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                for (i, size) in [100usize, 3000, 20_000].into_iter().enumerate() {
                    let data = payload(size, c * 10 + i as u64);
                    s.write_all(&data)?;
                    let mut got = vec![0u8; size];
                    s.read_exact(&mut got)?;
                    assert_eq!(got, data);
                }
                s.shutdown(std::net::Shutdown::Write)?;
                let mut rest = Vec::new();
                s.read_to_end(&mut rest)?;
            }
            let u = std::net::UdpSocket::bind("0.0.0.0:0")?;
            u.send_to(b"not captured", addr)?;
            let _ = std::net::TcpStream::connect_timeout(
                &format!("{SERVER_V4}:9")
                    .parse()
                    .map_err(std::io::Error::other)?,
                Duration::from_secs(2),
            );
            Ok(())
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    // The last ACKs, then both captures end. tcpdump is handed packets in blocks, a block at
    // the latest a second after its first packet: wait past that (the port-9 refusal comes at
    // once, so the exchange gives no time of its own).
    std::thread::sleep(Duration::from_millis(2500));
    interrupt(&mut capture, ours_err).map_err(|e| format!("corelane-stat capture: {e}"))?;
    interrupt(&mut peer, peer_err).map_err(|e| format!("tcpdump: {e}"))?;
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");

    let (our_in, our_out) = segments(&ours, SERVER_V4)?;
    let (their_out, their_in) = segments(&theirs, SERVER_V4)?;
    assert!(
        our_in.len() >= 4 * 4 && our_out.len() >= 4 * 4,
        "every connection's handshake, data and close: {} in, {} out",
        our_in.len(),
        our_out.len()
    );
    // Each connection's segments, in order each way. Across connections (and so across
    // cores) the merge orders frames by the turn in which their core handled them, not by
    // wire time: a core woken late stamps an earlier frame later than a spinning core
    // stamps a later one, so the interleaving of two connections is not compared.
    same_flows(
        &by_flow(&our_in, 0),
        &by_flow(&their_out, 0),
        "what the peer sent, as corelane received it",
    )?;
    same_flows(
        &by_flow(&our_out, 2),
        &by_flow(&their_in, 2),
        "what corelane sent, as the peer received it",
    )?;
    // Nothing but port 7 TCP: tcpdump reads every frame of the file as TCP to or from port 7.
    let all = std::process::Command::new("tcpdump")
        .args(["-r", ours.to_str().ok_or("path")?, "-nn", "-t"])
        .output()
        .map_err(|e| e.to_string())?;
    let all = String::from_utf8_lossy(&all.stdout);
    assert_eq!(
        all.lines().count(),
        our_in.len() + our_out.len(),
        "only the filter's frames: {all}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
