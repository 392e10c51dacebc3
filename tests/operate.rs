//! Operating a running server from outside: `corelane-stat` lists the connections a kernel
//! client holds (with the bytes it sent), per-core counters and rates that agree with the load,
//! and the Prometheus endpoint answers a real scrape.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use corelane_testnet::require_root;

/// The `corelane-stat` binary (built by `cargo test --workspace` for its own tests).
fn stat_bin() -> Result<PathBuf, String> {
    workspace_bin("corelane-stat")
}

#[test]
fn operate_stat_cli_and_metrics_agree_with_the_load() -> Result<(), String> {
    if !require_root("operate_stat") {
        return Ok(());
    }
    let bin = stat_bin()?;
    let net = net(2);
    let server = Echo::start(
        &net,
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "2",
            "--metrics",
            "127.0.0.1:9464",
        ],
    );
    let addr: SocketAddr = format!("{SERVER_V4}:7").parse().map_err(|_| "addr")?;
    // Eight kernel connections, each echoing 256 KiB and then staying open.
    const CONNS: usize = 8;
    const BYTES: usize = 256 << 10;
    let held = net
        .client_ns()
        .run(move || -> std::io::Result<Vec<TcpStream>> {
            let mut held = Vec::new();
            for i in 0..CONNS {
                let mut s = connect(addr)?;
                s.set_read_timeout(Some(Duration::from_secs(20)))?;
                let data = payload(BYTES, i as u64);
                let mut r = s.try_clone()?;
                let reader = std::thread::spawn(move || {
                    let mut got = vec![0u8; BYTES];
                    r.read_exact(&mut got).map(|()| got)
                });
                s.write_all(&data)?;
                let got = reader
                    .join()
                    .map_err(|_| std::io::Error::other("reader"))??;
                assert_eq!(got, data);
                held.push(s);
            }
            Ok(held)
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;

    let run = |args: &[&str]| -> Result<String, String> {
        let mut all = vec!["--iface", net.server_if()];
        all.extend_from_slice(args);
        net.server_ns()
            .exec(bin.to_str().ok_or("path")?, &all)
            .map_err(|e| e.to_string())
    };
    // Connections: every one listed ESTABLISHED on port 7 with the bytes the client sent.
    let conns = run(&["--json", "conns", "--port", "7", "--state", "ESTABLISHED"])?;
    assert_eq!(
        conns.matches("\"state\":\"ESTABLISHED\"").count(),
        CONNS,
        "{conns}"
    );
    assert_eq!(
        sum_field(&conns, "bytes_in"),
        (CONNS * BYTES) as u64,
        "{conns}"
    );
    assert_eq!(
        sum_field(&conns, "bytes_out"),
        (CONNS * BYTES) as u64,
        "{conns}"
    );
    assert!(conns.contains("\"stale_cores\":[]"), "{conns}");
    let table = run(&["conns"])?;
    assert!(
        table.contains("ESTABLISHED") && table.contains("10.77.0.2:"),
        "{table}"
    );

    // Per-core counters: the two cores together received at least the payload.
    let cores = run(&["--json", "cores"])?;
    assert!(
        sum_field(&cores, "tcp_bytes_in") >= (CONNS * BYTES) as u64,
        "{cores}"
    );
    // Each core's listener is a flow too.
    assert_eq!(sum_field(&cores, "flows"), CONNS as u64 + 2, "{cores}");
    assert!(sum_field(&cores, "xdp_steered") > 0, "{cores}");
    // The cores slept between the connections' bursts: each registered its queue to sleep on.
    assert!(sum_field(&cores, "queue_registrations") > 0, "{cores}");

    // Rates: a second transfer while `top` watches shows up as received bytes per second.
    let mut top_cmd = net.server_ns().command(bin.to_str().ok_or("path")?);
    top_cmd.args(["--iface", net.server_if(), "--json", "top"]);
    top_cmd.args(["--interval", "0.5", "--count", "4"]);
    let top = std::thread::spawn(move || top_cmd.output());
    assert_echoes(&net, addr, 32 << 20, 9);
    let top = top.join().map_err(|_| "top")?.map_err(|e| e.to_string())?;
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    let rate_lines: Vec<&str> = top.lines().filter(|l| l.contains("per_second")).collect();
    assert_eq!(rate_lines.len(), 4, "{top}");
    // The received-bytes rate of each round, summed over cores.
    let rates: Vec<u64> = rate_lines
        .iter()
        .map(|l| {
            l.split("\"per_second\":{")
                .skip(1)
                .map(|part| sum_field(part.split('}').next().unwrap_or(""), "tcp_bytes_in"))
                .sum()
        })
        .collect();
    assert!(
        rates.iter().any(|r| *r > 1_000_000),
        "no received-bytes rate while 32 MiB went through: {rates:?}\n{top}"
    );
    // Levels have no rate: the flows and the spin are among the counters, not the rates.
    for l in &rate_lines {
        assert!(l.contains("\"flows\":"), "{l}");
        for per_second in l.split("\"per_second\":{").skip(1) {
            let per_second = per_second.split('}').next().unwrap_or("");
            assert!(
                !per_second.contains("\"flows\"") && !per_second.contains("\"spin_ns\""),
                "a level given a rate: {l}"
            );
        }
    }

    // A client that trickles its request a byte at a time (for 6 s) does not hold the
    // endpoint: the real scrape beside it is answered (curl gives up after 4 s).
    let trickler = net
        .server_ns()
        .spawn(|| -> std::io::Result<()> {
            let mut t = TcpStream::connect("127.0.0.1:9464")?;
            for _ in 0..12 {
                if t.write_all(b"G").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(200));
    // A real scrape of the metrics endpoint, on the kernel's stack in the server namespace.
    let scrape = net
        .server_ns()
        .exec(
            "curl",
            &["-sf", "--max-time", "4", "http://127.0.0.1:9464/metrics"],
        )
        .map_err(|e| format!("a scrape beside a slow client: {e}"))?;
    let _ = trickler.join();
    assert!(scrape.contains("corelane_up{"), "{scrape}");
    let total: u64 = scrape
        .lines()
        .filter(|l| l.starts_with("corelane_tcp_bytes_in_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(total >= (CONNS * BYTES + (32 << 20)) as u64, "{scrape}");
    assert!(scrape.contains("# TYPE corelane_flows gauge"), "{scrape}");
    assert!(scrape.contains("# TYPE corelane_spin_ns gauge"), "{scrape}");
    assert!(
        scrape.contains("# TYPE corelane_queue_registrations_total counter"),
        "{scrape}"
    );

    drop(held);
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let after = run(&["list"])?;
    assert!(
        !after.contains(net.server_if()),
        "stats left after a clean exit:\n{after}"
    );
    Ok(())
}

#[test]
fn operate_top_started_first_follows_a_server_restart() -> Result<(), String> {
    if !require_root("operate_top_restart") {
        return Ok(());
    }
    let net = net(1);
    // Started before any server: it waits, then follows each one.
    let mut cmd = net.server_ns().command(stat_bin()?.to_str().ok_or("path")?);
    cmd.args(["--iface", net.server_if(), "top", "--interval", "0.1"]);
    let top = Echo::spawn_cmd(cmd);
    let seen = |pid: u32| {
        let want = format!("{} pid {pid} at", net.server_if());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !top.output().contains(&want) {
            if std::time::Instant::now() > deadline {
                return Err(format!("top never showed `{want}`:\n{}", top.output()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    };
    for _ in 0..2 {
        let server = Echo::start(&net, &["--addr", "10.77.0.3/24", "--cores", "1"]);
        seen(server.pid())?;
        let (status, out) = server.stop();
        assert_clean_exit(status, &out);
    }
    assert!(
        top.output().contains("; waiting"),
        "top did not say it was waiting between servers:\n{}",
        top.output()
    );
    // Each round: a title with the time of day, then the column header on its own line.
    let out = top.output();
    let lines: Vec<&str> = out.lines().collect();
    let title = lines
        .iter()
        .position(|l| l.contains(" pid ") && l.contains(" UTC, per second over the last "))
        .ok_or_else(|| format!("no title line:\n{out}"))?;
    assert!(
        lines
            .get(title + 1)
            .is_some_and(|l| l.trim_start().starts_with("CORE")),
        "the header follows the title:\n{out}"
    );
    Ok(())
}
