//! pcapng (the format Wireshark and `tcpdump -r` read): a section header, one Ethernet
//! interface with nanosecond timestamps, and an enhanced packet block per frame with its
//! direction.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::Stats;
use crate::{Capture, Record, now_ns};

const SHB: u32 = 0x0a0d_0d0a;
const IDB: u32 = 1;
const EPB: u32 = 6;
const LINKTYPE_ETHERNET: u16 = 1;
const OPT_END: u16 = 0;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;

/// A pcapng writer over `W`.
#[derive(Debug)]
pub struct PcapNg<W: Write> {
    out: W,
}

fn option(buf: &mut Vec<u8>, code: u16, value: &[u8]) {
    buf.extend_from_slice(&code.to_le_bytes());
    buf.extend_from_slice(&(value.len() as u16).to_le_bytes());
    buf.extend_from_slice(value);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let len = (12 + body.len().next_multiple_of(4)) as u32;
    let mut b = Vec::with_capacity(len as usize);
    b.extend_from_slice(&kind.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(body);
    b.resize(b.len().next_multiple_of(4), 0);
    b.extend_from_slice(&len.to_le_bytes());
    b
}

impl<W: Write> PcapNg<W> {
    /// Writes the section header and the interface (`name`, frames cut to `snap` bytes).
    ///
    /// # Errors
    /// Writing failed.
    pub fn new(mut out: W, name: &str, snap: usize) -> io::Result<PcapNg<W>> {
        let mut shb = Vec::new();
        shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
        shb.extend_from_slice(&1u16.to_le_bytes());
        shb.extend_from_slice(&0u16.to_le_bytes());
        shb.extend_from_slice(&(-1i64).to_le_bytes());
        out.write_all(&block(SHB, &shb))?;
        let mut idb = Vec::new();
        idb.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&(snap as u32).to_le_bytes());
        option(&mut idb, IF_NAME, name.as_bytes());
        option(&mut idb, IF_TSRESOL, &[9]);
        option(&mut idb, OPT_END, &[]);
        out.write_all(&block(IDB, &idb))?;
        Ok(PcapNg { out })
    }

    /// Writes one frame.
    ///
    /// # Errors
    /// Writing failed.
    pub fn write(&mut self, r: &Record) -> io::Result<()> {
        let cap = r.bytes.len();
        let pad = cap.next_multiple_of(4) - cap;
        // Block type and length, 20 bytes of packet header, the data, its padding, the flags
        // option (8 bytes), the end of options (4), the length again.
        let len = (8 + 20 + cap + pad + 8 + 4 + 4) as u32;
        // Direction: 1 inbound, 2 outbound.
        let flags: u32 = if r.outbound { 2 } else { 1 };
        let mut head = [0u8; 28];
        head[..4].copy_from_slice(&EPB.to_le_bytes());
        head[4..8].copy_from_slice(&len.to_le_bytes());
        head[12..16].copy_from_slice(&((r.at_ns >> 32) as u32).to_le_bytes());
        head[16..20].copy_from_slice(&(r.at_ns as u32).to_le_bytes());
        head[20..24].copy_from_slice(&(cap as u32).to_le_bytes());
        head[24..28].copy_from_slice(&(r.len.max(cap) as u32).to_le_bytes());
        let mut tail = [0u8; 3 + 16];
        let t = &mut tail[pad..pad + 16];
        t[..2].copy_from_slice(&EPB_FLAGS.to_le_bytes());
        t[2..4].copy_from_slice(&4u16.to_le_bytes());
        t[4..8].copy_from_slice(&flags.to_le_bytes());
        // t[8..12]: the end of options, zeros.
        t[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&head)?;
        self.out.write_all(&r.bytes)?;
        self.out.write_all(&tail[..pad + 16])
    }

    /// Flushes and returns the writer.
    ///
    /// # Errors
    /// Flushing failed.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// What [`record`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Frames written.
    pub frames: u64,
    /// Copies the cores dropped because their ring was full (the frames themselves went on).
    pub dropped: u64,
}

/// How long a frame waits for those of other cores before it is written: a core stamps a
/// frame with its turn's time and writes it within that turn.
const MERGE_DELAY: Duration = Duration::from_millis(20);

/// Most records held back for the merge by time; past it the oldest go out at once.
const MAX_PENDING: usize = 1 << 16;

/// Adds `fresh` records to `pending`, sorted by time, and says how many at its front are ripe
/// to write at `now`: those older than the merge delay (all of them when `ending`). The file is
/// a runtime's, which may lie: a record stamped further ahead than a second is taken as
/// stamped now, and never more than [`MAX_PENDING`] wait, so none is held for good and the
/// reader's memory stays bounded.
fn merge(pending: &mut Vec<Record>, fresh: Vec<Record>, now: u64, ending: bool) -> usize {
    let ahead = now.saturating_add(1_000_000_000);
    pending.extend(fresh.into_iter().map(|mut r| {
        if r.at_ns > ahead {
            r.at_ns = now;
        }
        r
    }));
    pending.sort_by_key(|r| (r.at_ns, r.core));
    if ending {
        return pending.len();
    }
    let cut = now.saturating_sub(MERGE_DELAY.as_nanos() as u64);
    pending
        .partition_point(|r| r.at_ns <= cut)
        .max(pending.len().saturating_sub(MAX_PENDING))
}

/// Writes what the running capture `cap` (see [`Stats::capture`]) takes from every core of
/// its runtime, merged by time, into `out` as pcapng, until `count` frames are written,
/// `until` passes or `stop` is set; the capture ends when this returns. Frames are stamped
/// with the start of the turn in which their core handled them, so each connection's frames
/// are in wire order; two cores' frames interleave by those stamps.
///
/// # Errors
/// Writing failed, or the stats file was truncated under the reader.
pub fn record<W: Write>(
    cap: Capture,
    count: Option<u64>,
    until: Option<Instant>,
    stop: &AtomicBool,
    out: W,
) -> io::Result<Recorded> {
    let mut cap = cap;
    let mut pcap = PcapNg::new(out, cap.ifname(), cap.snap())?;
    let dropped_before: u64 = cap.dropped().iter().sum();
    let mut pending: Vec<Record> = Vec::new();
    let mut done = Recorded::default();
    let full = |done: &Recorded| count.is_some_and(|c| done.frames >= c);
    loop {
        let ending = stop.load(Ordering::Relaxed) || until.is_some_and(|u| Instant::now() >= u);
        cap.renew();
        let fresh = cap.drain();
        if cap.shrunk() {
            // Truncated by its writer: what the rings read now is zeros, not frames.
            pcap.finish()?;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the stats file was truncated while it was read (by the user of the runtime \
                 that writes it): capture stopped",
            ));
        }
        let idle = fresh.is_empty();
        let ripe = merge(&mut pending, fresh, now_ns(), ending);
        for r in pending.drain(..ripe) {
            if full(&done) {
                break;
            }
            pcap.write(&r)?;
            done.frames += 1;
        }
        if ending || full(&done) {
            break;
        }
        // A busy core fills its ring in a few milliseconds: drain again at once while frames
        // come, rest a little when none did.
        if idle {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    done.dropped = cap
        .dropped()
        .iter()
        .sum::<u64>()
        .saturating_sub(dropped_before);
    drop(cap);
    pcap.finish()?;
    Ok(done)
}

#[cfg(test)]
mod merge_tests {
    use super::*;

    fn rec(core: usize, at_ns: u64) -> Record {
        Record {
            core,
            outbound: false,
            at_ns,
            len: 60,
            bytes: vec![0; 60],
        }
    }

    #[test]
    fn records_stamped_in_the_future_are_not_held_for_good() {
        let now = 1_000_000_000_000;
        let mut pending = Vec::new();
        // Stamped u64::MAX by a hostile runtime: taken as now, written once the delay passed.
        let ripe = merge(
            &mut pending,
            vec![rec(0, u64::MAX), rec(1, now - 1)],
            now,
            false,
        );
        assert_eq!((ripe, pending.len()), (0, 2));
        let later = now + 2 * MERGE_DELAY.as_nanos() as u64;
        assert_eq!(merge(&mut pending, Vec::new(), later, false), 2);
        // However many arrive at once, at most MAX_PENDING wait.
        let mut pending = Vec::new();
        let flood: Vec<Record> = (0..MAX_PENDING + 10).map(|i| rec(i % 2, now)).collect();
        let ripe = merge(&mut pending, flood, now, false);
        assert_eq!(pending.len() - ripe, MAX_PENDING);
    }
}
