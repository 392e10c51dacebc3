//! Nothing left behind, and no peer left waiting: a server killed with SIGKILL mid-load has its
//! transfer reset at once (its XDP program answers for it, held by a keeper, for a while: then
//! it goes), and the next server on the interface ends that keeper, puts back what the dead
//! one changed (its queue count, its multicast groups) and serves at once; a second server
//! while the first lives is refused with the first's pid.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use corelane_testnet::{VethPair, require_root};

/// The interface's link-layer multicast list (`ip maddr`), as text.
fn maddrs(net: &VethPair) -> String {
    net.server_ns()
        .exec("ip", &["maddr", "show", "dev", net.server_if()])
        .unwrap_or_default()
}

/// The claim file of the server's interface, found by the pid it records.
fn claim_file_of(pid: u32) -> Option<std::path::PathBuf> {
    let dirs = std::fs::read_dir("/run/corelane").ok()?;
    for ns in dirs.flatten() {
        // A namespace's directory (the run directory holds files too: the restart key).
        let Ok(ifaces) = std::fs::read_dir(ns.path()) else {
            continue;
        };
        for iface in ifaces.flatten() {
            let owner = iface.path().join("owner");
            let text = std::fs::read_to_string(&owner).unwrap_or_default();
            if text.lines().next() == Some(&format!("pid {pid}")) {
                return Some(owner);
            }
        }
    }
    None
}

/// Streams into the echo server (reading what comes back) until the connection fails or 30 s
/// pass; returns the bytes written and the error that ended it.
fn stream_until_cut(addr: SocketAddr) -> (u64, Option<std::io::Error>) {
    use std::io::{Read, Write};
    let mut s = match connect(addr) {
        Ok(s) => s,
        Err(e) => return (0, Some(e)),
    };
    let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
    if let Ok(mut r) = s.try_clone() {
        let _ = r.set_read_timeout(Some(Duration::from_secs(30)));
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while matches!(r.read(&mut buf), Ok(1..)) {}
        });
    }
    let chunk = payload(1 << 20, 1);
    let (mut sent, deadline) = (0u64, Instant::now() + Duration::from_secs(30));
    while Instant::now() < deadline {
        match s.write_all(&chunk) {
            Ok(()) => sent += chunk.len() as u64,
            Err(e) => return (sent, Some(e)),
        }
    }
    (sent, None)
}

/// A veth delivers what an XDP program sends back (XDP_TX: the resets that answer for a dead
/// server) only to a peer that runs an XDP program too; a real NIC needs nothing of the kind.
fn peer_takes_xdp_tx(net: &VethPair, on: bool) -> Result<(), String> {
    if on {
        net.client_ns()
            .attach_xdp(
                net.client_if(),
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/crates/corelane-xsk/xdp/corelane.bpf.o"
                ),
            )
            .map_err(|e| e.to_string())
    } else {
        net.client_ns()
            .ip(&["link", "set", "dev", net.client_if(), "xdpdrv", "off"])
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

#[test]
fn crash_sigkill_leaves_nothing_the_next_server_cannot_undo() -> Result<(), String> {
    if !require_root("crash_sigkill") {
        return Ok(());
    }
    let net = net(2);
    net.server_ns()
        .exec("ethtool", &["-L", net.server_if(), "rx", "1", "tx", "1"])
        .map_err(|e| e.to_string())?;
    // A veth delivers a frame on the receive queue numbered as the peer's transmit queue, and
    // one past the receive queues bypasses the XDP program: the client sends on one queue, so
    // the one-core server that follows sees every frame. (It receives on two: an XDP program
    // on a veth needs as many receive queues as its peer has transmit queues.)
    net.client_ns()
        .exec("ethtool", &["-L", net.client_if(), "rx", "2", "tx", "1"])
        .map_err(|e| e.to_string())?;
    assert_eq!(rx_queues(&net)?, 1);
    let v4: SocketAddr = format!("{SERVER_V4}:7").parse().map_err(|_| "addr")?;
    let before_groups = maddrs(&net);
    assert!(
        !before_groups.contains("33:33:ff:00:00:03"),
        "{before_groups}"
    );

    let first = Echo::start(
        &net,
        &[
            "--addr",
            "10.77.0.3/24",
            "--addr",
            "fd00:77::3/64",
            "--cores",
            "2",
        ],
    );
    assert_eq!(rx_queues(&net)?, 2, "raised for two cores");
    assert!(
        maddrs(&net).contains("33:33:ff:00:00:03"),
        "{}",
        maddrs(&net)
    );
    let owner = claim_file_of(first.pid()).ok_or("no claim file names the server's pid")?;
    let record = std::fs::read_to_string(&owner).map_err(|e| e.to_string())?;
    assert!(record.contains("channels 1 1 0"), "{record}");
    assert!(record.contains("group 33:33:ff:00:00:03"), "{record}");

    // A second server on the same interface while the first lives: refused, naming the first.
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.4/24"]);
    assert!(!status.success(), "{out}");
    assert!(
        out.contains(&format!(
            "served by another corelane runtime (pid {}",
            first.pid()
        )),
        "{out}"
    );

    // Now (the queues are raised: a veth's queue count cannot change under a peer's program).
    peer_takes_xdp_tx(&net, true)?;

    // Mid-load: a transfer is running when the server dies.
    let load = net
        .client_ns()
        .spawn(move || stream_until_cut(v4))
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let dead = first.pid();
    first.signal(libc::SIGKILL);
    let killed = Instant::now();
    let (status, _) = first.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );

    // The cut transfer ends at once with a reset (the program, held by the keeper, answers for
    // the dead server), and a new connection is refused at once.
    let (sent, error) = load.join().map_err(|e| e.to_string())?;
    assert!(sent > 0, "the load never ran");
    let cut = killed.elapsed();
    // A reset: seen by a read (ECONNRESET) or by the write after it (EPIPE).
    assert!(
        matches!(
            error.as_ref().map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)
        ),
        "the cut transfer: {error:?}"
    );
    let refused = net
        .client_ns()
        .run(move || std::net::TcpStream::connect_timeout(&v4, Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(std::io::ErrorKind::ConnectionRefused),
        "a connection while the server is dead"
    );
    let record = std::fs::read_to_string(&owner).map_err(|e| e.to_string())?;
    let keeper: u32 = record
        .lines()
        .find_map(|l| l.strip_prefix("linger "))
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| format!("no keeper in the record:\n{record}"))?;
    assert!(std::path::Path::new(&format!("/proc/{keeper}")).exists());
    // The queue count and the multicast group are still as the dead process left them (that
    // is what the record is for).
    assert_eq!(
        rx_queues(&net)?,
        2,
        "nothing but the record can put it back"
    );
    assert!(maddrs(&net).contains("33:33:ff:00:00:03"));
    assert!(owner.exists(), "the dead server's record is gone");

    peer_takes_xdp_tx(&net, false)?;
    // The next server (one core) starts at once, undoes the leftovers and serves.
    let started = Instant::now();
    let next = Echo::start(&net, &["--addr", "10.77.0.3/24", "--cores", "1"]);
    let took = started.elapsed();
    let out = next.output();
    assert!(
        out.contains("died on") && out.contains("receive queues put back to 1"),
        "{out}"
    );
    assert!(out.contains("1 multicast group(s) left"), "{out}");
    assert_eq!(rx_queues(&net)?, 1);
    assert!(
        !maddrs(&net).contains("33:33:ff:00:00:03"),
        "{}",
        maddrs(&net)
    );
    assert!(
        !out.contains(&format!("pid {dead}:")),
        "blamed the dead pid as busy:\n{out}"
    );
    assert!(out.contains(&format!("keeper (pid {keeper}")), "{out}");
    let gone = !std::fs::read(format!("/proc/{keeper}/cmdline")).is_ok_and(|c| !c.is_empty());
    assert!(gone, "the keeper lives on");
    assert_echoes(&net, v4, 1 << 20, 2);
    let (status, out) = next.stop();
    assert_clean_exit(status, &out);
    assert!(
        !owner.exists(),
        "a clean exit removes its record: {:?}",
        std::fs::read_to_string(&owner)
    );
    eprintln!("transfer reset {cut:?} after the kill; next server serving {took:?} after it");
    Ok(())
}

/// With no server after it, the program answers for the dead one as long as it was told
/// (here 1 s), then goes with its keeper: nothing is left attached.
#[test]
fn crash_sigkill_the_program_goes_after_its_linger() -> Result<(), String> {
    if !require_root("crash_sigkill_linger") {
        return Ok(());
    }
    let net = net(1);
    peer_takes_xdp_tx(&net, true)?;
    let v4: SocketAddr = format!("{SERVER_V4}:7").parse().map_err(|_| "addr")?;
    let server = Echo::start(
        &net,
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "1",
            "--linger-on-death",
            "1",
        ],
    );
    assert_echoes(&net, v4, 4096, 1);
    let owner = claim_file_of(server.pid()).ok_or("no claim record for the server")?;
    let dir = owner.parent().ok_or("claim record without a directory")?;
    let (stats, capture) = (dir.join("stats"), dir.join("capture"));
    assert!(stats.exists() && capture.exists(), "{}", dir.display());
    server.signal(libc::SIGKILL);
    let _ = server.wait();
    let refused = net
        .client_ns()
        .run(move || std::net::TcpStream::connect_timeout(&v4, Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    let kind = refused.err().map(|e| e.kind());
    assert_eq!(
        kind,
        Some(std::io::ErrorKind::ConnectionRefused),
        "answered with a reset while the keeper holds the program"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while net.server_link().unwrap_or_default().contains("xdp") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_no_xdp(&net);
    // The keeper took the dead server's statistics and capture files with it (megabytes of
    // tmpfs), and left the record a next server undoes the rest from.
    assert!(!stats.exists() && !capture.exists(), "{}", dir.display());
    assert!(owner.exists(), "the claim record went too");
    Ok(())
}
