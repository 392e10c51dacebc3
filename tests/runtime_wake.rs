//! How long a frame waits for a core that slept: the steering program stamps each frame it
//! steers (XDP metadata, `bpf_ktime_get_ns`), and a core that wakes up reads the stamp of the
//! first frame it finds; the exit report says what waking up cost against the wait of frames
//! that found the core awake.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::*;
use corelane_testnet::require_root;

/// "frame waits: A us after a sleep (N measured), B us awake (M sampled)" of core 0's line.
fn waits(out: &str) -> Option<(f64, u64, f64, u64)> {
    let line = out.lines().find(|l| l.contains("core 0 ("))?;
    let rest = line.split("frame waits: ").nth(1)?;
    let num = |s: &str| s.trim().parse::<f64>().ok();
    let mut it = rest.split(" us after a sleep (");
    let woken = num(it.next()?)?;
    let rest = it.next()?;
    let (n, rest) = rest.split_once(" measured), ")?;
    let (awake, rest) = rest.split_once(" us awake (")?;
    let (m, _) = rest.split_once(" sampled)")?;
    Some((woken, n.parse().ok()?, num(awake)?, m.parse().ok()?))
}

#[test]
fn a_sleeping_core_measures_what_waking_up_costs() {
    if !require_root("a_sleeping_core_measures_what_waking_up_costs") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let addr: std::net::SocketAddr = format!("{SERVER_V4}:7").parse().unwrap();
    net.client_ns()
        .run(move || {
            let mut s = connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.set_nodelay(true).unwrap();
            // Requests 20 ms apart: far past the spin, so the core sleeps before each.
            for i in 0..30u8 {
                std::thread::sleep(Duration::from_millis(20));
                s.write_all(&[i; 8]).unwrap();
                let mut back = [0u8; 8];
                s.read_exact(&mut back).unwrap();
                assert_eq!(back, [i; 8]);
            }
        })
        .unwrap();
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    let (woken, n, awake, m) = waits(&out).unwrap_or_else(|| panic!("no frame waits: {out}"));
    eprintln!("waking up: {woken:.1} us ({n} measured); awake: {awake:.1} us ({m} sampled)");
    // Most requests found the core asleep and each such wake-up was measured.
    assert!(n >= 15, "{n} wake-ups measured of 30 requests: {out}");
    // A real wait: more than nothing, far less than the 20 ms between requests.
    assert!(
        woken > 0.0 && woken < 20_000.0,
        "{woken} us after a sleep: {out}"
    );
    assert!((0.0..20_000.0).contains(&awake), "{awake} us awake: {out}");
}
