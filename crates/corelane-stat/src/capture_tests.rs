//! Capture written by a core's tap and read back, in one process.
use super::*;
use crate::capture::{LEASE, RING_WORDS as RING_WORDS_FOR_TESTS};

fn tap(p: &Publisher, core: usize) -> io::Result<CaptureTap> {
    p.core(core)
        .and_then(|c| c.capture_tap())
        .ok_or(bad("no capture tap"))
}

fn frame_v4(sport: u16, dport: u16, proto: u8, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(54)];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[23] = proto;
    f[26..30].copy_from_slice(&[10, 0, 0, 2]);
    f[30..34].copy_from_slice(&[10, 0, 0, 1]);
    f[34..36].copy_from_slice(&sport.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    for (i, b) in f.iter_mut().enumerate().skip(54) {
        *b = i as u8;
    }
    f
}

fn publisher(name: &str) -> io::Result<(Publisher, std::path::PathBuf)> {
    let dir = std::env::temp_dir().join(format!("corelane-cap-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("stats");
    Ok((
        Publisher::create(&path, "veth-cap", 2, &["rx_frames"], 4)?,
        path,
    ))
}

#[test]
fn frames_that_pass_the_filter_are_read_back_in_order_cut_to_the_snap_length() -> io::Result<()> {
    let (p, path) = publisher("filter")?;
    let (mut t0, mut t1) = (tap(&p, 0)?, tap(&p, 1)?);
    let now = now_ns();
    assert!(!t0.wanted(now), "nobody captures");
    let stats = Stats::open(&path)?;
    let filter = Filter {
        proto: Some(6),
        port: Some(80),
        host: None,
    };
    let mut cap = stats.capture(filter, 100)?;
    assert!(t0.wanted(now) && t1.wanted(now));
    assert!(t0.frame(false, 1, &frame_v4(40000, 80, 6, 1514)));
    assert!(
        !t0.frame(false, 2, &frame_v4(40000, 81, 6, 60)),
        "another port"
    );
    assert!(!t0.frame(false, 3, &frame_v4(40000, 80, 17, 60)), "UDP");
    assert!(!t0.frame(false, 3, &[0u8; 10]), "a runt");
    assert!(t1.frame(true, 4, &frame_v4(80, 40000, 6, 60)));
    assert!(t0.frame(true, 5, &frame_v4(80, 40000, 6, 70)));
    let got = cap.drain();
    let seen: Vec<(usize, bool, u64, usize, usize)> = got
        .iter()
        .map(|r| (r.core, r.outbound, r.at_ns, r.len, r.bytes.len()))
        .collect();
    assert_eq!(
        seen,
        [
            (0, false, 1, 1514, 100),
            (0, true, 5, 70, 70),
            (1, true, 4, 60, 60)
        ]
    );
    assert_eq!(got[0].bytes[..], frame_v4(40000, 80, 6, 1514)[..100]);
    assert!(cap.drain().is_empty(), "taken once");
    drop(cap);
    assert!(!t0.wanted(now_ns()), "a capture ends with its reader");
    Ok(())
}

#[test]
fn a_full_ring_drops_copies_and_counts_them_and_a_wrap_keeps_order() -> io::Result<()> {
    let (p, path) = publisher("full")?;
    let mut tap = tap(&p, 0)?;
    let stats = Stats::open(&path)?;
    let mut cap = stats.capture(Filter::default(), 1514)?;
    assert!(tap.wanted(now_ns()));
    let ring_bytes = RING_WORDS_FOR_TESTS * 8;
    let per = 2 * 8 + 1512; // a record of a 1512-byte frame
    let fit = ring_bytes / per;
    let mut kept = 0;
    for i in 0..fit + 10 {
        kept += usize::from(tap.frame(false, i as u64, &frame_v4(1, 2, 6, 1512)));
    }
    assert_eq!(kept, fit, "what fits is kept, the rest dropped");
    assert_eq!(cap.dropped()[0], 10);
    let first = cap.drain();
    assert_eq!(first.len(), fit);
    // Now the ring wraps: records go on in order across the end.
    let mut n = 0;
    for round in 0..3 {
        for i in 0..fit / 2 {
            assert!(tap.frame(true, (round * 1000 + i) as u64, &frame_v4(1, 2, 6, 1512)));
        }
        let got = cap.drain();
        assert_eq!(got.len(), fit / 2);
        assert!(got.windows(2).all(|w| w[0].at_ns < w[1].at_ns));
        assert!(got.iter().all(|r| r.bytes == frame_v4(1, 2, 6, 1512)));
        n += got.len();
    }
    assert_eq!(n, 3 * (fit / 2));
    Ok(())
}

#[test]
fn a_lease_not_renewed_ends_the_copying() -> io::Result<()> {
    let (p, path) = publisher("lease")?;
    let mut tap = tap(&p, 0)?;
    let stats = Stats::open(&path)?;
    let cap = stats.capture(Filter::default(), 64)?;
    let now = now_ns();
    assert!(tap.wanted(now));
    assert!(
        !tap.wanted(now + 2 * LEASE.as_nanos() as u64),
        "a reader that died"
    );
    cap.renew();
    assert!(tap.wanted(now_ns()));
    Ok(())
}

#[test]
fn filters_by_host_and_protocol_and_v6() {
    let f = frame_v4(1, 2, 17, 60);
    let host = |h: &str| Filter {
        host: h.parse().ok(),
        ..Filter::default()
    };
    assert!(host("10.0.0.1").matches(&f) && host("10.0.0.2").matches(&f));
    assert!(!host("10.0.0.3").matches(&f));
    let mut v6 = vec![0u8; 74];
    v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    v6[20] = 6;
    v6[22 + 15] = 1; // source ::1
    v6[54..56].copy_from_slice(&443u16.to_be_bytes());
    let port = Filter {
        port: Some(443),
        proto: Some(6),
        ..Filter::default()
    };
    assert!(port.matches(&v6) && host("::1").matches(&v6));
    assert!(!port.matches(&f));
    let arp = {
        let mut a = vec![0u8; 42];
        a[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        a
    };
    assert!(Filter::default().matches(&arp) && !host("10.0.0.1").matches(&arp));
}

#[test]
fn pcapng_blocks_are_well_formed() -> io::Result<()> {
    let mut w = PcapNg::new(Vec::new(), "veth0", 128)?;
    w.write(&Record {
        core: 0,
        outbound: true,
        at_ns: 1_700_000_000_123_456_789,
        len: 1514,
        bytes: vec![7; 128],
    })?;
    let b = w.finish()?;
    // Walk the blocks: each length at its start and its end, a multiple of 4.
    let mut at = 0;
    let mut kinds = Vec::new();
    while at < b.len() {
        let kind = u32::from_le_bytes(b[at..at + 4].try_into().map_err(|_| bad("kind"))?);
        let len =
            u32::from_le_bytes(b[at + 4..at + 8].try_into().map_err(|_| bad("len"))?) as usize;
        assert_eq!(len % 4, 0);
        let end = u32::from_le_bytes(
            b[at + len - 4..at + len]
                .try_into()
                .map_err(|_| bad("end"))?,
        );
        assert_eq!(end as usize, len);
        kinds.push(kind);
        if kind == 6 {
            let ts = (u64::from(u32::from_le_bytes(
                b[at + 12..at + 16].try_into().map_err(|_| bad("ts"))?,
            )) << 32)
                | u64::from(u32::from_le_bytes(
                    b[at + 16..at + 20].try_into().map_err(|_| bad("ts"))?,
                ));
            assert_eq!(ts, 1_700_000_000_123_456_789);
            assert_eq!(&b[at + 20..at + 28], &[128, 0, 0, 0, 0xea, 5, 0, 0]);
        }
        at += len;
    }
    assert_eq!(kinds, [0x0a0d_0d0a, 1, 6]);
    Ok(())
}

#[test]
fn the_capture_file_is_the_owners_alone_and_goes_with_the_runtime() -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (p, path) = publisher("mode")?;
    let cap = path.with_file_name("capture");
    let mode = |f: &std::path::Path| -> io::Result<u32> {
        Ok(std::fs::metadata(f)?.permissions().mode() & 0o777)
    };
    assert_eq!(mode(&cap)?, 0o600, "the frames are the traffic itself");
    assert_eq!(mode(&path)?, 0o644, "the counters are for everyone");
    drop(p);
    assert!(!cap.exists() && !path.exists());
    Ok(())
}

/// A served VLAN's frames carry an 802.1Q tag in a capture: the filter judges what it carries.
#[test]
fn filters_see_through_one_vlan_tag() {
    let plain = frame_v4(1000, 7, 6, 80);
    let mut tagged = plain[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 100]);
    tagged.extend_from_slice(&plain[12..]);
    let port = |p: u16| Filter {
        port: Some(p),
        proto: Some(6),
        host: "10.0.0.2".parse().ok(),
    };
    assert!(port(7).matches(&plain) && port(7).matches(&tagged));
    assert!(!port(8).matches(&tagged));
    // A tag with nothing after it is too short to judge.
    assert!(!port(7).matches(&tagged[..17]));
}

#[test]
fn filters_see_through_a_service_tag_and_the_vlan_tag_inside_it() {
    let plain = frame_v4(1000, 7, 6, 80);
    let mut qinq = plain[..12].to_vec();
    qinq.extend_from_slice(&[0x88, 0xa8, 0x00, 200, 0x81, 0x00, 0x00, 100]);
    qinq.extend_from_slice(&plain[12..]);
    let port = |p: u16| Filter {
        port: Some(p),
        proto: Some(6),
        host: "10.0.0.2".parse().ok(),
    };
    assert!(port(7).matches(&qinq));
    assert!(!port(8).matches(&qinq));
    assert!(!port(7).matches(&qinq[..21]), "cut inside the inner tag");
    // A third tag is not looked through: what it carries is not judged as IP.
    let mut three = plain[..12].to_vec();
    three.extend_from_slice(&[0x88, 0xa8, 0, 1, 0x88, 0xa8, 0, 2, 0x81, 0x00, 0, 3]);
    three.extend_from_slice(&plain[12..]);
    assert!(!port(7).matches(&three));
}

#[test]
fn a_record_longer_than_the_snap_length_asked_for_is_given_up_not_copied() -> io::Result<()> {
    let (p, path) = publisher("hostile-record")?;
    let mut t0 = tap(&p, 0)?;
    let stats = Stats::open(&path)?;
    let mut cap = stats.capture(Filter::default(), 100)?;
    // The runtime's user writes the file: it can claim any snap length for its cores, and a
    // record as long as its ring.
    cap.claim_snap(65535);
    assert!(t0.wanted(now_ns()));
    assert!(t0.frame(false, 1, &frame_v4(40000, 80, 6, 1514)));
    assert!(
        cap.drain().is_empty(),
        "a 1514-byte record where 100 bytes were asked for is not a core's: given up"
    );
    // What comes after it is read again.
    assert!(t0.frame(false, 2, &frame_v4(40000, 80, 6, 60)));
    let got = cap.drain();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].at_ns, got[0].bytes.len()), (2, 60));
    Ok(())
}
