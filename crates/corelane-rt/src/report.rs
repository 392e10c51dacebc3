//! What a run returns: per-core counters and frame accounting, and the XDP program's counters.

use crate::host::{BindMode, FrameCounts, XdpCounters};

use crate::CoreStats;

/// What a core reported when it ended.
#[derive(Debug, Clone)]
pub struct CoreReport {
    /// Its counters.
    pub stats: CoreStats,
    /// Where every frame of its UMEM was after shutdown (all free or with the kernel).
    pub frames: FrameCounts,
    /// AF_XDP bind mode.
    pub bind_mode: BindMode,
    /// What each panic of the core's future said, when it was run again after it.
    pub panics: Vec<String>,
}

/// What [`Runtime::run`](crate::Runtime::run) returns.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// One per core.
    pub cores: Vec<CoreReport>,
    /// The XDP program's counters at the end.
    pub xdp: XdpCounters,
    /// Conditions that needed attention, once each, as they were logged (a peer sending bad
    /// checksums, frames on a queue no core served).
    pub warnings: Vec<String>,
    /// True when the run ended by [`StopHandle::stop`](crate::StopHandle::stop) or
    /// [`StopHandle::shutdown`](crate::StopHandle::shutdown).
    pub stopped: bool,
    /// True when a new process took this run's place
    /// ([`Builder::upgrades`](crate::Builder::upgrades)): the queues and the XDP program went
    /// to it, and every frame is with it (`FrameCounts::away`).
    pub upgraded: bool,
}

impl RunReport {
    /// True when on every core every frame is back (none lost, none held).
    pub fn frames_balanced(&self) -> bool {
        self.cores
            .iter()
            .all(|c| c.frames.in_use == 0 && c.frames.sum() == c.frames.total)
    }

    /// Frame accounting summed over the cores.
    pub fn frames(&self) -> FrameCounts {
        let mut t = FrameCounts::default();
        for c in &self.cores {
            t += c.frames;
        }
        t
    }

    /// Device counters summed over the cores.
    pub fn device(&self) -> corelane_stack::DeviceStats {
        let mut t = corelane_stack::DeviceStats::default();
        for c in &self.cores {
            t += c.stats.device;
        }
        t
    }
}
