//! The HTTP case: Debian's nginx as a peer, and wrk as the load generator.
//!
//! nginx runs as the kernel-stack HTTP server people deploy: one worker per server CPU, pinned
//! (`worker_cpu_affinity`), keep-alive without a request limit, no access log, answering `GET /`
//! from its configuration with the same body the hyper servers send. wrk runs in the client
//! namespace on the load generator's CPU, one thread, keep-alive connections, and is stopped
//! with SIGINT after the measured time (wrk's own `-d` takes whole seconds only); it then prints
//! its totals and latency distribution, which are parsed here.

use std::io::BufRead;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corelane_testnet::VethPair;

use crate::cases::{HTTP, HTTP_BODY, KERNEL_SERVER};
use crate::hosts::Server;

/// nginx in the server namespace, one worker per CPU in `cpus`, listening on
/// `KERNEL_SERVER:HTTP`.
pub(crate) fn nginx_server(net: &VethPair, cpus: &[usize]) -> Result<Server, String> {
    let nginx = which("nginx").ok_or(
        "nginx is not installed (Debian's package `nginx`; scripts/install-deps.sh installs it)",
    )?;
    let dir = std::env::temp_dir().join(format!("corelane-compare-nginx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(&dir, cpus))
        .map_err(|e| format!("{}: {e}", conf.display()))?;
    let cpu_list = cpus
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    // The master is pinned to the server CPUs too, so nothing of nginx runs on the load's CPU.
    let mut cmd = net.server_ns().command("taskset");
    cmd.arg("-c")
        .arg(&cpu_list)
        .arg(&nginx)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("starting nginx: {e}"))?;
    if let Err(e) = wait_listening(net, &mut child) {
        let _ = child.kill();
        let _ = child.wait();
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        return Err(format!("nginx did not start: {e}\n{log}"));
    }
    Ok(Server::process(
        move || {
            // SIGTERM: the master stops its workers and exits (SIGKILL would orphan them).
            let _ = signal(&child, "TERM");
            let waited = child.wait().map(|_| ()).map_err(|e| e.to_string());
            let _ = std::fs::remove_dir_all(&dir);
            waited
        },
        KERNEL_SERVER,
    ))
}

fn nginx_conf(dir: &std::path::Path, cpus: &[usize]) -> String {
    let d = dir.display();
    // worker_cpu_affinity's mask: one digit per CPU, CPU 0 rightmost.
    let top = cpus.iter().copied().max().unwrap_or(0);
    let mask: String = (0..=top)
        .rev()
        .map(|c| if cpus.contains(&c) { '1' } else { '0' })
        .collect();
    let body = HTTP_BODY.replace('\n', "\\n");
    format!(
        "daemon off;\n\
         master_process on;\n\
         worker_processes {n};\n\
         worker_cpu_affinity auto {mask};\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   keepalive_requests 100000000;\n\
         \x20   keepalive_timeout 60s;\n\
         \x20   client_body_temp_path {d}/body;\n\
         \x20   proxy_temp_path {d}/proxy;\n\
         \x20   fastcgi_temp_path {d}/fastcgi;\n\
         \x20   uwsgi_temp_path {d}/uwsgi;\n\
         \x20   scgi_temp_path {d}/scgi;\n\
         \x20   server {{\n\
         \x20       listen {KERNEL_SERVER}:{HTTP} reuseport backlog=1024;\n\
         \x20       location / {{ default_type text/plain; return 200 \"{body}\"; }}\n\
         \x20   }}\n\
         }}\n",
        n = cpus.len()
    )
}

/// Waits until nginx accepts connections on its port (from inside the server namespace), or
/// says why it exited.
fn wait_listening(net: &VethPair, child: &mut Child) -> Result<(), String> {
    let addr: SocketAddr = format!("{KERNEL_SERVER}:{HTTP}")
        .parse()
        .map_err(|_| "address")?;
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(e) = child.stderr.take() {
                for line in std::io::BufReader::new(e).lines().map_while(Result::ok) {
                    err.push_str(&line);
                    err.push('\n');
                }
            }
            return Err(format!("it exited ({status}): {}", err.trim()));
        }
        let probe = net
            .server_ns()
            .spawn(move || TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
            .map_err(|e| e.to_string())?;
        if probe.join().unwrap_or(false) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err(format!("nothing listened on {addr} within 10 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn signal(child: &Child, sig: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .map_err(|e| format!("kill: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{sig} {}: {status}", child.id()))
    }
}

// ----- wrk ----------------------------------------------------------------------------------

/// What one wrk run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WrkOut {
    pub(crate) requests: u64,
    pub(crate) secs: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    /// Socket errors (connect, read, write, timeout) and responses that were not 2xx or 3xx.
    pub(crate) errors: u64,
}

/// Runs wrk in the client namespace on `cpu` against `url` with `conns` connections for `time`.
pub(crate) fn wrk(
    net: &VethPair,
    cpu: usize,
    conns: usize,
    url: &str,
    time: Duration,
) -> Result<WrkOut, String> {
    let wrk = which("wrk").ok_or(
        "wrk is not installed (Debian's package `wrk`; scripts/install-deps.sh installs it)",
    )?;
    let mut cmd = net.client_ns().command("taskset");
    cmd.arg("-c")
        .arg(cpu.to_string())
        .arg(&wrk)
        .args(["-t1", "-c", &conns.to_string(), "-d", "3600s", "--latency"])
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("starting wrk: {e}"))?;
    // wrk stops on SIGINT and prints what it measured so far, but only once it has installed
    // its handler: a SIGINT that reaches the exec chain before that ends it silently.
    if let Err(e) = wait_catching_sigint(&mut child) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    std::thread::sleep(time);
    let sent = signal(&child, "INT");
    let out = child.wait_with_output().map_err(|e| format!("wrk: {e}"))?;
    sent?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_wrk(&text).ok_or_else(|| {
        format!(
            "wrk's output was not understood ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits (at most 10 s) until the process `child` catches SIGINT, as wrk does once its
/// threads are running; `/proc/PID/status`'s `SigCgt` mask says so.
fn wait_catching_sigint(child: &mut Child) -> Result<(), String> {
    let status_path = format!("/proc/{}/status", child.id());
    let started = Instant::now();
    loop {
        if let Some(ended) = child.try_wait().map_err(|e| format!("wrk: {e}"))? {
            return Err(format!("wrk ended before it started its load: {ended}"));
        }
        let text = std::fs::read_to_string(&status_path).unwrap_or_default();
        if catches_sigint(&text) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err("wrk did not start its load within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether a `/proc/PID/status` text shows a handler for SIGINT (signal 2, bit 1 of `SigCgt`).
fn catches_sigint(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << 1) != 0)
}

/// A wrk duration or latency (`123.45us`, `1.20ms`, `2.00s`, `1.50m`) in microseconds.
fn parse_time_us(s: &str) -> Option<f64> {
    let split = s.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        _ => return None,
    };
    Some(v * scale)
}

/// Reads wrk's report (with `--latency`).
pub(crate) fn parse_wrk(text: &str) -> Option<WrkOut> {
    let mut requests = None;
    let mut secs = None;
    let (mut p50, mut p99) = (None, None);
    let mut errors = 0u64;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [n, "requests", "in", t, ..] => {
                requests = n.parse().ok();
                secs = parse_time_us(t.trim_end_matches(',')).map(|us| us / 1e6);
            }
            ["50%", t] => p50 = parse_time_us(t),
            ["99%", t] => p99 = parse_time_us(t),
            ["Socket", "errors:", rest @ ..] => {
                errors += rest
                    .iter()
                    .filter_map(|x| x.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>();
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => errors += n.parse::<u64>().ok()?,
            _ => {}
        }
    }
    Some(WrkOut {
        requests: requests?,
        secs: secs.filter(|s| *s > 0.0)?,
        p50_us: p50?,
        p99_us: p99?,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_a_sigint_handler_only_in_sigcgt() {
        let ignored = "Name:\twrk\nSigIgn:\t0000000000001002\nSigCgt:\t0000000000000000\n";
        let caught = "Name:\twrk\nSigIgn:\t0000000000001000\nSigCgt:\t0000000000000002\n";
        assert!(!catches_sigint(ignored));
        assert!(catches_sigint(caught));
        assert!(!catches_sigint("Name:\ttaskset\n"));
    }

    const REPORT: &str = "Running 60m test @ http://10.77.0.1:8080/
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   143.21us   40.11us   2.31ms   91.20%
    Req/Sec   110.12k     2.01k  113.40k    70.00%
  Latency Distribution
     50%  137.00us
     75%  151.00us
     90%  170.00us
     99%    1.21ms
  219874 requests in 2.00s, 34.60MB read
  Socket errors: connect 0, read 3, write 1, timeout 0
  Non-2xx or 3xx responses: 2
Requests/sec: 109900.10
Transfer/sec:     17.29MB
";

    #[test]
    fn reads_wrks_report() {
        let out = parse_wrk(REPORT);
        assert_eq!(
            out,
            Some(WrkOut {
                requests: 219_874,
                secs: 2.0,
                p50_us: 137.0,
                p99_us: 1210.0,
                errors: 6,
            })
        );
    }

    #[test]
    fn a_report_without_totals_is_not_understood() {
        let cut: String = REPORT
            .lines()
            .filter(|l| !l.contains("requests in"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(parse_wrk(&cut), None);
        assert_eq!(parse_time_us("12.5xs"), None);
        assert_eq!(parse_time_us("1.50m"), Some(90e6));
    }

    #[test]
    fn nginx_is_pinned_to_the_server_cpus() {
        let conf = nginx_conf(std::path::Path::new("/tmp/x"), &[0, 2]);
        assert!(conf.contains("worker_processes 2;"), "{conf}");
        assert!(conf.contains("worker_cpu_affinity auto 101;"), "{conf}");
        assert!(conf.contains("return 200 \"hello from the compare server\\n\""));
    }
}
