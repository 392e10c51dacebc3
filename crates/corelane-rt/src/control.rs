//! The control plane: what every core and every handle of a run reaches besides its own
//! queue, one owner per job, each in its own module with a narrow interface:
//!
//! - the steering ([`Steer`], `steward.rs`): the XDP program and its maps, changed only on the
//!   privileged thread;
//! - the address book ([`AddrBook`], `addrbook.rs`): the owned addresses and their generation;
//! - the route book ([`RouteBook`], `routing.rs`): the routes, followed while the kernel's change;
//! - the life of the run ([`Life`], `life.rs`): stop, drain, the futures still running, the
//!   first failure;
//! - telemetry ([`Telemetry`], `telemetry.rs`): live statistics, metrics, warnings;
//! - the flood defence ([`XdpCookies`], `cookies.rs`): the program's SYN cookies;
//! - the doorbells that wake each core;
//! - an upgrade ([`Upgrades`], `upgrade.rs`): the hand-over to a new process.
//!
//! None of those modules imports this one, the driver or the lane; what a job needs of
//! another (a stop rings every doorbell, an address added wakes every core) is said here.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::addrbook::AddrBook;
use crate::clock::Clock;
use crate::cookies::XdpCookies;
use crate::handoff::Doorbell;
use crate::life::Life;
use crate::routing::RouteBook;
use crate::steward::Steer;
use crate::telemetry::Telemetry;
use crate::upgrade::Upgrades;

/// The control plane of one run, shared by its cores and handles.
pub(crate) struct Shared {
    /// The program, read through [`Steer::read`], changed through [`Steer::run`].
    pub(crate) steer: Arc<Steer>,
    /// SYN cookies in the XDP program while a listener is flooded.
    pub(crate) cookies: XdpCookies,
    /// The owned addresses, as the cores should have them.
    pub(crate) addrs: AddrBook,
    /// The routes, as the cores should have them.
    pub(crate) routes: RouteBook,
    pub(crate) life: Life,
    pub(crate) telemetry: Telemetry,
    /// Ports picked for binds of port 0, in order (every core's n-th gets the n-th).
    pub(crate) auto_ports: Mutex<Vec<u16>>,
    /// One per core: rung to wake it.
    pub(crate) bells: Vec<Arc<Doorbell>>,
    /// A hand-over to a new process, or from an old one (dropped last: what it inherited puts
    /// the interface's queues back after the program is gone).
    pub(crate) upgrades: Upgrades,
    /// The run's clock: the wall clock, or a simulation's.
    pub(crate) clock: Clock,
    /// The program's count of frames that found no socket, as the last core to end read it
    /// while its socket was still open (what arrives after the sockets close is not a
    /// steering fault).
    pub(crate) no_socket_open: std::sync::atomic::AtomicU64,
}

impl Shared {
    pub(crate) fn stop_all(&self) {
        self.life.stop.store(true, Ordering::SeqCst);
        self.announce_shutdown();
        self.ring_all();
    }

    /// A core's future returned for good.
    pub(crate) fn app_done(&self) {
        if self.life.apps_running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.ring_all();
        }
    }

    /// The future of core `core` returned an error: the first one is kept for `run` to
    /// return, and the run stops.
    pub(crate) fn core_failed(&self, core: usize, message: String) {
        tracing::error!(
            "core {core}: its future returned an error ({message}); stopping the runtime"
        );
        self.life.fail(core, message);
        self.stop_all();
    }

    /// Wakes every task waiting in [`shutdown_requested`](crate::shutdown_requested).
    pub(crate) fn announce_shutdown(&self) {
        self.life.asked.notify_waiters();
    }

    /// A core is about to close its socket: notes the program's count of frames that found
    /// no socket so far.
    pub(crate) fn note_no_socket(&self) {
        if let Ok(c) = self.steer.read().counters() {
            self.no_socket_open.fetch_max(c.no_socket, Ordering::AcqRel);
        }
    }

    /// Wakes every core.
    pub(crate) fn ring_all(&self) {
        for b in &self.bells {
            b.ring_always();
        }
    }
}
