//! AF_XDP for corelane: the embedded XDP steering program, AF_XDP sockets over a UMEM whose
//! frames are accounted for one by one, and the interface facts the runtime needs.
//!
//! One module per kernel object: `steering` (the XDP program and its maps), `socket` (an
//! AF_XDP socket and its UMEM), `ethtool` (queues, driver), `netdev` (index, MAC, MTU), `routes` (the kernel's routes, over
//! rtnetlink), `caps`
//! (privileges), `claim` (one runtime per interface, and undoing a dead one's changes); `sys` holds the raw system calls. The frame interface, the ledger and the
//! in-memory link live in `corelane_frame` (re-exported here).
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

#![deny(unsafe_code)]

mod attach;
mod caps;
mod claim;
mod cookie;
mod error;
mod ethtool;
pub mod grant;
mod grant_words;
mod handover;
#[cfg(test)]
mod lab_tests;
mod linger;
mod netdev;
mod netlink;
pub mod peer;
mod program;
mod routes;
mod socket;
mod unixsock;
#[cfg(any(test, feature = "sim"))]
pub use socket::sim;
mod shared;
mod steering;
mod sys;
mod vlan;
mod vlan_filter;
mod xsk_features;

pub use caps::{
    ATTACH_CAPS, Cap, SOCKET_CAPS, check_attach_privileges, check_memlock, check_privileges,
    check_runtime_needs, check_socket_privileges, effective_caps, has_cap, missing_caps,
    retain_caps,
};
pub use claim::{Claim, iface_dir, netns_id, run_dir, set_channels_retrying};
pub use cookie::{CookieParams, monotonic_ns};
pub use corelane_frame::{
    Frame, FrameCounts, FrameIo, FrameLedger, FrameState, LedgerError, MemFrame, MemLink, MemPort,
    MemStats, Proto, SplitMix64, UmemId,
};
pub use error::Error;
pub use ethtool::{
    Channels, DriverInfo, channels, driver_info, rx_queue_count, set_channels, set_rx_queues,
};
pub use grant::{GrantClient, effective_uid};
pub use handover::{Handover, recv_handover, send_handover};
pub use netdev::{check_interface, mac_address, mtu};
pub use routes::{
    KernelRoute, RouteWatch, kernel_addrs, kernel_addrs_anywhere, kernel_addrs_with_prefix,
    kernel_routes,
};
pub use socket::{
    BindMode, CallOff, KernelStats, MAX_PIECES, PendingJoin, TX_NUDGE_AFTER, UpgradeOffer,
    UpgradePhase, XskConfig, XskFrame, XskQueue, XskStats, ZeroCopy, frames_in_two_hands,
};
pub use steering::{
    AttachMode, AttachedMode, GENERATIONS, MAPS, MAX_ADDRS, MAX_NEIGHBOURS, MAX_OLD_FLOWS,
    MAX_QUEUES, PROGRAM, STAT_SLOTS, Steering, SteeringShare, XDP_OBJECT, XdpCounters, iface_entry,
};
#[cfg(any(test, feature = "sim"))]
pub use steering::{MemProgram, Verdict};
pub use vlan::{MAX_VLAN, Vlan};
