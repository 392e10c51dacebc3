//! The lanes program end to end, shortened: one lane and two on a real 2-queue veth, each
//! receiving from kernel senders, and a report with a row per lane count and load.

use std::process::Command;

#[test]
fn lanes_runs_one_lane_and_two_and_reports_both() {
    if !corelane_testnet::require_root("lanes_runs_one_lane_and_two") {
        return;
    }
    let out = std::env::temp_dir().join(format!("corelane-lanes-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_lanes"))
        .args(["--repeat", "1", "--seconds", "0.5", "--loads", "0.5,max"])
        .args(["--conns", "8", "--out"])
        .arg(&out)
        .output()
        .expect("run the lanes program");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "lanes failed: {}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    let json = std::fs::read_to_string(out.join("lanes.json")).expect("lanes.json");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&json).expect("lanes.json parses");
    assert_eq!(rows.len(), 4, "two lane counts x two loads: {json}");
    for r in &rows {
        let good = r["goodput_gbit"].as_f64().unwrap_or(0.0);
        let cost = r["cpu_s_per_gb"].as_f64().unwrap_or(0.0);
        assert!(good > 0.1, "a run received nothing: {r}");
        assert!(cost > 0.0, "a run cost no CPU: {r}");
        // The busiest lane's share: all of it with one lane, at most all of it with two.
        let share = r["busiest_lane_share"].as_f64().unwrap_or(0.0);
        match r["lanes"].as_u64() {
            Some(1) => assert!((share - 1.0).abs() < 1e-9, "one lane took {share}: {r}"),
            Some(2) => assert!((0.5..=1.0).contains(&share), "two lanes: {r}"),
            other => panic!("unexpected lane count {other:?}: {r}"),
        }
    }
    let md = std::fs::read_to_string(out.join("lanes.md")).expect("lanes.md");
    assert!(
        md.contains("| 2 | 0 + 1 |"),
        "two lanes on CPUs 0 and 1:\n{md}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
