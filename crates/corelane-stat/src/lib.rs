//! corelane's live statistics, readable from outside the process.
//!
//! A running corelane runtime publishes its state in one file on tmpfs,
//! `/run/corelane/net-COOKIE/IFNAME/stats` (next to the interface's claim), mapped shared:
//!
//! - a header: who publishes (pid, interface, start time), how many cores, and the names of the
//!   per-core counters (so a reader needs no list of its own and survives new counters);
//! - one slot per core, 64-byte aligned, that only that core writes, every
//!   [`PUBLISH_INTERVAL_MS`] (never per frame): a sequence word (odd while it writes), the time,
//!   then the counters, each an `AtomicU64`;
//! - one connection table per core, written on request: a reader bumps the table's `want` word
//!   and the core writes a snapshot of its TCP connections at its next publish tick, so an
//!   unwatched runtime spends nothing on it.
//!
//! No lock and no system call on the packet path: a core stores plain relaxed atomics in its own
//! cache lines and publishes with a release store of its sequence word; readers retry a slot
//! whose sequence moved while they copied it.
//!
//! ```no_run
//! let stats = corelane_stat::Stats::open(std::path::Path::new("/run/corelane/net-1/eth0/stats"))?;
//! for core in stats.cores() {
//!     println!("core {}: {:?}", core.index, core.get("rx_frames"));
//! }
//! # Ok::<(), std::io::Error>(())
//! ```

#![deny(unsafe_code)]

mod capture;
#[cfg(test)]
mod capture_tests;
mod conn;
mod gone;
mod keep;
#[cfg(test)]
mod keep_tests;
mod map;
mod ns;
mod pcapng;
mod read;
mod sealed;
#[cfg(test)]
mod tests;
mod trust;
mod write;

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub use capture::{Capture, CaptureFile, CaptureTap, Filter, Record};
pub use conn::{Conn, TCP_STATES};
pub use gone::prune_gone_namespaces;
pub use keep::{RESTART_KEY_FILE, restart_key};
use map::Mapping;
pub use ns::{netns_id, run_dir};
pub use pcapng::{PcapNg, Recorded, record};
pub use read::{ConnSnapshot, CoreCounters, Stats};
pub use sealed::{SEALED_MAX_BYTES, sealed_file, write_pointer};
pub use trust::{check_dir, check_regular, make_dir, open_file};
pub use write::{CoreWriter, Publisher, new_capture_file, new_stats_file};

/// "corelane" in ASCII, the file's first word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"corelane");
/// The layout's version (the second word); a reader refuses another.
pub const VERSION: u64 = 1;
/// How often each core publishes its counters.
pub const PUBLISH_INTERVAL_MS: u64 = 100;
/// Words of one connection entry.
pub const CONN_WORDS: usize = 16;

// Header words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_PID: usize = 2;
const H_STARTED_MS: usize = 3;
const H_CORES: usize = 4;
const H_NAMES: usize = 5;
const H_SLOT_WORDS: usize = 6;
const H_SLOTS_AT: usize = 7;
const H_CONN_CAP: usize = 8;
const H_CONNS_AT: usize = 9;
const H_CONN_STRIDE: usize = 10;
const H_NAMES_AT: usize = 11;
const H_NAMES_LEN: usize = 12;
const H_CLOSED: usize = 13;
const H_IFNAME: usize = 16; // 4 words: up to 32 bytes
const HEADER_WORDS: usize = 32;

// Words at the head of a core slot and of a connection table.
const S_SEQ: usize = 0;
const S_TIME_NS: usize = 1;
const S_VALUES: usize = 2;
const C_SEQ: usize = 0;
const C_COUNT: usize = 1;
const C_WANT: usize = 2;
const C_SERVED: usize = 3;
const C_TOTAL: usize = 4;
const C_ENTRIES: usize = 8;

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// A new file at `path` with permissions `mode`, replacing the one there, opened for reading
/// and writing (the stats file, the capture file).
fn new_file(path: &std::path::Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
}

/// A file's identity (device, inode).
type FileId = (u64, u64);

fn file_id(file: &std::fs::File) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    file.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// Removes `path` while it still names the file `id`: another runtime may have made its own
/// file there since (the new process of an upgrade), and that one stays.
fn remove_if_same(path: &std::path::Path, id: FileId) {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == id) {
        let _ = std::fs::remove_file(path);
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Packs bytes into little-endian words.
fn pack(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

fn unpack(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The geometry of a stats file.
#[derive(Debug, Clone, Copy)]
struct Layout {
    cores: usize,
    names: usize,
    slot_words: usize,
    slots_at: usize,
    conn_cap: usize,
    conns_at: usize,
    conn_stride: usize,
    names_at: usize,
    names_len: usize,
}

impl Layout {
    fn new(cores: usize, names: &[&str], conn_cap: usize) -> Layout {
        let names_len = names.iter().map(|n| n.len() + 1).sum::<usize>();
        let names_at = HEADER_WORDS;
        let slots_at = round_up(names_at + names_len.div_ceil(8), 8);
        let slot_words = round_up(S_VALUES + names.len(), 8);
        let conns_at = round_up(slots_at + cores * slot_words, 512);
        let conn_stride = round_up(C_ENTRIES + conn_cap * CONN_WORDS, 512);
        Layout {
            cores,
            names: names.len(),
            slot_words,
            slots_at,
            conn_cap,
            conns_at,
            conn_stride,
            names_at,
            names_len,
        }
    }

    fn words(&self) -> usize {
        self.conns_at + self.cores * self.conn_stride
    }

    fn read(w: &[AtomicU64]) -> io::Result<Layout> {
        let get = |i: usize| w.get(i).map_or(0, |x| x.load(Ordering::Acquire));
        if get(H_MAGIC) != MAGIC {
            return Err(bad("not a corelane stats file"));
        }
        if get(H_VERSION) != VERSION {
            return Err(bad(&format!(
                "stats layout version {} (this reader knows {VERSION}): use the corelane-stat \
                 of the same release as the server",
                get(H_VERSION)
            )));
        }
        let n = |i: usize| usize::try_from(get(i)).unwrap_or(usize::MAX);
        let l = Layout {
            cores: n(H_CORES),
            names: n(H_NAMES),
            slot_words: n(H_SLOT_WORDS),
            slots_at: n(H_SLOTS_AT),
            conn_cap: n(H_CONN_CAP),
            conns_at: n(H_CONNS_AT),
            conn_stride: n(H_CONN_STRIDE),
            names_at: n(H_NAMES_AT),
            names_len: n(H_NAMES_LEN),
        };
        // Checked arithmetic throughout: a crafted header must not overflow into a check
        // that passes.
        let end = |at: usize, count: usize, each: usize| {
            count.checked_mul(each).and_then(|n| at.checked_add(n))
        };
        let fits = l.cores <= 4096
            && l.names <= 4096
            && l.conn_cap <= 1 << 24
            && l.names_at >= HEADER_WORDS
            && l.slot_words >= S_VALUES + l.names
            && l.conn_stride >= C_ENTRIES + l.conn_cap * CONN_WORDS
            && end(l.names_at, l.names_len.div_ceil(8), 1).is_some_and(|e| e <= l.slots_at)
            && end(l.slots_at, l.cores, l.slot_words).is_some_and(|e| e <= l.conns_at)
            && end(l.conns_at, l.cores, l.conn_stride).is_some_and(|e| e <= w.len());
        if !fits {
            return Err(bad("the stats file's header does not fit the file"));
        }
        Ok(l)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Every stats file under the run directory, in this network namespace's directory first when
/// `netns` names it (see `corelane_xsk::netns_id`), else in all.
pub fn find(run_dir: &Path, netns: Option<&str>) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(spaces) = std::fs::read_dir(run_dir) else {
        return found;
    };
    for ns in spaces.flatten() {
        if netns.is_some_and(|n| ns.file_name().to_string_lossy() != n) {
            continue;
        }
        let Ok(ifaces) = std::fs::read_dir(ns.path()) else {
            continue;
        };
        for iface in ifaces.flatten() {
            let p = iface.path().join("stats");
            if p.exists() {
                found.push(p);
            }
        }
    }
    found.sort();
    found
}

/// Whether counter `name` is a level (a gauge) rather than a running count.
pub fn is_gauge(name: &str) -> bool {
    name.starts_with("frames_")
        || name.starts_with("batch_")
        || matches!(
            name,
            "fill_target" | "flows" | "neighbors" | "tcp_mem_bytes" | "wake_cost_ns" | "spin_ns"
        )
}

/// The statistics in Prometheus' text exposition format (version 0.0.4): one metric per
/// counter, `corelane_NAME_total` for counts and `corelane_NAME` for levels, labelled with the
/// interface and the core; `corelane_up` says whether the publishing runtime is alive.
pub fn prometheus(stats: &Stats) -> String {
    use std::fmt::Write as _;
    let iface = stats.ifname().replace(['\\', '"', '\n'], "_");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP corelane_up Whether the corelane runtime publishing these statistics is alive.\n\
         # TYPE corelane_up gauge\ncorelane_up{{iface=\"{iface}\",pid=\"{}\"}} {}",
        stats.pid(),
        u8::from(stats.alive())
    );
    let cores = stats.cores();
    for (k, name) in stats.names().iter().enumerate() {
        let (metric, kind) = if is_gauge(name) {
            (format!("corelane_{name}"), "gauge")
        } else {
            (format!("corelane_{name}_total"), "counter")
        };
        let _ = writeln!(out, "# TYPE {metric} {kind}");
        for c in &cores {
            let v = c.values.get(k).map_or(0, |(_, v)| *v);
            let _ = writeln!(
                out,
                "{metric}{{iface=\"{iface}\",core=\"{}\"}} {v}",
                c.index
            );
        }
    }
    out
}

/// An IPv4 socket address (for tests and examples).
pub fn v4(a: [u8; 4], port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a)), port)
}
