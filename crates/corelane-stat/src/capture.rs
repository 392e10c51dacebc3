//! Packet capture from the fast path, in a file beside the stats file (`capture`, mode 0600:
//! the frames are the traffic itself, so only the server's user and root may map it, where
//! the stats are for everyone).
//!
//! A reader ([`Stats::capture`]) writes a filter and a lease (a time until which it wants
//! frames, renewed while it runs) into the control block. Each core looks at the lease once per
//! turn; while it holds, the core's [`CaptureTap`] copies the frames it receives and sends that
//! pass the filter, cut to the snap length, into the core's own ring, which only that core
//! writes and only the reader consumes. A full ring drops the copy (counted), never the frame;
//! a reader that dies stops the copying when its lease runs out (a second).
//!
//! A ring is words: `head` (bytes written, the core's), `tail` (bytes consumed, the reader's),
//! the counts of copies dropped and kept, then the data. A record is two words (lengths,
//! direction and a mark; the time in Unix nanoseconds) and the frame's bytes, packed in words;
//! a record never wraps: where the end of the ring is too near, a skip mark sends the reader
//! back to the start.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::map::Mapping;
use crate::{Stats, now_ns};

/// "clcaptur" in ASCII, the capture file's first word.
const MAGIC: u64 = u64::from_le_bytes(*b"clcaptur");
/// The capture file's layout version.
const VERSION: u64 = 1;
// Header words.
const F_MAGIC: usize = 0;
const F_VERSION: usize = 1;
const F_CORES: usize = 2;
const F_RING: usize = 3;
const HEADER_WORDS: usize = 16;
/// Words of the control block (after the header).
const CONTROL_WORDS: usize = 16;
/// Words before a ring's data.
const R_DATA: usize = 8;
/// Data words of each core's ring: 2 MiB (tmpfs pages are only taken once written).
#[cfg(not(test))]
pub(crate) const RING_WORDS: usize = 1 << 18;
/// A small ring in tests, so that they fill it.
#[cfg(test)]
pub(crate) const RING_WORDS: usize = 1 << 12;
/// The smallest ring a reader accepts.
const MIN_RING_WORDS: usize = 1024;
/// How long a lease lasts: a reader renews it well within.
pub(crate) const LEASE: Duration = Duration::from_secs(1);

// The control block.
const K_LEASE: usize = 0;
const K_GEN: usize = 1;
const K_SNAP: usize = 2;
const K_PROTO: usize = 3;
const K_PORT: usize = 4;
const K_FAMILY: usize = 5;
const K_HOST: usize = 6; // two words

/// The geometry of a capture file.
#[derive(Debug, Clone, Copy)]
struct Layout {
    cores: usize,
    /// Data words of each core's ring.
    ring: usize,
}

impl Layout {
    const CONTROL: usize = HEADER_WORDS;

    /// What a runtime of `cores` cores writes.
    fn of(cores: usize) -> Layout {
        Layout {
            cores: cores.max(1),
            ring: RING_WORDS,
        }
    }

    fn ring_at(&self, core: usize) -> usize {
        HEADER_WORDS + CONTROL_WORDS + core * (R_DATA + self.ring)
    }

    fn words(&self) -> usize {
        self.ring_at(self.cores)
    }

    fn read(w: &[AtomicU64]) -> io::Result<Layout> {
        let get = |i: usize| w.get(i).map_or(0, |x| x.load(Ordering::Acquire));
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        if get(F_MAGIC) != MAGIC || get(F_VERSION) != VERSION {
            return Err(bad(
                "not a corelane capture file of this release (use the corelane-stat of the \
                 server's release)",
            ));
        }
        let l = Layout {
            cores: usize::try_from(get(F_CORES)).unwrap_or(usize::MAX),
            ring: usize::try_from(get(F_RING)).unwrap_or(usize::MAX),
        };
        let fits = l.cores >= 1
            && l.cores <= 4096
            && (MIN_RING_WORDS..=1 << 28).contains(&l.ring)
            && l.words() <= w.len();
        if !fits {
            return Err(bad("the capture file's header does not fit the file"));
        }
        Ok(l)
    }
}

/// The runtime's capture file: made beside its stats file, removed with it.
#[derive(Debug)]
pub struct CaptureFile {
    map: Arc<Mapping>,
    layout: Layout,
    path: PathBuf,
    /// Remove the file when dropped, while its path still names it (None: someone else made
    /// it and removes it).
    remove: Option<crate::FileId>,
}

impl CaptureFile {
    /// Creates (or replaces) the capture file at `path` for `cores` cores, readable and
    /// writable by its owner only. Its pages are taken only when a capture writes them.
    ///
    /// # Errors
    /// The file cannot be created or mapped.
    pub fn create(path: &Path, cores: usize) -> io::Result<CaptureFile> {
        let file = crate::new_capture_file(path)?;
        let mut c = CaptureFile::create_in(&file, path, cores)?;
        c.remove = crate::file_id(&file);
        Ok(c)
    }

    /// The size of the file [`CaptureFile::create_in`] makes for `cores` cores: what a server
    /// asks a broker for.
    pub fn bytes_for(cores: usize) -> u64 {
        (Layout::of(cores).words() * 8) as u64
    }

    /// Like [`CaptureFile::create`], in `file`, which someone else made at `path` (opened for
    /// reading and writing) and removes: a grant broker that hands the file to a server
    /// without the right to write its directory. Dropping this one leaves the file.
    ///
    /// # Errors
    /// The file cannot be sized or mapped.
    pub fn create_in(file: &std::fs::File, path: &Path, cores: usize) -> io::Result<CaptureFile> {
        let layout = Layout::of(cores);
        let map = Mapping::create_in(file, layout.words())?;
        let w = map.words();
        w[F_VERSION].store(VERSION, Ordering::Relaxed);
        w[F_CORES].store(layout.cores as u64, Ordering::Relaxed);
        w[F_RING].store(layout.ring as u64, Ordering::Relaxed);
        w[F_MAGIC].store(MAGIC, Ordering::Release);
        Ok(CaptureFile {
            map: Arc::new(map),
            layout,
            path: path.to_path_buf(),
            remove: None,
        })
    }

    /// Core `core`'s tap (None past the core count).
    pub fn tap(&self, core: usize) -> Option<CaptureTap> {
        (core < self.layout.cores).then(|| CaptureTap::new(self.map.clone(), &self.layout, core))
    }
}

impl Drop for CaptureFile {
    fn drop(&mut self) {
        if let Some(id) = self.remove {
            crate::remove_if_same(&self.path, id);
        }
    }
}

// A ring's head words.
const R_HEAD: usize = 0;
const R_TAIL: usize = 1;
const R_DROPPED: usize = 2;
const R_KEPT: usize = 3;

const MARK_RECORD: u64 = 0xa5;
const MARK_SKIP: u64 = 0x5a;

/// Which frames a capture keeps. The default keeps every frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filter {
    /// IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6).
    pub proto: Option<u8>,
    /// Source or destination port (TCP or UDP).
    pub port: Option<u16>,
    /// Source or destination address.
    pub host: Option<IpAddr>,
}

impl Filter {
    fn is_all(&self) -> bool {
        *self == Filter::default()
    }

    /// Whether `frame` (Ethernet) passes. Frames that are not IP pass only a filter that
    /// keeps everything; a frame too short for what the filter asks about does not pass.
    pub fn matches(&self, frame: &[u8]) -> bool {
        if self.is_all() {
            return true;
        }
        let Some(mut ethertype) = frame.get(12..14) else {
            return false;
        };
        // Up to two VLAN tags (a served VLAN's frames carry an 802.1Q tag, inside an 802.1ad
        // service tag with QinQ): judge what they carry.
        let mut l2 = 14;
        for _ in 0..2 {
            if ethertype != [0x81, 0x00] && ethertype != [0x88, 0xa8] {
                break;
            }
            let Some(inner) = frame.get(l2 + 2..l2 + 4) else {
                return false;
            };
            ethertype = inner;
            l2 += 4;
        }
        let (proto, src, dst, l4) = match u16::from_be_bytes([ethertype[0], ethertype[1]]) {
            0x0800 => {
                let Some(ip) = frame.get(l2..l2 + 20) else {
                    return false;
                };
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                let src = IpAddr::from([ip[12], ip[13], ip[14], ip[15]]);
                let dst = IpAddr::from([ip[16], ip[17], ip[18], ip[19]]);
                // Only the first fragment has the ports.
                let first = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff == 0;
                (ip[9], src, dst, first.then_some(l2 + ihl))
            }
            0x86dd => {
                let Some(ip) = frame.get(l2..l2 + 40) else {
                    return false;
                };
                let mut s = [0u8; 16];
                let mut d = [0u8; 16];
                s.copy_from_slice(&ip[8..24]);
                d.copy_from_slice(&ip[24..40]);
                (ip[6], IpAddr::from(s), IpAddr::from(d), Some(l2 + 40))
            }
            _ => return false,
        };
        if self.proto.is_some_and(|p| p != proto) {
            return false;
        }
        if self.host.is_some_and(|h| h != src && h != dst) {
            return false;
        }
        match self.port {
            None => true,
            Some(port) => {
                if proto != 6 && proto != 17 {
                    return false;
                }
                let Some(ports) = l4.and_then(|at| frame.get(at..at + 4)) else {
                    return false;
                };
                let sp = u16::from_be_bytes([ports[0], ports[1]]);
                let dp = u16::from_be_bytes([ports[2], ports[3]]);
                sp == port || dp == port
            }
        }
    }

    fn store(&self, w: &[AtomicU64], at: usize) {
        let put = |i: usize, v: u64| w[at + i].store(v, Ordering::Relaxed);
        put(K_PROTO, self.proto.map_or(0, |p| 0x100 | u64::from(p)));
        put(K_PORT, self.port.map_or(0, |p| 0x1_0000 | u64::from(p)));
        let (family, bytes) = match self.host {
            None => (0, [0u8; 16]),
            Some(IpAddr::V4(a)) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&a.octets());
                (4, b)
            }
            Some(IpAddr::V6(a)) => (6, a.octets()),
        };
        put(K_FAMILY, family);
        put(
            K_HOST,
            u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8])),
        );
        put(
            K_HOST + 1,
            u64::from_le_bytes(bytes[8..].try_into().unwrap_or([0; 8])),
        );
    }

    fn load(w: &[AtomicU64], at: usize) -> Filter {
        let get = |i: usize| w[at + i].load(Ordering::Relaxed);
        let proto = get(K_PROTO);
        let port = get(K_PORT);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&get(K_HOST).to_le_bytes());
        bytes[8..].copy_from_slice(&get(K_HOST + 1).to_le_bytes());
        let host = match get(K_FAMILY) {
            4 => Some(IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])),
            6 => Some(IpAddr::from(bytes)),
            _ => None,
        };
        Filter {
            proto: (proto & 0x100 != 0).then_some(proto as u8),
            port: (port & 0x1_0000 != 0).then_some(port as u16),
            host,
        }
    }
}

/// One core's writing side: owned by the core, it copies frames into the core's ring while a
/// reader's lease holds.
#[derive(Debug)]
pub struct CaptureTap {
    map: Arc<Mapping>,
    control: usize,
    ring: usize,
    words: usize,
    generation: u64,
    filter: Filter,
    snap: usize,
}

impl CaptureTap {
    fn new(map: Arc<Mapping>, layout: &Layout, core: usize) -> CaptureTap {
        CaptureTap {
            map,
            control: Layout::CONTROL,
            ring: layout.ring_at(core),
            words: layout.ring,
            generation: 0,
            filter: Filter::default(),
            snap: 0,
        }
    }

    /// Whether a reader wants frames at `now_ns` (Unix nanoseconds). One load while nobody
    /// captures; a new capture's filter and snap length are read when it starts.
    pub fn wanted(&mut self, now_ns: u64) -> bool {
        let w = self.map.words();
        if w[self.control + K_LEASE].load(Ordering::Acquire) <= now_ns {
            return false;
        }
        let generation = w[self.control + K_GEN].load(Ordering::Acquire);
        if generation != self.generation {
            self.generation = generation;
            self.filter = Filter::load(w, self.control);
            self.snap = w[self.control + K_SNAP]
                .load(Ordering::Relaxed)
                .clamp(14, 65535) as usize;
        }
        true
    }

    /// The capture the last [`wanted`](Self::wanted) saw (a new one starts with a new number).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Copies `frame` (received when `outbound` is false) into the ring when it passes the
    /// filter; `at_ns` is its time (Unix nanoseconds). Returns whether it was kept.
    pub fn frame(&mut self, outbound: bool, at_ns: u64, frame: &[u8]) -> bool {
        if !self.filter.matches(frame) {
            return false;
        }
        let w = self.map.words();
        let r = self.ring;
        let keep = frame.len().min(self.snap);
        let need = 2 + keep.div_ceil(8);
        let head = w[r + R_HEAD].load(Ordering::Relaxed) as usize / 8;
        let tail = w[r + R_TAIL].load(Ordering::Acquire) as usize / 8;
        let at = head % self.words;
        // A record does not wrap: the rest of the ring is skipped when it is too short.
        let skip = if at + need > self.words {
            self.words - at
        } else {
            0
        };
        if head.wrapping_sub(tail) + skip + need > self.words {
            w[r + R_DROPPED].fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let data = r + R_DATA;
        if skip > 0 {
            w[data + at].store(MARK_SKIP << 56, Ordering::Relaxed);
        }
        let at = (head + skip) % self.words;
        let dir = if outbound { 2u64 } else { 1 };
        let first =
            keep as u64 | (frame.len().min(0xffff) as u64) << 32 | dir << 48 | MARK_RECORD << 56;
        w[data + at].store(first, Ordering::Relaxed);
        w[data + at + 1].store(at_ns, Ordering::Relaxed);
        for (i, chunk) in frame[..keep].chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            w[data + at + 2 + i].store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        w[r + R_KEPT].fetch_add(1, Ordering::Relaxed);
        w[r + R_HEAD].store(((head + skip + need) * 8) as u64, Ordering::Release);
        true
    }
}

/// A frame a capture kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The core that saw it.
    pub core: usize,
    /// Sent by the runtime (else received).
    pub outbound: bool,
    /// When (Unix nanoseconds; the core's turn that handled it).
    pub at_ns: u64,
    /// Its length on the wire.
    pub len: usize,
    /// Its first bytes, up to the snap length.
    pub bytes: Vec<u8>,
}

/// A running capture: the reader's side. Dropping it ends the capture.
#[derive(Debug)]
pub struct Capture {
    map: Mapping,
    layout: Layout,
    snap: usize,
    ifname: String,
}

impl Stats {
    /// Starts capturing the frames that pass `filter`, each cut to `snap` bytes, on every
    /// core of this runtime (see the module). One capture at a time: a second reader takes it
    /// over.
    ///
    /// # Errors
    /// The runtime has no capture file (it publishes through a grant broker's file), or this
    /// user may not open it (capture needs the server's user or root).
    pub fn capture(&self, filter: Filter, snap: usize) -> io::Result<Capture> {
        let path = self.path().with_file_name("capture");
        let map = match Mapping::open(&path) {
            Ok(m) if m.writable() => m,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{}: read-only to this user; capture needs the server's user or root",
                        path.display()
                    ),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{}: this runtime has no capture file (under a grant broker older than \
                         this corelane-stat, update the broker)",
                        path.display()
                    ),
                ));
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        };
        let layout = Layout::read(map.words())?;
        let w = map.words();
        filter.store(w, Layout::CONTROL);
        let snap = snap.clamp(14, 65535);
        w[Layout::CONTROL + K_SNAP].store(snap as u64, Ordering::Relaxed);
        // What is in the rings from an earlier capture is not this one's.
        for core in 0..layout.cores {
            let r = layout.ring_at(core);
            let head = w[r + R_HEAD].load(Ordering::Acquire);
            w[r + R_TAIL].store(head, Ordering::Release);
        }
        w[Layout::CONTROL + K_GEN].fetch_add(1, Ordering::AcqRel);
        let c = Capture {
            map,
            layout,
            snap,
            ifname: self.ifname(),
        };
        c.renew();
        Ok(c)
    }
}

impl Capture {
    fn words(&self) -> &[AtomicU64] {
        self.map.words()
    }

    /// Whether the file shrank while mapped (its writer truncated it): the rings read zero from
    /// then on. A reader stops.
    pub fn shrunk(&self) -> bool {
        self.map.shrunk()
    }

    /// Writes another snap length for the cores than the one this reader asked for, as the
    /// file's writer may (for tests of what a reader does with records it never asked for).
    #[cfg(test)]
    pub(crate) fn claim_snap(&self, snap: usize) {
        self.words()[Layout::CONTROL + K_SNAP].store(snap as u64, Ordering::Relaxed);
    }

    /// The snap length each frame is cut to (14 to 65535 bytes).
    pub fn snap(&self) -> usize {
        self.snap
    }

    /// The interface of the runtime being captured.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    fn ring(&self, core: usize) -> usize {
        self.layout.ring_at(core)
    }

    /// Keeps the capture on for another second; call it more often than that.
    pub fn renew(&self) {
        let until = now_ns() + LEASE.as_nanos() as u64;
        self.words()[Layout::CONTROL + K_LEASE].store(until, Ordering::Release);
    }

    /// Copies dropped so far because a core's ring was full, per core (counted since the
    /// runtime started).
    pub fn dropped(&self) -> Vec<u64> {
        (0..self.layout.cores)
            .map(|c| self.words()[self.ring(c) + R_DROPPED].load(Ordering::Relaxed))
            .collect()
    }

    /// Takes what every core's ring holds, each core's in its order.
    pub fn drain(&mut self) -> Vec<Record> {
        let mut out = Vec::new();
        for core in 0..self.layout.cores {
            self.drain_core(core, &mut out);
        }
        out
    }

    fn drain_core(&self, core: usize, out: &mut Vec<Record>) {
        let w = self.words();
        let size = self.layout.ring;
        let r = self.ring(core);
        let data = r + R_DATA;
        let head = w[r + R_HEAD].load(Ordering::Acquire) as usize / 8;
        let mut tail = w[r + R_TAIL].load(Ordering::Relaxed) as usize / 8;
        // A head more than a ring ahead is not a core's: start over from it.
        if head.wrapping_sub(tail) > size {
            tail = head;
        }
        while tail < head {
            let at = tail % size;
            let first = w[data + at].load(Ordering::Relaxed);
            if first >> 56 == MARK_SKIP {
                tail += size - at;
                continue;
            }
            let keep = (first & 0xffff_ffff) as usize;
            let need = 2 + keep.div_ceil(8);
            if first >> 56 != MARK_RECORD
                || at + need > size
                || tail + need > head
                || keep > self.snap()
            {
                // Not a record a core wrote (longer than the snap length the reader asked
                // for, say: never allocated): the rest is given up.
                tail = head;
                break;
            }
            let mut bytes = Vec::with_capacity(keep);
            for i in 0..keep.div_ceil(8) {
                bytes
                    .extend_from_slice(&w[data + at + 2 + i].load(Ordering::Relaxed).to_le_bytes());
            }
            bytes.truncate(keep);
            out.push(Record {
                core,
                outbound: (first >> 48) & 0xff == 2,
                at_ns: w[data + at + 1].load(Ordering::Relaxed),
                len: ((first >> 32) & 0xffff) as usize,
                bytes,
            });
            tail += need;
        }
        w[r + R_TAIL].store((tail * 8) as u64, Ordering::Release);
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.words()[Layout::CONTROL + K_LEASE].store(0, Ordering::Release);
    }
}
