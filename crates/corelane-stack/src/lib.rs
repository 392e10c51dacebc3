//! corelane's protocol stages over AF_XDP frames.
//!
//! - [`classify`]: parse each frame once and verify its IPv4, TCP and UDP checksums; malformed
//!   and corrupted frames are counted and dropped before any protocol code sees them.
//! - [`XdpDevice`]: a smoltcp `Device` over any [`corelane_xsk::FrameIo`]. RX tokens read the
//!   UMEM frame in place; TX tokens write straight into a UMEM frame; frames are pulled and sent
//!   in batches, with one kick per batch.
//! - [`Stack`]: smoltcp's interface and sockets over the device, with a TCP backlog (a SYN queue
//!   and an accept queue per listener) and OS-seeded initial sequence numbers.
//!
//! The stack is sans-IO at its core: the clock is an argument and frames come from a `FrameIo`,
//! so [`corelane_xsk::MemLink`] can drive two stacks back to back in tests and benchmarks.

pub mod classify;
mod device;
mod stack;

pub use device::{DeviceStats, RxToken, SynGate, TxToken, XdpDevice};
pub use smoltcp;
pub use stack::{ListenerId, Stack, StackConfig, StackError, os_random_seed};

#[cfg(test)]
mod tests;
