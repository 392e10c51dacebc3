//! The `corelane-stat` command against a real stats file (published by this test through the
//! library's writer, as a runtime does), and its errors.

use std::path::Path;
use std::process::Command;

use corelane_stat::{Conn, Publisher};

fn cli(run_dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_corelane-stat"))
        .env("CORELANE_RUN_DIR", run_dir)
        .args(args)
        .output()
        .map_err(|e| e.to_string());
    match out {
        Ok(o) => (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        ),
        Err(e) => (false, e),
    }
}

#[test]
fn cli_lists_counts_and_connections_of_a_published_runtime() -> Result<(), String> {
    let run = std::env::temp_dir().join(format!("corelane-stat-cli-{}", std::process::id()));
    let ns = corelane_stat::netns_id().map_err(|e| e.to_string())?;
    let dir = run.join(&ns).join("veth-cli");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;

    let (ok, out) = cli(&run, &["conns"]);
    assert!(
        !ok && out.contains("no corelane runtime publishes statistics"),
        "{out}"
    );

    let p = Publisher::create(
        &dir.join("stats"),
        "veth-cli",
        2,
        &["rx_frames", "flows"],
        8,
    )
    .map_err(|e| e.to_string())?;
    let (c0, c1) = (p.core(0).ok_or("core 0")?, p.core(1).ok_or("core 1")?);
    c0.publish(&[100, 1]);
    c1.publish(&[50, 0]);

    let (ok, out) = cli(&run, &["list"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("veth-cli") && out.contains(&std::process::id().to_string()),
        "{out}"
    );
    let (ok, out) = cli(&run, &["--json", "cores"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("\"rx_frames\":100") && out.contains("\"rx_frames\":50"),
        "{out}"
    );
    let (ok, out) = cli(&run, &["prometheus"]);
    assert!(
        ok && out.contains("corelane_rx_frames_total{iface=\"veth-cli\",core=\"1\"} 50"),
        "{out}"
    );

    // A connection listing is answered by the cores: here a thread plays both cores' part.
    let answer = std::thread::spawn(move || {
        let local = corelane_stat::v4([10, 0, 0, 3], 7);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (mut done0, mut done1) = (false, false);
        while !(done0 && done1) && std::time::Instant::now() < deadline {
            if c0.conns_wanted() {
                c0.publish_conns([Conn {
                    core: 0,
                    state: 4,
                    local,
                    remote: corelane_stat::v4([10, 0, 0, 2], 40000),
                    bytes_in: 1234,
                    bytes_out: 1234,
                    retrans: 0,
                    srtt: Some(std::time::Duration::from_micros(80)),
                    rttvar: Some(std::time::Duration::from_micros(20)),
                    cwnd: 14480,
                    send_queue: 0,
                    recv_queue: 0,
                    snd_window: 65535,
                    rcv_window: 65535,
                }]);
                done0 = true;
            }
            if c1.conns_wanted() {
                c1.publish_conns([]);
                done1 = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        done0 && done1
    });
    let (ok, out) = cli(&run, &["conns", "--state", "established", "--port", "7"]);
    assert!(answer.join().unwrap_or(false), "the cores were never asked");
    assert!(ok, "{out}");
    assert!(
        out.contains("ESTABLISHED") && out.contains("10.0.0.2:40000"),
        "{out}"
    );
    assert!(out.contains("1 shown, 1 listed, 1 in all"), "{out}");

    let (ok, out) = cli(&run, &["--bogus"]);
    assert!(!ok && out.contains("unknown argument `--bogus`"), "{out}");
    drop(p);
    let (ok, out) = cli(&run, &["cores"]);
    assert!(
        !ok && out.contains("no corelane runtime"),
        "removed with its runtime: {out}"
    );
    std::fs::remove_dir_all(&run).map_err(|e| e.to_string())?;
    Ok(())
}
