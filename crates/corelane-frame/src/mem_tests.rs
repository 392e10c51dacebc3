//! Tests of the in-memory link (`mem.rs`), copying and zero-copy.

use super::*;

fn small() -> MemLink {
    MemLink {
        frames: 16,
        frame_size: 256,
        ring_size: 8,
    }
}

#[test]
fn frames_cross_the_link_and_are_accounted() {
    let (mut a, mut b) = small().pair();
    assert_eq!(a.counts().fill, 8);
    let mut tx = Vec::new();
    assert_eq!(a.alloc(&mut tx, 3), 3);
    for (n, f) in tx.iter_mut().enumerate() {
        a.bytes_mut(f, 10 + n).fill(n as u8 + 1);
    }
    assert_eq!(a.counts().in_use, 3);
    assert_eq!(a.send(&mut tx).unwrap(), 3);
    assert_eq!(a.counts().completion, 3);
    let mut rx = VecDeque::new();
    assert_eq!(b.recv(&mut rx, 64), 3);
    let c = b.counts();
    assert_eq!((c.in_use, c.fill, c.rx), (3, 5, 0));
    for (n, f) in rx.iter().enumerate() {
        assert_eq!(b.bytes(f), vec![n as u8 + 1; 10 + n].as_slice());
    }
    let mut done: Vec<MemFrame> = rx.drain(..).collect();
    b.release(&mut done);
    assert_eq!(b.counts().fill, 8);
    assert_eq!(a.complete().unwrap(), 3);
    let c = a.counts();
    assert_eq!(c.free + c.fill, 16);
    assert_eq!(c.sum(), c.total);
}

#[test]
fn ring_wraps_many_times_without_losing_frames() {
    let (mut a, mut b) = small().pair();
    let mut rx = VecDeque::new();
    let mut tx = Vec::new();
    for round in 0..1000u32 {
        a.alloc(&mut tx, 5);
        for f in tx.iter_mut() {
            a.bytes_mut(f, 4).copy_from_slice(&round.to_le_bytes());
        }
        a.send(&mut tx).unwrap();
        a.complete().unwrap();
        assert_eq!(b.recv(&mut rx, 64), 5, "round {round}");
        for f in &rx {
            assert_eq!(b.bytes(f), round.to_le_bytes());
        }
        let mut done: Vec<_> = rx.drain(..).collect();
        b.release(&mut done);
    }
    for p in [&mut a, &mut b] {
        let c = p.counts();
        assert_eq!(c.in_use + c.rx + c.tx + c.completion, 0);
        assert_eq!(c.sum(), 16);
    }
}

#[test]
fn a_full_peer_drops_and_counts_instead_of_blocking() {
    let (mut a, b) = small().pair();
    let mut tx = Vec::new();
    // The peer has 8 fill frames; send 12.
    for _ in 0..3 {
        a.alloc(&mut tx, 4);
        for f in tx.iter_mut() {
            a.bytes_mut(f, 60);
        }
        a.send(&mut tx).unwrap();
        a.complete().unwrap();
    }
    assert_eq!(a.stats().peer_dropped, 4);
    assert_eq!(b.rx_dropped(), 4);
}

#[test]
#[should_panic(expected = "used with UMEM")]
fn a_frame_of_one_port_is_refused_by_another() {
    let (mut a, b) = small().pair();
    let mut tx = Vec::new();
    a.alloc(&mut tx, 1);
    // Same frame size, index in range: only the brand tells them apart.
    let _ = b.bytes(&tx[0]);
}

/// Every buffer of the arena, as the two ports' maps name them, sorted.
fn buffers(a: &MemPort, b: &MemPort) -> Vec<u32> {
    let mut all: Vec<u32> = [&a.region, &b.region]
        .iter()
        .flat_map(|r| r.map.iter().map(Cell::get))
        .collect();
    all.sort_unstable();
    all
}

/// Sends `n` frames from `tx_port` holding `tag`, with the round in their first bytes.
fn send_tagged(p: &mut MemPort, n: usize, tag: u8, round: u32) {
    let mut tx = Vec::new();
    p.alloc(&mut tx, n);
    for (k, f) in tx.iter_mut().enumerate() {
        let b = p.bytes_mut(f, 8 + k);
        b[..4].copy_from_slice(&round.to_le_bytes());
        b[4..].fill(tag);
    }
    p.send(&mut tx).unwrap();
}

#[test]
fn zero_copy_hands_buffers_over_and_the_arena_stays_a_permutation() {
    let link = MemLink {
        frames: 32,
        ..small()
    };
    let (mut a, mut b) = link.pair_zero_copy();
    a.set_loss_every(7);
    let mut rx = VecDeque::new();
    let mut moved = 0;
    for round in 0..500u32 {
        let before = a.region.map[0].get();
        // Both ways, sometimes more than the peer has fill frames for (drops).
        send_tagged(&mut a, 1 + (round % 7) as usize, 0xa, round);
        a.complete().unwrap();
        send_tagged(&mut a, 1 + (round % 5) as usize, 0xa, round);
        send_tagged(&mut b, 1 + (round % 5) as usize, 0xb, round);
        for (p, tag) in [(&mut a, 0xb), (&mut b, 0xa)] {
            p.recv(&mut rx, 64);
            for f in &rx {
                let got = p.bytes(f);
                assert_eq!(got[..4], round.to_le_bytes(), "round {round}");
                assert!(got[4..].iter().all(|&x| x == tag), "round {round}");
            }
            let mut done: Vec<_> = rx.drain(..).collect();
            p.release(&mut done);
            p.complete().unwrap();
        }
        moved += usize::from(a.region.map[0].get() != before);
        assert_eq!(
            buffers(&a, &b),
            (0..64).collect::<Vec<u32>>(),
            "round {round}"
        );
    }
    assert!(moved > 0, "a zero-copy delivery never moved a buffer");
    assert!(a.stats().lost > 0 && a.stats().peer_dropped > 0);
    for p in [&mut a, &mut b] {
        let c = p.counts();
        assert_eq!(c.in_use + c.rx + c.tx + c.completion, 0);
        assert_eq!(c.sum(), 32);
    }
}

#[test]
fn copy_mode_never_moves_a_buffer() {
    let (mut a, mut b) = small().pair();
    let mut rx = VecDeque::new();
    for round in 0..50u32 {
        send_tagged(&mut a, 3, 1, round);
        b.recv(&mut rx, 64);
        let mut done: Vec<_> = rx.drain(..).collect();
        b.release(&mut done);
        a.complete().unwrap();
    }
    let ids = |p: &MemPort| p.region.map.iter().map(Cell::get).collect::<Vec<_>>();
    assert_eq!(ids(&a), (0..16).collect::<Vec<u32>>());
    assert_eq!(ids(&b), (16..32).collect::<Vec<u32>>());
}

/// A released receive frame goes back to the free list and the fill ring is topped up to the
/// fill target only, as an AF_XDP queue does: however many frames arrive, the frames over the
/// target stay free for transmit, and the frame released last is the next one posted.
#[test]
fn released_frames_beyond_the_fill_target_stay_free_for_transmit() {
    let link = MemLink {
        frames: 16,
        frame_size: 256,
        ring_size: 16,
    };
    let (mut a, mut b) = link.pair();
    assert_eq!(b.fill_target(), 8);
    assert_eq!(b.counts().fill, 8);
    // The sender delivers many rounds, as fast as the receiver posts frames.
    let (mut tx, mut rx) = (Vec::new(), VecDeque::new());
    for _ in 0..10 {
        a.alloc(&mut tx, 8);
        for f in tx.iter_mut() {
            a.bytes_mut(f, 60).fill(7);
        }
        a.send(&mut tx).unwrap();
        a.complete().unwrap();
        b.recv(&mut rx, 64);
        let mut done: Vec<MemFrame> = rx.drain(..).collect();
        let last = done.last().map(|f| f.index());
        b.release(&mut done);
        let c = b.counts();
        assert_eq!((c.fill, c.free), (8, 8), "{c:?}");
        // Its memory is the warmest: the last frame freed is the next one filled.
        assert_eq!(b.me.borrow().fill.front().copied(), last.map(|i| i as u32));
    }
    // The receiver can still send a window's worth.
    assert_eq!(b.alloc(&mut tx, 16), 8);
    b.free(&mut tx);
}
