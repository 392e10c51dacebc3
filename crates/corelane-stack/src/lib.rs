//! corelane's protocol core, sans-IO: no sockets, no clock, no system calls. Frames come from a
//! [`corelane_frame::FrameIo`], time is an argument, the random seed and the cache size are
//! configuration, so the same code runs over AF_XDP in the runtime and over the in-memory link
//! in tests and benchmarks, on any OS.
//!
//! - [`classify`]: parse each frame once and verify its IPv4, TCP and UDP checksums; malformed
//!   and corrupted frames are counted and dropped before any protocol code sees them.
//! - [`XdpDevice`]: a smoltcp `Device` over any `FrameIo`. RX tokens read the frame in place;
//!   TX tokens write straight into a frame; frames are pulled and sent in batches, one kick
//!   per batch.
//! - [`Stack`]: smoltcp behind an O(1) flow table (one single-socket set per flow, so smoltcp
//!   never scans), egress only for flows with work, a timer heap, a TCP backlog (SYN queue and
//!   accept queue per listener, wake-one accept), and the calls the application's sockets make
//!   (`tcp_read`, `tcp_write`, `udp_send_to`, ...), each queueing its own egress.
//! - [`Pipeline`]: the one pipeline turn (RX, classify, handoff in, demux + protocol, egress,
//!   TX, recycle, refill) with stage timing and the Model-T [`BatchTuner`]. What other cores
//!   exist, and which owns a frame, is the caller's [`Peers`].
//! - [`sim`]: two stacks through a seeded, impaired path under bidirectional workloads, with
//!   invariants checked after every step: the deterministic simulation.
//! - [`Node`] and [`Pair`]: one stack with its pipeline, and two back to back over the
//!   in-memory link with a clock that jumps to the next deadline.

#![forbid(unsafe_code)]

pub mod classify;
mod config;
mod copy;
mod device;
mod device_stats;
#[cfg(test)]
mod device_tests;
pub mod flows;
pub mod frag;
pub mod frames;
pub mod fuzzing;
pub mod keyed;
mod node;
mod pipeline;
pub mod quic_cid;
pub mod route;
pub mod sim;
mod stack;
pub mod tcp;
pub mod tune;
pub mod udp;

pub use classify::{Class, FlowKey};
pub use config::{DEFAULT_TCP_MEM_LIMIT, EPHEMERAL_START, MAX_ADDRS, StackConfig, StackError};
pub use corelane_frame::Proto;
pub use device::{DeviceStats, RxToken, Tap, TxToken, XdpDevice};
pub use flows::FlowTable;
pub use node::{Node, Pair};
pub use pipeline::{
    Alone, Disposition, Peers, Pipeline, PipelineStats, Stage, TIMED_EVERY, Turn, Unclaimed,
};
pub use smoltcp;
pub use stack::{
    AcceptOptions, ConnectOptions, FlowId, Stack, StackStats, SynCookieTemplate, TcpInfo,
};
pub use tcp::{Congestion, EcnMode, TcpConfig, TcpState, TcpStats};
pub use tune::{BatchTuner, LevelStats, TuneConfig};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_memory_attack;
#[cfg(test)]
mod tests_no_frame;
#[cfg(test)]
mod tests_pass;
#[cfg(test)]
mod tests_quic_steer;
#[cfg(test)]
mod tests_quiet;
#[cfg(test)]
mod tests_reply_path;
#[cfg(test)]
mod tests_secrets;
#[cfg(test)]
mod tests_sleep;
#[cfg(test)]
mod tests_stop;
#[cfg(test)]
mod tests_zero_window;
