//! RACK's loss marking against a model: the scoreboard walks the segments sent once with a
//! cursor and only the retransmissions through its time order, and must mark exactly what a
//! walk over every segment in flight, sorted by transmit time (then sequence), marks. Seeded
//! random sending, SACKs, cumulative ACKs, retransmissions, tail probes and cuts, at segment
//! edges.

use smoltcp::time::{Duration, Instant};

use super::board::{Board, Delivered, SegState};
use super::seq::Seq;

const BASE: Seq = Seq(0xffff_0000);

/// What RACK must do to `b` (RFC 8985 section 6.2, step 5): walking the segments in flight
/// oldest sent first, each sent before the newest delivered one is lost once `rtt + reo` has
/// passed since it was sent; the first not sent before it, or not yet due, ends the walk.
fn model(
    b: &Board,
    rack: (Instant, Seq),
    rtt: Duration,
    reo: Duration,
    now: Instant,
) -> (Vec<u32>, Option<Instant>) {
    let mut live: Vec<_> = b
        .segs()
        .filter(|s| matches!(s.state, SegState::Sent | SegState::Retrans))
        .map(|s| (s.xmit, s.start.since(BASE) as u32, s.end))
        .collect();
    live.sort_unstable_by_key(|&(x, at, _)| (x, at));
    let mut lost = Vec::new();
    for (xmit, at, end) in live {
        let before = xmit < rack.0 || (xmit == rack.0 && end.le(rack.1));
        if !before {
            return (lost, None);
        }
        let due = xmit + rtt + reo;
        if due > now {
            return (lost, Some(due));
        }
        lost.push(at);
    }
    (lost, None)
}

/// The newer of two RACK marks: the later transmit, then the higher end.
fn newer(a: Option<(Instant, Seq)>, b: Option<(Instant, Seq)>) -> Option<(Instant, Seq)> {
    match (a, b) {
        (Some(x), Some(y)) if y.0 > x.0 || (y.0 == x.0 && y.1.gt(x.1)) => Some(y),
        (Some(x), _) => Some(x),
        (None, y) => y,
    }
}

fn lost_starts(b: &Board) -> Vec<u32> {
    b.segs()
        .filter(|s| s.state == SegState::Lost)
        .map(|s| s.start.since(BASE) as u32)
        .collect()
}

#[test]
fn rack_marks_what_a_walk_in_transmit_order_marks() {
    let mut x = 0x243f_6a88_85a3_08d3u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut checks, mut marked_total, mut resent_total, mut splits) = (0, 0, 0, 0);
    for _round in 0..200 {
        let mut b = Board::default();
        let mut now = Instant::from_millis(1);
        let mut snd = BASE;
        let mut rack: Option<(Instant, Seq)> = None;
        for _step in 0..150 {
            // Often at the same instant: a pass resends and sends new data at one time.
            if next() % 3 != 0 {
                now += Duration::from_micros(next() % 3_000);
            }
            match next() % 8 {
                0..=2 => {
                    // A pass: a few segments sent at the same instant.
                    for _ in 0..1 + next() % 6 {
                        let len = 100 + (next() % 1_349) as usize;
                        b.push(snd, snd.plus(len), false, now);
                        snd = snd.plus(len);
                    }
                }
                3 => {
                    // A SACK block over whole segments.
                    let n = b.len();
                    if n > 1 {
                        let i = 1 + (next() as usize) % (n - 1);
                        let j = (i + 1 + (next() as usize) % 4).min(n);
                        let segs: Vec<_> = b.segs().map(|s| (s.start, s.end)).collect();
                        let base = segs[0].0;
                        let mut d = Delivered::default();
                        b.sack(segs[i].0, segs[j - 1].1, base, now, &mut d);
                        rack = newer(rack, d.newest);
                    }
                }
                4 => {
                    // A cumulative ACK at a segment's end.
                    let ends: Vec<_> = b.segs().map(|s| s.end).take(3).collect();
                    if let Some(&e) = ends.get((next() as usize) % 3) {
                        let mut d = Delivered::default();
                        b.ack(e, now, &mut d);
                        rack = newer(rack, d.newest);
                    }
                }
                5 => {
                    // Retransmissions of what is deemed lost.
                    for _ in 0..1 + next() % 3 {
                        if let Some((i, _)) = b.next_lost() {
                            b.resent(i, now);
                            resent_total += 1;
                        }
                    }
                }
                6 if next() % 4 == 0 => {
                    b.probe_last(now);
                }
                6 => {
                    // A segment cut in two (options that no longer fit).
                    let n = b.len();
                    if n > 0 {
                        let i = (next() as usize) % n;
                        let s = b.segs().nth(i).map(|s| (s.start, s.len()));
                        if let Some((start, len)) = s.filter(|s| s.1 > 1) {
                            b.split(i, start.plus(len / 2));
                            splits += 1;
                        }
                    }
                }
                _ => {
                    let Some(r) = rack else { continue };
                    let rtt = Duration::from_micros(2_000 + next() % 4_000);
                    let reo = Duration::from_micros(next() % 2_000);
                    let mut want = lost_starts(&b);
                    let (newly, timer) = model(&b, r, rtt, reo, now);
                    want.extend(&newly);
                    want.sort_unstable();
                    let (bytes, got_timer) = b.rack_detect(r, rtt, reo, now);
                    let got = lost_starts(&b);
                    assert_eq!(got, want, "lost segments differ at {now:?}");
                    assert_eq!(got_timer, timer, "the reordering timer differs at {now:?}");
                    assert_eq!(bytes > 0, !newly.is_empty());
                    marked_total += newly.len();
                    checks += 1;
                }
            }
        }
    }
    // The comparison means something only if RACK marked and the board resent a good deal.
    eprintln!("{checks} checks, {marked_total} marked, {resent_total} resent, {splits} cut");
    assert!(checks > 2_000 && marked_total > 1_000 && resent_total > 500 && splits > 500);
}
