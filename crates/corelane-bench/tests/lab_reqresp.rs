//! The runtime-level request/response bench runs (a quick slice: every row, fewer requests):
//! each row's exchange completes on corelane's sockets in the lab and on the kernel's.

#[test]
fn every_row_of_the_runtime_level_exchange_completes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lab-reqresp"))
        .arg("--quick")
        .output()
        .expect("the bench runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<f64>> = text
        .lines()
        .skip(1)
        .map(|l| {
            l.split_whitespace()
                .map(|w| w.trim_end_matches('x').parse().expect("a number"))
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 6, "{text}");
    for r in &rows {
        assert_eq!(r.len(), 5, "{text}");
        assert!(r[2] > 0.0 && r[3] > 0.0, "both stacks answered: {text}");
    }
}
