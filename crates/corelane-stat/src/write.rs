//! The writing side: a runtime creates the file, and each core writes its own slot.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering, fence};

use crate::*;

/// Creates a fresh, empty stats file at `path` (mode 0644: readable by everyone, as
/// `/proc/net/tcp` is), replacing the one there: a reader still holding the old one keeps its
/// old (closed) view.
///
/// # Errors
/// The file cannot be created.
pub fn new_stats_file(path: &Path) -> io::Result<std::fs::File> {
    new_file(path, 0o644)
}

/// Makes (or replaces) an empty capture file at `path`, readable and writable by its owner
/// only (the frames are the traffic itself), opened for reading and writing.
///
/// # Errors
/// The file cannot be created.
pub fn new_capture_file(path: &Path) -> io::Result<std::fs::File> {
    crate::new_file(path, 0o600)
}

/// The writing side: created by a runtime, one [`CoreWriter`] per core.
#[derive(Debug)]
pub struct Publisher {
    map: std::sync::Arc<Mapping>,
    layout: Layout,
    path: PathBuf,
    /// The capture file beside it (see [`CaptureFile`]), when it could be made.
    capture: Option<std::sync::Arc<CaptureFile>>,
    /// Remove the file when dropped, while its path still names it (None: someone else made
    /// it and removes it).
    remove: Option<crate::FileId>,
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
        let file = new_stats_file(path)?;
        let mut p = Publisher::create_in(&file, path, ifname, cores, names, conn_cap)?;
        p.remove = crate::file_id(&file);
        // Beside the stats: a server that may write the directory may capture.
        p.capture = CaptureFile::create(&path.with_file_name("capture"), cores)
            .ok()
            .map(std::sync::Arc::new);
        Ok(p)
    }

    /// The size of the file [`Publisher::create_in`] makes for these arguments: what a server
    /// asks a broker for.
    pub fn bytes_for(cores: usize, names: &[&str], conn_cap: usize) -> u64 {
        (Layout::new(cores, names, conn_cap).words() * 8) as u64
    }

    /// Like [`Publisher::create`], in `file`, which someone else made at `path` (opened for
    /// reading and writing) and removes: a broker that hands a server without the right to
    /// write its directory the file to publish in.
    ///
    /// # Errors
    /// The file cannot be sized or mapped.
    pub fn create_in(
        file: &std::fs::File,
        path: &Path,
        ifname: &str,
        cores: usize,
        names: &[&str],
        conn_cap: usize,
    ) -> io::Result<Publisher> {
        let layout = Layout::new(cores, names, conn_cap);
        let map = Mapping::create_in(file, layout.words())?;
        Ok(Publisher::init(map, layout, path, ifname, names))
    }

    fn init(map: Mapping, layout: Layout, path: &Path, ifname: &str, names: &[&str]) -> Publisher {
        let cores = layout.cores;
        let conn_cap = layout.conn_cap;
        let map = std::sync::Arc::new(map);
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
        Publisher {
            map,
            layout,
            path: path.to_path_buf(),
            capture: None,
            remove: None,
        }
    }

    /// Packet capture through `capture` (made with [`CaptureFile::create_in`] in a file a
    /// grant broker handed over), for a publisher whose directory it may not write. Before
    /// the cores' writers are taken.
    pub fn with_capture(mut self, capture: CaptureFile) -> Publisher {
        self.capture = Some(std::sync::Arc::new(capture));
        self
    }

    /// The writer of core `index`'s slot and connection table (None past the core count).
    pub fn core(&self, index: usize) -> Option<CoreWriter> {
        (index < self.layout.cores).then(|| CoreWriter {
            map: self.map.clone(),
            layout: self.layout,
            index,
            capture: self.capture.clone(),
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
        if let Some(id) = self.remove {
            crate::remove_if_same(&self.path, id);
        }
    }
}

/// One core's writer: only that core writes its slot and table.
#[derive(Debug)]
pub struct CoreWriter {
    map: std::sync::Arc<Mapping>,
    layout: Layout,
    index: usize,
    capture: Option<std::sync::Arc<CaptureFile>>,
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

impl CoreWriter {
    /// The core's side of packet capture (see [`CaptureTap`]); None when the runtime has no
    /// capture file.
    pub fn capture_tap(&self) -> Option<CaptureTap> {
        self.capture.as_ref().and_then(|c| c.tap(self.index))
    }
}
