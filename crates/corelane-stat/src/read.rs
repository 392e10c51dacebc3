//! The reading side: consistent copies of the slots, and connection snapshots on request.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::*;

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

    /// Each count's rate per second since `before` (the same core's counters `secs` earlier),
    /// by name. Levels ([`crate::is_gauge`]: flows, free frames, the spin) have none: the
    /// difference of two levels is no rate. A count that went down (a restarted core) reads 0.
    pub fn rates_since(&self, before: &CoreCounters, secs: f64) -> Vec<(String, f64)> {
        let secs = secs.max(1e-3);
        self.values
            .iter()
            .zip(&before.values)
            .filter(|((n, _), _)| !crate::is_gauge(n))
            .map(|((n, v), (_, w))| (n.clone(), v.saturating_sub(*w) as f64 / secs))
            .collect()
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
    pub(crate) map: Mapping,
    pub(crate) layout: Layout,
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
            // Escaped: a crafted file cannot put terminal control sequences on the screen.
            .map(|n| n.escape_ascii().to_string())
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

    /// Whether the file shrank while mapped (its writer truncated it): what was read since is
    /// zeros, not the runtime's counters. A reader stops trusting it.
    pub fn shrunk(&self) -> bool {
        self.map.shrunk()
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
        bytes[..end].escape_ascii().to_string()
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
