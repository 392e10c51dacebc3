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

mod map;
mod ns;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use map::Mapping;
pub use ns::{netns_id, run_dir};

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

/// The TCP states, in the order a connection entry encodes them.
pub const TCP_STATES: [&str; 11] = [
    "CLOSED",
    "LISTEN",
    "SYN-SENT",
    "SYN-RECEIVED",
    "ESTABLISHED",
    "FIN-WAIT-1",
    "FIN-WAIT-2",
    "CLOSE-WAIT",
    "CLOSING",
    "LAST-ACK",
    "TIME-WAIT",
];

/// One TCP connection as a core published it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    /// The core that holds it.
    pub core: usize,
    /// Index into [`TCP_STATES`].
    pub state: u8,
    /// This side.
    pub local: SocketAddr,
    /// The peer.
    pub remote: SocketAddr,
    /// Payload bytes received.
    pub bytes_in: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Segments retransmitted.
    pub retrans: u64,
    /// Smoothed RTT, once measured.
    pub srtt: Option<Duration>,
    /// RTT variation, once measured.
    pub rttvar: Option<Duration>,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Bytes written and not yet acknowledged.
    pub send_queue: u64,
    /// Bytes received and not yet read.
    pub recv_queue: u64,
    /// The peer's window, bytes.
    pub snd_window: u64,
    /// This side's receive window, bytes.
    pub rcv_window: u64,
}

impl Conn {
    /// The state's name.
    pub fn state_name(&self) -> &'static str {
        TCP_STATES.get(self.state as usize).copied().unwrap_or("?")
    }

    fn encode(&self) -> [u64; CONN_WORDS] {
        let ip16 = |a: IpAddr| match a {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        let (l, r) = (ip16(self.local.ip()), ip16(self.remote.ip()));
        let half = |b: &[u8; 16], i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let v6 = u64::from(self.local.is_ipv6());
        let dur = |d: Option<Duration>| d.map_or(u64::MAX, |d| d.as_micros() as u64);
        [
            v6 | (u64::from(self.state) << 8) | ((self.core as u64) << 16),
            u64::from(self.local.port()) | (u64::from(self.remote.port()) << 16),
            half(&l, 0),
            half(&l, 1),
            half(&r, 0),
            half(&r, 1),
            self.bytes_in,
            self.bytes_out,
            self.retrans,
            dur(self.srtt),
            dur(self.rttvar),
            self.cwnd,
            self.send_queue,
            self.recv_queue,
            self.snd_window,
            self.rcv_window,
        ]
    }

    fn decode(w: &[u64; CONN_WORDS]) -> Conn {
        let v6 = w[0] & 1 == 1;
        let ip = |a: u64, b: u64| -> IpAddr {
            let mut o = [0u8; 16];
            o[..8].copy_from_slice(&a.to_le_bytes());
            o[8..].copy_from_slice(&b.to_le_bytes());
            let v = Ipv6Addr::from(o);
            match v.to_ipv4_mapped() {
                Some(v4) if !v6 => IpAddr::V4(v4),
                _ => IpAddr::V6(v),
            }
        };
        let dur = |x: u64| (x != u64::MAX).then(|| Duration::from_micros(x));
        Conn {
            core: ((w[0] >> 16) & 0xffff) as usize,
            state: ((w[0] >> 8) & 0xff) as u8,
            local: SocketAddr::new(ip(w[2], w[3]), (w[1] & 0xffff) as u16),
            remote: SocketAddr::new(ip(w[4], w[5]), ((w[1] >> 16) & 0xffff) as u16),
            bytes_in: w[6],
            bytes_out: w[7],
            retrans: w[8],
            srtt: dur(w[9]),
            rttvar: dur(w[10]),
            cwnd: w[11],
            send_queue: w[12],
            recv_queue: w[13],
            snd_window: w[14],
            rcv_window: w[15],
        }
    }
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
        let fits = l.cores <= 4096
            && l.names <= 4096
            && l.conn_cap <= 1 << 24
            && l.slot_words >= S_VALUES + l.names
            && l.conn_stride >= C_ENTRIES + l.conn_cap * CONN_WORDS
            && l.names_at + l.names_len.div_ceil(8) <= l.slots_at
            && l.slots_at + l.cores * l.slot_words <= l.conns_at
            && l.words() <= w.len();
        if !fits {
            return Err(bad("the stats file's header does not fit the file"));
        }
        Ok(l)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The writing side: created by a runtime, one [`CoreWriter`] per core.
#[derive(Debug)]
pub struct Publisher {
    map: std::sync::Arc<Mapping>,
    layout: Layout,
    path: PathBuf,
}

impl Publisher {
    /// Creates (or replaces) the stats file at `path` for `cores` cores publishing `names`
    /// counters each and up to `conn_cap` connections per core in a snapshot. The file is
    /// readable by everyone (as `/proc/net/tcp` is) and writable by its owner.
    ///
    /// # Errors
    /// The file cannot be created or mapped.
    pub fn create(
        path: &Path,
        ifname: &str,
        cores: usize,
        names: &[&str],
        conn_cap: usize,
    ) -> io::Result<Publisher> {
        let layout = Layout::new(cores, names, conn_cap);
        let map = std::sync::Arc::new(Mapping::create(path, layout.words())?);
        let w = map.words();
        let put = |i: usize, v: u64| w[i].store(v, Ordering::Relaxed);
        put(H_PID, u64::from(std::process::id()));
        put(H_STARTED_MS, now_ns() / 1_000_000);
        put(H_CORES, cores as u64);
        put(H_NAMES, names.len() as u64);
        put(H_SLOT_WORDS, layout.slot_words as u64);
        put(H_SLOTS_AT, layout.slots_at as u64);
        put(H_CONN_CAP, conn_cap as u64);
        put(H_CONNS_AT, layout.conns_at as u64);
        put(H_CONN_STRIDE, layout.conn_stride as u64);
        put(H_NAMES_AT, layout.names_at as u64);
        put(H_NAMES_LEN, layout.names_len as u64);
        let name_bytes = ifname.as_bytes();
        for (i, word) in pack(&name_bytes[..name_bytes.len().min(31)])
            .into_iter()
            .enumerate()
        {
            put(H_IFNAME + i, word);
        }
        let mut joined = Vec::with_capacity(layout.names_len);
        for n in names {
            joined.extend_from_slice(n.as_bytes());
            joined.push(0);
        }
        for (i, word) in pack(&joined).into_iter().enumerate() {
            put(layout.names_at + i, word);
        }
        put(H_VERSION, VERSION);
        // Last, with release: a reader that sees the magic sees the header.
        w[H_MAGIC].store(MAGIC, Ordering::Release);
        Ok(Publisher {
            map,
            layout,
            path: path.to_path_buf(),
        })
    }

    /// The writer of core `index`'s slot and connection table (None past the core count).
    pub fn core(&self, index: usize) -> Option<CoreWriter> {
        (index < self.layout.cores).then(|| CoreWriter {
            map: self.map.clone(),
            layout: self.layout,
            index,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Marks the file as left by a runtime that ended (readers say so instead of showing
    /// frozen numbers as live).
    pub fn close(&self) {
        self.map.words()[H_CLOSED].store(1, Ordering::Release);
    }
}

impl Drop for Publisher {
    /// Marks the file closed (a reader still mapping it says the runtime ended) and removes
    /// it.
    fn drop(&mut self) {
        self.close();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One core's writer: only that core writes its slot and table.
#[derive(Debug)]
pub struct CoreWriter {
    map: std::sync::Arc<Mapping>,
    layout: Layout,
    index: usize,
}

impl CoreWriter {
    /// Publishes the core's counters, in the order of the names given to
    /// [`Publisher::create`] (extra values are ignored, missing ones left as they were).
    pub fn publish(&self, values: &[u64]) {
        let w = self.map.words();
        let base = self.layout.slots_at + self.index * self.layout.slot_words;
        let seq = w[base + S_SEQ].load(Ordering::Relaxed);
        w[base + S_SEQ].store(seq.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        w[base + S_TIME_NS].store(now_ns(), Ordering::Relaxed);
        for (i, v) in values.iter().take(self.layout.names).enumerate() {
            w[base + S_VALUES + i].store(*v, Ordering::Relaxed);
        }
        w[base + S_SEQ].store((seq | 1).wrapping_add(1), Ordering::Release);
    }

    /// Whether a reader asked for a connection snapshot since the last one.
    pub fn conns_wanted(&self) -> bool {
        let w = self.map.words();
        let base = self.layout.conns_at + self.index * self.layout.conn_stride;
        w[base + C_WANT].load(Ordering::Acquire) != w[base + C_SERVED].load(Ordering::Relaxed)
    }

    /// Writes a snapshot of the core's connections (`total` of them; those past the table's
    /// capacity are counted, not listed) and answers the request that asked for it.
    pub fn publish_conns(&self, conns: impl IntoIterator<Item = Conn>) {
        let w = self.map.words();
        let base = self.layout.conns_at + self.index * self.layout.conn_stride;
        let want = w[base + C_WANT].load(Ordering::Acquire);
        let seq = w[base + C_SEQ].load(Ordering::Relaxed);
        w[base + C_SEQ].store(seq.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let (mut listed, mut total) = (0usize, 0u64);
        for c in conns {
            total += 1;
            if listed < self.layout.conn_cap {
                let at = base + C_ENTRIES + listed * CONN_WORDS;
                for (i, v) in c.encode().into_iter().enumerate() {
                    w[at + i].store(v, Ordering::Relaxed);
                }
                listed += 1;
            }
        }
        w[base + C_COUNT].store(listed as u64, Ordering::Relaxed);
        w[base + C_TOTAL].store(total, Ordering::Relaxed);
        w[base + C_SEQ].store((seq | 1).wrapping_add(1), Ordering::Release);
        w[base + C_SERVED].store(want, Ordering::Release);
    }
}

/// One core's counters as read.
#[derive(Debug, Clone)]
pub struct CoreCounters {
    /// Core index.
    pub index: usize,
    /// When the core last published (Unix time).
    pub at: SystemTime,
    /// The counters, by name.
    pub values: Vec<(String, u64)>,
}

impl CoreCounters {
    /// A counter by name.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// A connection snapshot across cores.
#[derive(Debug, Clone, Default)]
pub struct ConnSnapshot {
    /// The connections listed.
    pub conns: Vec<Conn>,
    /// Connections the cores hold in all (more than listed when a table was full).
    pub total: u64,
    /// Cores that did not answer in time (asleep, or the file is read-only to this reader
    /// and no snapshot was ever asked for).
    pub stale_cores: Vec<usize>,
}

/// A reader of a runtime's stats file.
#[derive(Debug)]
pub struct Stats {
    map: Mapping,
    layout: Layout,
    names: Vec<String>,
    path: PathBuf,
}

impl Stats {
    /// Maps the stats file at `path` (read-write when this user may, so connection snapshots
    /// can be asked for; read-only otherwise).
    ///
    /// # Errors
    /// The file is missing, not a corelane stats file, or of another layout version.
    pub fn open(path: &Path) -> io::Result<Stats> {
        let map = Mapping::open(path)?;
        let layout = Layout::read(map.words())?;
        let words: Vec<u64> = map.words()
            [layout.names_at..layout.names_at + layout.names_len.div_ceil(8)]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        let bytes = unpack(&words);
        let names: Vec<String> = bytes[..layout.names_len.min(bytes.len())]
            .split(|b| *b == 0)
            .take(layout.names)
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        Ok(Stats {
            map,
            layout,
            names,
            path: path.to_path_buf(),
        })
    }

    fn word(&self, i: usize) -> u64 {
        self.map.words()[i].load(Ordering::Acquire)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The publishing process.
    pub fn pid(&self) -> u32 {
        u32::try_from(self.word(H_PID)).unwrap_or(0)
    }

    /// The interface it serves.
    pub fn ifname(&self) -> String {
        let words: Vec<u64> = (0..4).map(|i| self.word(H_IFNAME + i)).collect();
        let bytes = unpack(&words);
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// When the runtime started.
    pub fn started(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.word(H_STARTED_MS))
    }

    /// Whether the runtime ended (cleanly) after writing this file.
    pub fn closed(&self) -> bool {
        self.word(H_CLOSED) != 0
    }

    /// Whether the publishing process is still alive (and is the one that wrote the file).
    pub fn alive(&self) -> bool {
        !self.closed() && Path::new(&format!("/proc/{}", self.pid())).exists()
    }

    /// The counter names, in slot order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Every core's counters, each read consistently (a slot being written is read again).
    pub fn cores(&self) -> Vec<CoreCounters> {
        (0..self.layout.cores).map(|i| self.core(i)).collect()
    }

    fn core(&self, index: usize) -> CoreCounters {
        let w = self.map.words();
        let base = self.layout.slots_at + index * self.layout.slot_words;
        let mut values = vec![0u64; self.layout.names];
        let mut at = 0;
        for _ in 0..1000 {
            let s1 = w[base + S_SEQ].load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            at = w[base + S_TIME_NS].load(Ordering::Relaxed);
            for (i, v) in values.iter_mut().enumerate() {
                *v = w[base + S_VALUES + i].load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if w[base + S_SEQ].load(Ordering::Relaxed) == s1 {
                break;
            }
        }
        CoreCounters {
            index,
            at: UNIX_EPOCH + Duration::from_nanos(at),
            values: self.names.iter().cloned().zip(values).collect(),
        }
    }

    /// Asks every core for a connection snapshot and waits up to `wait` for the answers
    /// (cores publish every [`PUBLISH_INTERVAL_MS`]); a core that does not answer in time is
    /// listed as stale, with the last snapshot it wrote.
    pub fn connections(&self, wait: Duration) -> ConnSnapshot {
        let w = self.map.words();
        let writable = self.map.writable();
        let mut asked = Vec::new();
        for core in 0..self.layout.cores {
            let base = self.layout.conns_at + core * self.layout.conn_stride;
            let want = if writable {
                w[base + C_WANT].fetch_add(1, Ordering::AcqRel) + 1
            } else {
                w[base + C_WANT].load(Ordering::Acquire)
            };
            asked.push(want);
        }
        let deadline = std::time::Instant::now() + wait;
        let answered = |core: usize| {
            let base = self.layout.conns_at + core * self.layout.conn_stride;
            w[base + C_SERVED].load(Ordering::Acquire) >= asked[core]
        };
        while std::time::Instant::now() < deadline && !(0..self.layout.cores).all(answered) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut snap = ConnSnapshot::default();
        for core in 0..self.layout.cores {
            if !answered(core) || !writable {
                snap.stale_cores.push(core);
            }
            let base = self.layout.conns_at + core * self.layout.conn_stride;
            for _ in 0..1000 {
                let s1 = w[base + C_SEQ].load(Ordering::Acquire);
                if s1 & 1 == 1 {
                    std::thread::sleep(Duration::from_micros(50));
                    continue;
                }
                let count =
                    (w[base + C_COUNT].load(Ordering::Relaxed) as usize).min(self.layout.conn_cap);
                let total = w[base + C_TOTAL].load(Ordering::Relaxed);
                let mut conns = Vec::with_capacity(count);
                for k in 0..count {
                    let at = base + C_ENTRIES + k * CONN_WORDS;
                    let mut e = [0u64; CONN_WORDS];
                    for (i, x) in e.iter_mut().enumerate() {
                        *x = w[at + i].load(Ordering::Relaxed);
                    }
                    conns.push(Conn::decode(&e));
                }
                fence(Ordering::Acquire);
                if w[base + C_SEQ].load(Ordering::Relaxed) == s1 {
                    snap.conns.extend(conns);
                    snap.total += total;
                    break;
                }
            }
        }
        snap
    }
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
        || matches!(name, "fill_target" | "flows" | "neighbors")
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
