//! Packet capture on a core: the reader (`corelane-stat capture`) asks through the stats
//! file; the core looks once per turn whether a capture runs and, while one does, gives its
//! device a tap that copies the frames into the core's capture ring (see
//! [`corelane_stat::CaptureTap`]). No capture, no tap: the frame path pays one branch per
//! batch.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use corelane_stack::Tap;
use corelane_stat::{CaptureTap, CoreWriter};

/// The tap in the device: the core's ring, and the turn's time.
struct Tapped {
    tap: CaptureTap,
    now: u64,
}

impl Tap for Tapped {
    fn clock(&mut self, unix_ns: u64) {
        self.now = unix_ns;
    }

    fn frame(&mut self, outbound: bool, bytes: &[u8]) {
        self.tap.frame(outbound, self.now, bytes);
    }
}

/// One core's side of capture.
pub(crate) struct CoreCapture {
    writer: CoreWriter,
    /// Reads the control block each turn.
    probe: CaptureTap,
    /// The capture the device's tap was made for.
    installed: Option<u64>,
    /// Unix time at `epoch`, in nanoseconds.
    unix_at_epoch: u64,
    epoch: Instant,
}

impl CoreCapture {
    /// None when the runtime has no capture file (it publishes through a broker's). `now`:
    /// the host's clock, read with the wall's to date the capture.
    pub(crate) fn new(writer: CoreWriter, epoch: Instant, now: Instant) -> Option<CoreCapture> {
        let unix_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let since = now.saturating_duration_since(epoch).as_nanos() as u64;
        Some(CoreCapture {
            probe: writer.capture_tap()?,
            writer,
            installed: None,
            unix_at_epoch: unix_now.saturating_sub(since),
            epoch,
        })
    }

    /// Once per turn, before the device moves frames: what the tap should be now.
    pub(crate) fn turn(&mut self, clock: Instant) -> Option<Change> {
        let now =
            self.unix_at_epoch + clock.saturating_duration_since(self.epoch).as_nanos() as u64;
        if !self.probe.wanted(now) {
            return self.installed.take().map(|_| Change::Remove);
        }
        let generation = self.probe.generation();
        if self.installed == Some(generation) {
            return Some(Change::Clock(now));
        }
        let mut tap = self.writer.capture_tap()?;
        tap.wanted(now);
        self.installed = Some(generation);
        Some(Change::Install(Box::new(Tapped { tap, now })))
    }
}

/// What the device's tap becomes.
pub(crate) enum Change {
    /// A new capture: this tap.
    Install(Box<dyn Tap>),
    /// The capture goes on: the turn's time.
    Clock(u64),
    /// It ended.
    Remove,
}
