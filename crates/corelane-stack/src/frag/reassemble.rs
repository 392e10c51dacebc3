//! The reassembly table: datagrams in progress, charged for what they hold, dropped least
//! recently used first, timed out in the order they began. Both orders are queues with lazy
//! deletion (an entry whose datagram is gone or was touched since is skipped), compacted
//! when stale entries outnumber the live ones, so every operation is amortised O(1) in the
//! table's size and O(`max_pieces`) in a datagram's.

use std::collections::{HashMap, VecDeque};

use smoltcp::time::{Duration, Instant};

use super::{FragLimits, FragStats, Key, Piece, parse};
use crate::keyed::KeyedState;
use crate::tcp::wire::inet_checksum;

/// What a datagram in progress is charged beyond its bytes: its entry in the table and in
/// both queues.
const DATAGRAM_COST: usize = 256;
/// What each fragment held is charged beyond its bytes: its allocation and its place.
const PIECE_COST: usize = 64;

#[derive(Debug)]
struct Pending {
    /// The fragments received, by offset, not overlapping.
    pieces: Vec<(usize, Vec<u8>)>,
    /// Payload bytes received.
    got: usize,
    /// The payload's length, once the last fragment came.
    total: Option<usize>,
    /// The Ethernet and IP header of the first fragment (offset 0), once it came.
    head: Option<Vec<u8>>,
    started: Instant,
    /// Which datagram this is (a key reused after a drop is another one).
    serial: u64,
    /// When a fragment last added to it, in fragments accepted by the table.
    used: u64,
    /// What it is charged.
    cost: usize,
}

/// Puts fragmented datagrams back together.
#[derive(Debug)]
pub struct Reassembler {
    limits: FragLimits,
    pending: HashMap<Key, Pending, KeyedState>,
    /// (key, serial), oldest first: for the timeout.
    by_start: VecDeque<(Key, u64)>,
    /// (key, used), least recently used first: for eviction.
    by_use: VecDeque<(Key, u64)>,
    serials: u64,
    uses: u64,
    bytes: usize,
    stats: FragStats,
}

enum Added {
    Partial,
    Duplicate,
    Complete,
    Bad,
    TooMany,
}

impl Reassembler {
    /// An empty reassembler with `limits`, its table keyed by a fresh key from the OS.
    pub fn new(limits: FragLimits) -> Self {
        Reassembler::keyed(limits, KeyedState::random())
    }

    /// An empty reassembler with `limits` whose table of datagrams in progress (indexed by
    /// what the senders choose: addresses and identification) hashes under `key`.
    pub fn keyed(limits: FragLimits, key: KeyedState) -> Self {
        Reassembler {
            limits,
            pending: HashMap::with_hasher(key),
            by_start: VecDeque::new(),
            by_use: VecDeque::new(),
            serials: 0,
            uses: 0,
            bytes: 0,
            stats: FragStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> FragStats {
        self.stats
    }

    /// Counts a datagram this side sent as fragments.
    pub(crate) fn count_fragmented(&mut self) {
        self.stats.fragmented += 1;
    }

    /// Bytes held by datagrams in progress, as charged (their fragments' bytes and a fixed
    /// cost per fragment and per datagram).
    pub fn bytes_held(&self) -> usize {
        self.bytes
    }

    /// Datagrams in progress.
    pub fn in_progress(&self) -> usize {
        self.pending.len()
    }

    /// True when `frame` is an IPv4 or IPv6 fragment.
    pub fn is_fragment(frame: &[u8]) -> bool {
        match frame.get(12..14) {
            Some([0x08, 0x00]) => frame
                .get(20..22)
                .is_some_and(|f| u16::from_be_bytes([f[0], f[1]]) & 0x3fff != 0),
            Some([0x86, 0xdd]) => frame.get(20) == Some(&44),
            _ => false,
        }
    }

    /// Takes one fragment (a whole Ethernet frame). Returns the whole datagram's frame
    /// (Ethernet, then the IP header without fragmentation, then the payload) when this was
    /// the last piece missing.
    pub fn push(&mut self, frame: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.stats.fragments += 1;
        self.expire(now);
        let Some(p) = parse(frame) else {
            self.stats.malformed += 1;
            return None;
        };
        let end = p.offset + p.data.len();
        if end > 65535 || (p.more && p.data.len() % 8 != 0) || (p.more && p.data.is_empty()) {
            self.stats.malformed += 1;
            return None;
        }
        if !self.pending.contains_key(&p.key) {
            while self.pending.len() >= self.limits.max_datagrams.max(1) {
                self.evict();
            }
            self.serials += 1;
            self.pending.insert(
                p.key,
                Pending {
                    pieces: Vec::new(),
                    got: 0,
                    total: None,
                    head: None,
                    started: now,
                    serial: self.serials,
                    used: 0,
                    cost: DATAGRAM_COST,
                },
            );
            self.bytes += DATAGRAM_COST;
            self.by_start.push_back((p.key, self.serials));
        }
        let max_pieces = self.limits.max_pieces.max(1);
        let d = self.pending.get_mut(&p.key)?;
        let before = d.cost;
        let verdict = add(d, &p, end, max_pieces);
        self.bytes = self.bytes + d.cost - before;
        match verdict {
            Added::Bad => {
                self.drop_key(p.key);
                self.stats.overlaps += 1;
                return None;
            }
            Added::TooMany => {
                self.drop_key(p.key);
                self.stats.too_many_pieces += 1;
                return None;
            }
            Added::Duplicate => return None,
            Added::Partial => {}
            Added::Complete => {
                let d = self.pending.remove(&p.key)?;
                self.bytes -= d.cost;
                self.stats.reassembled += 1;
                self.compact();
                return Some(rebuild(d, p.v6, p.key.proto));
            }
        }
        self.uses += 1;
        d.used = self.uses;
        self.by_use.push_back((p.key, self.uses));
        while self.bytes > self.limits.max_bytes && !self.pending.is_empty() {
            self.evict();
        }
        self.compact();
        None
    }

    /// Drops what began longer ago than the timeout.
    pub fn expire(&mut self, now: Instant) {
        let timeout: Duration = self.limits.timeout.into();
        while let Some(&(k, serial)) = self.by_start.front() {
            match self.pending.get(&k) {
                Some(d) if d.serial == serial => {
                    if now - d.started < timeout {
                        return;
                    }
                    self.drop_key(k);
                    self.stats.timeouts += 1;
                }
                _ => {}
            }
            self.by_start.pop_front();
        }
    }

    /// Drops the datagram that received a fragment least recently (one never added to, first).
    fn evict(&mut self) {
        // A datagram made but not yet added to has no entry in `by_use`: its fragment is
        // being placed now, so it is not the one to drop unless it is the only one.
        while let Some((k, used)) = self.by_use.pop_front() {
            if self.pending.get(&k).is_some_and(|d| d.used == used) {
                self.drop_key(k);
                self.stats.evicted += 1;
                return;
            }
        }
        if let Some(&k) = self.pending.keys().next() {
            self.drop_key(k);
            self.stats.evicted += 1;
        }
    }

    fn drop_key(&mut self, k: Key) {
        if let Some(d) = self.pending.remove(&k) {
            self.bytes -= d.cost;
        }
    }

    /// Removes the stale entries of both queues once they outnumber the live ones.
    fn compact(&mut self) {
        let live = 2 * self.pending.len() + 64;
        if self.by_use.len() > live {
            let pending = &self.pending;
            self.by_use
                .retain(|(k, used)| pending.get(k).is_some_and(|d| d.used == *used));
        }
        if self.by_start.len() > live {
            let pending = &self.pending;
            self.by_start
                .retain(|(k, serial)| pending.get(k).is_some_and(|d| d.serial == *serial));
        }
    }
}

fn add(d: &mut Pending, p: &Piece<'_>, end: usize, max_pieces: usize) -> Added {
    if !p.more {
        match d.total {
            Some(t) if t != end => return Added::Bad,
            _ => d.total = Some(end),
        }
    }
    if d.total.is_some_and(|t| end > t) {
        return Added::Bad;
    }
    if p.data.is_empty() {
        return Added::Partial;
    }
    // Where the new piece goes among those received; an exact repeat is harmless, any other
    // overlap drops the datagram (RFC 5722).
    let i = d.pieces.partition_point(|(s, _)| *s < p.offset);
    if let Some((s, v)) = d.pieces.get(i)
        && *s == p.offset
        && v.len() == p.data.len()
    {
        return Added::Duplicate;
    }
    let overlaps_prev = i > 0 && d.pieces[i - 1].0 + d.pieces[i - 1].1.len() > p.offset;
    let overlaps_next = d.pieces.get(i).is_some_and(|(s, _)| *s < end);
    if overlaps_prev || overlaps_next {
        return Added::Bad;
    }
    if d.pieces.len() >= max_pieces {
        return Added::TooMany;
    }
    d.pieces.insert(i, (p.offset, p.data.to_vec()));
    d.got += p.data.len();
    d.cost += p.data.len() + PIECE_COST;
    if p.offset == 0 {
        d.cost += p.head.len();
        d.head = Some(p.head.to_vec());
    }
    // Complete when the pieces (which never overlap) add up to the whole.
    if d.total == Some(d.got) && d.head.is_some() {
        Added::Complete
    } else {
        Added::Partial
    }
}

/// The whole datagram's frame from its pieces.
fn rebuild(d: Pending, v6: bool, proto: u8) -> Vec<u8> {
    let head = d.head.unwrap_or_default();
    let mut out = Vec::with_capacity(head.len() + d.got);
    out.extend_from_slice(&head);
    for (_, piece) in &d.pieces {
        out.extend_from_slice(piece);
    }
    if v6 {
        // The fixed header now says what follows it and how long the payload is.
        let len = d.got as u16;
        out[14 + 4..14 + 6].copy_from_slice(&len.to_be_bytes());
        out[14 + 6] = proto;
    } else {
        let ihl = head.len() - 14;
        let total = (ihl + d.got) as u16;
        out[16..18].copy_from_slice(&total.to_be_bytes());
        out[20..22].copy_from_slice(&[0, 0]);
        out[24..26].copy_from_slice(&[0, 0]);
        let c = inet_checksum(&out[14..14 + ihl]);
        out[24..26].copy_from_slice(&c.to_ne_bytes());
    }
    out
}
