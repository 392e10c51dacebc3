//! The cross_core program end to end, shortened: every server answers every round trip and
//! the report has its three rows.

use std::process::Command;

#[test]
fn cross_core_serves_on_either_core_and_on_the_kernel() {
    if !corelane_testnet::require_root("cross_core_serves_on_either_core") {
        return;
    }
    let run = Command::new(env!("CARGO_BIN_EXE_cross_core"))
        .args(["--round-trips", "200", "--conns", "2"])
        .output()
        .expect("run the cross_core program");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "cross_core failed: {}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    for row in [
        "| corelane, on the accepting core |",
        "| corelane, handed to the other core |",
        "| kernel (a thread per connection) |",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no row {row}:\n{stdout}"));
        let rate: f64 = line
            .split('|')
            .nth(4)
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or(0.0);
        assert!(rate > 0.0, "no round trips: {line}");
    }
}
