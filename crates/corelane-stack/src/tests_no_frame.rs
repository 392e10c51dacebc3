//! A connection whose output found no free transmit frame sends the rest as soon as frames
//! come back, not at its next timer (which an idle connection may not have).

use std::task::Poll;

use smoltcp::time::Duration;

use crate::config::StackConfig;
use crate::node::Pair;
use crate::tcp::TcpState;

#[test]
fn output_that_found_no_free_frame_goes_on_when_frames_come_back()
-> Result<(), Box<dyn std::error::Error>> {
    const CONNS: usize = 8;
    const EACH: usize = 16 * 1024;
    let cfg = StackConfig {
        seed: Some(0xf4a3e),
        ..StackConfig::default()
    };
    // 64 frames a side, half of them posted for receive: far fewer free transmit frames than
    // the segments written below.
    let link = corelane_frame::MemLink {
        frames: 64,
        ..Default::default()
    };
    let mut p = Pair::with(link, cfg, cfg);
    p.a.stack.listen_tcp(7, None)?;
    let mut clients = Vec::new();
    for _ in 0..CONNS {
        clients.push(p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?.0);
    }
    let mut servers = Vec::new();
    let open = p.drive(Duration::from_secs(1), |p| {
        while let Some(s) = p.a.stack.accept(7) {
            servers.push(s);
        }
        servers.len() == CONNS
            && clients
                .iter()
                .all(|&c| p.b.stack.tcp_state(c) == Some(TcpState::Established))
    })?;
    assert!(open, "{} of {CONNS} connections open", servers.len());
    // Idle: nothing in flight, no ACK owed, no timer but the keepalive's.
    p.drive_for(Duration::from_millis(500), |_| {})?;

    // Every connection writes at once, in one turn.
    let data = vec![0x5au8; EACH];
    for &s in &servers {
        assert!(matches!(
            p.a.stack.tcp_write(s, &data, None),
            Poll::Ready(Ok(n)) if n == EACH
        ));
    }
    let mut got = vec![0usize; CONNS];
    let mut buf = vec![0u8; 64 * 1024];
    let start = p.now();
    let done = p.drive(Duration::from_secs(5), |p| {
        for (i, &c) in clients.iter().enumerate() {
            while let Poll::Ready(Ok(n)) = p.b.stack.tcp_read(c, &mut buf, None) {
                if n == 0 {
                    break;
                }
                got[i] += n;
            }
        }
        got.iter().all(|&g| g == EACH)
    })?;
    let took = p.now() - start;
    let a = p.a.dev().stats();
    eprintln!(
        "{CONNS} x {EACH} bytes in {took:?} of simulated time; {} times no free transmit frame",
        a.tx_no_frame
    );
    assert!(done, "received {got:?} of {EACH} each");
    // The test means something only if frames ran out.
    assert!(a.tx_no_frame > 0, "frames never ran out");
    // Nothing is lost on the in-memory link: no timer needs to fire. The ACK delay is the
    // longest wait any of it has reason for.
    assert!(
        took < Duration::from_millis(50),
        "took {took:?}: output waited for a timer"
    );
    Ok(())
}

/// Every scenario of the simulation (each workload through each impairment, both directions)
/// with 64 frames a side, so that senders run out of transmit frames and receivers of posted
/// ones (a frame that finds none posted is dropped, as a NIC drops it): every byte still
/// arrives, within the simulation's stall limits, nothing livelocks, and every frame comes
/// back at the end. `CORELANE_SIM_FRAMES` sets another count, `CORELANE_SIM_ONLY` runs the
/// scenarios whose name contains it.
#[test]
fn every_scenario_runs_short_of_frames() {
    let frames: usize = std::env::var("CORELANE_SIM_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let only = std::env::var("CORELANE_SIM_ONLY").unwrap_or_default();
    let (mut ran, mut short, mut dropped) = (0, 0, 0);
    let mut failures = Vec::new();
    for s in crate::sim::scenarios() {
        if !s.name.contains(only.as_str()) {
            continue;
        }
        let mut cfg = crate::sim::SimConfig::new(3, s.up, s.down);
        cfg.frames = frames;
        ran += 1;
        match crate::sim::run_with(&s, &cfg) {
            Ok(r) => {
                eprintln!(
                    "{}: {} ms simulated; {} times no transmit frame, {} frames dropped on \
                     arrival, {} retransmits",
                    s.name,
                    r.elapsed.total_millis(),
                    r.no_frame,
                    r.rx_no_frame,
                    r.retransmits
                );
                short += u64::from(r.no_frame > 0);
                dropped += r.rx_no_frame;
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    eprintln!("{short} of {ran} scenarios ran short of transmit frames; {dropped} frames dropped");
    // The sweep means something only if most scenarios did run short.
    assert!(
        ran > 0 && short * 2 > ran,
        "{short} of {ran} scenarios ran short"
    );
}
