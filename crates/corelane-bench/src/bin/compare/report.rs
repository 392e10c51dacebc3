//! The report: medians and corelane/kernel ratios as a Markdown table, JSON (serde) and PNG.

use std::path::Path;

use corelane_bench::{Panel, markdown_table, plot_png};
use serde::Serialize;

use crate::cases::{Kind, Setup};
use crate::runs::{Sample, ratio, summary};

/// How the run was set up.
pub(crate) struct Meta {
    pub(crate) server_cpus: Vec<usize>,
    pub(crate) client_cpu: usize,
    pub(crate) offloads: bool,
    pub(crate) mtu: u32,
    /// The kernel sockets' congestion control (`default`: the machine's).
    pub(crate) kernel_cc: String,
    /// corelane's runtime settings, as given on the command line.
    pub(crate) corelane: String,
    pub(crate) seconds: f64,
    pub(crate) warmup: f64,
    pub(crate) repeat: usize,
    /// The committed run to report the change against (None: none).
    pub(crate) baseline: Option<std::path::PathBuf>,
}

/// compare.json.
#[derive(Serialize)]
struct Report<'a> {
    server_cpus: &'a [usize],
    client_cpu: usize,
    kernel: String,
    kernel_cc: &'a str,
    offloads: bool,
    mtu: u32,
    seconds: f64,
    repeat: usize,
    results: Vec<Row>,
}

/// One case and setup: medians over the repetitions (non-finite figures become null).
#[derive(Serialize)]
struct Row {
    case: String,
    setup: &'static str,
    runs: usize,
    rate: f64,
    unit: &'static str,
    /// The repetitions' rates: (highest - lowest) / median.
    spread: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    server_cpu_s: f64,
    machine_cpu_s: f64,
    server_cost: f64,
    machine_cost: f64,
    cost_unit: &'static str,
    /// corelane / kernel; None on the kernel's own rows.
    vs_kernel: Option<VsKernel>,
    /// The HTTP case's rows against nginx's; None elsewhere and on nginx's own rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_nginx: Option<VsKernel>,
}

#[derive(Serialize, Clone, Copy)]
struct VsKernel {
    rate: f64,
    p99: f64,
    server_cost: f64,
    machine_cost: f64,
}

/// Prints the table and writes compare.md, compare.json and compare.png into `out`.
pub(crate) fn write(
    out: &Path,
    meta: &Meta,
    kinds: &[Kind],
    setups: &[Setup],
    samples: &[Vec<Vec<Sample>>],
) -> Result<(), String> {
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let mut vs_nginx_rows = Vec::new();
    let kernel = setups.iter().position(|s| *s == Setup::Kernel);
    let nginx = setups.iter().position(|s| *s == Setup::Nginx);
    for (ki, kind) in kinds.iter().enumerate() {
        let base = kernel
            .filter(|&k| !samples[ki][k].is_empty())
            .map(|k| summary(&samples[ki][k]));
        let nginx_base = nginx
            .filter(|&n| !samples[ki][n].is_empty())
            .map(|n| summary(&samples[ki][n]));
        for (si, setup) in setups.iter().enumerate() {
            if samples[ki][si].is_empty() {
                // This setup takes no part in this case (nginx serves HTTP only).
                continue;
            }
            let m = summary(&samples[ki][si]);
            let (rate, unit) = if kind.bulk() {
                (m.gbit, "Gbit/s")
            } else if *kind == Kind::Connect {
                (m.rate, "conn/s")
            } else {
                (m.rate, "req/s")
            };
            let cost_unit = if kind.bulk() {
                "CPU s/GB"
            } else {
                "CPU s per M"
            };
            let against = |b: Sample| {
                let brate = if kind.bulk() { b.gbit } else { b.rate };
                VsKernel {
                    rate: ratio(rate, brate),
                    p99: ratio(m.p99_us, b.p99_us),
                    server_cost: ratio(m.server_cost, b.server_cost),
                    machine_cost: ratio(m.machine_cost, b.machine_cost),
                }
            };
            let vs = base.filter(|_| *setup != Setup::Kernel).map(against);
            let vs_nginx = nginx_base.filter(|_| *setup != Setup::Nginx).map(against);
            if let Some(v) = vs_nginx {
                vs_nginx_rows.push(vec![
                    kind.name(),
                    setup.name().to_string(),
                    format!("{:.2}", v.rate),
                    format!("{:.2}", v.p99),
                    format!("{:.2}", v.server_cost),
                    format!("{:.2}", v.machine_cost),
                ]);
            }
            let lat = |x: f64| {
                if kind.bulk() || !x.is_finite() || x == 0.0 {
                    "-".to_string()
                } else {
                    format!("{x:.1}")
                }
            };
            let r = |f: fn(&VsKernel) -> f64| {
                vs.map(|v| f(&v))
                    .filter(|x| !x.is_nan())
                    .map_or("-".into(), |x| format!("{x:.2}"))
            };
            rows.push(vec![
                kind.name(),
                setup.name().to_string(),
                if kind.bulk() {
                    format!("{rate:.3} {unit}")
                } else {
                    format!("{rate:.0} {unit}")
                },
                lat(m.p50_us),
                lat(m.p99_us),
                lat(m.p999_us),
                format!("{:.3} {cost_unit}", m.server_cost),
                format!("{:.3}", m.machine_cost),
                r(|v| v.rate),
                if kind.bulk() {
                    "-".into()
                } else {
                    r(|v| v.p99)
                },
                r(|v| v.server_cost),
                r(|v| v.machine_cost),
            ]);
            results.push(Row {
                case: kind.id(),
                setup: setup.name(),
                runs: samples[ki][si].len(),
                rate,
                unit,
                spread: spread(&samples[ki][si], kind.bulk()),
                p50_us: m.p50_us,
                p99_us: m.p99_us,
                p999_us: m.p999_us,
                server_cpu_s: m.server_cpu_s,
                machine_cpu_s: m.machine_cpu_s,
                server_cost: m.server_cost,
                machine_cost: m.machine_cost,
                cost_unit,
                vs_kernel: vs,
                vs_nginx,
            });
        }
    }
    let table = markdown_table(
        &[
            "case",
            "setup",
            "rate",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "server CPU",
            "machine CPU",
            "rate / kernel",
            "p99 / kernel",
            "server CPU / kernel",
            "machine CPU / kernel",
        ],
        &rows,
    );
    println!("\n{table}");
    let nginx_table = (!vs_nginx_rows.is_empty()).then(|| {
        format!(
            "### HTTP against nginx\n\nThe same wrk load; ratios to nginx's figures (rate above 1 \
             is better, latency and CPU below 1).\n\n{}",
            markdown_table(
                &[
                    "case",
                    "setup",
                    "rate / nginx",
                    "p99 / nginx",
                    "server CPU / nginx",
                    "machine CPU / nginx",
                ],
                &vs_nginx_rows,
            )
        )
    });
    if let Some(t) = &nginx_table {
        println!("\n{t}");
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let kernel_release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let write = |name: &str, text: &str| {
        let p = out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    // Read before compare.json is written: `out` may be where the baseline is.
    let baseline = match &meta.baseline {
        Some(p) => crate::regress::load(p)?.map(|v| (p.clone(), v)),
        None => None,
    };
    let report = Report {
        server_cpus: &meta.server_cpus,
        client_cpu: meta.client_cpu,
        kernel: kernel_release,
        kernel_cc: &meta.kernel_cc,
        offloads: meta.offloads,
        mtu: meta.mtu,
        seconds: meta.seconds,
        repeat: meta.repeat,
        results,
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| format!("compare.json: {e}"))?;
    let mut md = markdown(meta, &report.kernel, &table);
    if let Some(t) = &nginx_table {
        md.push('\n');
        md.push_str(t);
    }
    if let Some((path, old)) = baseline {
        let new = serde_json::to_value(&report).map_err(|e| format!("compare.json: {e}"))?;
        let section = crate::regress::section(&path, &crate::regress::changes(&old, &new));
        println!("\n{section}");
        md.push('\n');
        md.push_str(&section);
    }
    write("compare.md", &md)?;
    write("compare.json", &(json + "\n"))?;
    let panels = panels(kinds, setups, samples);
    let png = out.join("compare.png");
    if !panels.is_empty() {
        plot_png(&png, &panels)?;
    }
    println!(
        "wrote {}, {}{}",
        out.join("compare.md").display(),
        out.join("compare.json").display(),
        if panels.is_empty() {
            String::new()
        } else {
            format!(" and {}", png.display())
        }
    );
    Ok(())
}

/// (highest - lowest) / median of the repetitions' rates (Gbit/s for bulk).
fn spread(v: &[Sample], bulk: bool) -> f64 {
    let rates: Vec<f64> = v
        .iter()
        .map(|s| if bulk { s.gbit } else { s.rate })
        .collect();
    let (lo, hi) = rates
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
    let med = corelane_bench::median(&rates);
    if med > 0.0 { (hi - lo) / med } else { 0.0 }
}

fn markdown(meta: &Meta, kernel_release: &str, table: &str) -> String {
    format!(
        "# corelane against the kernel TCP stack (same veth, same CPUs)\n\n\
         Server on CPU(s) {:?}, load generator on CPU {}; kernel {kernel_release}, congestion \
         control {}; corelane {} (CUBIC); veth MTU {}, offloads {}; medians of {} run(s) of {} s after {} s of warm-up; the setups alternate \
         within every repetition.\n\n\
         - `kernel`: kernel stack on both ends (tokio, one current_thread runtime per server CPU, \
         SO_REUSEPORT); `corelane-server`: the same kernel-socket load generator against corelane; \
         `corelane-both`: the load generator on corelane as well; `epoll-c`: a C epoll server \
         (one thread per server CPU, no runtime); `monoio`: monoio's io_uring runtime, one per \
         server CPU.\n\
         - HTTP (`http GET`): wrk (one thread, keep-alive, on the load generator's CPU) against \
         hyper on the kernel (`kernel`) or on corelane (`corelane-server`), as the http example \
         serves it, and against Debian's nginx (`nginx`: one worker per server CPU, pinned, no \
         access log); the same short body from each. wrk reports no p99.9.\n\
         - Server CPU: busy time (user, system, irq, softirq) of the server CPUs; machine CPU: all \
         CPUs. Per million requests (or connections), or per GB for bulk. On veth the receive \
         side's softirq runs on the sender's CPU, so part of each stack's receive work is charged \
         to the other end's CPU: the machine column counts it wherever it ran.\n\
         - Ratios are corelane / kernel: above 1 is better for rate, below 1 better for latency \
         and CPU.\n\n{table}\n\nReproduce: `scripts/compare.sh` (or `cargo run --release -p \
         corelane-bench --bin compare -- --repeat {} --seconds {}`).\n",
        meta.server_cpus,
        meta.client_cpu,
        meta.kernel_cc,
        meta.corelane,
        meta.mtu,
        if meta.offloads {
            "on"
        } else {
            "off (TSO, GSO, GRO, TX checksum)"
        },
        meta.repeat,
        meta.seconds,
        meta.warmup,
        meta.repeat,
        meta.seconds
    )
}

/// Request/response against connections, one line per setup: rate, p99 and server CPU.
fn panels(kinds: &[Kind], setups: &[Setup], samples: &[Vec<Vec<Sample>>]) -> Vec<Panel> {
    let mut panels = Vec::new();
    for size in [1usize, 64] {
        let pick = |f: &dyn Fn(&Sample) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
            setups
                .iter()
                .enumerate()
                .map(|(si, s)| {
                    let pts = kinds
                        .iter()
                        .enumerate()
                        .filter_map(|(ki, k)| match k {
                            Kind::Rr { size: sz, conns }
                                if *sz == size && !samples[ki][si].is_empty() =>
                            {
                                Some((*conns as f64, f(&summary(&samples[ki][si]))))
                            }
                            _ => None,
                        })
                        .collect();
                    (s.name().to_string(), pts)
                })
                .filter(|(_, p): &(String, Vec<_>)| !p.is_empty())
                .collect()
        };
        let rate = pick(&|m| m.rate / 1e3);
        if rate.is_empty() {
            continue;
        }
        panels.push(Panel {
            title: format!("{size}-byte request/response"),
            x: "connections".into(),
            y: "thousand requests/s".into(),
            series: rate,
        });
        panels.push(Panel {
            title: format!("{size}-byte p99 latency"),
            x: "connections".into(),
            y: "p99 us".into(),
            series: pick(&|m| m.p99_us),
        });
        panels.push(Panel {
            title: format!("{size}-byte server CPU"),
            x: "connections".into(),
            y: "server CPU s per M requests".into(),
            series: pick(&|m| m.server_cost),
        });
    }
    panels
}
