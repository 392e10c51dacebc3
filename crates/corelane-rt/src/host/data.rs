//! The host's data: what its traits and the program's handle say, and the kernel facts the
//! runtime keeps, as the AF_XDP layer defines them. No behaviour, and no import of the
//! runtime: every part of the runtime may take these, the error type included.

pub(crate) use corelane_xsk::{
    BindMode, CallOff, Channels, CookieParams, Error as XskError, FrameCounts, FrameIo,
    GENERATIONS, KernelRoute, Steering, SteeringShare, TX_NUDGE_AFTER, UpgradeOffer, UpgradePhase,
    XdpCounters, monotonic_ns,
};
