//! The file written and read back, in one process.
use super::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn conn(core: usize, port: u16) -> Conn {
    Conn {
        core,
        state: 4,
        local: v4([10, 0, 0, 1], 80),
        remote: "[fd00::2]:40000".parse().unwrap_or(v4([0; 4], 0)),
        bytes_in: 1,
        bytes_out: u64::from(port),
        retrans: 3,
        srtt: Some(Duration::from_micros(250)),
        rttvar: None,
        cwnd: 14480,
        send_queue: 5,
        recv_queue: 6,
        snd_window: 7,
        rcv_window: 8,
    }
}

#[test]
fn a_published_file_reads_back_counters_and_connections() -> io::Result<()> {
    let dir = std::env::temp_dir().join(format!("corelane-stat-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("stats");
    let names = ["rx_frames", "tx_frames", "flows"];
    let p = Publisher::create(&path, "veth-test", 2, &names, 4)?;
    let (c0, c1) = (
        p.core(0).ok_or(bad("core 0"))?,
        p.core(1).ok_or(bad("core 1"))?,
    );
    assert!(p.core(2).is_none());
    c0.publish(&[10, 20, 3]);
    c1.publish(&[1, 2]);
    let s = Stats::open(&path)?;
    assert_eq!(
        (s.pid(), s.ifname()),
        (std::process::id(), "veth-test".into())
    );
    assert_eq!(s.names(), names);
    let cores = s.cores();
    assert_eq!(cores[0].get("tx_frames"), Some(20));
    assert_eq!(cores[1].get("rx_frames"), Some(1));
    assert_eq!(cores[1].get("flows"), Some(0));
    assert!(s.alive());
    // Nobody answers: the snapshot comes back empty and says which cores were stale.
    let snap = s.connections(Duration::from_millis(20));
    assert_eq!((snap.conns.len(), snap.stale_cores.len()), (0, 2));
    // The cores see the request and answer it; the table overflows on core 1.
    assert!(c0.conns_wanted() && c1.conns_wanted());
    c0.publish_conns([conn(0, 1)]);
    c1.publish_conns((0..6).map(|i| conn(1, i)));
    assert!(!c0.conns_wanted());
    let c = Conn::decode(&conn(1, 9).encode());
    assert_eq!(c, conn(1, 9));
    assert_eq!(c.state_name(), "ESTABLISHED");
    let listed = Stats::open(&path)?;
    let w = listed.map.words();
    let base = listed.layout.conns_at + listed.layout.conn_stride;
    assert_eq!(w[base + C_TOTAL].load(Ordering::Relaxed), 6);
    assert_eq!(w[base + C_COUNT].load(Ordering::Relaxed), 4);
    let text = prometheus(&s);
    assert!(text.contains("corelane_up{iface=\"veth-test\""), "{text}");
    assert!(
        text.contains("# TYPE corelane_tx_frames_total counter"),
        "{text}"
    );
    assert!(
        text.contains("corelane_tx_frames_total{iface=\"veth-test\",core=\"0\"} 20"),
        "{text}"
    );
    assert!(text.contains("# TYPE corelane_flows gauge"), "{text}");
    p.close();
    assert!(!s.alive());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn a_file_of_another_kind_is_refused() -> io::Result<()> {
    let dir = std::env::temp_dir().join(format!("corelane-stat-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("stats");
    std::fs::write(&path, vec![7u8; 8192])?;
    let e = Stats::open(&path).err().map(|e| e.to_string());
    assert!(e.is_some_and(|e| e.contains("not a corelane stats file")));
    std::fs::write(&path, b"short")?;
    assert!(Stats::open(&path).is_err());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// A header crafted to overflow the layout's arithmetic, or to point past the file, is refused
/// with an error (no panic, no read out of bounds).
#[test]
fn a_crafted_header_is_refused_not_trusted() -> io::Result<()> {
    let dir = std::env::temp_dir().join(format!("corelane-stat-craft-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("stats");
    let header = |fields: &[(usize, u64)]| -> Vec<u8> {
        let mut w = vec![0u64; 1024];
        w[0] = crate::MAGIC;
        w[1] = crate::VERSION;
        for &(i, v) in fields {
            w[i] = v;
        }
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    };
    let huge = u64::MAX / 2;
    let cases: Vec<Vec<(usize, u64)>> = vec![
        // names_at near the top: names_at + len wraps.
        vec![
            (4, 1),
            (5, 1),
            (6, 64),
            (7, 64),
            (8, 0),
            (9, 512),
            (10, 512),
            (11, u64::MAX),
            (12, 8),
        ],
        // slots_at + cores * slot_words wraps.
        vec![
            (4, 2),
            (5, 1),
            (6, huge),
            (7, 64),
            (8, 0),
            (9, 512),
            (10, 512),
            (11, 32),
            (12, 8),
        ],
        // The connections' area past the file's end.
        vec![
            (4, 1),
            (5, 1),
            (6, 64),
            (7, 64),
            (8, 0),
            (9, 100_000),
            (10, 512),
            (11, 32),
            (12, 8),
        ],
        // Names where the header is.
        vec![
            (4, 1),
            (5, 1),
            (6, 64),
            (7, 64),
            (8, 0),
            (9, 512),
            (10, 512),
            (11, 0),
            (12, 8),
        ],
    ];
    for (k, fields) in cases.iter().enumerate() {
        std::fs::write(&path, header(fields))?;
        let e = Stats::open(&path).err().map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains("does not fit")),
            "case {k}: {e:?}"
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn a_runtime_that_ends_leaves_the_file_a_newer_one_made_in_its_place() -> io::Result<()> {
    let dir = std::env::temp_dir().join(format!("corelane-stat-new-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("stats");
    let old = Publisher::create(&path, "veth-old", 1, &["rx_frames"], 4)?;
    // The new process of an upgrade makes its own file at the same path while the old one runs.
    let new = Publisher::create(&path, "veth-new", 1, &["rx_frames"], 4)?;
    drop(old);
    assert_eq!(
        Stats::open(&path)?.ifname(),
        "veth-new",
        "the new file stays"
    );
    assert!(path.with_file_name("capture").exists());
    drop(new);
    assert!(!path.exists(), "the new one removes its own file");
    assert!(!path.with_file_name("capture").exists());
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

#[test]
fn rates_are_taken_of_counts_only_and_a_count_that_fell_reads_zero() {
    let at = std::time::SystemTime::UNIX_EPOCH;
    let core = |turns: u64, flows: u64, spin: u64, parks: u64| CoreCounters {
        index: 0,
        at,
        values: vec![
            ("turns".into(), turns),
            ("flows".into(), flows),
            ("spin_ns".into(), spin),
            ("parks".into(), parks),
        ],
    };
    let before = core(1_000, 9, 40_000, 50);
    let after = core(3_000, 4, 80_000, 20);
    let rates = after.rates_since(&before, 2.0);
    assert_eq!(
        rates,
        vec![("turns".to_string(), 1_000.0), ("parks".to_string(), 0.0)]
    );
}
