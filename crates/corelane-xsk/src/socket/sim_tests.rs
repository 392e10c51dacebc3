//! Tests of the in-memory kernel, and a seeded slice of the upgrade simulation (no root).

use super::upgrade::{Outcome, run};
use super::*;
use crate::XskFrame;
use corelane_frame::FrameIo;

fn config() -> XskConfig {
    XskConfig {
        frames: 64,
        frame_size: 2048,
        ring_size: 16,
        ..XskConfig::default()
    }
}

#[test]
fn a_queue_on_the_in_memory_kernel_receives_and_sends_like_copy_mode() {
    let (k, mut q) = SimKernel::open(&config()).unwrap();
    // The fill ring holds the queue's share: as many frames as the ring takes.
    assert_eq!(k.frames_held().len(), 16);
    for n in 0..20u8 {
        assert_eq!(k.deliver(&[n; 60]), n < 16, "frame {n}");
    }
    let mut got = std::collections::VecDeque::new();
    assert_eq!(q.recv(&mut got, 64), 16);
    let mut out: Vec<XskFrame> = got.into_iter().collect();
    assert_eq!(q.bytes(&out[3]), &[3u8; 60][..]);
    assert_eq!(q.send(&mut out).unwrap(), 16);
    let wire = k.take_wire();
    assert_eq!(wire.len(), 16);
    assert_eq!(wire[5], vec![5u8; 60]);
    // The completions come back, and the fill ring is topped up again.
    q.complete().unwrap();
    let c = q.counts();
    assert_eq!((c.tx, c.in_use, c.sum()), (0, 0, 64), "{c:?}");
    assert!(k.deliver(&[9; 60]));
    assert_eq!(k.dropped(), 4);
}

#[test]
fn a_zero_copy_driver_that_asked_for_a_wakeup_with_the_fill_ring_full_is_woken_when_receive_runs_dry()
 {
    // The race of a slow zero-copy guest: the driver found the fill ring empty, user space
    // posted entries and looked at the flag before the driver set it. Nothing more is posted
    // (every frame is in the fill ring), so only a receive that finds nothing and looks at the
    // flag again can wake the driver; without it the queue is deaf for good.
    let (k, mut q) = SimKernel::open(&config()).unwrap();
    k.fill_like_zero_copy();
    k.fill_runs_dry_now();
    assert_eq!(k.frames_held().len(), 16, "the fill ring is full");
    let mut got = std::collections::VecDeque::new();
    let mut heard = 0;
    for turn in 0..4u8 {
        k.deliver(&[turn; 60]);
        heard += q.recv(&mut got, 64);
    }
    assert!(heard > 0, "the queue never woke its driver");
    assert!(q.stats().fill_wakeups > 0);
    let mut out: Vec<XskFrame> = got.into_iter().collect();
    q.release(&mut out);
    // Once the fill ring really runs dry, posting to it again wakes the driver.
    let (k, mut q) = SimKernel::open(&config()).unwrap();
    k.fill_like_zero_copy();
    for n in 0..17u8 {
        k.deliver(&[n; 60]);
    }
    assert!(!k.deliver(&[0; 60]), "the driver waits for its wakeup");
    let mut got = std::collections::VecDeque::new();
    assert_eq!(q.recv(&mut got, 64), 16);
    let mut out: Vec<XskFrame> = got.into_iter().collect();
    q.release(&mut out);
    assert!(
        k.deliver(&[1; 60]),
        "the refilled ring's wakeup was not sent"
    );
}

#[test]
fn a_seed_of_the_upgrade_simulation_replays_exactly() {
    let a = run(7, 300).unwrap_or_else(|f| panic!("{f}"));
    let b = run(7, 300).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(a, b);
    assert!(a.delivered > 0 && a.echoed > 0, "{a:?}");
}

#[test]
fn the_upgrade_simulation_keeps_every_frame_in_one_place_over_seeds() {
    let seeds: u64 = std::env::var("CORELANE_UPGRADE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut outcomes = std::collections::BTreeMap::new();
    let mut called_off = 0;
    let mut failures = Vec::new();
    for seed in 0..seeds {
        match run(seed, 300) {
            Ok(r) => {
                *outcomes.entry(r.outcome).or_insert(0) += 1;
                called_off += u64::from(r.call_offs > 0);
            }
            Err(f) => failures.push(f.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {seeds} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Both ends happen: upgrades completed, and upgrades called off at every stage.
    assert!(
        outcomes
            .get(&Outcome::Upgraded)
            .is_some_and(|&n| n > seeds / 10),
        "{outcomes:?}"
    );
    assert!(
        called_off > seeds / 10,
        "{called_off} of {seeds} runs called one off"
    );
}

#[test]
fn a_descriptor_past_the_umem_is_refused_not_taken_for_the_frame_it_wraps_to() {
    let (k, mut q) = SimKernel::open(&config()).unwrap();
    let before = q.counts();
    // Frame 5 plus 2^32 frames: truncated to 32 bits it would be frame 5, which is posted.
    let addr = ((1u64 << 32) + 5) * 2048 + 256;
    {
        let mut kernel = k.kernel();
        let d = super::Desc {
            addr,
            len: 60,
            options: 0,
        };
        assert_eq!(kernel.sockets[0].rx.push(&[d]), 1);
    }
    let mut got = std::collections::VecDeque::new();
    assert_eq!(q.recv(&mut got, 64), 0, "a frame that is not this UMEM's");
    assert_eq!(q.counts(), before, "no frame moved");
    assert!(q.pool.ledger().verify().is_ok());
}

#[test]
fn a_new_process_outlives_an_old_one_killed_after_the_hand_over_and_gets_every_frame_back() {
    let (k, mut old) = SimKernel::open(&config()).unwrap();
    let join = crate::PendingJoin::bind_sim(&k, old.offer_upgrade().unwrap()).unwrap();
    join.ask().unwrap();
    // The old process hands the rings over on its next turn.
    old.complete().unwrap();
    let mut new = join.try_take_over().unwrap().expect("handed over");
    new.complete().unwrap();
    // Traffic for the old process: it holds some frames as it dies, some wait on its RX ring.
    for n in 0..6u8 {
        assert!(k.deliver(&[n; 60]), "frame {n}");
    }
    let mut got = std::collections::VecDeque::new();
    assert_eq!(old.recv(&mut got, 3), 3);
    old.crash_for_simulation();
    let m = k.misplaced(&mut [&mut new]).unwrap();
    assert!(m.twice.is_empty(), "{m:?}");
    assert!(
        !m.lost.is_empty(),
        "the frames the old process held are in no place until the new one takes them: {m:?}"
    );
    let taken = new.outlive_partner().unwrap();
    assert!(
        taken >= m.lost.len(),
        "{taken} taken, {} lost",
        m.lost.len()
    );
    let m = k.misplaced(&mut [&mut new]).unwrap();
    assert_eq!(m, Misplaced::default(), "every frame in one place again");
    assert_eq!(
        new.upgrade_phase(),
        None,
        "the queue is the new process's alone"
    );
    // And it serves: the program steers to it, it fills, receives and sends.
    k.steer_to(&new);
    new.complete().unwrap();
    assert!(k.deliver(&[7; 60]));
    let mut got = std::collections::VecDeque::new();
    assert_eq!(new.recv(&mut got, 8), 1);
    let mut out: Vec<XskFrame> = got.into_iter().collect();
    assert_eq!(new.send(&mut out).unwrap(), 1);
    assert_eq!(k.take_wire(), vec![vec![7u8; 60]]);
    assert!(new.outlive_partner().is_err(), "nothing left to outlive");
}

#[test]
fn a_driver_that_stops_sending_without_asking_for_a_wakeup_is_kicked_anyway() {
    let (k, mut q) = SimKernel::open(&config()).unwrap();
    k.tx_stalls_silently();
    let mut out = Vec::new();
    assert_eq!(q.alloc(&mut out, 3), 3);
    for (n, f) in out.iter_mut().enumerate() {
        q.bytes_mut(f, 60).fill(n as u8 + 1);
    }
    assert_eq!(q.send(&mut out).unwrap(), 3);
    assert!(k.take_wire().is_empty(), "a stalled driver sent nothing");
    // Turns go on (each completes what it can); nothing completes, and no flag asks for a
    // kick: the queue kicks once the stall has lasted long enough.
    let mut wire = Vec::new();
    for _ in 0..500 {
        q.complete().unwrap();
        wire = k.take_wire();
        if !wire.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    assert_eq!(wire.len(), 3, "the frames went out");
    assert_eq!(wire[2], vec![3u8; 60]);
    assert!(q.stats().tx_nudges >= 1);
    q.complete().unwrap();
    let c = q.counts();
    assert_eq!((c.tx, c.completion), (0, 0), "{c:?}");
}

#[test]
fn a_receive_stamp_is_read_once_and_never_again_from_the_frame_s_next_use() {
    let (k, mut q) = SimKernel::open(&config()).unwrap();
    let mut got = std::collections::VecDeque::new();
    // Not asked for: nothing is read.
    assert!(k.deliver_stamped(&[1; 60], 111));
    assert_eq!(q.recv(&mut got, 64), 1);
    assert_eq!(q.take_rx_stamp(), None);
    // Asked for: the first frame of the next batch gives its stamp, the second none.
    q.want_rx_stamp(200);
    assert!(k.deliver_stamped(&[2; 60], 222));
    assert!(k.deliver_stamped(&[3; 60], 333));
    assert_eq!(q.recv(&mut got, 64), 2);
    assert_eq!(q.take_rx_stamp(), Some(222));
    assert_eq!(q.take_rx_stamp(), None, "taken once");
    // Every frame goes round the fill ring and comes back unstamped (a driver without
    // metadata): the stamps the frames carried before are not read again.
    let mut done: Vec<XskFrame> = got.drain(..).collect();
    q.release(&mut done);
    for round in 0..40u8 {
        q.want_rx_stamp(1000);
        assert!(k.deliver(&[round; 60]));
        assert_eq!(q.recv(&mut got, 64), 1);
        assert_eq!(
            q.take_rx_stamp(),
            None,
            "round {round}: a stale stamp was read"
        );
        let mut done: Vec<XskFrame> = got.drain(..).collect();
        assert_eq!(q.bytes(&done[0]), &[round; 60][..]);
        q.release(&mut done);
    }
    // A stamp older than the moment given is refused; a request no batch answered ends with
    // the next take, so a later batch is not read.
    q.want_rx_stamp(1000);
    assert!(k.deliver_stamped(&[5; 60], 999));
    assert_eq!(q.recv(&mut got, 64), 1);
    assert_eq!(q.take_rx_stamp(), None);
    q.want_rx_stamp(1000);
    assert_eq!(q.take_rx_stamp(), None);
    assert!(k.deliver_stamped(&[4; 60], 4444));
    assert_eq!(q.recv(&mut got, 64), 1);
    assert_eq!(q.take_rx_stamp(), None);
}
