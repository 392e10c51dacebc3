//! The HTTP/3 comparison end to end, shortened: h3 over corelane's QUIC and over quinn on the
//! kernel each serve every case on a real veth pair, two repetitions alternating, and the
//! table of medians carries a figure for each setup and a ratio for each case.

use std::process::Command;

#[test]
fn h3compare_runs_both_setups_through_every_case_and_prints_ratios() {
    if !corelane_testnet::require_root("h3compare_runs_both_setups") {
        return;
    }
    let run = Command::new(env!("CARGO_BIN_EXE_h3compare"))
        .args([
            "--repeat",
            "2",
            "--seconds",
            "0.3",
            "--warmup",
            "0.1",
            "--cases",
            "handshake,rr,bulk",
            "--conns",
            "1,4",
        ])
        .output()
        .expect("running h3compare");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    for case in [
        "handshake, 8 loops",
        "rr 100 B, 1 conn",
        "rr 100 B, 4 conn",
        "bulk 16 MiB, 1 conn",
    ] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {case} |")))
            .unwrap_or_else(|| panic!("no row for {case} in\n{stdout}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | case | corelane | quinn | ratio | ...: both measured, a ratio between them.
        let num = |i: usize| cells.get(i).and_then(|c| c.parse::<f64>().ok());
        assert!(num(2).is_some_and(|v| v > 0.0), "corelane's figure: {row}");
        assert!(num(3).is_some_and(|v| v > 0.0), "quinn's figure: {row}");
        assert!(num(4).is_some_and(|v| v > 0.0), "the ratio: {row}");
    }
    // Each repetition of each setup printed its line.
    let reps = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("rep "))
        .count();
    assert_eq!(reps, 2 * 2 * 4, "{stdout}");
}
