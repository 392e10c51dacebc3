//! Tests of the segment writer and parser (`wire.rs`).

use super::sums::sum;
use super::*;
use crate::classify::{Class, classify};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

fn path(v6: bool) -> std::result::Result<Path, std::net::AddrParseError> {
    let (l, r) = if v6 {
        ("[fd00::1]:80", "[fd00::2]:40000")
    } else {
        ("10.0.0.1:80", "10.0.0.2:40000")
    };
    Ok(Path {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        local: l.parse::<std::net::SocketAddr>()?.into(),
        remote: r.parse::<std::net::SocketAddr>()?.into(),
        ttl: 64,
        tos: 0,
    })
}

#[test]
fn built_frames_pass_the_checksum_checks_and_parse_back() -> Result {
    let data: Vec<u8> = (0..3001u32).map(|i| (i * 31 + 7) as u8).collect();
    for v6 in [false, true] {
        // Odd and even splits of the payload across the ring's halves.
        for split in [0usize, 1, 2, 999, 1000, 3001] {
            let p = path(v6)?;
            let seg = Out {
                seq: Seq(123_456),
                ack: Some(Seq(u32::MAX - 3)),
                flags: PSH,
                window: 4321,
                ts: Some((77, 88)),
                sack: [(Seq(10), Seq(20)), (Seq(30), Seq(40)), (Seq(0), Seq(0))],
                nsack: 2,
                payload: (&data[..split], &data[split..]),
                ..Out::default()
            };
            let mut buf = vec![0u8; seg.frame_len(&p)];
            write(&mut buf, &p, &seg, false);
            assert!(
                matches!(classify(&buf), Class::Tcp { syn: false, .. }),
                "v6 {v6} split {split}: {:?}",
                classify(&buf)
            );
            let inn = parse(&buf).ok_or("does not parse")?;
            assert_eq!(inn.local, p.remote);
            assert_eq!(inn.remote, p.local);
            assert_eq!(inn.seg.payload, &data[..]);
            assert_eq!(
                inn.seg.timestamp.map(|t| (t.tsval, t.tsecr)),
                Some((77, 88))
            );
            assert_eq!(inn.seg.sack_ranges[1], Some((30, 40)));
            assert_eq!(inn.seg.window_len, 4321);
        }
    }
    Ok(())
}

#[test]
fn every_payload_length_and_split_sums_right_in_both_families() -> Result {
    let data: Vec<u8> = (0..70u32).map(|i| (i * 97 + 13) as u8 | 0x80).collect();
    for v6 in [false, true] {
        let p = path(v6)?;
        for len in 0..data.len() {
            for split in [0, len / 2, len.saturating_sub(1), len] {
                let payload = &data[..len];
                let seg = Out {
                    seq: Seq(len as u32 * 1_000_003),
                    ack: Some(Seq(!(split as u32))),
                    flags: PSH,
                    ect: len % 2 == 0,
                    window: 0xfff0 + len as u16 % 16,
                    ts: (len % 3 != 0).then_some((len as u32, u32::MAX - len as u32)),
                    nsack: len % 4,
                    sack: [
                        (Seq(1), Seq(2)),
                        (Seq(3), Seq(0xffff_fff4)),
                        (Seq(5), Seq(6)),
                    ],
                    payload: (&payload[..split], &payload[split..]),
                    ..Out::default()
                };
                let mut buf = vec![0xa5u8; seg.frame_len(&p)];
                write(&mut buf, &p, &seg, false);
                assert!(
                    matches!(classify(&buf), Class::Tcp { syn: false, .. }),
                    "v6 {v6} len {len} split {split}: {:?}",
                    classify(&buf)
                );
                let inn = parse(&buf).ok_or("does not parse")?;
                assert_eq!(inn.seg.payload, payload);
                assert_eq!(inn.seg.seq_number.0 as u32, seg.seq.0);
                assert_eq!(inn.seg.sack_ranges.iter().flatten().count(), seg.nsack);
            }
        }
    }
    Ok(())
}

#[test]
fn the_direct_reading_agrees_with_the_general_parser() -> Result {
    // Built segments of every layout, then each with bytes flipped at random: wherever the
    // direct reading answers, the general parser answers the same.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let data = [7u8; 40];
    let (mut direct, mut refused) = (0, 0);
    for v6 in [false, true] {
        let p = path(v6)?;
        for layout in 0..6 {
            let seg = Out {
                seq: Seq(1000),
                ack: (layout != 5).then_some(Seq(2000)),
                flags: [0, PSH, FIN, RST, PSH, SYN][layout],
                window: 512,
                ts: (layout % 2 == 0).then_some((5, 6)),
                nsack: usize::from(layout == 4),
                sack: [(Seq(1), Seq(2)); 3],
                mss: (layout == 5).then_some(1460),
                payload: (&data[..layout * 7], &[]),
                ..Out::default()
            };
            let mut clean = vec![0u8; seg.frame_len(&p)];
            write(&mut clean, &p, &seg, false);
            for round in 0..2000 {
                let mut f = clean.clone();
                for _ in 0..(round % 4) {
                    let at = next() as usize % f.len();
                    f[at] ^= 1 << (next() % 8);
                }
                if round % 7 == 0 {
                    f.truncate(next() as usize % (f.len() + 1));
                }
                let general = parse_general(&f);
                match parse_direct(&f) {
                    Direct::Parsed(d) => {
                        direct += 1;
                        let g = general.ok_or("read directly, refused by the general parser")?;
                        assert_eq!(d.seg, g.seg, "v6 {v6} layout {layout} round {round}");
                        assert_eq!(
                            (d.src_mac, d.local, d.remote),
                            (g.src_mac, g.local, g.remote)
                        );
                        assert_eq!(d.ecn, g.ecn);
                    }
                    Direct::Refused => {
                        refused += 1;
                        assert!(general.is_none(), "refused directly, parsed in general");
                    }
                    Direct::Other => {}
                }
            }
        }
    }
    // Both answers were exercised, and the common layouts are read directly.
    assert!(
        direct > 5000 && refused > 0,
        "{direct} read directly, {refused} refused"
    );
    Ok(())
}

#[test]
fn syn_options_round_trip() -> Result {
    let p = path(false)?;
    let seg = Out {
        seq: Seq(1),
        flags: SYN,
        window: 65535,
        mss: Some(1460),
        wscale: Some(7),
        sack_perm: true,
        ts: Some((1, 0)),
        ..Out::default()
    };
    let mut buf = vec![0u8; seg.frame_len(&p)];
    write(&mut buf, &p, &seg, false);
    assert!(matches!(classify(&buf), Class::Tcp { syn: true, .. }));
    let s = parse(&buf).ok_or("does not parse")?.seg;
    assert_eq!(
        (s.max_seg_size, s.window_scale, s.sack_permitted),
        (Some(1460), Some(7), true)
    );
    Ok(())
}

/// A SYN with an option of length 0 (or 1, or one running past the header, or an MSS of the
/// wrong length) is read as Linux reads it, not dropped: what came before the bad option
/// stands, and the payload is the frame's own.
#[test]
fn a_silly_option_ends_the_options_and_the_syn_still_parses() -> Result {
    let p = path(false)?;
    let seg = Out {
        seq: Seq(1),
        flags: SYN,
        window: 65535,
        mss: Some(1460),
        wscale: Some(7),
        sack_perm: true,
        ts: Some((1, 0)),
        ..Out::default()
    };
    let mut good = vec![0u8; seg.frame_len(&p)];
    write(&mut good, &p, &seg, false);
    let tcp = ETH + 20;
    let hl = usize::from(good[tcp + 12] >> 4) * 4;
    let opts = tcp + 20..tcp + hl;
    // The MSS option first, as the writer lays them out.
    assert_eq!(&good[opts.start..opts.start + 2], &[2, 4]);
    for (what, bad) in [
        ("length 0", [9u8, 0]),
        ("length 1", [9, 1]),
        ("past the header", [9, 40]),
    ] {
        let mut f = good.clone();
        // Right after the MSS option.
        f[opts.start + 4..opts.start + 6].copy_from_slice(&bad);
        let s = parse(&f).ok_or(format!("{what}: dropped"))?.seg;
        assert!(is_syn(&s), "{what}");
        assert_eq!(
            s.max_seg_size,
            Some(1460),
            "{what}: the MSS before it stands"
        );
        assert_eq!(s.window_scale, None, "{what}: nothing after it is read");
        assert!(s.payload.is_empty(), "{what}");
    }
    // An MSS option of length 3 is skipped; the rest is read.
    let mut f = good.clone();
    f[opts.start..opts.start + 4].copy_from_slice(&[2, 3, 5, 1]);
    let s = parse(&f).ok_or("wrong MSS length: dropped")?.seg;
    assert_eq!((s.max_seg_size, s.window_scale), (None, Some(7)));
    Ok(())
}

#[test]
fn resets_follow_rfc_9293() -> Result {
    let p = path(false)?;
    let syn = Out {
        seq: Seq(500),
        flags: SYN,
        ..Out::default()
    };
    let mut buf = vec![0u8; syn.frame_len(&p)];
    write(&mut buf, &p, &syn, false);
    let inn = parse(&buf).ok_or("does not parse")?;
    let r = reset_for(&inn.seg).ok_or("no reset")?;
    assert_eq!((r.seq, r.ack, r.flags), (Seq(0), Some(Seq(501)), RST));
    Ok(())
}

#[test]
fn ecn_fields_round_trip_and_a_router_mark_reads_as_ce() -> Result {
    use crate::tcp::ecn::{CWR, ECE, EcnIn};
    for v6 in [false, true] {
        let p = path(v6)?;
        let seg = Out {
            seq: Seq(1),
            ack: Some(Seq(2)),
            flags: ECE | CWR,
            ect: true,
            payload: (b"data", b""),
            ..Out::default()
        };
        let mut buf = vec![0u8; seg.frame_len(&p)];
        write(&mut buf, &p, &seg, false);
        assert!(matches!(classify(&buf), Class::Tcp { .. }), "v6 {v6}");
        let inn = parse(&buf).ok_or("does not parse")?;
        assert_eq!(
            inn.ecn,
            EcnIn {
                ce: false,
                ece: true,
                cwr: true
            },
            "v6 {v6}"
        );
        // A router marks it CE (ECN field 0b11) and fixes the IPv4 header checksum.
        if v6 {
            buf[ETH + 1] |= 0b11 << 4;
        } else {
            buf[ETH + 1] |= 0b11;
            buf[ETH + 10..ETH + 12].copy_from_slice(&[0, 0]);
            let c = !fold(sum(&buf[ETH..ETH + 20]));
            buf[ETH + 10..ETH + 12].copy_from_slice(&c.to_ne_bytes());
        }
        assert!(matches!(classify(&buf), Class::Tcp { .. }), "v6 {v6}");
        assert!(parse(&buf).ok_or("does not parse")?.ecn.ce, "v6 {v6}");
    }
    Ok(())
}

#[test]
fn a_set_type_of_service_is_written_with_the_stack_s_own_ecn_bits() -> Result {
    for v6 in [false, true] {
        // DSCP 24 with both ECN bits set by the application: the stack's ECT(0) wins.
        let p = Path {
            tos: 0x63,
            ..path(v6)?
        };
        for ect in [false, true] {
            let seg = Out {
                seq: Seq(1),
                ack: Some(Seq(2)),
                window: 100,
                ect,
                ..Out::default()
            };
            let mut buf = vec![0u8; seg.frame_len(&p)];
            write(&mut buf, &p, &seg, false);
            let class = if v6 {
                (buf[14] & 0x0f) << 4 | buf[15] >> 4
            } else {
                buf[15]
            };
            assert_eq!(
                class,
                0x60 | if ect { ECT0 } else { 0 },
                "v6 {v6} ect {ect}"
            );
            assert!(
                parse(&buf).is_some(),
                "v6 {v6}: the header checksum is wrong"
            );
        }
    }
    Ok(())
}

#[test]
fn the_urgent_pointer_is_read_in_both_layouts_and_only_with_urg() -> Result {
    for v6 in [false, true] {
        // Without options (read directly) and with a SACK block (the general parser).
        for nsack in [0, 1] {
            let p = path(v6)?;
            let seg = Out {
                seq: Seq(1000),
                ack: Some(Seq(2000)),
                flags: PSH,
                window: 100,
                sack: [(Seq(10), Seq(20)), (Seq(0), Seq(0)), (Seq(0), Seq(0))],
                nsack,
                payload: (&[9u8; 30][..], &[][..]),
                ..Out::default()
            };
            let mut buf = vec![0u8; seg.frame_len(&p)];
            write(&mut buf, &p, &seg, false);
            let tcp = 14 + if v6 { 40 } else { 20 };
            // Checksums are not checked here: only the fields matter.
            buf[tcp + 18..tcp + 20].copy_from_slice(&7u16.to_be_bytes());
            let inn = parse(&buf).ok_or("does not parse")?;
            assert_eq!(
                inn.urgent, None,
                "v6 {v6} sack {nsack}: a pointer without URG"
            );
            buf[tcp + 13] |= URG;
            let inn = parse(&buf).ok_or("does not parse with URG")?;
            assert_eq!(inn.urgent, Some(7), "v6 {v6} sack {nsack}");
            assert_eq!(
                inn.seg.payload.len(),
                30,
                "the urgent data stays in the payload"
            );
        }
    }
    Ok(())
}

#[test]
fn a_segment_left_for_the_device_to_sum_is_once_summed_the_segment_summed_here() -> Result {
    let data: Vec<u8> = (0..1449u32).map(|i| (i * 131 + 5) as u8).collect();
    for v6 in [false, true] {
        let p = path(v6)?;
        for len in [0usize, 1, 2, 3, 1447, 1448] {
            for split in [0, 1, len / 2, len] {
                let split = split.min(len);
                for syn in [false, true] {
                    let seg = Out {
                        seq: Seq(0xfff0_0001),
                        ack: Some(Seq(7)),
                        flags: if syn { SYN } else { PSH },
                        window: 65535,
                        mss: syn.then_some(1460),
                        wscale: syn.then_some(7),
                        sack_perm: syn,
                        ts: Some((u32::MAX, 1)),
                        sack: [(Seq(1), Seq(9)), (Seq(0), Seq(0)), (Seq(0), Seq(0))],
                        nsack: usize::from(!syn),
                        payload: (&data[..split], &data[split..len]),
                        ..Out::default()
                    };
                    let mut whole = vec![0u8; seg.frame_len(&p)];
                    write(&mut whole, &p, &seg, false);
                    let mut partial = vec![0xa5u8; whole.len()];
                    write(&mut partial, &p, &seg, true);
                    let start = whole.len() - seg.header_len() - seg.payload_len();
                    assert_ne!(
                        partial[start + 16..start + 18],
                        whole[start + 16..start + 18]
                    );
                    // What a device does with the request: the sum from `start` to the end,
                    // over the pseudo-header's sum in the field, stored complemented.
                    let c = inet_checksum(&partial[start..]);
                    partial[start + 16..start + 18].copy_from_slice(&c.to_ne_bytes());
                    assert_eq!(partial, whole, "v6 {v6} len {len} split {split} syn {syn}");
                }
            }
        }
    }
    Ok(())
}
