//! corelane's per-core runtime.
//!
//! One thread per core, pinned, each owning one interface queue: its AF_XDP socket and UMEM, its
//! protocol stack (flow table, sockets, timers) and a single-threaded tokio executor (a
//! current_thread `LocalRuntime`), so `tokio::time`, `tokio::sync` and `spawn_local` work and
//! tasks need not be `Send`. Nothing is shared between cores on the per-frame path;
//! frames that reach the wrong core are copied over a ring for that core ([`handoff`]).
//!
//! The pipeline runs as a task of the executor (the driver): one turn of
//! [`corelane_stack::Pipeline`] (RX batch, classify, handoff in, flow demux and protocol, egress,
//! TX batch with one kick, recycle, refill); then it yields so the tasks whose sockets changed
//! (and only those) run. Which core owns which frame is this crate's policy (`peers.rs`). In
//! [`PollMode::Adaptive`] an idle core spins for a bounded time, then sleeps on the AF_XDP
//! socket, its doorbell, its tasks' output and its next protocol timer.
//!
//! ```no_run
//! # use corelane_rt as corelane;
//! use corelane::{Runtime, net::TcpListener};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let rt = Runtime::builder("veth0").addr("10.0.0.1/24").build()?;
//! rt.run(|_core| async move {
//!     let listener = TcpListener::bind(7).await.expect("port 7");
//!     loop {
//!         let (mut s, _) = listener.accept().await.expect("accept");
//!         tokio::task::spawn_local(async move {
//!             let mut buf = vec![0; 4096];
//!             while let Ok(n @ 1..) = s.read(&mut buf).await {
//!                 if s.write_all(&buf[..n]).await.is_err() { break }
//!             }
//!         });
//!     }
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]

mod access;
mod addrbook;
mod addrs;
mod builder;
mod builder_life;
mod builder_tcp;
mod capture;
mod cidr;
mod clock;
mod control;
mod cookies;
mod cores;
mod cpu;
mod driver;
mod driver_run;
mod error;
mod executor;
pub mod handoff;
mod host;
#[cfg(any(test, feature = "sim"))]
pub mod lab;
#[cfg(test)]
mod lab_tests;
mod lane;
mod launch;
mod life;
mod lock;
mod metrics;
pub mod net;
mod open;
mod outcome;
mod peers;
mod publish;
mod queues;
#[cfg(feature = "quic")]
pub mod quic;
mod report;
mod routing;
mod say;
mod signals;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod spin;
mod steward;
mod stop;
mod telemetry;
mod threads;
mod upgrade;
mod upgrade_core;
mod upgrade_new;
mod upgrade_old;
mod upgrade_words;

/// What `corelane-fuzz` drives: the decoders of what another process sends. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// The upgrade's words and extras from any bytes (see `corelane-fuzz --target
    /// upgrade-words`).
    pub fn upgrade_words(input: &[u8]) {
        crate::upgrade_words::fuzz(input);
    }

    /// A QUIC server's demux and its accept path (see `corelane-fuzz --target quic`).
    #[cfg(feature = "quic")]
    pub use crate::quic::fuzz::QuicServer;
}

use std::time::Duration;

pub use access::Xdp;
pub use addrs::AddrHandle;
pub use builder::{Builder, bandwidth_delay_product};
pub use cidr::{Cidr, IntoCidr, parse_cidr};
pub use corelane_stack::PipelineStats;
pub use corelane_topo::{Lane, Machine, Placement, Plan, Sharing};
pub use cpu::{allowed_cpus, l2_bytes};
pub use error::Error;
pub use lane::{BatchStats, CoreStats, RX_WAIT_SAMPLE_EVERY, Stage};
pub use launch::{CoreInfo, Runtime};
pub use life::OnPanic;
pub use outcome::shutdown_requested;
pub use report::{CoreReport, RunReport};
pub use stop::StopHandle;

/// How an idle core waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Never sleep: lowest latency, one CPU fully used per core.
    Busy,
    /// Once idle, spin through a gap the recent ones say is short (under half the longest
    /// spin: the whole longest spin), else as long as the stretch of work just done took (at
    /// least 2 µs, at most the longest spin), then sleep until a frame, a handoff, a task's
    /// output or the next protocol timer. Under steady load the next frame arrives within the
    /// spin, at light load the core sleeps through the gaps.
    ///
    /// The longest spin is set from what a wake-up costs on this host: each core measures how
    /// long a frame that woke it waited (from the steering program's receive stamp to the
    /// core's turn) against one that found it awake, and spins at most four times the
    /// difference (at least 10 µs, at most `spin`; `spin` until a wake-up was measured). So it
    /// spins through gaps up to twice a wake-up's cost, which sleeping would lengthen by half
    /// or more: on a virtual CPU whose wake-up costs 30-70 µs a one-connection ping-pong (its
    /// gaps 20-35 µs) is answered spinning, where a sleep would triple the p99
    /// (docs/results/tail.md), and on a host that wakes in a few microseconds the core sleeps
    /// through gaps of tens. [`CoreStats::wake_cost`] and [`CoreStats::spin`] say what it
    /// measured and chose.
    Adaptive {
        /// The longest spin once idle, however slow a wake-up.
        spin: Duration,
    },
}

impl Default for PollMode {
    fn default() -> Self {
        PollMode::Adaptive {
            spin: Duration::from_micros(200),
        }
    }
}

/// The index of the core the calling task runs on (None outside the runtime).
pub fn core_index() -> Option<usize> {
    crate::lane::current().ok().map(|c| c.index)
}

/// Counters of the core the calling task runs on (None outside the runtime).
pub fn core_stats() -> Option<CoreStats> {
    crate::lane::current().ok().map(|c| c.snapshot())
}
