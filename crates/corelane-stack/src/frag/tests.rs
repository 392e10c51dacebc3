use super::*;
use smoltcp::time::Instant;

const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn ip(s: &str) -> IpAddress {
    s.parse::<std::net::IpAddr>()
        .map_or(IpAddress::Ipv4([0; 4].into()), Into::into)
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

/// Every piece in the order `order` gives; returns the whole frame if one came out.
fn reassemble(r: &mut Reassembler, frames: &[Vec<u8>], order: &[usize]) -> Option<Vec<u8>> {
    let mut out = None;
    for &i in order {
        if let Some(w) = r.push(&frames[i], Instant::ZERO) {
            out = Some(w);
        }
    }
    out
}

#[test]
fn ipv4_and_ipv6_datagrams_come_back_whole_in_any_order() {
    for (src, dst, hdr) in [("10.0.0.2", "10.0.0.1", 20), ("fd00::2", "fd00::1", 40)] {
        let data = payload(60_000);
        let frames = fragment(B, A, ip(src), ip(dst), 17, 0x1234_5678, &data, 1500);
        assert_eq!(frames.len(), 60_000usize.div_ceil((1500 - hdr - 8) & !7));
        assert!(
            frames.iter().all(|f| f.len() <= 14 + 1500),
            "each fits the MTU"
        );
        assert!(frames.iter().all(|f| Reassembler::is_fragment(f)));
        let mut order: Vec<usize> = (0..frames.len()).rev().collect();
        order.swap(3, 10);
        let mut r = Reassembler::new(FragLimits::default());
        let whole = reassemble(&mut r, &frames, &order).expect("whole");
        assert_eq!(&whole[14 + hdr..], &data[..], "{src}: the payload");
        assert!(!Reassembler::is_fragment(&whole));
        if hdr == 20 {
            assert_eq!(inet_checksum(&whole[14..34]), 0, "a valid IPv4 header");
            assert_eq!(u16::from_be_bytes([whole[16], whole[17]]), 60_020);
        } else {
            assert_eq!(whole[20], 17, "the IPv6 header names UDP");
            assert_eq!(u16::from_be_bytes([whole[18], whole[19]]), 60_000);
        }
        assert_eq!((r.in_progress(), r.bytes_held()), (0, 0));
        assert_eq!(r.stats().reassembled, 1);
    }
    // What fits goes whole, with DF set (IPv4).
    let small = fragment(
        B,
        A,
        ip("10.0.0.2"),
        ip("10.0.0.1"),
        17,
        1,
        &payload(100),
        1500,
    );
    assert_eq!(small.len(), 1);
    assert!(!Reassembler::is_fragment(&small[0]));
}

#[test]
fn overlapping_fragments_drop_their_datagram_and_repeats_are_harmless() {
    let data = payload(4000);
    let frames = fragment(B, A, ip("fd00::2"), ip("fd00::1"), 17, 9, &data, 1280);
    let mut r = Reassembler::new(FragLimits::default());
    assert!(r.push(&frames[0], Instant::ZERO).is_none());
    assert!(r.push(&frames[0], Instant::ZERO).is_none(), "a repeat");
    // A forged piece overlapping the first: the datagram is gone.
    let other = fragment(B, A, ip("fd00::2"), ip("fd00::1"), 17, 9, &data[8..], 1280);
    let mut forged = other[0].clone();
    forged[14 + 42..14 + 44].copy_from_slice(&((1u16 << 3) | 1).to_be_bytes());
    assert!(r.push(&forged, Instant::ZERO).is_none());
    assert_eq!(r.stats().overlaps, 1);
    assert_eq!((r.in_progress(), r.bytes_held()), (0, 0));
    // The rest alone cannot complete it.
    assert!(reassemble(&mut r, &frames, &[1, 2, 3]).is_none());
}

#[test]
fn a_flood_of_incomplete_datagrams_stays_within_the_limits_and_times_out() {
    let limits = FragLimits {
        max_bytes: 1 << 20,
        max_datagrams: 64,
        max_pieces: 128,
        timeout: std::time::Duration::from_secs(30),
    };
    let mut r = Reassembler::new(limits);
    let data = payload(60_000);
    for id in 0..2000u32 {
        // Only the last fragment of each: never complete.
        let frames = fragment(B, A, ip("10.0.0.2"), ip("10.0.0.1"), 17, id, &data, 1500);
        let last = frames.last().expect("frames");
        assert!(r.push(last, Instant::from_millis(i64::from(id))).is_none());
        assert!(
            r.bytes_held() <= limits.max_bytes,
            "{} bytes",
            r.bytes_held()
        );
        assert!(r.in_progress() <= limits.max_datagrams);
    }
    assert!(r.stats().evicted > 1900);
    // A whole datagram still gets through the flood.
    let good = fragment(
        B,
        A,
        ip("10.0.0.3"),
        ip("10.0.0.1"),
        17,
        1,
        &payload(3000),
        1500,
    );
    assert!(reassemble(&mut r, &good, &[0, 1, 2]).is_some());
    r.expire(Instant::from_secs(100));
    assert_eq!((r.in_progress(), r.bytes_held()), (0, 0));
    assert!(r.stats().timeouts > 0);
}

#[test]
fn malformed_and_truncated_fragments_are_counted_not_trusted() {
    let frames = fragment(
        B,
        A,
        ip("10.0.0.2"),
        ip("10.0.0.1"),
        17,
        5,
        &payload(3000),
        1500,
    );
    let mut r = Reassembler::new(FragLimits::default());
    for f in &frames {
        for n in 0..f.len() {
            assert!(r.push(&f[..n], Instant::ZERO).is_none());
        }
    }
    assert!(r.stats().malformed > 0);
    // A piece claiming to run past 65535 bytes.
    let mut far = frames[1].clone();
    far[20..22].copy_from_slice(&0x1fffu16.to_be_bytes());
    far[24..26].copy_from_slice(&[0, 0]);
    let c = inet_checksum(&far[14..34]);
    far[24..26].copy_from_slice(&c.to_ne_bytes());
    let before = r.stats().malformed;
    assert!(r.push(&far, Instant::ZERO).is_none());
    assert_eq!(r.stats().malformed, before + 1);
}

/// An IPv4 fragment of datagram `id` from `src`: `len` bytes at `offset`, more to come.
fn piece(src: &str, id: u32, offset: usize, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + len];
    f[..6].copy_from_slice(&A);
    f[6..12].copy_from_slice(&B);
    let frag = Some(Frag {
        offset,
        more: true,
        id,
    });
    write_ip_header(&mut f, ip(src), ip("10.0.0.1"), 17, len, id as u16, frag);
    f
}

#[test]
fn a_fragment_is_charged_for_what_it_holds_not_for_its_offset() {
    let mut r = Reassembler::new(FragLimits::default());
    assert!(
        r.push(&piece("10.0.0.2", 1, 65000, 8), Instant::ZERO)
            .is_none()
    );
    assert_eq!(r.in_progress(), 1);
    assert!(
        r.bytes_held() < 512,
        "one 8-byte fragment at offset 65000 is charged {} bytes",
        r.bytes_held()
    );
}

#[test]
fn a_flood_of_tiny_high_offset_fragments_does_not_evict_a_datagram_in_progress() {
    let limits = FragLimits::default();
    let mut r = Reassembler::new(limits);
    let good = fragment(
        B,
        A,
        ip("10.0.0.3"),
        ip("10.0.0.1"),
        17,
        7,
        &payload(60_000),
        1500,
    );
    // 200,000 flood fragments from 256 spoofed sources, each a new datagram that never
    // completes; the good datagram's 41 fragments come in among them, one per 500.
    let (mut whole, mut next, mut most) = (None, 0, 0);
    for n in 0..200_000u32 {
        let src = format!("10.1.0.{}", n % 256);
        let f = piece(&src, n, 64_000 - 8 * (n as usize % 64), 8);
        let now = Instant::from_micros(i64::from(n));
        assert!(r.push(&f, now).is_none());
        most = most.max(r.bytes_held());
        assert!(r.in_progress() <= limits.max_datagrams);
        if n % 500 == 0 && next < good.len() {
            whole = r.push(&good[next], now).or(whole);
            next += 1;
        }
    }
    assert_eq!(next, good.len());
    assert!(
        whole.is_some(),
        "the datagram in progress was dropped: {:?}",
        r.stats()
    );
    assert!(most <= limits.max_bytes, "held {most} bytes");
    assert!(r.stats().evicted > 190_000, "{:?}", r.stats());
}

#[test]
fn a_datagram_in_too_many_pieces_is_dropped_and_each_piece_costs_bounded_work() {
    let limits = FragLimits::default();
    let mut r = Reassembler::new(limits);
    // 8,000 8-byte pieces of one datagram, every other slot (no overlap, never complete).
    for k in 0..8_000usize {
        let _ = r.push(&piece("10.0.0.2", 9, 16 * k % 64_000, 8), Instant::ZERO);
        assert!(r.in_progress() <= 1);
        assert!(r.bytes_held() <= 256 + 64 + limits.max_pieces * (64 + 8));
    }
    assert!(r.stats().too_many_pieces > 0, "{:?}", r.stats());
}
