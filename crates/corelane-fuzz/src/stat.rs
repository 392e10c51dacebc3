//! The stats file as a fuzz target: `corelane-stat` maps a file another user's process wrote
//! (`Stats::open`) and reads every part of it (names, counters, the connection table, the
//! Prometheus text), so a crafted or truncated file must come back as an error or as values,
//! never as a panic, an out-of-bounds read or a SIGBUS. An input is the file's bytes.

use std::path::PathBuf;
use std::time::Duration;

use corelane_stat::{Conn, Publisher, Stats};

/// Where inputs are written to be opened (one file per process, overwritten each run).
fn scratch() -> PathBuf {
    std::env::temp_dir().join(format!("corelane-fuzz-stat-{}", std::process::id()))
}

/// Writes `input` as a stats file and reads all of it back.
pub(crate) fn run(input: &[u8]) {
    let path = scratch();
    if std::fs::write(&path, input).is_err() {
        return;
    }
    if let Ok(s) = Stats::open(&path) {
        let _ = (
            s.pid(),
            s.ifname(),
            s.started(),
            s.closed(),
            s.names().len(),
        );
        for c in s.cores() {
            let _ = c.get("rx_frames");
        }
        let _ = s.connections(Duration::ZERO);
        let _ = corelane_stat::prometheus(&s);
    }
}

/// Real files as a runtime writes them: two cores, counters and a connection table.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("corelane-fuzz-seed-{}", std::process::id()));
    let mut out = Vec::new();
    if std::fs::create_dir_all(&dir).is_err() {
        return out;
    }
    for (cores, conns) in [(1usize, 0usize), (2, 3)] {
        let path = dir.join(format!("stats-{cores}"));
        let names = ["rx_frames", "tx_frames", "flows", "tcp_segs_in"];
        let Ok(p) = Publisher::create(&path, "veth-fuzz", cores, &names, 4) else {
            continue;
        };
        for k in 0..cores {
            if let Some(c) = p.core(k) {
                c.publish(&[10, 20, 3, 7]);
                c.publish_conns((0..conns).map(|i| Conn {
                    core: k,
                    state: 4,
                    local: corelane_stat::v4([10, 0, 0, 1], 80),
                    remote: corelane_stat::v4([10, 0, 0, 2], 40_000 + i as u16),
                    bytes_in: 1,
                    bytes_out: 2,
                    retrans: 0,
                    srtt: Some(Duration::from_micros(250)),
                    rttvar: None,
                    cwnd: 14_480,
                    send_queue: 0,
                    recv_queue: 0,
                    snd_window: 65_535,
                    rcv_window: 65_535,
                }));
            }
        }
        if let Ok(bytes) = std::fs::read(&path) {
            out.push(bytes);
        }
        drop(p);
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Words a header field is likely to be checked against: zero, one, the edges of the
/// integer types, and sizes near the file's own.
fn interesting(len_words: u64, pick: u64) -> u64 {
    match pick % 10 {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u64::MAX / 2,
        4 => u64::from(u32::MAX),
        5 => len_words,
        6 => len_words.wrapping_add(1),
        7 => len_words.wrapping_sub(1),
        8 => 1 << (pick % 64),
        _ => pick >> 8,
    }
}

/// A mutation of `base` (sometimes spliced with `other`), in whole 8-byte words mostly: the
/// file's fields are words.
pub(crate) fn mutate(r: &mut impl FnMut(usize) -> usize, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + r(4) {
        let words = v.len() / 8;
        match r(6) {
            // A word, the header's first 32 most often, set to an interesting value.
            0 | 1 if words > 0 => {
                let i = if r(2) == 0 {
                    r(words.min(32))
                } else {
                    r(words)
                };
                let val = interesting(words as u64, r(usize::MAX) as u64);
                v[i * 8..i * 8 + 8].copy_from_slice(&val.to_le_bytes());
            }
            2 if !v.is_empty() => {
                let i = r(v.len());
                v[i] ^= 1 << r(8);
            }
            // Cut short (a file truncated while read).
            3 if !v.is_empty() => v.truncate(r(v.len())),
            // Grown with zeros or with the other input's tail.
            4 => {
                let n = 8 * (1 + r(64));
                v.extend(std::iter::repeat_n(0u8, n));
            }
            _ if !other.is_empty() => {
                let at = r(v.len() + 1);
                let from = r(other.len());
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    v
}

pub(crate) fn cleanup() {
    let _ = std::fs::remove_file(scratch());
}

#[cfg(test)]
mod tests {
    /// The seeds and a few thousand mutations, each read back in full without a panic.
    #[test]
    fn crafted_stats_files_are_errors_or_values_never_panics() {
        let seeds = super::seeds();
        assert_eq!(seeds.len(), 2, "the seed files were written");
        let mut s = 0x5eed_u64;
        let mut r = |n: usize| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n.max(1) as u64) as usize
        };
        for k in 0..5_000 {
            let (a, b) = (&seeds[k % 2], &seeds[(k + 1) % 2]);
            let input = super::mutate(&mut r, a, b);
            super::run(&input);
        }
        super::cleanup();
    }
}
