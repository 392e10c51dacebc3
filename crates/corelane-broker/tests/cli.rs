//! `corelane-broker`'s command line: bad words are refused in one line naming them, before
//! anything is attached.

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_corelane-broker"))
        .args(args)
        .output()
        .expect("run corelane-broker");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn a_bad_port_or_user_is_named_in_one_line() {
    let (ok, out) = run(&["grant", "lo", "--addr", "10.0.0.1", "--tcp", "7,99999"]);
    assert!(!ok);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("`99999` is not a port"), "{out}");
    let (ok, out) = run(&[
        "grant",
        "lo",
        "--addr",
        "10.0.0.1",
        "--user",
        "no-such-user-x",
    ]);
    assert!(!ok);
    assert!(out.contains("no user `no-such-user-x`"), "{out}");
    let (ok, out) = run(&["grant", "lo", "--addr", "ten"]);
    assert!(!ok);
    assert!(out.contains("`ten` is not an IP address"), "{out}");
}

#[test]
fn a_missing_interface_is_named() {
    let (ok, out) = run(&[
        "grant",
        "corelane-nosuch0",
        "--addr",
        "10.0.0.1",
        "--tcp",
        "7",
    ]);
    assert!(!ok);
    assert_eq!(out.lines().count(), 1, "{out}");
    // As root: the interface; without privileges: the capabilities.
    assert!(
        out.contains("no interface `corelane-nosuch0`") || out.contains("lacks CAP_"),
        "{out}"
    );
}
