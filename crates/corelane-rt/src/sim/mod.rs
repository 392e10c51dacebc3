//! A seeded simulation of whole runtimes, in virtual time and without root: the old process
//! of an upgrade and the new one, each a runtime's control plane and core (the same `Driver`,
//! upgrade stages and machines a real run uses), over one queue of the in-memory kernel
//! (`corelane_xsk::sim::SimKernel`) and the in-memory program (`corelane_xsk::MemProgram`,
//! which steers every frame by the maps the runtimes write), with a peer host opening
//! connections to the echo server throughout.
//!
//! The seed picks everything: when the upgrade starts, how long the new process takes between
//! `build` and `run` and to listen, the order of the turns (and turns left out), when each of
//! the peer's connections opens and how much it sends, and one fault in two runs: the new
//! process slow to run or to listen past the old one's deadlines, the `joined` word arriving
//! after the old process gave up, every word late or heard twice, the new process killed at
//! any point, the old one killed during the hand-over.
//!
//! Checked after every step: no frame of the queue in two places across both processes'
//! ledgers, the kernel's rings and the exchange. At the end: every frame in exactly one place,
//! every byte of every connection echoed once and in order (a connection may end with a
//! reset only where a process was killed), the program back to one generation with no
//! connection kept, and the survivor with nothing left to finish.
//!
//! ```
//! let report = corelane_rt::sim::run(7)?; // a failure names its seed and the replay command
//! assert!(report.connections > 0);
//! # Ok::<(), corelane_rt::sim::Failure>(())
//! ```
//!
//! `cargo run --release -p corelane-bench --bin runtime-sim -- --seeds 100000` sweeps; a
//! failing seed replays with `--seed N`.

mod peer;
pub(crate) mod process;
pub(crate) mod talk;
mod world;

use std::time::Duration;

use crate::host::mem::SplitMix64 as Rng;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// No upgrade was started.
    NotStarted,
    /// An upgrade started and had not ended (only in a failure's report).
    Pending,
    /// The new process took over and the old one left.
    Upgraded,
    /// The upgrade was called off; the old process serves on.
    CalledOff,
    /// The old process was killed during the upgrade; the new one serves alone.
    TakenOver,
    /// No process serves any more (a process was killed, and the other one stood down or
    /// had drained).
    ServerGone,
    /// No upgrade; the process shut down gracefully.
    Drained,
}

/// A fault a run injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// The new process took longer than the old one waits for `joined` between its `build`
    /// and its `run`.
    SlowToRun,
    /// Its application took longer than the new process waits for it to listen.
    SlowToListen,
    /// Its `joined` arrived after the old process gave up waiting.
    LateJoined,
    /// Every word between the two took up to half a second.
    Late,
    /// Words were heard twice.
    Twice,
    /// The new process was killed.
    NewCrashes,
    /// The old process was killed during the upgrade.
    OldCrashes,
    /// A process not upgraded was shut down gracefully (`StopHandle::shutdown`) under its
    /// connections.
    Drain,
    /// The queue's driver takes the fill ring as a zero-copy one does, and now and then sets
    /// the ring's need-wakeup flag with entries in it (the race a receive must survive).
    ZeroCopyFill,
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The faults injected.
    pub faults: Vec<Fault>,
    /// Upgrades called off.
    pub call_offs: u32,
    /// The peer's connections.
    pub connections: usize,
    /// Those that ended with an error: reset where a process was killed, refused by a
    /// graceful shutdown.
    pub reset: usize,
    /// Steps taken.
    pub steps: u64,
    /// Simulated time.
    pub simulated: Duration,
}

/// A run that broke an invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The seed, to replay it.
    pub seed: u64,
    /// The step it failed at.
    pub step: u64,
    /// When, in simulated milliseconds.
    pub at_ms: u64,
    /// What broke.
    pub what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} step {} ({} ms): {} (replay: cargo run --release -p corelane-bench --bin \
             runtime-sim -- --seed {})",
            self.seed, self.step, self.at_ms, self.what, self.seed
        )
    }
}

impl std::error::Error for Failure {}

/// A simulated process of an upgrade, as the other sees it: set once it has ended (what its
/// pidfd tells a real one).
#[derive(Debug)]
pub(crate) struct SimProcess(pub(crate) std::sync::Arc<std::sync::atomic::AtomicBool>);

impl crate::host::Partner for SimProcess {
    fn ended(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    fn kill(&self) -> Result<u32, String> {
        Err("a simulated process is not ended from here".into())
    }
}

/// One run with `seed`.
///
/// # Errors
/// The first invariant broken, with the seed, the step and the command that replays it.
pub fn run(seed: u64) -> Result<Report, Failure> {
    world::World::new(seed)?.run()
}

#[cfg(test)]
#[path = "../sim_tests.rs"]
mod tests;
