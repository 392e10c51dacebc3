//! One run of one case on one setup, its CPU accounting, and medians over repetitions.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use corelane_bench::median;
use corelane_bench::sys::cpu_busy;
use corelane_testnet::VethPair;

use crate::cases::{ECHO, HTTP, Kind, Setup};
use crate::hosts::{corelane_client, corelane_server, epoll_server, kernel_client, kernel_server};
use crate::load::{MEASURE, START, STOP};

/// Busy seconds between two [`cpu_busy`] readings: of the server CPUs, and of every CPU.
fn busy_between(before: &[f64], after: &[f64], server: &[usize]) -> (f64, f64) {
    let busy = |c: usize| after.get(c).unwrap_or(&0.0) - before.get(c).unwrap_or(&0.0);
    (
        server.iter().map(|&c| busy(c)).sum(),
        (0..after.len()).map(busy).sum(),
    )
}

// ----- one run ------------------------------------------------------------------------------

/// One run's figures.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sample {
    /// Requests or connections per second.
    pub(crate) rate: f64,
    pub(crate) gbit: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) server_cpu_s: f64,
    pub(crate) machine_cpu_s: f64,
    /// Server CPU seconds per million operations, or per GB for bulk.
    pub(crate) server_cost: f64,
    pub(crate) machine_cost: f64,
    /// Operations that failed or timed out.
    pub(crate) errors: f64,
}

/// How corelane's server runtime is set up (the defaults unless a tail study changes them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Knobs {
    pub(crate) poll: corelane::PollMode,
    pub(crate) publish: bool,
    pub(crate) adaptive_batch: bool,
    pub(crate) tx_checksum_offload: bool,
}

impl Knobs {
    pub(crate) fn parse(
        poll: &str,
        publish: &str,
        batch: &str,
        tx_checksum: &str,
    ) -> Result<Knobs, String> {
        let poll = match poll {
            "busy" => corelane::PollMode::Busy,
            "adaptive" => corelane::PollMode::default(),
            p => match p
                .strip_prefix("adaptive:")
                .and_then(|us| us.parse::<u64>().ok())
            {
                Some(us) => corelane::PollMode::Adaptive {
                    spin: Duration::from_micros(us),
                },
                None => {
                    return Err(format!(
                        "--corelane-poll {p}: busy, adaptive or adaptive:US"
                    ));
                }
            },
        };
        let on_off = |flag: &str, v: &str| match v {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => Err(format!("{flag} {v}: on or off")),
        };
        let adaptive_batch = match batch {
            "adaptive" => true,
            "fixed" => false,
            b => return Err(format!("--corelane-batch {b}: adaptive or fixed")),
        };
        Ok(Knobs {
            poll,
            publish: on_off("--corelane-publish", publish)?,
            adaptive_batch,
            tx_checksum_offload: on_off("--corelane-tx-checksum", tx_checksum)?,
        })
    }
}

pub(crate) struct Ctx<'a> {
    pub(crate) knobs: Knobs,
    pub(crate) net: &'a VethPair,
    pub(crate) server_cpus: Vec<usize>,
    pub(crate) client_cpu: usize,
    pub(crate) warmup: Duration,
    pub(crate) seconds: Duration,
}

pub(crate) fn one_run(
    ctx: &Ctx<'_>,
    setup: Setup,
    kind: Kind,
    verbose: bool,
) -> Result<Sample, String> {
    let server = if setup == Setup::Nginx {
        crate::http::nginx_server(ctx.net, &ctx.server_cpus)?
    } else if setup.corelane_server() {
        corelane_server(ctx.net, &ctx.server_cpus, ctx.knobs)?
    } else if setup == Setup::Epoll {
        epoll_server(ctx.net, &ctx.server_cpus)?
    } else if setup == Setup::Monoio {
        crate::monoio_host::monoio_server(ctx.net, &ctx.server_cpus)?
    } else {
        kernel_server(ctx.net, &ctx.server_cpus)?
    };
    if let Kind::Http { conns } = kind {
        let out = http_run(ctx, server.addr, conns);
        let stopped = server.stop();
        let out = out?;
        stopped?;
        return Ok(out);
    }
    let addr: SocketAddr = format!("{}:{ECHO}", server.addr)
        .parse()
        .map_err(|_| "address")?;
    let phase = Arc::new(AtomicU8::new(START));
    let client = if setup.corelane_client() {
        corelane_client(ctx.net, ctx.client_cpu, kind, addr, phase.clone())
    } else {
        kernel_client(ctx.net, ctx.client_cpu, kind, addr, phase.clone())
    };
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            let _ = server.stop();
            return Err(e);
        }
    };
    // The warm-up runs from the first connection (up to 15 s for one to come).
    let asked = Instant::now();
    while phase.load(Ordering::SeqCst) == START && asked.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(ctx.warmup);
    let before = cpu_busy()?;
    let t = Instant::now();
    phase.store(MEASURE, Ordering::SeqCst);
    std::thread::sleep(ctx.seconds);
    phase.store(STOP, Ordering::SeqCst);
    let after = cpu_busy()?;
    let secs = t.elapsed().as_secs_f64();
    let out = client.join().map_err(|e| e.to_string());
    let stopped = server.stop();
    let mut out = out??;
    stopped?;
    if out.ops == 0 && out.bytes == 0 {
        return Err(format!(
            "{} / {}: nothing was measured ({} error(s){})",
            setup.name(),
            kind.name(),
            out.errors,
            out.first_error
                .map(|e| format!(", first: {e}"))
                .unwrap_or_default()
        ));
    }
    if let (Some(e), true) = (&out.first_error, verbose) {
        eprintln!(
            "{}{} / {}: {} error(s), first: {e}",
            clear_line(),
            setup.name(),
            kind.name(),
            out.errors
        );
    }
    let (server_cpu_s, machine_cpu_s) = busy_between(&before, &after, &ctx.server_cpus);
    out.lat_ns.sort_unstable();
    let pct = |q: f64| -> f64 {
        if out.lat_ns.is_empty() {
            return 0.0;
        }
        let i = ((q * out.lat_ns.len() as f64) as usize).min(out.lat_ns.len() - 1);
        out.lat_ns[i] as f64 / 1e3
    };
    let per = |cpu: f64| {
        if kind.bulk() {
            cpu / (out.bytes as f64 / 1e9).max(1e-12)
        } else {
            cpu / (out.ops as f64 / 1e6).max(1e-12)
        }
    };
    Ok(Sample {
        rate: out.ops as f64 / secs,
        gbit: out.bytes as f64 * 8.0 / secs / 1e9,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        server_cpu_s,
        machine_cpu_s,
        server_cost: per(server_cpu_s),
        machine_cost: per(machine_cpu_s),
        errors: out.errors as f64,
    })
}

/// The HTTP case: wrk for the warm-up, then wrk again for the measured time.
fn http_run(ctx: &Ctx<'_>, server: &str, conns: usize) -> Result<Sample, String> {
    let url = format!("http://{server}:{HTTP}/");
    crate::http::wrk(ctx.net, ctx.client_cpu, conns, &url, ctx.warmup)?;
    let before = cpu_busy()?;
    let out = crate::http::wrk(ctx.net, ctx.client_cpu, conns, &url, ctx.seconds)?;
    let after = cpu_busy()?;
    if out.requests == 0 {
        return Err(format!(
            "wrk completed no request ({} error(s))",
            out.errors
        ));
    }
    let (server_cpu_s, machine_cpu_s) = busy_between(&before, &after, &ctx.server_cpus);
    let millions = (out.requests as f64 / 1e6).max(1e-12);
    Ok(Sample {
        rate: out.requests as f64 / out.secs,
        gbit: 0.0,
        p50_us: out.p50_us,
        p99_us: out.p99_us,
        // wrk's distribution stops at the 99th percentile.
        p999_us: f64::NAN,
        server_cpu_s,
        machine_cpu_s,
        server_cost: server_cpu_s / millions,
        machine_cost: machine_cpu_s / millions,
        errors: out.errors as f64,
    })
}

// ----- report -------------------------------------------------------------------------------

pub(crate) fn med(v: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

pub(crate) fn summary(v: &[Sample]) -> Sample {
    Sample {
        rate: med(v, |s| s.rate),
        gbit: med(v, |s| s.gbit),
        p50_us: med(v, |s| s.p50_us),
        p99_us: med(v, |s| s.p99_us),
        p999_us: med(v, |s| s.p999_us),
        server_cpu_s: med(v, |s| s.server_cpu_s),
        machine_cpu_s: med(v, |s| s.machine_cpu_s),
        server_cost: med(v, |s| s.server_cost),
        machine_cost: med(v, |s| s.machine_cost),
        errors: v.iter().map(|s| s.errors).sum(),
    }
}

pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

/// What erases the progress bar's line before another line is printed: nothing when stderr
/// is not a terminal (a log file gets plain lines, no escape codes).
pub(crate) fn clear_line() -> &'static str {
    if std::io::stderr().is_terminal() {
        "\r\x1b[2K"
    } else {
        ""
    }
}

/// The progress bar on a terminal, redrawn in place; elsewhere one plain line per step.
pub(crate) fn progress(done: usize, total: usize, started: Instant, what: &str) {
    let width = 30;
    let filled = width * done / total.max(1);
    let eta = if done > 0 {
        started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64
    } else {
        0.0
    };
    if !std::io::stderr().is_terminal() {
        eprintln!("{done}/{total} eta {eta:.0} s  {what}");
        return;
    }
    eprint!(
        "\r\x1b[2K[{}{}] {done}/{total} eta {:>4.0} s  {what}",
        "#".repeat(filled),
        ".".repeat(width - filled),
        eta
    );
}
