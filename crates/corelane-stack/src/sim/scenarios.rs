//! The scenarios the simulation runs: each workload shape through each impaired path, the
//! reordering sweep, and the runner that turns a panic or a broken invariant into a failure
//! that names its scenario and seed.

use smoltcp::time::{Duration, Instant};

use super::{Impair, Shape, Sim, SimConfig, SimFailure, SimReport, Workload};

/// A named pairing of a workload and an impaired path.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// `workload/impairment`, e.g. `echo/loss-1%`.
    pub name: String,
    /// What the sockets do.
    pub shape: Shape,
    /// Client to server.
    pub up: Impair,
    /// Server to client.
    pub down: Impair,
}

/// The impairments every workload is run through: `(name, both directions alike)`, each on a
/// path with 1 ms of delay each way (50 us for the `short-` ones, 5 ms for the bottleneck).
pub fn impairments() -> Vec<(&'static str, Impair)> {
    let base = Impair::delay_ms(1);
    let short = Duration::from_micros(50);
    let loss = |ppm| Impair {
        loss_ppm: ppm,
        ..base
    };
    let reorder = |ppm, hold| Impair {
        reorder_ppm: ppm,
        reorder_hold: hold,
        ..base
    };
    vec![
        ("clean", base),
        ("loss-0.1%", loss(1_000)),
        ("loss-1%", loss(10_000)),
        ("loss-5%", loss(50_000)),
        ("loss-10%", loss(100_000)),
        (
            "ack-loss-10%",
            Impair {
                ack_loss_ppm: 100_000,
                ..base
            },
        ),
        ("reorder-5%", reorder(50_000, 3)),
        ("reorder-20%", reorder(200_000, 8)),
        (
            "dup-30%",
            Impair {
                dup_ppm: 300_000,
                ..base
            },
        ),
        (
            "mix",
            Impair {
                loss_ppm: 10_000,
                dup_ppm: 100_000,
                reorder_ppm: 100_000,
                reorder_hold: 3,
                ..base
            },
        ),
        (
            "bottleneck",
            Impair {
                rate_bps: 200_000_000,
                queue_bytes: 64 * 1024,
                ..Impair::delay_ms(5)
            },
        ),
        // A veth's round trip (100 us): timers meet the path's pace differently.
        (
            "short-loss-5%",
            Impair {
                delay: short,
                ..loss(50_000)
            },
        ),
        (
            "short-ack-loss-10%",
            Impair {
                ack_loss_ppm: 100_000,
                delay: short,
                ..base
            },
        ),
        (
            "short-reorder-20%",
            Impair {
                delay: short,
                ..reorder(200_000, 8)
            },
        ),
    ]
}

/// Every scenario: each workload shape through each impairment.
pub fn scenarios() -> Vec<Scenario> {
    let mut v = Vec::new();
    for shape in Shape::all() {
        for (imp, i) in impairments() {
            v.push(Scenario {
                name: format!("{}/{imp}", shape.name()),
                shape,
                up: i,
                down: i,
            });
        }
    }
    v
}

/// The reordering sweep: for each depth `d` of `depths` and share `p` of `shares` (percent),
/// each workload shape through a path of a veth's pace (50 us each way) that holds `p`% of the
/// frames each way behind `d` later ones and loses nothing, named `<shape>/hold-<d>-<p>`; and
/// `<shape>/hold-0-0`, the same path with nothing held, to compare against.
pub fn hold_scenarios(depths: &[u32], shares: &[f64]) -> Vec<Scenario> {
    let mut v = Vec::new();
    for shape in Shape::all() {
        let cell = |d: u32, p: f64| {
            let i = Impair {
                reorder_ppm: (p * 10_000.0).round().clamp(0.0, 1_000_000.0) as u32,
                reorder_hold: d,
                delay: Duration::from_micros(50),
                ..Impair::default()
            };
            Scenario {
                name: format!("{}/hold-{d}-{p}", shape.name()),
                shape,
                up: i,
                down: i,
            }
        };
        v.push(cell(0, 0.0));
        for &d in depths {
            for &p in shares {
                v.push(cell(d, p));
            }
        }
    }
    v
}

/// Runs `s` with `seed`.
///
/// # Errors
/// The invariant the run broke, with the scenario and seed that replay it.
pub fn run_scenario(s: &Scenario, seed: u64) -> Result<SimReport, SimFailure> {
    let cfg = SimConfig::new(seed, s.up, s.down);
    run_with(s, &cfg)
}

/// Runs `s` with the configuration `cfg` (its seed, TCP settings and limits).
///
/// # Errors
/// The invariant the run broke, with the scenario and seed that replay it.
pub fn run_with(s: &Scenario, cfg: &SimConfig) -> Result<SimReport, SimFailure> {
    let mut sim = Sim::new(cfg);
    let mut w = Workload::new(s.shape, cfg.seed);
    // A panic is a failure like any other: reported with its seed.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run(cfg, &mut w)));
    let r = r.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("panicked: {msg}"))
    });
    r.map_err(|what| SimFailure {
        scenario: s.name.clone(),
        seed: cfg.seed,
        at: sim.now() - Instant::ZERO,
        what,
        report: Box::new(sim.report()),
    })
}
