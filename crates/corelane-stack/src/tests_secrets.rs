//! What a peer sees of the stack's secrets: nothing it can compute from the seed. IPv4 frames
//! that carry DF take identification 0; the identifications of fragmented datagrams, the
//! initial sequence numbers and the timestamps come from keys that a one-bit change of a
//! fixed seed changes beyond recognition (no affine function of the seed on the wire, as the
//! IP-ID `seed >> 17` and IPv6 fragment ID `seed >> 32` were).

use std::collections::VecDeque;
use std::task::Poll;

use smoltcp::time::Duration;

use smoltcp::wire::IpCidr;

use crate::{Node, Pair, StackConfig};

/// Two nodes (10.9.0.1 and fd00:9::1, 10.9.0.2 and fd00:9::2) with seeds `seed` and
/// `seed + 1`.
fn pair(seed: u64) -> Pair {
    let (x, y) = corelane_frame::MemLink::default().pair();
    let node = |io, last: u8, seed: u64| {
        let v4 = smoltcp::wire::Ipv4Address::new(10, 9, 0, last);
        let v6 = std::net::Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, u16::from(last));
        let cfg = StackConfig {
            seed: Some(seed),
            ..StackConfig::default()
        };
        Node::new(
            io,
            [2, 0, 0, 0, 0, last],
            &[IpCidr::new(v4.into(), 24), IpCidr::new(v6.into(), 64)],
            1500,
            cfg,
        )
    };
    Pair::from_nodes(node(x, 1, seed), node(y, 2, seed.wrapping_add(1)))
}

/// What `b` sends on a warmed-up pair when it sends a UDP datagram of `n` bytes to `to`, the
/// frames as captured.
fn sent_by_b(seed: u64, to: &str, n: usize) -> Result<Vec<Vec<u8>>, Box<dyn std::error::Error>> {
    let mut p = pair(seed);
    let (a, _) = p.a.stack.bind_udp(9)?;
    let (b, _) = p.b.stack.bind_udp(0)?;
    let to: std::net::SocketAddr = to.parse()?;
    // One small datagram first, delivered, so each side knows the other's hardware address.
    assert!(matches!(
        p.b.stack.udp_send_to(b, b"hi", to, None),
        Poll::Ready(Ok(2))
    ));
    let mut buf = vec![0u8; 70_000];
    let mut got = false;
    p.drive(Duration::from_secs(2), |p| {
        got |= matches!(
            p.a.stack.udp_recv_from(a, &mut buf, None),
            Poll::Ready(Ok(_))
        );
        got
    })?;
    assert!(got, "the first datagram arrived");
    p.b.dev_mut().io_mut().set_capture(true);
    let data = vec![7u8; n];
    assert!(matches!(
        p.b.stack.udp_send_to(b, &data, to, None),
        Poll::Ready(Ok(m)) if m == n
    ));
    p.drive_for(Duration::from_millis(5), |_| {})?;
    let mut out = VecDeque::new();
    p.b.dev_mut().io_mut().take_sent(&mut out);
    Ok(out.into())
}

fn ethertype(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[12], f[13]])
}

/// The identification of a fragmented datagram: IPv4's 16 bits, IPv6's fragment header's 32.
fn frag_id(f: &[u8]) -> Option<u32> {
    match ethertype(f) {
        0x0800 => {
            let flags = u16::from_be_bytes([f[20], f[21]]);
            (flags & 0x3fff != 0).then(|| u32::from(u16::from_be_bytes([f[18], f[19]])))
        }
        0x86dd => (f[20] == 44).then(|| u32::from_be_bytes([f[58], f[59], f[60], f[61]])),
        _ => None,
    }
}

#[test]
fn an_atomic_ipv4_datagram_carries_identification_zero() -> Result<(), Box<dyn std::error::Error>> {
    let frames = sent_by_b(0xc0de, "10.9.0.1:9", 100)?;
    let v4: Vec<&Vec<u8>> = frames.iter().filter(|f| ethertype(f) == 0x0800).collect();
    assert!(!v4.is_empty(), "the datagram was sent");
    for f in v4 {
        assert_eq!(
            u16::from_be_bytes([f[20], f[21]]),
            0x4000,
            "DF, not a fragment"
        );
        assert_eq!(&f[18..20], &[0, 0], "identification 0");
    }
    Ok(())
}

/// Mean bits that differ between `f(seed)` and `f(seed with one bit flipped)`, over all 64
/// bits, as a share of the bits compared; an affine or truncated function of the seed gives
/// 0 for many flips (the bits it drops) or always the same pattern.
fn avalanche(bits: u32, f: impl Fn(u64) -> u32) -> f64 {
    let seed = 0x5eed_1234_abcd_9876u64;
    let base = f(seed);
    let mut flips = Vec::new();
    for k in 0..64 {
        let d = (f(seed ^ (1 << k)) ^ base).count_ones();
        assert!(d > 0, "flipping seed bit {k} changed nothing");
        flips.push(d);
    }
    flips.iter().map(|&d| f64::from(d)).sum::<f64>() / (64.0 * f64::from(bits))
}

#[test]
fn fragment_identifications_are_keyed_not_derived_from_the_seed()
-> Result<(), Box<dyn std::error::Error>> {
    for (to, bits) in [("10.9.0.1:9", 16), ("[fd00:9::1]:9", 32)] {
        let id = |seed: u64| -> u32 {
            let frames = sent_by_b(seed, to, 4000).unwrap_or_default();
            let ids: Vec<u32> = frames.iter().filter_map(|f| frag_id(f)).collect();
            assert!(ids.len() >= 3, "{to}: the datagram went in fragments");
            assert!(ids.iter().all(|&i| i == ids[0]), "one datagram, one ID");
            ids[0]
        };
        // The old identifications: a counter started at `seed >> 17` (IPv4) or `seed >> 32`
        // (IPv6), so one fragment gave the seed's bits away.
        let seed = 0x0123_4567_89ab_cdefu64;
        let old = if bits == 16 {
            u32::from(((seed >> 17) as u16).wrapping_add(2))
        } else {
            ((seed >> 32) as u32).wrapping_add(1)
        };
        assert_ne!(id(seed), old, "{to}");
        let share = avalanche(bits, id);
        assert!(
            (0.35..0.65).contains(&share),
            "{to}: a one-bit change of the seed changes {share:.2} of the ID's bits"
        );
    }
    Ok(())
}

#[test]
fn every_secret_has_a_key_of_its_own() {
    use crate::tcp::Secret;
    let v4 = |last: u8, port: u16| {
        smoltcp::wire::IpEndpoint::new(smoltcp::wire::Ipv4Address::new(10, 0, 0, last).into(), port)
    };
    let (l, r) = (v4(1, 80), v4(2, 40000));
    let t = smoltcp::time::Instant::from_millis(5);
    for (what, share) in [
        ("ISN", avalanche(32, |s| Secret::new(s).isn(l, r, t).0)),
        (
            "timestamp offset",
            avalanche(32, |s| Secret::new(s).ts_offset(l, r)),
        ),
        (
            "cookie key",
            avalanche(32, |s| Secret::new(s).key().0 as u32),
        ),
        (
            "port start",
            avalanche(32, |s| Secret::new(s).port_hashes(l.addr, r, 0).0),
        ),
    ] {
        assert!((0.35..0.65).contains(&share), "{what}: {share:.2}");
    }
    // The keys differ from each other, and fresh ones from the OS differ between stacks.
    let s = Secret::new(1);
    assert_ne!(s.key(), s.table_key());
    let (a, b) = (Secret::random(), Secret::random());
    assert!(a.is_some() && b.is_some(), "the OS gives random bytes");
    if let (Some(a), Some(b)) = (a, b) {
        assert_ne!(a.key(), b.key());
        assert_ne!(a.table_key(), b.table_key());
    }
}

#[test]
fn a_master_key_has_128_bits_that_count_and_takes_precedence_over_a_seed() {
    use crate::tcp::Secret;
    // Keys that differ in the second word only: every purpose's key differs (a 64-bit seed
    // had no second word, so 64 bits were all an attacker had to search).
    let (a, b) = (Secret::from_master((1, 2)), Secret::from_master((1, 3)));
    assert_ne!(a.key(), b.key());
    assert_ne!(a.ts_key(), b.ts_key());
    assert_ne!(a.table_key(), b.table_key());
    let (l, r) = (
        smoltcp::wire::Ipv4Address::new(10, 0, 0, 1).into(),
        smoltcp::wire::IpEndpoint::new(smoltcp::wire::Ipv4Address::new(10, 0, 0, 2).into(), 80),
    );
    assert_ne!(a.port_hashes(l, r, 0), b.port_hashes(l, r, 0));
    // A key is not a seed's expansion in disguise.
    assert_ne!(Secret::from_master((1, 2)).key(), Secret::new(1).key());
    // The OS gives a fresh one each time.
    let (k1, k2) = (StackConfig::random_key(), StackConfig::random_key());
    assert!(k1.is_some() && k1 != k2, "{k1:?} {k2:?}");
}

#[test]
fn connections_to_one_destination_take_ports_in_turn_from_a_start_no_one_can_guess()
-> Result<(), Box<dyn std::error::Error>> {
    // RFC 6056's algorithm 4: a port comes back to the same peer only after the whole share
    // was used (a peer may still hold the last incarnation in TIME-WAIT), while where the
    // turn starts depends on the key and the destination.
    let span = u32::from(u16::MAX) - u32::from(crate::config::EPHEMERAL_START) + 1;
    let first_ports = |seed: u64, to: &str| -> Result<Vec<u16>, Box<dyn std::error::Error>> {
        let mut p = pair(seed);
        let to = to.parse()?;
        let mut v = Vec::new();
        for _ in 0..20 {
            v.push(p.b.stack.connect_tcp(to)?.1);
        }
        Ok(v)
    };
    let a = first_ports(1, "10.9.0.1:7")?;
    for w in a.windows(2) {
        let next = (u32::from(w[0]) - u32::from(crate::config::EPHEMERAL_START) + 1) % span;
        assert_eq!(
            u32::from(w[1]) - u32::from(crate::config::EPHEMERAL_START),
            next,
            "{a:?}"
        );
    }
    // Another destination, or another key, starts somewhere else.
    let other_port = first_ports(1, "10.9.0.1:8")?;
    let other_key = first_ports(3, "10.9.0.1:7")?;
    assert!(!a.contains(&other_port[0]), "{a:?} {other_port:?}");
    assert!(!a.contains(&other_key[0]), "{a:?} {other_key:?}");
    // UDP sockets bound to port 0 have no destination: each starts anywhere.
    let mut p = pair(1);
    let mut udp = Vec::new();
    for _ in 0..4 {
        udp.push(p.b.stack.bind_udp(0)?.1);
    }
    assert!(
        udp.windows(2).all(|w| w[1] != w[0].wrapping_add(1)),
        "{udp:?}"
    );
    Ok(())
}
