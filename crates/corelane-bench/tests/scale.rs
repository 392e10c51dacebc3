//! The scale program end to end at two cores, shortened: request/response and bulk at one
//! core and two, the three placements, and an accept storm, on a real two-queue veth.

use std::process::Command;

#[test]
fn scale_runs_every_case_at_one_core_and_two() {
    if !corelane_testnet::require_root("scale_runs_every_case_at_one_core_and_two") {
        return;
    }
    if corelane::allowed_cpus().len() < 2 {
        eprintln!("skipped: fewer than 2 CPUs");
        return;
    }
    let out = std::env::temp_dir().join(format!("corelane-scale-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_scale"))
        .args(["--cores", "2", "--seconds", "0.4", "--conns-per-core", "4"])
        .args(["--accept", "600", "--out"])
        .arg(&out)
        .output()
        .expect("run the scale program");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "scale failed: {}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    let json = std::fs::read_to_string(out.join("scale.json")).expect("scale.json");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&json).expect("scale.json parses");
    let of = |case: &str| -> Vec<&serde_json::Value> {
        rows.iter().filter(|r| r["case"] == case).collect()
    };
    for case in ["rr", "bulk"] {
        let v = of(case);
        assert_eq!(v.len(), 2, "{case} at one core and two: {json}");
        for r in &v {
            assert!(r["rate"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
            assert!(
                r["cpu"].as_f64().unwrap_or(0.0) > 0.0,
                "no CPU counted: {r}"
            );
            let k = r["cores"].as_u64().unwrap_or(0) as usize;
            assert_eq!(r["split"].as_array().map(Vec::len), Some(k), "{r}");
        }
        assert!(v[0]["efficiency"].as_f64() == Some(1.0), "{json}");
        assert!(v[1]["efficiency"].as_f64().unwrap_or(0.0) > 0.0, "{json}");
    }
    // The placement rows that this machine can lay out (splits need two CPUs a lane).
    assert!(!of("placement").is_empty(), "{json}");
    let acc = of("accept");
    assert_eq!(acc.len(), 1, "{json}");
    let split: Vec<u64> = acc[0]["split"]
        .as_array()
        .map(|v| v.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default();
    // Every connection accepted (and the first, warming one), spread over both cores.
    assert_eq!(split.len(), 2, "{json}");
    assert!(split.iter().sum::<u64>() >= 601, "{split:?}");
    assert!(
        split.iter().all(|&n| n > 0),
        "one core took none: {split:?}"
    );
    let md = std::fs::read_to_string(out.join("scale.md")).expect("scale.md");
    assert!(md.contains("| accept | 2 |"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}
