//! Bad input ends with one clear error line naming the cause and the fix, a non-zero exit, and
//! nothing left attached.

mod common;

use std::process::ExitStatus;

use common::*;
use corelane_testnet::{VethPair, require_root};

/// Runs `program args...` in the server namespace; returns its status and all it printed.
fn run_in_server(net: &VethPair, program: &str, args: &[&str]) -> (ExitStatus, String) {
    let out = net
        .server_ns()
        .command(program)
        .args(args)
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status, text)
}

#[test]
fn datapath_error_missing_interface() {
    if !require_root("datapath_error_missing_interface") {
        return;
    }
    let net = net(1);
    let echo = echo_bin();
    let (status, out) = run_in_server(
        &net,
        echo.to_str().unwrap(),
        &["--iface", "nosuch0", "--addr", "10.77.0.3/24"],
    );
    assert_fails_with(&net, status, &out, &["no interface `nosuch0`", "ip link"]);
}

#[test]
fn datapath_error_without_privileges() {
    if !require_root("datapath_error_without_privileges") {
        return;
    }
    let net = net(1);
    // Drop to nobody with no capabilities, inside the server namespace.
    let echo = echo_bin();
    let (status, out) = run_in_server(
        &net,
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            echo.to_str().unwrap(),
            "--iface",
            net.server_if(),
            "--addr",
            "10.77.0.3/24",
        ],
    );
    assert_fails_with(
        &net,
        status,
        &out,
        &[
            "missing privilege",
            "lacks CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF, CAP_PERFMON;",
            "run it as root",
            "corelane-broker grant",
        ],
    );
}

#[test]
fn datapath_error_native_mode_refused_by_the_driver() {
    if !require_root("datapath_error_native_mode_refused") {
        return;
    }
    // A macvlan has no native XDP.
    let net = net(1);
    net.server_ns()
        .ip(&[
            "link",
            "add",
            "clmv1",
            "link",
            net.server_if(),
            "type",
            "macvlan",
            "mode",
            "bridge",
        ])
        .unwrap();
    net.server_ns().ip(&["link", "set", "clmv1", "up"]).unwrap();
    let mut cmd = net
        .server_ns()
        .command(example_bin("echo").to_str().unwrap());
    cmd.args([
        "--iface",
        "clmv1",
        "--addr",
        "10.77.0.3/24",
        "--xdp-mode",
        "native",
    ]);
    let out = cmd.output().expect("echo");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_fails_with(
        &net,
        out.status,
        &text,
        &[
            "refused the XDP program in native mode",
            "clmv1 has no native XDP",
            "generic mode",
        ],
    );
}

#[test]
fn datapath_error_mtu_beyond_a_chain_of_frames() {
    if !require_root("datapath_error_mtu_beyond_a_chain_of_frames") {
        return;
    }
    // A frame longer than 17 UMEM frames of 4096 bytes (the kernel's limit on a chain) cannot
    // be carried in any mode: one line says so and what to do.
    let net = VethPair::builder()
        .mtu(65_500)
        .server_addr("10.77.0.1/24")
        .client_addr("10.77.0.2/24")
        .build()
        .unwrap();
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.3/24"]);
    assert_fails_with(
        &net,
        status,
        &out,
        &["MTU 65500", "lower the MTU to at most 65266"],
    );
}

#[test]
fn datapath_error_interface_already_served() {
    if !require_root("datapath_error_interface_already_served") {
        return;
    }
    let net = net(1);
    let first = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.4/24"]);
    assert!(!status.success(), "{out}");
    // The first server's program is still attached, so check the message here and the
    // detachment after the first server stops. The second is refused before it touches the
    // interface, naming the first.
    let errors: Vec<&str> = out.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{out}");
    let want = format!("served by another corelane runtime (pid {}", first.pid());
    assert!(errors[0].contains(&want), "{}", errors[0]);
    assert!(
        errors[0].contains(&format!("kill {}", first.pid())),
        "{}",
        errors[0]
    );
    // The first server is untouched and still echoes.
    assert_echoes(
        &net,
        format!("{SERVER_V4}:7").parse().unwrap(),
        256 * 1024,
        5,
    );
    let (status, out) = first.stop();
    assert_clean_exit(status, &out);
    assert_no_xdp(&net);
}

#[test]
fn datapath_error_bad_flags() {
    if !require_root("datapath_error_bad_flags") {
        return;
    }
    let net = net(1);
    for (args, want) in [
        (vec!["--addr", "10.77.0.3"], "not an address with prefix"),
        (
            vec!["--addr", "10.77.0.3/24", "--xdp-mode", "fast"],
            "use auto, native or generic",
        ),
        (
            vec!["--addr", "10.77.0.3/24", "--cores", "2"],
            "1 receive queue(s), too few for 2 core(s)",
        ),
    ] {
        let (status, out) = run_echo(&net, &args);
        assert_fails_with(&net, status, &out, &[want]);
    }
}

#[test]
fn datapath_error_an_address_the_kernel_holds_is_refused() {
    if !require_root("datapath_error_an_address_the_kernel_holds_is_refused") {
        return;
    }
    let net = net(1);
    // 10.77.0.1 is the kernel's own address on the server end.
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.1/24"]);
    assert_fails_with(
        &net,
        status,
        &out,
        &[
            "10.77.0.1 is the kernel's address",
            "ip addr del 10.77.0.1/24 dev",
        ],
    );
    // A malformed address names the text it could not take.
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.3/40"]);
    assert_fails_with(&net, status, &out, &["10.77.0.3/40", "at most 32"]);
}

#[test]
fn datapath_error_a_peer_sending_partial_checksums_is_named_with_the_fix() {
    if !require_root("datapath_error_a_peer_sending_partial_checksums_is_named_with_the_fix") {
        return;
    }
    let net = VethPair::builder()
        .server_addr("10.77.0.1/24")
        .client_addr("10.77.0.2/24")
        .client_tx_checksum_on(true)
        .build()
        .unwrap();
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24", "--cores", "1"]);
    let to: std::net::SocketAddr = "10.77.0.3:7".parse().unwrap();
    // Every SYN arrives with a partial checksum and is dropped: the connect fails. One
    // client's SYN and its first two retries (at about 1 and 3 s) are enough to be told.
    let ok = net
        .client_ns()
        .run(move || {
            usize::from(
                std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_millis(3500))
                    .is_ok(),
            )
        })
        .unwrap();
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert_eq!(ok, 0, "no connection with bad checksums:\n{out}");
    assert!(
        out.contains("warning: core 0:") && out.contains("bad TCP/UDP checksums"),
        "the cause is named:\n{out}"
    );
    assert!(
        out.contains("ethtool -K PEER_IF tx off"),
        "and the fix:\n{out}"
    );
}

#[test]
fn datapath_error_foreign_xdp_program() -> Result<(), String> {
    if !require_root("datapath_error_foreign_xdp_program") {
        return Ok(());
    }
    let net = net(1);
    let ifname = net.server_if().to_string();
    let bin = echo_bin();
    // Another XDP program (not a corelane runtime: no claim) holds the interface.
    let (ok, out) = net
        .server_ns()
        .run(move || -> Result<(bool, String), String> {
            let _held = corelane_xsk::Steering::attach(&ifname, corelane_xsk::AttachMode::Auto)
                .map_err(|e| e.to_string())?;
            let o = std::process::Command::new(&bin)
                .args(["--iface", &ifname, "--addr", "10.77.0.3/24"])
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            Ok((o.status.success(), text))
        })
        .map_err(|e| e.to_string())??;
    assert!(!ok, "{out}");
    let errors: Vec<&str> = out.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{out}");
    assert!(
        errors[0].contains("already has an XDP program"),
        "{}",
        errors[0]
    );
    assert!(errors[0].contains("xdp off"), "{}", errors[0]);
    assert_no_xdp(&net);
    Ok(())
}

/// A cgroup of the pids controller, made for one test and removed when dropped: cgroup v1's
/// hierarchy (`/sys/fs/cgroup/pids/`) where it is mounted, else v2's (the controller enabled
/// for the root's children).
struct PidsCgroup(std::path::PathBuf);

impl PidsCgroup {
    fn new(name: &str) -> Result<Self, String> {
        let v1 = std::path::Path::new("/sys/fs/cgroup/pids");
        let dir = if v1.is_dir() {
            v1.join(name)
        } else {
            let root = std::path::Path::new("/sys/fs/cgroup");
            std::fs::write(root.join("cgroup.subtree_control"), "+pids")
                .map_err(|e| format!("enabling the pids controller of cgroup v2: {e}"))?;
            root.join(name)
        };
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(PidsCgroup(dir))
    }

    /// At most `n` tasks (threads count) in the group.
    fn limit(&self, n: usize) -> Result<(), String> {
        std::fs::write(self.0.join("pids.max"), n.to_string()).map_err(|e| e.to_string())
    }

    /// `cmd`, run from a shell that first puts itself in the group.
    fn command(&self, cmd: &std::process::Command) -> std::process::Command {
        let mut sh = std::process::Command::new("sh");
        let procs = self.0.join("cgroup.procs");
        sh.arg("-c")
            .arg(format!("echo $$ > {} && exec \"$@\"", procs.display()))
            .arg("sh")
            .arg(cmd.get_program())
            .args(cmd.get_args());
        sh
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Whatever thread cannot be started (a limit on the tasks of the process's cgroup, swept from
/// one task up), the server says which and exits, its XDP program gone, or it serves. A core's
/// thread that could not be started panicked the run while the others waited for it at the
/// start, and the threads beside the cores (the kernel's routes) waited for a core future
/// that never ran: the process hung.
#[test]
fn datapath_error_a_thread_that_cannot_start() {
    if !require_root("datapath_error_a_thread_that_cannot_start") {
        return;
    }
    let net = net(1);
    let cgroup = PidsCgroup::new(&format!("corelane-test-{}", std::process::id()))
        .unwrap_or_else(|e| panic!("no cgroup of the pids controller: {e}"));
    let (mut refused_core, mut served) = (false, false);
    for limit in 1..=8 {
        cgroup.limit(limit).unwrap();
        let mut echo_cmd = net.server_ns().command(echo_bin().to_str().unwrap());
        echo_cmd
            .arg("--iface")
            .arg(net.server_if())
            .args(["--addr", "10.77.0.3/24"]);
        let mut echo = Echo::spawn_cmd(cgroup.command(&echo_cmd));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let exited = loop {
            if echo.output().contains("echo: serving") {
                break None;
            }
            if let Some(status) = echo.try_wait() {
                break Some(status);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{limit} tasks: neither serving nor ended after 20 s:\n{}",
                echo.output()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        match exited {
            None => {
                served = true;
                let (status, out) = echo.stop();
                assert_clean_exit(status, &out);
            }
            Some(status) => {
                let out = echo.wait().1;
                assert!(!status.success(), "{limit} tasks: {status}:\n{out}");
                assert!(!out.contains("panicked"), "{limit} tasks:\n{out}");
                let last = out.lines().last().unwrap_or("");
                assert!(
                    last.starts_with("echo: error: ") && last.contains("cannot start"),
                    "{limit} tasks: the error does not say what could not start: {last}\n{out}"
                );
                refused_core |= last.contains("core 0") && last.contains("thread");
                assert_no_xdp(&net);
            }
        }
    }
    assert!(
        refused_core,
        "no limit left the core's thread without a task"
    );
    assert!(served, "no limit was enough to serve");
}
