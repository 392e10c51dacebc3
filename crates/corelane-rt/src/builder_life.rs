//! The builder's options about privileges, death and succession: which capabilities the
//! runtime keeps, how long the XDP program answers for it once it died, and how a new process
//! takes over from it without dropping a connection.

use std::path::PathBuf;
use std::time::Duration;

use crate::Builder;

impl Builder {
    /// Keeps every capability the process has after `build` (default: dropped). By default
    /// the thread that builds the runtime keeps none under a grant, and only `CAP_NET_ADMIN`
    /// and `CAP_BPF` (to put the queues back and detach the program) when the runtime attached
    /// the program; the core and application threads, which parse the wire and run the
    /// application's tasks, keep none either way, and what needs a capability while they run
    /// (a port bound, an address taken) is done for them by one thread that parses nothing
    /// (`corelane-priv`). Threads the application started before `build` keep theirs.
    pub fn keep_capabilities(mut self, keep: bool) -> Self {
        self.keep_capabilities = keep;
        self
    }

    /// How long the XDP program answers for this runtime after the process dies, however it
    /// dies (SIGKILL included): a reset for every TCP segment to an owned address and port
    /// unreachable for every UDP datagram, so that a peer in the middle of a transfer learns
    /// at once, as from a host whose process died, instead of waiting for its timeout
    /// (default 60 s; zero: none). A small keeper process (`/bin/sleep`, shown as
    /// `corelane-linger`) holds the program for that long and changes nothing while the
    /// runtime lives; a clean exit ends it first, and the next runtime on the interface ends
    /// one a dead runtime left at once. Only when the runtime attached the program itself
    /// (under a grant, the broker answers for a server that died).
    pub fn linger_on_death(mut self, time: Duration) -> Self {
        self.death_linger = time;
        self
    }

    /// Lets a new process take this runtime's place without dropping a connection (an
    /// upgrade): the runtime listens on a unix socket at `path` (mode 0600; only root or this
    /// process's user may connect), and a process built with
    /// [`upgrade_from`](Builder::upgrade_from) the same path takes over from it. Then new
    /// connections go to the new process; this one's listeners close, its connections go on
    /// until they close or `grace` ends (what is left then is reset), and its `run` returns
    /// (`RunReport::stopped` set). Only for a runtime that attached the XDP program itself
    /// (not under a grant).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// use std::time::Duration;
    /// // The running server:
    /// let rt = corelane::Runtime::builder("eth0")
    ///     .addr("10.0.0.5/24")
    ///     .upgrades("/run/myserver.upgrade", Duration::from_secs(30))
    ///     .build()?;
    /// // Its successor, started later (another binary, say), takes over:
    /// let next = corelane::Runtime::builder("eth0")
    ///     .addr("10.0.0.5/24")
    ///     .upgrade_from("/run/myserver.upgrade")
    ///     .upgrades("/run/myserver.upgrade", Duration::from_secs(30))
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn upgrades(mut self, path: impl Into<PathBuf>, grace: Duration) -> Self {
        self.upgrades = Some((path.into(), grace));
        self
    }

    /// Takes over from the runtime listening at `path` ([`upgrades`](Builder::upgrades))
    /// instead of starting afresh: `build` receives its XDP program and joins each of its
    /// queues (so this runtime must serve the same queues: the same cores and placement), and
    /// from then on gets the new connections while the old one drains. The old process's
    /// connection secret comes too, so SYN cookies it sent are answered here. `build` fails,
    /// naming why, when nothing listens at `path` or the old process does not hand over.
    pub fn upgrade_from(mut self, path: impl Into<PathBuf>) -> Self {
        self.upgrade_from = Some((path.into(), false));
        self
    }

    /// As [`upgrade_from`](Builder::upgrade_from) when a runtime listens at `path`, and a
    /// fresh start when none does (no socket there, or one a dead process left): the one
    /// command a service manager runs both to start a server and to replace it. With
    /// [`upgrades`](Builder::upgrades) at the same path, each process takes over from the last.
    pub fn take_over(mut self, path: impl Into<PathBuf>) -> Self {
        self.upgrade_from = Some((path.into(), true));
        self
    }
}
