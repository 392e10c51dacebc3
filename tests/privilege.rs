//! Least privilege, tested as an unprivileged user (`nobody`) with exactly the capabilities
//! each mode documents, through `setpriv`:
//! - a server under a grant from `corelane-broker grant` runs with `CAP_NET_RAW` and
//!   `CAP_IPC_LOCK` alone, ends up with no capability in any thread, and can steer only what
//!   was granted; the broker runs with `CAP_NET_ADMIN`, `CAP_BPF` and `CAP_PERFMON` and keeps
//!   the first two;
//! - a server that attaches its own program runs with those four plus `CAP_IPC_LOCK` and keeps
//!   `CAP_NET_ADMIN` and `CAP_BPF`;
//! - every missing privilege is one line naming the capability and the fix.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use common::*;
use corelane_testnet::{VethPair, require_root};

const NOBODY: u32 = 65534;
const CAP_NET_ADMIN: u64 = 1 << 12;
const CAP_BPF: u64 = 1 << 39;

/// A run directory `nobody` may write (each test its own: claims never collide).
fn run_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("corelane-priv-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    dir
}

/// `program args` in the server namespace as user `uid` with exactly `caps` (setpriv names:
/// `net_raw`, ...), in run directory `run`.
fn as_user(
    net: &VethPair,
    run: &Path,
    uid: u32,
    caps: &[&str],
    program: &Path,
    args: &[&str],
) -> Command {
    let set = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = net.server_ns().command("setpriv");
    cmd.env("CORELANE_RUN_DIR", run)
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg(format!("--inh-caps={set}"))
        .arg(format!("--ambient-caps={set}"))
        .arg(format!("--bounding-set={set}"))
        .arg("--")
        .arg(program)
        .args(args);
    cmd
}

fn broker_bin() -> PathBuf {
    workspace_bin("corelane-broker").unwrap()
}

/// The broker, as `nobody` with exactly what it needs, granting `.3` and `fd00:77::3` with
/// TCP and UDP port 7 to `nobody`.
fn start_broker(net: &VethPair, run: &Path) -> Echo {
    Echo::start_cmd(broker_cmd(net, run), "corelane-broker")
}

/// The command [`start_broker`] runs.
fn broker_cmd(net: &VethPair, run: &Path) -> Command {
    as_user(
        net,
        run,
        NOBODY,
        &["net_admin", "bpf", "perfmon"],
        &broker_bin(),
        &[
            "grant",
            net.server_if(),
            "--addr",
            SERVER_V4,
            "--addr",
            SERVER_V6,
            "--tcp",
            "7",
            "--udp",
            "7",
            "--user",
            "nobody",
        ],
    )
}

fn echo_args(net: &VethPair) -> Vec<String> {
    [
        "--iface",
        net.server_if(),
        "--cores",
        "1",
        "--addr",
        "10.77.0.3/24",
        "--addr",
        "fd00:77::3/64",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn echo_as(net: &VethPair, run: &Path, uid: u32, caps: &[&str], extra: &[&str]) -> Command {
    let mut args = echo_args(net);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    as_user(net, run, uid, caps, &echo_bin(), &args)
}

/// Runs to completion; status and everything printed.
fn finish(mut cmd: Command) -> (ExitStatus, String) {
    let out = cmd.output().expect("run");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status, text)
}

/// The effective capabilities of every thread of `pid`.
fn thread_caps(pid: u32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        let name = status
            .lines()
            .find_map(|l| l.strip_prefix("Name:"))
            .unwrap_or("")
            .trim()
            .to_string();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .expect("CapEff");
        out.push((name, eff));
    }
    assert!(!out.is_empty());
    out
}

fn wait_for(e: &Echo, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !e.output().contains(text) {
        assert!(Instant::now() < deadline, "no `{text}`:\n{}", e.output());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A broker on `net` and a granted echo server (user nobody, `CAP_NET_RAW` and `CAP_IPC_LOCK`
/// only) that has taken its grant.
fn broker_and_granted_server(net: &VethPair, run: &Path) -> (Echo, Echo) {
    let broker = start_broker(net, run);
    let server = Echo::start_cmd(
        echo_as(net, run, NOBODY, &["net_raw", "ipc_lock"], &[]),
        "echo",
    );
    wait_for(
        &broker,
        &format!("pid {} (uid {NOBODY}) took", server.pid()),
    );
    (broker, server)
}

/// The one line containing "error", after checking there is exactly one.
fn one_error_line(status: ExitStatus, out: &str) -> String {
    assert!(!status.success(), "expected a failure:\n{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "want exactly one error line:\n{out}");
    assert!(!out.contains("verifier log"), "{out}");
    lines[0].to_string()
}

#[test]
fn a_granted_server_needs_only_net_raw_and_steers_only_its_grant() {
    if !require_root("a_granted_server_needs_only_net_raw_and_steers_only_its_grant") {
        return;
    }
    let net = net(1);
    let run = run_dir("granted");
    let (broker, server) = broker_and_granted_server(&net, &run);
    assert!(
        server.output().contains("by corelane-broker grant"),
        "{}",
        server.output()
    );
    // Once started, no thread of the server holds any capability; the broker keeps what it
    // needs for map updates and queue changes.
    for (name, caps) in thread_caps(server.pid()) {
        assert_eq!(caps, 0, "server thread {name} kept capabilities {caps:#x}");
    }
    for (name, caps) in thread_caps(broker.pid()) {
        assert_eq!(
            caps,
            CAP_NET_ADMIN | CAP_BPF,
            "broker thread {name}: {caps:#x}"
        );
    }
    // Its restart key (ISNs and timestamps that run on across its restarts) is the broker's
    // for its user, kept under the broker's own (uid NOBODY here), readable by it alone.
    let key = run
        .join("keys")
        .join(format!("uid-{NOBODY}"))
        .join("restart-key");
    let meta = std::fs::metadata(&key)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", key.display(), server.output()));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (meta.uid(), meta.mode() & 0o777, meta.len()),
        (NOBODY, 0o600, 16)
    );
    assert!(
        !server.output().contains("no restart key"),
        "{}",
        server.output()
    );
    let v4 = SocketAddr::new(SERVER_V4.parse().unwrap(), 7);
    let v6 = SocketAddr::new(SERVER_V6.parse().unwrap(), 7);
    assert_echoes(&net, v4, 256 * 1024, 1);
    assert_echoes(&net, v6, 64 * 1024, 2);
    // Its live statistics are published through the file the broker handed it.
    let list = net
        .server_ns()
        .command(workspace_bin("corelane-stat").unwrap().to_str().unwrap())
        .env("CORELANE_RUN_DIR", &run)
        .arg("list")
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(&server.pid().to_string())),
        "corelane-stat list: {list}"
    );

    // Packet capture works through the broker too: it made the capture file beside the stats
    // file, sealed, found by root's reader through its pointer.
    let capture = run_capture_during(&net, &run, || assert_echoes(&net, v4, 16 * 1024, 4));
    assert!(
        capture >= 6,
        "a handshake and echoed data captured: {capture} frames"
    );

    // A second server is refused, naming the first.
    let (status, out) = finish(echo_as(&net, &run, NOBODY, &["net_raw", "ipc_lock"], &[]));
    let line = one_error_line(status, &out);
    assert!(line.contains(&format!("pid {}", server.pid())), "{line}");
    // A user the grant does not name is refused.
    let (status, out) = finish(echo_as(&net, &run, 65533, &["net_raw", "ipc_lock"], &[]));
    let line = one_error_line(status, &out);
    assert!(line.contains("uid 65533 is not granted"), "{line}");

    // Killed: the broker stops steering what it asked for, and the next server serves.
    server.signal(libc::SIGKILL);
    let (_, _) = server.wait();
    wait_for(&broker, "left");
    let server = Echo::start_cmd(
        echo_as(&net, &run, NOBODY, &["net_raw", "ipc_lock"], &[]),
        "echo",
    );
    assert_echoes(&net, v4, 64 * 1024, 3);
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);

    // Outside the grant: an address, and a port (the bind fails, named, in one line).
    let (status, out) = finish(echo_as(
        &net,
        &run,
        NOBODY,
        &["net_raw", "ipc_lock"],
        &["--addr", "10.77.0.9/24"],
    ));
    assert!(
        one_error_line(status, &out).contains("10.77.0.9 is not granted"),
        "{out}"
    );
    let server = Echo::start_cmd(
        echo_as(
            &net,
            &run,
            NOBODY,
            &["net_raw", "ipc_lock"],
            &["--port", "9"],
        ),
        "echo",
    );
    wait_for(&server, "tcp port 9 is not granted");
    drop(server);

    // The broker stops on SIGTERM: program detached, socket and claim gone.
    broker.signal(libc::SIGTERM);
    let (status, out) = broker.wait();
    assert!(status.success(), "{out}");
    assert!(out.contains("program detached"), "{out}");
    assert_no_xdp(&net);
    let left = left_behind(&run);
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&run);
}

/// Runs `corelane-stat capture` (as root) on the granted server's TCP port 7 while `load`
/// runs; returns the frames `tcpdump -r` reads from the file. Checks the capture file's owner
/// and mode on the way.
fn run_capture_during(net: &VethPair, run: &Path, load: impl FnOnce()) -> usize {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::MetadataExt;
    let out = run.join("granted-capture.pcapng");
    let mut cap = net
        .server_ns()
        .command(workspace_bin("corelane-stat").unwrap().to_str().unwrap())
        .env("CORELANE_RUN_DIR", run)
        .args(["capture", "-w"])
        .arg(&out)
        .args([
            "--port",
            "7",
            "--proto",
            "tcp",
            "-c",
            "6",
            "--seconds",
            "20",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(cap.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(
        line.contains("capturing on"),
        "corelane-stat capture: {line}"
    );
    let file = walk(run)
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == "capture"))
        .expect("the broker's capture file");
    // A pointer to the sealed memory file the broker made (nothing the server can grow sits
    // in the run directory), readable by the broker's user alone.
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600, "{}", file.display());
    let pointer = std::fs::read_to_string(&file).unwrap();
    assert!(pointer.starts_with("corelane-sealed "), "{pointer}");
    load();
    let status = cap.wait().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    assert!(status.success(), "corelane-stat capture: {line}{rest}");
    let read = Command::new("tcpdump")
        .args(["-r", out.to_str().unwrap(), "-nn", "tcp", "port", "7"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&out);
    String::from_utf8_lossy(&read.stdout).lines().count()
}

/// Every file under `dir` but the restart keys, which outlive every run on purpose (until the
/// machine restarts: a new process's ISNs and timestamps go on from its last one's).
fn left_behind(dir: &Path) -> Vec<PathBuf> {
    walk(dir)
        .into_iter()
        .filter(|p| !p.ends_with(corelane_stat::RESTART_KEY_FILE))
        .collect()
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_server_that_attaches_needs_four_capabilities_and_its_wire_threads_keep_none() {
    if !require_root(
        "a_server_that_attaches_needs_four_capabilities_and_its_wire_threads_keep_none",
    ) {
        return;
    }
    let net = net(1);
    let run = run_dir("attach");
    let caps = ["net_admin", "net_raw", "bpf", "perfmon", "ipc_lock"];
    let server = Echo::start_cmd(
        echo_as(&net, &run, NOBODY, &caps, &["--xdp", "attach"]),
        "echo",
    );
    // The threads that parse the wire and run the application's tasks keep nothing; the
    // privileged thread, corelane-priv (the XDP program's maps, IPv6 groups), and the thread
    // that built the runtime (it puts the queues back and detaches) keep the two they need.
    let is_core = |name: &str| {
        name.strip_prefix("corelane-")
            .map(|r| r.trim_end_matches("-app"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    // A thread names itself once it first runs: on a busy machine the privileged thread may
    // not have run yet when the server says it is ready (it still shows the process's name).
    let deadline = Instant::now() + Duration::from_secs(10);
    let threads = loop {
        let threads = thread_caps(server.pid());
        let named = threads.iter().any(|(n, _)| is_core(n))
            && threads.iter().any(|(n, _)| n == "corelane-priv");
        if named || Instant::now() >= deadline {
            break threads;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(threads.iter().any(|(n, _)| is_core(n)), "{threads:?}");
    assert!(
        threads.iter().any(|(n, _)| n == "corelane-priv"),
        "{threads:?}"
    );
    for (name, caps) in &threads {
        if is_core(name) {
            assert_eq!(*caps, 0, "core thread {name}: {caps:#x}");
        } else {
            assert_eq!(
                *caps & !(CAP_NET_ADMIN | CAP_BPF),
                0,
                "thread {name}: {caps:#x}"
            );
        }
    }
    let steward = threads.iter().find(|(n, _)| n == "corelane-priv").unwrap();
    assert_eq!(steward.1, CAP_NET_ADMIN | CAP_BPF, "{threads:?}");
    assert_echoes(
        &net,
        SocketAddr::new(SERVER_V4.parse().unwrap(), 7),
        128 * 1024,
        4,
    );
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    assert_no_xdp(&net);
    let _ = std::fs::remove_dir_all(&run);
}

#[test]
fn each_missing_privilege_is_one_line_naming_it_and_the_fix() {
    if !require_root("each_missing_privilege_is_one_line_naming_it_and_the_fix") {
        return;
    }
    let net = net(1);
    let run = run_dir("missing");
    // Attaching without CAP_PERFMON: named before the verifier is reached.
    let (status, out) = finish(echo_as(
        &net,
        &run,
        NOBODY,
        &["net_admin", "net_raw", "bpf", "ipc_lock"],
        &[],
    ));
    let line = one_error_line(status, &out);
    // The suggested command works as written: ambient capabilities need the inheritable set.
    for want in [
        "lacks CAP_PERFMON;",
        "setpriv --inh-caps=+net_admin",
        "--ambient-caps=+net_admin",
        "corelane-broker grant",
    ] {
        assert!(line.contains(want), "{want}: {line}");
    }
    // The broker without CAP_PERFMON.
    let broker = as_user(
        &net,
        &run,
        NOBODY,
        &["net_admin", "bpf"],
        &broker_bin(),
        &[
            "grant",
            net.server_if(),
            "--addr",
            SERVER_V4,
            "--user",
            "nobody",
        ],
    );
    let (status, out) = finish(broker);
    let line = one_error_line(status, &out);
    assert!(line.contains("lacks CAP_PERFMON"), "{line}");
    assert_no_xdp(&net);

    let broker = start_broker(&net, &run);
    // Under a grant, without CAP_NET_RAW.
    let (status, out) = finish(echo_as(&net, &run, NOBODY, &[], &[]));
    let line = one_error_line(status, &out);
    assert!(line.contains("lacks CAP_NET_RAW"), "{line}");
    // Without CAP_IPC_LOCK and under a locked-memory limit smaller than the UMEM.
    let mut args = echo_args(&net);
    args.splice(
        0..0,
        ["--memlock=65536:65536".to_string(), "--".to_string()],
    );
    args.insert(2, echo_bin().display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, out) = finish(as_user(
        &net,
        &run,
        NOBODY,
        &["net_raw"],
        Path::new("/usr/bin/prlimit"),
        &args,
    ));
    let line = one_error_line(status, &out);
    for want in ["locked memory", "64 KiB", "CAP_IPC_LOCK", "ulimit -l"] {
        assert!(line.contains(want), "{want}: {line}");
    }
    // Without CAP_NET_RAW and under that limit: both in the one line, fixed in one round.
    let (status, out) = finish(as_user(
        &net,
        &run,
        NOBODY,
        &[],
        Path::new("/usr/bin/prlimit"),
        &args,
    ));
    let line = one_error_line(status, &out);
    for want in ["lacks CAP_NET_RAW", "locked memory", "64 KiB", "ulimit -l"] {
        assert!(line.contains(want), "{want}: {line}");
    }
    // Demanding a grant where none is served.
    broker.signal(libc::SIGTERM);
    let (status, out) = broker.wait();
    assert!(status.success(), "{out}");
    let (status, out) = finish(echo_as(
        &net,
        &run,
        NOBODY,
        &["net_raw", "ipc_lock"],
        &["--xdp", "granted"],
    ));
    let line = one_error_line(status, &out);
    assert!(line.contains("no corelane-broker grant serves"), "{line}");
    let _ = std::fs::remove_dir_all(&run);
}

/// A local user cannot take the broker down: a thousand idle connections to its socket,
/// under an open-file limit of 64, leave it serving (connections past its limit are closed
/// at once, the rest dropped when they say no hello in 2 s), and a granted server then
/// starts and echoes.
#[test]
fn a_thousand_idle_connections_do_not_take_the_broker_down() {
    if !require_root("a_thousand_idle_connections_do_not_take_the_broker_down") {
        return;
    }
    let net = net(1);
    let run = run_dir("idle");
    let inner = broker_cmd(&net, &run);
    let mut cmd = Command::new("prlimit");
    cmd.env("CORELANE_RUN_DIR", &run)
        .arg("--nofile=64:64")
        .arg("--")
        .arg(inner.get_program())
        .args(inner.get_args());
    let broker = Echo::start_cmd(cmd, "corelane-broker");
    wait_for(&broker, "serving");
    let path = broker
        .output()
        .lines()
        .find_map(|l| {
            l.split("grant socket ")
                .nth(1)
                .map(|p| p.trim().to_string())
        })
        .expect("the broker names its socket");
    let mut idle = Vec::new();
    for _ in 0..1000 {
        if let Ok(s) = corelane_xsk::grant::open_connection(Path::new(&path)) {
            idle.push(s);
        }
    }
    assert!(
        idle.len() >= 900,
        "{} connections opened to {path}: {:?}",
        idle.len(),
        corelane_xsk::grant::open_connection(Path::new(&path)).err()
    );
    // The idle ones that got a session thread are dropped after their hello deadline.
    std::thread::sleep(Duration::from_millis(2500));
    let alive = process_alive(broker.pid());
    assert!(alive, "the broker died:\n{}", broker.output());
    let server = Echo::start_cmd(
        echo_as(&net, &run, NOBODY, &["net_raw", "ipc_lock"], &[]),
        "echo",
    );
    wait_for(
        &broker,
        &format!("pid {} (uid {NOBODY}) took", server.pid()),
    );
    assert_echoes(
        &net,
        SocketAddr::new(SERVER_V4.parse().unwrap(), 7),
        64 * 1024,
        3,
    );
    drop(idle);
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let (_, out) = broker.stop();
    assert!(!out.contains("error"), "{out}");
}

/// Whether process `pid` still runs (its /proc entry is there and not a zombie).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2).is_none_or(|st| st != "Z"))
        .unwrap_or(false)
}

/// A granted server that dies (SIGKILL: nothing of it runs) leaves no peer waiting: the broker
/// keeps its addresses owned a while with no port steered, so the XDP program answers what
/// its peers still send with a reset, as a host does for a process that died, and a new SYN
/// is refused at once.
#[test]
fn a_killed_granted_server_s_peers_are_reset_at_once() {
    if !require_root("a_killed_granted_server_s_peers_are_reset_at_once") {
        return;
    }
    use std::io::{Read, Write};
    let net = net(1);
    // veth hands the program's answers (XDP_TX) to a peer only when the peer runs an XDP
    // program of its own (a NIC needs none): corelane's, owning nothing, passes everything.
    let object = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/corelane-xsk/xdp/corelane.bpf.o"
    );
    net.client_ns()
        .attach_xdp(net.client_if(), object)
        .expect("the peer's program");
    let run = run_dir("killed");
    let (broker, server) = broker_and_granted_server(&net, &run);
    let v4: SocketAddr = SocketAddr::new(SERVER_V4.parse().unwrap(), 7);
    let mut s = net
        .client_ns()
        .run(move || connect_patiently(v4))
        .expect("client thread");
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    server.signal(libc::SIGKILL);
    let (_, _) = server.wait();
    wait_for(&broker, "left");
    // The peer writes again: a reset comes back, long before any timeout.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    let _ = s.write_all(b"more");
    let r = s.read(&mut b);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "after the server died the peer got {r:?} in {:?}",
        start.elapsed()
    );
    // A new connection is refused at once.
    let refused = net
        .client_ns()
        .run(move || std::net::TcpStream::connect_timeout(&v4, Duration::from_secs(3)))
        .expect("client thread");
    assert!(
        matches!(&refused, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
    let (_, out) = broker.stop();
    assert!(out.contains("answer with resets"), "{out}");
}

#[test]
fn a_broker_stopped_while_its_server_runs_leaves_nothing_behind() {
    if !require_root("a_broker_stopped_while_its_server_runs_leaves_nothing_behind") {
        return;
    }
    let net = net(1);
    let run = run_dir("stopped-under");
    let (broker, server) = broker_and_granted_server(&net, &run);
    // The session's files (statistics, capture) are there while the server is.
    let during = walk(&run);
    assert!(during.iter().any(|p| p.ends_with("capture")), "{during:?}");
    // Stopped with the session still open: everything it made goes with it.
    broker.signal(libc::SIGTERM);
    let (status, out) = broker.wait();
    assert!(status.success(), "{out}");
    let left = left_behind(&run);
    assert!(left.is_empty(), "left behind: {left:?}");
    drop(server);
    let _ = std::fs::remove_dir_all(&run);
}
