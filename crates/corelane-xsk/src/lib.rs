//! AF_XDP for corelane: the embedded XDP steering program, AF_XDP sockets over a UMEM whose
//! frames are accounted for one by one, and an in-memory link with the same interface for tests
//! and benchmarks.
//!
//! ```no_run
//! use corelane_xsk::{AttachMode, Proto, Steering, XskConfig, XskQueue};
//! let mut steering = Steering::attach("veth0", AttachMode::Auto)?;
//! steering.own_addr("10.0.0.1".parse().unwrap())?;
//! steering.own_port(Proto::Tcp, 7)?;
//! let queue = XskQueue::open("veth0", 0, &XskConfig::default())?;
//! steering.register(0, queue.fd())?;
//! println!("XDP {} mode, AF_XDP {} mode", steering.mode(), queue.mode());
//! # Ok::<(), corelane_xsk::Error>(())
//! ```

mod bpf;
mod error;
mod socket;

pub use bpf::{AttachMode, AttachedMode, Steering, XDP_OBJECT, XdpCounters};
pub use corelane_frame::{
    Frame, FrameCounts, FrameIo, FrameLedger, FrameState, LedgerError, MemFrame, MemLink, MemPort,
    MemStats, Proto, UmemId,
};
pub use error::{
    Channels, DriverInfo, Error, channels, check_interface, check_privileges, driver_info,
    mac_address, mtu, rx_queue_count, set_channels,
};
pub use socket::{BindMode, XskConfig, XskFrame, XskQueue, XskStats, ZeroCopy};
