//! The startup program end to end, one run of each server: both answer their first request
//! and the report has a row for each, with times that add up.

use std::process::Command;

#[test]
fn startup_times_both_servers_to_their_first_answered_request() {
    if !corelane_testnet::require_root("startup_times_both_servers") {
        return;
    }
    let run = Command::new(env!("CARGO_BIN_EXE_startup"))
        .args(["--runs", "1"])
        .output()
        .expect("run the startup program");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "startup failed: {}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    for server in ["corelane", "tokio (kernel)"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {server} |")))
            .unwrap_or_else(|| panic!("no row for {server}:\n{stdout}"));
        let ms: Vec<f64> = row
            .split('|')
            .filter_map(|c| c.trim().parse().ok())
            .collect();
        assert_eq!(ms.len(), 3, "{row}");
        assert!(
            ms[0] <= ms[1] && ms[1] <= ms[2] && ms[2] > 0.0,
            "built, listening and answered come in that order: {row}"
        );
    }
    assert!(
        stdout.contains("corelane / tokio, first request answered"),
        "{stdout}"
    );
}
