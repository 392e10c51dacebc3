//! corelane: a Rust async runtime and user-space TCP/IP stack over Linux AF_XDP.
//!
//! An XDP program steers the frames for the addresses and ports an application owns to AF_XDP
//! sockets, one per interface queue; everything else (ping, ssh, kernel listeners) goes to the
//! kernel untouched. Each queue is served by one pinned core that runs the protocol stages
//! (corelane's own TCP engine, UDP, ARP/NDP, ICMP and IP fragments behind an O(1) flow table)
//! and the application's tasks (a single-threaded tokio executor) on the same core, with no
//! work stealing.
//!
//! # When to use it, and when not
//! Use it for a server (or client) that owns its addresses on an interface and wants the
//! kernel's per-packet costs off its path: request/response and streaming services that run
//! one task set per core, where a tokio service ports by changing its imports (see README's
//! "Porting a tokio service"). It is a host on a routed network, IPv4 and IPv6, with path MTU
//! discovery, fragments, and up to 64 addresses.
//!
//! Not yet, or not for: Linux only, root (or the capabilities below); tested on veth in copy
//! mode and on virtio-net in zero-copy mode (an emulated guest), not yet on physical NICs; no TLS of its own (use rustls over the
//! streams), no DNS (resolve first), no UDP broadcast or multicast sends, no IPv6 extension
//! headers but fragments. Sockets are `Send` and `Sync`: `tokio::spawn` on a core runs the task
//! on that core, and a socket on another core's task works through its own. ECN (RFC 3168) is negotiated when the peer asks for it.
//!
//! This crate is the facade; the rooms behind it are `corelane-frame` (frames, no system
//! dependencies), `corelane-stack` (the sans-IO protocol core and its one pipeline turn),
//! `corelane-xsk` (XDP and AF_XDP), `corelane-rt` (the per-core runtime and sockets),
//! `corelane-topo` (placement) and `corelane-macros` (the attributes). `docs/ARCHITECTURE.md` follows one frame through them.
//!
//! ```no_run
//! use corelane::Runtime;
//! use corelane::net::TcpListener;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let rt = Runtime::builder("veth0").addr("10.0.0.1/24").build()?;
//! println!("{}", rt.describe());
//! // SIGTERM/SIGINT left at their default end the run in 1 s, then the process; a handler
//! // of your own calls these instead.
//! let stop = rt.stop_handle();
//! # let _ = &stop;
//! let report = rt.run(|core| async move {
//!     let listener = TcpListener::bind(7).await.expect("port 7");
//!     println!("core {} listening", core.index);
//!     loop {
//!         let Ok((mut s, _peer)) = listener.accept().await else { break };
//!         tokio::task::spawn_local(async move {
//!             let mut buf = vec![0; 16384];
//!             while let Ok(n @ 1..) = s.read(&mut buf).await {
//!                 if s.write_all(&buf[..n]).await.is_err() { break }
//!             }
//!         });
//!     }
//! })?;
//! assert!(report.frames_balanced());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Where each queue's protocol and the application run is a [`Placement`] (same core by
//! default; shared cache, spread, fewest cores, or given CPUs), planned from the machine hwloc
//! reads with NIC-local CPUs first; [`Runtime::plan`] prints why.
//!
//! Use an address the kernel does not also hold on that interface (`build` refuses one it
//! holds): corelane answers ARP and NDP for it. A runtime that attaches its own XDP program needs
//! root or CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and CAP_PERFMON; under a grant from
//! `corelane-broker grant` (see [`Xdp`]) it needs only CAP_NET_RAW and locked memory. Errors name
//! what is missing in one line.

#![forbid(unsafe_code)]

#[cfg(feature = "lab")]
pub use corelane_rt::lab;
#[cfg(feature = "quic")]
pub use corelane_rt::quic;

/// Runs an `async fn main` on every core of a corelane runtime: `#[tokio::main]`, ported by
/// changing the attribute. The runtime takes the interface, the addresses and the core count
/// from the attribute, and the `CORELANE_IFACE`, `CORELANE_ADDR` (a comma-separated list) and
/// `CORELANE_CORES` variables over them, so a built binary can be pointed elsewhere. As with
/// [`Runtime::run`], the body runs once on every core.
///
/// `async fn main()` prints an error (one that stops the runtime or a core) and exits with 1;
/// `async fn main() -> Result<(), E>` returns it, where `E` takes [`Error`] with `?`
/// (`Box<dyn std::error::Error>`, `anyhow::Error`), and a core's own error stops the run as
/// [`Runtime::try_run`] does.
///
/// ```no_run
/// use corelane::net::TcpListener;
/// use tokio::io::AsyncWriteExt;
///
/// #[corelane::main(iface = "veth0", addr = "10.0.0.5/24")]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let listener = TcpListener::bind(7).await?;
///     loop {
///         let (mut s, _) = listener.accept().await?;
///         tokio::spawn(async move { s.write_all(b"hello\n").await });
///     }
/// }
/// ```
pub use corelane_macros::main;

/// Runs an `async fn` test in a corelane lab ([`lab`]: one core over an in-memory queue,
/// owning `127.0.0.1/8` and `::1`, with no root, interface or XDP program): `#[tokio::test]`,
/// ported by changing the attribute. A test that returns a `Result` keeps it.
///
/// ```
/// # mod wrap {
/// use corelane::net::{TcpListener, TcpStream};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// #[corelane::test]
/// async fn echoes() -> std::io::Result<()> {
///     let listener = TcpListener::bind("127.0.0.1:0").await?;
///     let addr = listener.local_addr()?;
///     tokio::spawn(async move {
///         let (mut s, _) = listener.accept().await?;
///         let (mut r, mut w) = s.split();
///         tokio::io::copy(&mut r, &mut w).await
///     });
///     let mut c = TcpStream::connect(addr).await?;
///     c.write_all(b"ping").await?;
///     let mut b = [0u8; 4];
///     c.read_exact(&mut b).await?;
///     assert_eq!(&b, b"ping");
///     Ok(())
/// }
/// # }
/// ```
#[cfg(feature = "lab")]
pub use corelane_macros::test;

/// What the attributes expand to call; not an interface of its own.
#[doc(hidden)]
pub mod __macro {
    /// A builder for `#[corelane::main]`: the `CORELANE_*` variables over the attribute's
    /// values.
    pub fn builder(
        iface: Option<&str>,
        addrs: &[&str],
        cores: Option<usize>,
    ) -> Result<crate::Builder, crate::Error> {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        let iface = var("CORELANE_IFACE")
            .or(iface.map(str::to_string))
            .ok_or_else(|| {
                crate::Error::Config(
                    "#[corelane::main] has no interface: give it `iface = \"IF\"`, or set \
                 CORELANE_IFACE"
                        .into(),
                )
            })?;
        let addrs: Vec<String> = match var("CORELANE_ADDR") {
            Some(v) => v.split(',').map(|a| a.trim().to_string()).collect(),
            None => addrs.iter().map(|a| a.to_string()).collect(),
        };
        let mut b = crate::Runtime::builder(&iface);
        for a in addrs.iter().filter(|a| !a.is_empty()) {
            b = b.addr(a.as_str());
        }
        let cores = match var("CORELANE_CORES") {
            Some(v) => Some(v.trim().parse::<usize>().map_err(|_| {
                crate::Error::Config(format!("CORELANE_CORES={v}: not a number of cores"))
            })?),
            None => cores,
        };
        if let Some(n) = cores {
            b = b.cores(n);
        }
        Ok(b)
    }
}
pub use corelane_rt::{
    AddrHandle, BatchStats, Builder, Cidr, CoreInfo, CoreReport, CoreStats, Error, IntoCidr, Lane,
    Machine, OnPanic, Placement, Plan, PollMode, RX_WAIT_SAMPLE_EVERY, RunReport, Runtime, Sharing,
    Stage, StopHandle, Xdp, allowed_cpus, bandwidth_delay_product, core_index, core_stats,
    parse_cidr, shutdown_requested,
};
pub use corelane_stack::frag::{FragLimits, FragStats};
pub use corelane_stack::udp::UdpStats;
pub use corelane_stack::{
    Congestion, DeviceStats, EcnMode, PipelineStats, StackConfig, StackError, StackStats,
    TcpConfig, TcpInfo, TcpState, TcpStats,
};
/// The machine could not be read, or a placement does not fit it ([`Error::Topology`]).
pub use corelane_topo::Error as TopologyError;
/// What the AF_XDP layer refused: privileges, interface, XDP mode, socket binding
/// ([`Error::Xsk`]).
pub use corelane_xsk::Error as XskError;
pub use corelane_xsk::{
    AttachMode, AttachedMode, BindMode, FrameCounts, XdpCounters, XskConfig, ZeroCopy,
};

/// The rest of the machine's topology and the placement planner (hwloc), to plan against
/// this machine or a described one: [`Machine`], [`Placement`], [`Plan`], [`Lane`] and
/// [`Sharing`] are at the crate's root.
pub mod topo {
    pub use corelane_topo::{Cache, Cpu, DEFAULT_PER_CORE_BITS, Nic, Request, plan};
}

/// TCP and UDP sockets of the current core, with tokio's `AsyncRead` and `AsyncWrite`, laid
/// out as `tokio::net`: the sockets here, the halves of a split stream in [`net::tcp`].
pub mod net {
    // Everything of the runtime's `net`: with the `hyper` feature its `Connector` for
    // hyper-util's client, with `tonic` its `Incoming` for tonic's server.
    pub use corelane_rt::net::*;

    /// The halves of a [`TcpStream`], as `tokio::net::tcp` has them.
    ///
    /// ```
    /// use corelane::net::TcpStream;
    /// use corelane::net::tcp::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, WriteHalf};
    ///
    /// fn owned(s: TcpStream) -> (OwnedReadHalf, OwnedWriteHalf) {
    ///     s.into_split()
    /// }
    /// fn borrowed(s: &mut TcpStream) -> (ReadHalf<'_>, WriteHalf<'_>) {
    ///     s.split()
    /// }
    /// ```
    pub mod tcp {
        pub use corelane_rt::net::tcp::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, WriteHalf};
    }
}

// README's Rust examples are compiled as doctests of this crate, against this facade.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_examples {}

/// Result with corelane's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
