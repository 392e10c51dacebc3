//! Bad input ends with one clear error line naming the cause and the fix, a non-zero exit, and
//! nothing left attached.

mod common;

use common::*;
use corelane_testnet::require_root;

fn error_line(out: &str) -> &str {
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "want exactly one error line:\n{out}");
    lines[0]
}

#[test]
fn datapath_error_missing_interface() {
    if !require_root("datapath_error_missing_interface") {
        return;
    }
    let net = net(1);
    let out = net
        .server_ns()
        .command(echo_bin().to_str().unwrap())
        .args(["--iface", "nosuch0", "--addr", "10.77.0.3/24"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = error_line(&err);
    assert!(
        line.contains("no interface `nosuch0`") && line.contains("ip link"),
        "{line}"
    );
    assert_no_xdp(&net);
}

#[test]
fn datapath_error_without_privileges() {
    if !require_root("datapath_error_without_privileges") {
        return;
    }
    let net = net(1);
    // Drop to nobody with no capabilities, inside the server namespace.
    let out = net
        .server_ns()
        .command("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            echo_bin().to_str().unwrap(),
            "--iface",
            net.server_if(),
            "--addr",
            "10.77.0.3/24",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = error_line(&err);
    assert!(
        line.contains("missing privilege") && line.contains("CAP_NET_ADMIN"),
        "{line}"
    );
    assert!(line.contains("run as root"), "{line}");
    assert_no_xdp(&net);
}

#[test]
fn datapath_error_native_mode_refused_by_the_driver() {
    if !require_root("datapath_error_native_mode_refused") {
        return;
    }
    // veth refuses native XDP while the MTU is this large.
    let net = corelane_testnet::VethPair::builder()
        .mtu(9000)
        .server_addr("10.77.0.1/24")
        .client_addr("10.77.0.2/24")
        .build()
        .unwrap();
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.3/24", "--xdp-mode", "native"]);
    assert!(!status.success());
    let line = error_line(&out);
    assert!(
        line.contains("refused the XDP program in native mode"),
        "{line}"
    );
    assert!(
        line.contains("lower the MTU") && line.contains("generic"),
        "{line}"
    );
    assert_no_xdp(&net);
    // In auto mode it falls back to generic, then says why the MTU cannot work at all.
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.3/24"]);
    assert!(!status.success());
    let line = error_line(&out);
    assert!(
        line.contains("MTU 9000") && line.contains("lower the MTU"),
        "{line}"
    );
    assert_no_xdp(&net);
}

#[test]
fn datapath_error_interface_already_served() {
    if !require_root("datapath_error_interface_already_served") {
        return;
    }
    let net = net(1);
    let first = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.4/24"]);
    assert!(!status.success());
    let line = error_line(&out);
    assert!(line.contains("already has an XDP program"), "{line}");
    assert!(line.contains("xdp off"), "{line}");
    // The first server is untouched and still echoes.
    let data = payload(256 * 1024, 5);
    let want = sha256(&data);
    let (got, _) = net
        .client_ns()
        .run(move || tcp_echo(format!("{SERVER_V4}:7").parse().unwrap(), &data))
        .unwrap()
        .unwrap();
    assert_eq!(got, want);
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
        (vec!["--addr", "10.77.0.3/24", "--cores", "2"], "--cores 2"),
    ] {
        let (status, out) = run_echo(&net, &args);
        assert!(!status.success(), "{args:?}");
        assert!(out.contains(want), "{args:?}: {out}");
        assert_no_xdp(&net);
    }
}
