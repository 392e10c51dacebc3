//! corelane's protocol stages over AF_XDP frames.
//!
//! - [`classify`]: parse each frame once and verify its IPv4, TCP and UDP checksums; malformed
//!   and corrupted frames are counted and dropped before any protocol code sees them.
//! - [`XdpDevice`]: a smoltcp `Device` over any [`corelane_xsk::FrameIo`]. RX tokens read the
//!   UMEM frame in place; TX tokens write straight into a UMEM frame; frames are pulled and sent
//!   in batches, with one kick per batch.
//! - [`Stack`]: smoltcp behind an O(1) flow table (one single-socket set per flow, so smoltcp
//!   never scans), egress only for flows with work, a timer heap, a TCP backlog (SYN queue and
//!   accept queue per listener, wake-one accept) and OS-seeded initial sequence numbers. Several
//!   stacks, one per core, share an interface by a port-ownership rule (see [`Stack::ingress`]).
//!
//! The stack is sans-IO at its core: the clock is an argument and frames come from a `FrameIo`,
//! so [`corelane_xsk::MemLink`] can drive two stacks back to back in tests and benchmarks.

pub mod classify;
mod device;
pub mod flows;
pub mod frames;
mod stack;
pub mod tune;

pub use classify::{Class, FlowKey};
pub use device::{DeviceStats, RxToken, TxToken, XdpDevice};
pub use flows::FlowTable;
pub use smoltcp;
pub use stack::{
    EPHEMERAL_START, FlowId, Node, Proto, Stack, StackConfig, StackError, StackStats,
    os_random_seed,
};
pub use tune::{BatchTuner, LevelStats, TuneConfig};

#[cfg(test)]
mod tests;
