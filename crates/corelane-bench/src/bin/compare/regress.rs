//! The change against the last committed run (`docs/results/compare.json` by default): for
//! every case and corelane setup both runs have, the ratios to the kernel measured in the same
//! run (rate, p99, server CPU) old and new. Ratios rather than absolute figures, so a machine
//! that is faster or slower as a whole does not read as a regression; a change is reported when
//! it is larger than the noise (the spread of this run's repetitions, at least 10%).

use std::path::Path;

use serde_json::Value;

/// The least relative change reported, whatever the spread.
const FLOOR: f64 = 0.10;

/// One ratio that moved past the noise.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    pub(crate) case: String,
    pub(crate) setup: String,
    /// "rate / kernel", "p99 / kernel" or "server CPU / kernel".
    pub(crate) what: &'static str,
    pub(crate) old: f64,
    pub(crate) new: f64,
    /// Relative change, signed so that below zero is worse.
    pub(crate) better: f64,
    pub(crate) noise: f64,
}

/// Reads the baseline, if there is one. `Ok(None)`: no such file.
pub(crate) fn load(path: &Path) -> Result<Option<Value>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn key(row: &Value) -> Option<(&str, &str)> {
    Some((row.get("case")?.as_str()?, row.get("setup")?.as_str()?))
}

fn vs(row: &Value, field: &str) -> Option<f64> {
    row.get("vs_kernel")?.get(field)?.as_f64()
}

/// The ratios of `new` (a compare.json value) that moved against `old` by more than the noise.
pub(crate) fn changes(old: &Value, new: &Value) -> Vec<Change> {
    fn rows(v: &Value) -> &[Value] {
        v.get("results")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }
    let old_rows = rows(old);
    let mut out = Vec::new();
    for n in rows(new) {
        let Some((case, setup)) = key(n) else {
            continue;
        };
        let Some(o) = old_rows.iter().find(|o| key(o) == Some((case, setup))) else {
            continue;
        };
        let spread = n.get("spread").and_then(Value::as_f64).unwrap_or(0.0);
        let noise = spread.max(FLOOR);
        let bulk = n.get("unit").and_then(Value::as_str) == Some("Gbit/s");
        // (field, what, higher is better)
        let mut fields = vec![
            ("rate", "rate / kernel", true),
            ("server_cost", "server CPU / kernel", false),
        ];
        if !bulk {
            fields.push(("p99", "p99 / kernel", false));
        }
        for (field, what, higher_better) in fields {
            let (Some(a), Some(b)) = (vs(o, field), vs(n, field)) else {
                continue;
            };
            if !(a.is_finite() && b.is_finite() && a > 0.0) {
                continue;
            }
            let rel = b / a - 1.0;
            let better = if higher_better { rel } else { -rel };
            if better.abs() > noise {
                out.push(Change {
                    case: case.to_string(),
                    setup: setup.to_string(),
                    what,
                    old: a,
                    new: b,
                    better,
                    noise,
                });
            }
        }
    }
    out
}

/// The Markdown section (and what is printed): regressions first, then improvements.
pub(crate) fn section(baseline: &Path, changes: &[Change]) -> String {
    let mut s = format!(
        "## Change against {}\n\nRatios to the kernel of the same run, old and new; reported \
         when the change is larger than the noise (this run's spread between repetitions, at \
         least {:.0}%).\n\n",
        baseline.display(),
        FLOOR * 100.0
    );
    if changes.is_empty() {
        s.push_str("No ratio moved past the noise.\n");
        return s;
    }
    let mut sorted: Vec<&Change> = changes.iter().collect();
    sorted.sort_by(|a, b| a.better.total_cmp(&b.better));
    for c in sorted {
        s.push_str(&format!(
            "- {} {} / {}: {} {:.2} -> {:.2} ({:+.0}%, noise {:.0}%)\n",
            if c.better < 0.0 {
                "REGRESSION"
            } else {
                "improved"
            },
            c.case,
            c.setup,
            c.what,
            c.old,
            c.new,
            c.better * 100.0,
            c.noise * 100.0
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rows: &[(&str, &str, f64, f64, f64)]) -> Value {
        let results: Vec<Value> = rows
            .iter()
            .map(|&(case, setup, rate, cost, spread)| {
                serde_json::json!({
                    "case": case, "setup": setup, "unit": "req/s", "spread": spread,
                    "vs_kernel": {"rate": rate, "p99": 0.5, "server_cost": cost},
                })
            })
            .collect();
        serde_json::json!({ "results": results })
    }

    #[test]
    fn a_drop_past_the_noise_is_a_regression_and_a_small_one_is_not() {
        let old = report(&[("rr1_c1", "corelane-server", 2.5, 1.4, 0.0)]);
        let new = report(&[("rr1_c1", "corelane-server", 2.0, 1.45, 0.02)]);
        let c = changes(&old, &new);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].what, "rate / kernel");
        assert!((c[0].better + 0.2).abs() < 1e-9);
        assert!(section(Path::new("x.json"), &c).contains("REGRESSION rr1_c1"));
    }

    #[test]
    fn lower_cost_is_an_improvement_and_a_noisy_run_reports_less() {
        let old = report(&[("rr1_c16", "corelane-both", 2.0, 0.6, 0.0)]);
        let new = report(&[("rr1_c16", "corelane-both", 2.0, 0.4, 0.0)]);
        let c = changes(&old, &new);
        assert_eq!(c.len(), 1);
        assert!(c[0].better > 0.3);
        let noisy = report(&[("rr1_c16", "corelane-both", 2.0, 0.4, 0.5)]);
        assert!(changes(&old, &noisy).is_empty());
        // A case only one run has is not compared.
        let other = report(&[("rr64_c1", "corelane-both", 0.1, 9.0, 0.0)]);
        assert!(changes(&old, &other).is_empty());
    }
}
