//! The users of the same machine: what a local process that is not the server's may do to it.
//! - a second user granted the same interface cannot take the first one's server over
//!   (`hello upgrade` is refused unless it comes from the holder's own user);
//! - root refuses a run directory another user can change, and never writes through a link
//!   planted in one (the claim's `owner` linked to a file of root's is left as it was);
//! - a process of the server's own user without the server's capabilities is not handed the
//!   program, the queues and the UMEM over the upgrade socket, nor one in a user namespace of
//!   its own making (where it shows every capability), nor one that sent no proof;
//! - a broker's `hello upgrade` takes the same rules;
//! - users that keep connections to the broker open all the time (one not granted, one
//!   granted) do not keep a granted server from starting.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use corelane_testnet::{VethPair, require_root};

const NOBODY: u32 = 65534;
/// A second user with no passwd entry (setpriv takes a number).
const OTHER: u32 = 4242;
const SERVER_V4: &str = "10.77.0.3";

fn run_dir(test: &str, owner: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("corelane-trust-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(owner), Some(owner)).unwrap();
    dir
}

/// `program args` in the server namespace as `uid` with exactly `caps`.
fn as_user(net: &VethPair, run: &Path, uid: u32, caps: &[&str], program: &Path) -> Command {
    let set = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = net.server_ns().command("setpriv");
    cmd.env("CORELANE_RUN_DIR", run)
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(format!("--inh-caps={set}"))
        .arg(format!("--ambient-caps={set}"))
        .arg(format!("--bounding-set={set}"))
        .arg("--")
        .arg(program);
    cmd
}

/// The echo example as nobody attaching its own program (the capabilities that needs: the
/// documented least-privilege server, a service user with ambient capabilities), one core,
/// with `upgrade` (`--upgrades PATH` or `--upgrade-from PATH`), logging the upgrade's steps.
fn attaching_echo(net: &VethPair, run: &Path, upgrade: [&str; 2]) -> Echo {
    let caps = ["net_admin", "net_raw", "bpf", "perfmon", "ipc_lock"];
    let mut cmd = as_user(net, run, NOBODY, &caps, &echo_bin());
    cmd.args([
        "--iface",
        net.server_if(),
        "--cores",
        "1",
        "--addr",
        "10.77.0.3/24",
    ])
    .args(["--xdp", "attach"])
    .args(upgrade)
    .env("RUST_LOG", "corelane_rt=info");
    Echo::start_cmd(cmd, "echo")
}

fn grant_args(net: &VethPair) -> Vec<String> {
    [
        "grant",
        net.server_if(),
        "--addr",
        SERVER_V4,
        "--tcp",
        "7",
        "--udp",
        "7",
        "--user",
        "nobody",
        "--user",
        &OTHER.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn wait_for(e: &Echo, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !e.output().contains(text) {
        assert!(Instant::now() < deadline, "no `{text}`:\n{}", e.output());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the broker at `socket` answers `hello` from `uid` (python3 as that user: a
/// `SOCK_SEQPACKET` client with no privilege at all).
fn hello_as(net: &VethPair, uid: u32, socket: &str, hello: &str) -> String {
    let script = "import socket,sys\n\
                  s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n\
                  s.settimeout(5)\n\
                  s.connect(sys.argv[1])\n\
                  s.send(sys.argv[2].encode())\n\
                  print(s.recv(4096).decode(errors='replace'))\n";
    let out = python_as(net, uid)
        .args(["-c", script, socket, hello])
        .output()
        .expect("python3");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

/// python3 in the server namespace as `uid` with exactly `caps` (ambient), run through
/// `wrap` first (`unshare -U -r -n`: a user and network namespace of its own making).
fn python_with(net: &VethPair, uid: u32, caps: &[&str], wrap: &[&str]) -> Command {
    let set = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = net.server_ns().command("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(format!("--inh-caps={set}"))
        .arg(format!("--ambient-caps={set}"))
        .arg(format!("--bounding-set={set}"))
        .arg("--")
        .args(wrap)
        .arg("/usr/bin/python3");
    cmd
}

/// What the socket at `socket` answers a successor's first word `word`, sent by `cmd` (a
/// python3) with a proof of its own making when it can make one: a unix socket marked with
/// `corelane_xsk::peer::PROOF_MARK` (only a holder of CAP_NET_RAW over the network namespace
/// it runs in can mark one). The first line says whether it could.
fn successor_says(mut cmd: Command, socket: &str, word: &str) -> String {
    let script = "import socket,sys\n\
                  s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n\
                  s.settimeout(5)\n\
                  s.connect(sys.argv[1])\n\
                  p=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n\
                  try:\n\
                  \x20 p.setsockopt(socket.SOL_SOCKET,socket.SO_MARK,int(sys.argv[3]))\n\
                  \x20 print('marked')\n\
                  except OSError as e:\n\
                  \x20 print('cannot mark', e.errno)\n\
                  w=sys.argv[2].encode()\n\
                  if w==b'hello upgrade':\n\
                  \x20 s.send(w); r=s.recv(4096).decode(errors='replace')\n\
                  \x20 if r!='ok prove': print(r); sys.exit(0)\n\
                  \x20 w=b'prove'\n\
                  socket.send_fds(s,[w],[p.fileno()])\n\
                  print(s.recv(4096).decode(errors='replace'))\n";
    let out = cmd
        .args(["-c", script, socket, word])
        .arg(corelane_xsk::peer::PROOF_MARK.to_string())
        .output()
        .expect("python3");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

/// A user and a network namespace of the caller's own making, its user mapped to root there:
/// every capability, over nothing of the server's.
const OWN_NAMESPACES: [&str; 4] = ["unshare", "-U", "-r", "-n"];
/// A user namespace of its own only (the server's network namespace still).
const OWN_USER_NS: [&str; 3] = ["unshare", "-U", "-r"];

/// python3 in the server namespace as `uid` with no capability at all.
fn python_as(net: &VethPair, uid: u32) -> Command {
    let mut cmd = net.server_ns().command("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .args([
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            "/usr/bin/python3",
        ]);
    cmd
}

/// The broker as nobody with what it needs, granting nobody and [`OTHER`]; and its socket.
fn start_broker(net: &VethPair, run: &Path) -> (Echo, String) {
    let broker_bin = workspace_bin("corelane-broker").unwrap();
    let mut cmd = as_user(
        net,
        run,
        NOBODY,
        &["net_admin", "bpf", "perfmon"],
        &broker_bin,
    );
    cmd.args(grant_args(net));
    let broker = Echo::start_cmd(cmd, "corelane-broker");
    let socket = broker
        .output()
        .lines()
        .find_map(|l| {
            l.split("grant socket ")
                .nth(1)
                .map(|p| p.trim().to_string())
        })
        .expect("the broker names its socket");
    (broker, socket)
}

/// The echo example as nobody under the broker's grant (`CAP_NET_RAW`, `CAP_IPC_LOCK`), once
/// it has taken the grant.
fn start_granted_server(net: &VethPair, run: &Path, broker: &Echo) -> Echo {
    let mut cmd = as_user(net, run, NOBODY, &["net_raw", "ipc_lock"], &echo_bin());
    cmd.args([
        "--iface",
        net.server_if(),
        "--cores",
        "1",
        "--addr",
        "10.77.0.3/24",
    ]);
    let server = Echo::start_cmd(cmd, "echo");
    wait_for(broker, &format!("pid {} (uid {NOBODY}) took", server.pid()));
    server
}

#[test]
fn a_second_granted_user_cannot_take_over_the_first_one_s_server() {
    if !require_root("a_second_granted_user_cannot_take_over_the_first_one_s_server") {
        return;
    }
    let net = net(1);
    let run = run_dir("successor", NOBODY);
    let (broker, socket) = start_broker(&net, &run);
    let server = start_granted_server(&net, &run, &broker);

    // The other granted user asks to be the running server's successor: refused, naming
    // whose server it is.
    let said = hello_as(&net, OTHER, &socket, "hello upgrade");
    assert!(
        said.starts_with("err") && said.contains(&format!("only uid {NOBODY}")),
        "the broker answered uid {OTHER}'s `hello upgrade` with: {said}\n{}",
        broker.output()
    );
    // The server still serves, its connections untouched.
    let v4 = SocketAddr::new(SERVER_V4.parse().unwrap(), 7);
    let served = net.client_ns().run(move || echo_once(v4)).unwrap();
    assert!(
        served.is_ok(),
        "{served:?}\n{}\n{}",
        server.output(),
        broker.output()
    );
    assert_echoes(&net, v4, 64 * 1024, 1);
    // The holder's own user may be one (an upgrade is the same user's), once it has proved it
    // holds CAP_NET_RAW here; without the capability it cannot, and is refused.
    let said = hello_as(&net, NOBODY, &socket, "hello upgrade");
    assert!(said.starts_with("ok prove"), "{said}\n{}", broker.output());
    let bare = python_with(&net, NOBODY, &[], &[]);
    let said = successor_says(bare, &socket, "hello upgrade");
    assert!(
        said.starts_with("cannot mark") && said.contains("err") && said.contains("not marked"),
        "{said}\n{}",
        broker.output()
    );
    // In a user namespace of its own it holds every capability there and none here.
    for wrap in [&OWN_NAMESPACES[..], &OWN_USER_NS[..]] {
        let cmd = python_with(&net, NOBODY, &[], wrap);
        let said = successor_says(cmd, &socket, "hello upgrade");
        assert!(
            said.contains("err") && said.contains("another user namespace"),
            "{wrap:?}: {said}\n{}",
            broker.output()
        );
    }
    let said = successor_says(
        python_with(&net, NOBODY, &["net_raw"], &[]),
        &socket,
        "hello upgrade",
    );
    assert!(
        said.starts_with("marked") && said.contains("\nok"),
        "{said}\n{}",
        broker.output()
    );
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let (_, out) = broker.stop();
    assert!(out.contains("refused pid"), "{out}");
    let _ = std::fs::remove_dir_all(&run);
}

#[test]
fn root_refuses_a_run_directory_a_user_owns_and_writes_through_no_link_planted_there() {
    if !require_root(
        "root_refuses_a_run_directory_a_user_owns_and_writes_through_no_link_planted_there",
    ) {
        return;
    }
    let net = net(1);
    let run = run_dir("planted", NOBODY);
    // What the run directory's owner wants root to empty: a file of root's elsewhere.
    let precious =
        std::env::temp_dir().join(format!("corelane-trust-{}-shadow", std::process::id()));
    std::fs::write(&precious, b"root:secret:1\n").unwrap();
    let cookie = net
        .server_ns()
        .run(|| corelane_xsk::netns_id().map_err(|e| e.to_string()))
        .unwrap()
        .unwrap();
    let dir = run.join(&cookie).join(net.server_if());
    std::fs::create_dir_all(&dir).unwrap();
    for d in [run.join(&cookie), dir.clone()] {
        std::os::unix::fs::chown(&d, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::os::unix::fs::symlink(&precious, dir.join("owner")).unwrap();

    // The broker, as root, over that directory: one line naming it and the fix.
    let out = net
        .server_ns()
        .command(workspace_bin("corelane-broker").unwrap().to_str().unwrap())
        .env("CORELANE_RUN_DIR", &run)
        .args(grant_args(&net))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!("owned by uid {NOBODY}")) && text.contains("CORELANE_RUN_DIR"),
        "{text}"
    );
    // A server attaching its own program, as root: refused the same way.
    let (status, out) = run_echo_in(&net, &run);
    assert!(!status.success(), "{out}");
    assert!(out.contains(&format!("owned by uid {NOBODY}")), "{out}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"root:secret:1\n");
    assert_no_xdp(&net);

    // The same link in a run directory of root's own (planted there by root's mistake, or
    // before the directory changed hands): not followed either.
    let ours = run_dir("planted-root", 0);
    let dir = ours.join(&cookie).join(net.server_if());
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&precious, dir.join("owner")).unwrap();
    let (status, out) = run_echo_in(&net, &ours);
    assert!(!status.success(), "{out}");
    assert!(out.contains("symbolic link, not followed"), "{out}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"root:secret:1\n");
    for d in [run, ours] {
        let _ = std::fs::remove_dir_all(d);
    }
    let _ = std::fs::remove_file(&precious);
}

/// The echo example as root with run directory `run`, to completion.
fn run_echo_in(net: &VethPair, run: &Path) -> (std::process::ExitStatus, String) {
    let out = net
        .server_ns()
        .command(echo_bin().to_str().unwrap())
        .env("CORELANE_RUN_DIR", run)
        .args([
            "--iface",
            net.server_if(),
            "--cores",
            "1",
            "--addr",
            "10.77.0.3/24",
            "--xdp",
            "attach",
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

#[test]
fn a_process_of_the_same_user_without_the_capabilities_gets_no_hand_over() {
    if !require_root("a_process_of_the_same_user_without_the_capabilities_gets_no_hand_over") {
        return;
    }
    let net = net(1);
    let run = run_dir("caps", NOBODY);
    let sock = run.join("upgrade.sock");
    let server = attaching_echo(&net, &run, ["--upgrades", sock.to_str().unwrap()]);
    // A process of the same user with no capability asks to take its place (its proof
    // unmarked: it cannot mark one): the connection closes with nothing handed over.
    let said = successor_says(
        python_with(&net, NOBODY, &[], &[]),
        sock.to_str().unwrap(),
        "prove",
    );
    assert!(
        !said.contains("corelane-upgrade"),
        "a capability-less process was handed the run: {said}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.output().contains("lacks capabilities") {
        assert!(Instant::now() < deadline, "{}", server.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_echoes(
        &net,
        SocketAddr::new(SERVER_V4.parse().unwrap(), 7),
        64 * 1024,
        1,
    );
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let _ = std::fs::remove_dir_all(&run);
}

#[test]
fn a_process_in_a_user_namespace_of_its_own_gets_no_hand_over() {
    if !require_root("a_process_in_a_user_namespace_of_its_own_gets_no_hand_over") {
        return;
    }
    let net = net(1);
    let run = run_dir("userns", NOBODY);
    let sock = run.join("upgrade.sock");
    let path = sock.to_str().unwrap();
    let server = attaching_echo(&net, &run, ["--upgrades", path]);
    assert_echoes(
        &net,
        SocketAddr::new(SERVER_V4.parse().unwrap(), 7),
        64 * 1024,
        1,
    );
    // A process of the same user with no capability makes a user namespace: there it shows
    // every capability. With a network namespace of its own too it can even mark its proof.
    // Neither is handed anything.
    for wrap in [&OWN_NAMESPACES[..], &OWN_USER_NS[..]] {
        let said = successor_says(python_with(&net, NOBODY, &[], wrap), path, "prove");
        assert!(
            !said.contains("corelane-upgrade"),
            "{wrap:?}: a process in a user namespace of its own was handed the run: {said}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.output().matches("another user namespace").count() < 2 {
        assert!(Instant::now() < deadline, "{}", server.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    // One that sends no proof at all: refused too.
    let said = hello_as(&net, NOBODY, path, "joined");
    assert!(!said.contains("corelane-upgrade"), "{said}");
    wait_for(&server, "before its proof");
    // The server serves on, and takes a real successor (same user, same capabilities) after.
    assert_echoes(
        &net,
        SocketAddr::new(SERVER_V4.parse().unwrap(), 7),
        64 * 1024,
        2,
    );
    let next = attaching_echo(&net, &run, ["--upgrade-from", path]);
    let (status, out) = server.wait();
    assert!(status.success() && out.contains("echo: upgraded"), "{out}");
    assert_echoes(
        &net,
        SocketAddr::new(SERVER_V4.parse().unwrap(), 7),
        64 * 1024,
        3,
    );
    let (status, out) = next.stop();
    assert_clean_exit(status, &out);
    let _ = std::fs::remove_dir_all(&run);
}

/// Keeps up to `n` connections to `socket` open as `uid` for `secs` seconds, opening one
/// whenever it can (every 2 ms) and closing each after 1.9 s, just before the broker's hello
/// deadline: a sustained attacker that never says anything and retakes every slot that frees.
fn hold_connections(
    net: &VethPair,
    uid: u32,
    socket: &str,
    n: u32,
    secs: u32,
) -> std::process::Child {
    let script = "import socket,sys,time\n\
                  p=sys.argv[1]; end=time.time()+float(sys.argv[2]); n=int(sys.argv[3])\n\
                  held=[]\n\
                  while time.time()<end:\n\
                  \x20   now=time.time()\n\
                  \x20   keep=[]\n\
                  \x20   for (t,s) in held:\n\
                  \x20       if now-t>1.9: s.close()\n\
                  \x20       else: keep.append((t,s))\n\
                  \x20   held=keep\n\
                  \x20   if len(held)<n:\n\
                  \x20       s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n\
                  \x20       s.setblocking(False)\n\
                  \x20       try:\n\
                  \x20           s.connect(p); held.append((now,s))\n\
                  \x20       except OSError:\n\
                  \x20           s.close()\n\
                  \x20   time.sleep(0.002)\n";
    python_as(net, uid)
        .args(["-c", script, socket, &secs.to_string(), &n.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3")
}

/// A user not granted cannot hand the broker a descriptor whose last close blocks (a TCP socket
/// lingering 30 s on data a zero window never takes): the grant socket takes no descriptor
/// before its user is granted, so the send fails (or finds the connection refused and closed
/// already); and a granted server starts meanwhile.
#[test]
fn a_user_not_granted_cannot_hand_the_broker_a_descriptor_that_blocks_its_close() {
    if !require_root("a_user_not_granted_cannot_hand_the_broker_a_descriptor_that_blocks_its_close")
    {
        return;
    }
    let net = net(1);
    let run = run_dir("linger", NOBODY);
    let (broker, socket) = start_broker(&net, &run);
    let script = "import socket,sys,struct\n\
                  l=socket.socket(); l.bind(('127.0.0.1',0)); l.listen()\n\
                  sent=refused=closed=0\n\
                  keep=[]\n\
                  for i in range(80):\n\
                  \x20 c=socket.create_connection(l.getsockname()); a,_=l.accept(); keep.append(a)\n\
                  \x20 c.setsockopt(socket.SOL_SOCKET,socket.SO_SNDBUF,4096)\n\
                  \x20 c.setblocking(False)\n\
                  \x20 try:\n\
                  \x20\x20 while True: c.send(b'x'*65536)\n\
                  \x20 except BlockingIOError: pass\n\
                  \x20 c.setsockopt(socket.SOL_SOCKET,socket.SO_LINGER,struct.pack('ii',1,30))\n\
                  \x20 s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n\
                  \x20 s.connect(sys.argv[1])\n\
                  \x20 try:\n\
                  \x20\x20 socket.send_fds(s,[b'hello'],[c.fileno()]); sent+=1\n\
                  \x20 except PermissionError: refused+=1\n\
                  \x20 except (BrokenPipeError, ConnectionResetError): closed+=1\n\
                  \x20 c.close(); s.close()\n\
                  print('sent', sent, 'refused', refused, 'closed', closed)\n";
    let mut attacker = python_as(&net, OTHER + 1)
        .args(["-c", script, &socket])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    // The granted server starts, takes the grant and serves meanwhile.
    let server = start_granted_server(&net, &run, &broker);
    assert_echoes(
        &net,
        SocketAddr::new(SERVER_V4.parse().unwrap(), 7),
        64 * 1024,
        1,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while attacker.try_wait().expect("the attacker").is_none() {
        assert!(Instant::now() < deadline, "the attacker did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = attacker.wait_with_output().expect("the attacker");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Refused at the send (EPERM), or already told why and closed: never delivered.
    assert!(said.starts_with("sent 0 refused "), "{said}");
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let (_, out) = broker.stop();
    assert!(!out.contains("cannot refuse descriptors"), "{out}");
    let _ = std::fs::remove_dir_all(&run);
}

/// A granted session asks for its stats and capture files again and again: the broker keeps
/// the latest of each, where it kept every one it ever made (descriptors and memory without
/// bound).
#[test]
fn asking_for_stats_again_and_again_holds_one_file_in_the_broker() {
    if !require_root("asking_for_stats_again_and_again_holds_one_file_in_the_broker") {
        return;
    }
    let net = net(1);
    let run = run_dir("memfds", NOBODY);
    let (broker, socket) = start_broker(&net, &run);
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", broker.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let script = "import socket,sys,os\n\
                  s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n\
                  s.settimeout(5)\n\
                  s.connect(sys.argv[1])\n\
                  s.send(b'hello'); print(s.recv(4096).decode())\n\
                  for i in range(int(sys.argv[2])):\n\
                  \x20 for w in (b'stats 4096', b'capture 4096'):\n\
                  \x20\x20 s.send(w); m,f,_,_=socket.recv_fds(s,4096,4)\n\
                  \x20\x20 [os.close(x) for x in f]\n\
                  print('asked', sys.argv[2]); sys.stdout.flush()\n\
                  sys.stdin.read()\n";
    let ask = |n: u32| {
        let mut child = python_as(&net, NOBODY)
            .args(["-c", script, &socket, &n.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("its output"));
        let mut line = String::new();
        while !line.starts_with("asked") {
            line.clear();
            let read = std::io::BufRead::read_line(&mut out, &mut line).expect("its output");
            assert!(read > 0, "the client ended early:\n{}", broker.output());
        }
        // Held open (stdin) while the broker's descriptors are counted.
        let held = fds();
        drop(child.stdin.take());
        let _ = child.wait();
        held
    };
    let once = ask(1);
    let many = ask(300);
    assert!(
        many <= once + 2,
        "the broker holds {many} descriptors after 300 requests of each kind, {once} after one"
    );
    let _ = broker.stop();
    let _ = std::fs::remove_dir_all(&run);
}

/// A granted user asks for the kernel's own address whole (every port corelane's, the host's
/// ssh and listeners on it reset): refused, naming the shared form and the grant's option;
/// shared, it is served.
#[test]
fn a_granted_user_gets_the_kernel_s_own_address_only_shared() {
    if !require_root("a_granted_user_gets_the_kernel_s_own_address_only_shared") {
        return;
    }
    let net = net(1);
    let run = run_dir("kernel-addr", NOBODY);
    net.server_ns()
        .ip(&["addr", "add", "10.77.0.3/24", "dev", net.server_if()])
        .expect("the kernel's address");
    let (broker, socket) = start_broker(&net, &run);
    let script = "import socket,sys\n\
                  s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n\
                  s.settimeout(5)\n\
                  s.connect(sys.argv[1])\n\
                  for w in sys.argv[2:]:\n\
                  \x20 s.send(w.encode()); print(s.recv(4096).decode(errors='replace'))\n";
    let out = python_as(&net, NOBODY)
        .args(["-c", script, &socket, "hello"])
        .args([
            &format!("addr {SERVER_V4}"),
            &format!("addr {SERVER_V4} shared"),
        ])
        .output()
        .expect("python3");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = said.lines().collect();
    let context = format!(
        "{said}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        broker.output()
    );
    assert!(
        lines.first().is_some_and(|l| l.starts_with("ok")),
        "{context}"
    );
    assert!(
        lines.get(1).is_some_and(|l| l.starts_with("err")
            && l.contains("served only shared")
            && l.contains("--own-kernel-addr")),
        "{context}"
    );
    assert!(lines.get(2).is_some_and(|l| *l == "ok"), "{context}");
    let _ = broker.stop();
    let _ = std::fs::remove_dir_all(&run);
}

#[test]
fn users_holding_connections_to_the_broker_do_not_keep_a_granted_server_out() {
    if !require_root("users_holding_connections_to_the_broker_do_not_keep_a_granted_server_out") {
        return;
    }
    let net = net(1);
    let run = run_dir("flood", NOBODY);
    let (broker, socket) = start_broker(&net, &run);
    // A user not granted, and a granted one, each keeping 64 connections open all along.
    let mut attackers = [
        hold_connections(&net, OTHER + 1, &socket, 64, 12),
        hold_connections(&net, OTHER, &socket, 64, 12),
    ];
    std::thread::sleep(Duration::from_secs(2));
    // The granted server starts, takes the grant and serves meanwhile.
    let server = start_granted_server(&net, &run, &broker);
    assert_echoes(
        &net,
        SocketAddr::new(SERVER_V4.parse().unwrap(), 7),
        64 * 1024,
        1,
    );
    for a in &mut attackers {
        let _ = a.kill();
        let _ = a.wait();
    }
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let (_, out) = broker.stop();
    assert!(out.contains("is not granted the interface"), "{out}");
    let _ = std::fs::remove_dir_all(&run);
}

#[test]
fn a_granted_server_cannot_grow_or_shrink_the_files_the_broker_hands_it() {
    if !require_root("a_granted_server_cannot_grow_or_shrink_the_files_the_broker_hands_it") {
        return;
    }
    let net = net(1);
    let run = run_dir("sealed", NOBODY);
    let (broker, socket) = start_broker(&net, &run);
    let server = start_granted_server(&net, &run, &broker);
    // As the server's user, on a session of its own: a file past the cap is refused, and the
    // descriptor of one within it can be written but not resized.
    let script = "import socket,sys,os\n\
                  s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n\
                  s.settimeout(5)\n\
                  s.connect(sys.argv[1])\n\
                  p=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n\
                  p.setsockopt(socket.SOL_SOCKET,socket.SO_MARK,int(sys.argv[2]))\n\
                  s.send(b'hello upgrade'); print(s.recv(4096).decode())\n\
                  socket.send_fds(s,[b'prove'],[p.fileno()]); print(s.recv(4096).decode())\n\
                  s.send(b'stats 1099511627776'); print(s.recv(4096).decode())\n\
                  s.send(b'capture 8192')\n\
                  m,fds,_,_=socket.recv_fds(s,4096,4); print(m.decode())\n\
                  f=fds[0]; print('size', os.fstat(f).st_size)\n\
                  os.pwrite(f, b'x'*16, 0); print('wrote')\n\
                  for n in (1<<30, 0):\n\
                  \x20 try: os.ftruncate(f, n); print('resized', n)\n\
                  \x20 except OSError as e: print('resize refused', e.errno)\n\
                  try: os.pwrite(f, b'x'*4096, 8192); print('wrote past the end')\n\
                  except OSError as e: print('write refused', e.errno)\n";
    let out = python_with(&net, NOBODY, &["net_raw"], &[])
        .args(["-c", script, &socket])
        .arg(corelane_xsk::peer::PROOF_MARK.to_string())
        .output()
        .expect("python3");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = said.lines().collect();
    let context = format!("{said}\n{}", broker.output());
    assert!(
        lines.first().is_some_and(|l| l.starts_with("ok prove"))
            && lines.get(1).is_some_and(|l| l.starts_with("ok")),
        "{context}"
    );
    assert!(
        lines
            .get(2)
            .is_some_and(|l| l.starts_with("err")
                && l.contains(&corelane_stat::SEALED_MAX_BYTES.to_string())),
        "a terabyte was not refused naming the cap: {context}"
    );
    for want in ["size 8192", "wrote", "resize refused 1", "write refused 1"] {
        assert!(lines.contains(&want), "no `{want}`: {context}");
    }
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("resize refused"))
            .count(),
        2,
        "{context}"
    );
    assert!(
        !said.contains("resized") && !said.contains("past the end"),
        "{context}"
    );
    drop(server);
    let _ = broker.stop();
    let _ = std::fs::remove_dir_all(&run);
}
