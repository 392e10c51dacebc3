//! Interface kinds besides a plain veth or NIC, end to end with a kernel client: a macvlan on
//! the link and a bridge with the link as its port (both in generic XDP mode, which the echo
//! example falls back to and says), and the kinds refused at once with why (loopback). Which
//! kinds this kernel can make at all (no VLAN, bonding, ipvlan or dummy modules here) is in
//! docs/OPERATING.md.

mod common;

use common::*;
use corelane_testnet::require_root;

/// Serves echo on `ifname` (made in the server namespace by `setup`) and checks a kernel
/// client's TCP echo through it, byte for byte.
fn serves_through(kind: &str, setup: &[&[&str]], ifname: &str) {
    let net = net(1);
    for cmd in setup {
        let args: Vec<String> = cmd
            .iter()
            .map(|a| a.replace("LINK", net.server_if()))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        net.server_ns()
            .ip(&args)
            .unwrap_or_else(|e| panic!("{kind}: ip {args:?}: {e}"));
    }
    let echo = Echo::start_in(
        net.server_ns(),
        ifname,
        "echo",
        &["--addr", "10.77.0.3/24", "--cores", "1"],
    );
    assert!(
        echo.output().contains("attached in generic mode"),
        "{kind}: {}",
        echo.output()
    );
    assert_echoes(
        &net,
        format!("{SERVER_V4}:7").parse().unwrap(),
        256 << 10,
        21,
    );
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
}

#[test]
fn interface_kinds_macvlan_and_bridge_serve_loopback_is_refused() {
    if !require_root("interface_kinds") {
        return;
    }
    serves_through(
        "macvlan",
        &[
            &[
                "link", "add", "clmv0", "link", "LINK", "type", "macvlan", "mode", "bridge",
            ],
            &["link", "set", "clmv0", "up"],
        ],
        "clmv0",
    );
    serves_through(
        "bridge",
        &[
            &["link", "add", "clbr0", "type", "bridge"],
            &["link", "set", "LINK", "master", "clbr0"],
            &["link", "set", "clbr0", "up"],
        ],
        "clbr0",
    );
    // Not Ethernet: one line naming why, nothing attached.
    let net = net(1);
    let mut cmd = net
        .server_ns()
        .command(example_bin("echo").to_str().unwrap());
    cmd.args(["--iface", "lo", "--addr", "127.0.0.9/8"]);
    let out = cmd.output().expect("echo");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("lo is not an Ethernet interface"), "{err}");
}
