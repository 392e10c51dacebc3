//! The comparison program end to end, shortened: every setup (the peers included) serves every
//! kind of case on a real veth pair (nginx the HTTP case, with wrk as the load), the reports carry a figure and a ratio for each, and the
//! change against the committed run is reported.

use std::process::Command;

#[test]
fn compare_runs_every_setup_and_writes_reports_with_ratios() {
    if !corelane_testnet::require_root("compare_runs_every_setup") {
        return;
    }
    let out = std::env::temp_dir().join(format!("corelane-compare-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args([
            "--repeat",
            "1",
            "--seconds",
            "0.3",
            "--warmup",
            "0.1",
            "--cases",
            "rr64,bulk-in,connect,http",
            "--conns",
            "4",
            "--http-conns",
            "4",
            "--out",
        ])
        .arg(&out)
        .arg("--baseline")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/results/compare.json"
        ))
        .output()
        .expect("running compare");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    let json = std::fs::read_to_string(out.join("compare.json")).expect("compare.json");
    let md = std::fs::read_to_string(out.join("compare.md")).expect("compare.md");
    let png = std::fs::read(out.join("compare.png")).expect("compare.png");
    assert_eq!(&png[1..4], b"PNG");
    let json: serde_json::Value = serde_json::from_str(&json).expect("compare.json parses");
    let results = json["results"].as_array().expect("a results array");
    for case in ["rr64_c4", "bulk_in", "connect"] {
        for setup in [
            "kernel",
            "epoll-c",
            "monoio",
            "corelane-server",
            "corelane-both",
        ] {
            let row = results
                .iter()
                .find(|r| r["case"] == case && r["setup"] == setup)
                .unwrap_or_else(|| panic!("no {case} / {setup} in\n{json:#}"));
            // A rate was measured, and corelane's rows carry a ratio to the kernel's.
            let rate = row["rate"].as_f64().unwrap_or(0.0);
            assert!(rate > 0.0, "{row}");
            assert_eq!(
                row["vs_kernel"]["rate"].as_f64().is_some(),
                setup != "kernel",
                "{row}"
            );
        }
    }
    // HTTP: wrk against hyper on either stack and against nginx, with ratios to nginx; nginx
    // takes part in nothing else.
    for setup in ["kernel", "nginx", "corelane-server"] {
        let row = results
            .iter()
            .find(|r| r["case"] == "http_c4" && r["setup"] == setup)
            .unwrap_or_else(|| panic!("no http_c4 / {setup} in\n{json:#}"));
        assert!(row["rate"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        assert!(row["p99_us"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        assert_eq!(
            row["vs_nginx"]["rate"].as_f64().is_some(),
            setup != "nginx",
            "{row}"
        );
    }
    assert!(
        !results
            .iter()
            .any(|r| r["setup"] == "nginx" && r["case"] != "http_c4"),
        "{json:#}"
    );
    assert!(md.contains("### HTTP against nginx"), "{md}");
    assert!(md.contains("| rr 64 B x 4 conn | corelane-both |"), "{md}");
    // The change against the committed run: the cases both have (bulk in, connect) compared.
    assert!(md.contains("## Change against"), "{md}");
    assert!(stdout.contains("## Change against"), "{stdout}");
    let _ = std::fs::remove_dir_all(&out);
}
