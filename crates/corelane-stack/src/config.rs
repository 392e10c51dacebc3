//! Sizes, limits and errors of a [`Stack`](crate::Stack).

use std::io;

/// First port of the ephemeral range from which connections this side opens take their port.
pub const EPHEMERAL_START: u16 = 49152;

/// Most addresses a stack owns (the XDP program's address maps hold as many).
pub const MAX_ADDRS: usize = 64;

/// The default cap on what one stack's TCP buffers hold (see
/// [`StackConfig::tcp_mem_limit`]): 1 GiB. The runtime sets its own default from the machine's
/// memory.
pub const DEFAULT_TCP_MEM_LIMIT: usize = 1 << 30;

/// Sizes and limits of a [`Stack`](crate::Stack).
#[derive(Debug, Clone, Copy)]
pub struct StackConfig {
    /// Largest receive window per TCP connection, in bytes (sets the window scale). The
    /// window starts at [`TcpConfig::rx_initial`](crate::tcp::TcpConfig::rx_initial) and grows
    /// toward the measured bandwidth-delay product; memory is allocated as data arrives.
    pub tcp_rx_buffer: usize,
    /// Largest send buffer per TCP connection, in bytes (allocated as the application writes).
    /// A connection's buffer may hold two congestion windows (at least 64 KiB) up to this, so
    /// it follows the path's bandwidth-delay product.
    pub tcp_tx_buffer: usize,
    /// Most bytes the TCP buffers of this stack (one core) may hold, or None for no cap
    /// (default [`DEFAULT_TCP_MEM_LIMIT`]). Past it a write takes only what fits in the
    /// buffer it has (a writer with none waits until memory is given back), receive windows
    /// stop growing, and a received segment that would need more memory is dropped (its
    /// sender retransmits it; a window is a promise of room, not a reservation, so peers
    /// that send out of order or faster than the application reads cannot pass the cap).
    /// [`StackStats::tcp_mem`](crate::StackStats::tcp_mem) counts the bytes held,
    /// `tcp_mem_limited` the refusals, `tcp_mem_dropped` the segments dropped.
    pub tcp_mem_limit: Option<usize>,
    /// Most TCP connections this stack (one core) holds at once, in any state (TIME-WAIT
    /// included). Past it a SYN (or a SYN cookie's ACK) is dropped and `connect` fails with
    /// [`StackError::TooManyConnections`]; [`StackStats::tcp_conn_limited`](crate::StackStats)
    /// counts both. Bounds what a peer that opens connections and sends nothing can make the
    /// core hold (each costs about [`Stack::conn_size`](crate::Stack::conn_size) bytes
    /// without its buffers).
    pub max_tcp: usize,
    /// Default most connections per listener that are half-open or waiting to be accepted.
    pub backlog: usize,
    /// Datagrams buffered per UDP socket, each way.
    pub udp_packets: usize,
    /// Payload bytes buffered per UDP socket, each way.
    pub udp_bytes: usize,
    /// Frames per RX batch and per TX kick.
    pub batch: usize,
    /// Flows the table is sized for at start (it grows past this if it must).
    pub flows: usize,
    /// This stack's core index, in `0..cores`.
    pub core: usize,
    /// How many cores (stacks) share the interface. With `core`, this stack's share of the
    /// ephemeral range: the ports `p` with `p % cores == core`. Which core owns which frame is
    /// the runtime's policy (see [`crate::Peers`]), not the stack's.
    pub cores: usize,
    /// Seed of the stack's generators (initial sequence numbers, ephemeral ports). None: a
    /// fresh seed from the OS for each stack; a fixed seed makes a test reproducible.
    pub seed: Option<u64>,
    /// A 128-bit master key every key of the stack is drawn from (SYN cookies, ISNs,
    /// timestamp offsets, IP IDs, ephemeral ports, table keys). Set, it takes precedence over
    /// `seed`: what a runtime does, so that all its cores (and the new process of an upgrade)
    /// share one secret of full strength. [`StackConfig::random_key`] makes one.
    pub key: Option<[u64; 2]>,
    /// A 128-bit key that outlives the process, from which the ISN and timestamp-offset keys
    /// are drawn instead of from `key`/`seed` (the others stay the run's own). With it, and a
    /// clock that runs on across processes (a runtime counts from the host's monotonic zero),
    /// the next process gives a four-tuple timestamps and ISNs above those of the last one,
    /// so a peer still holding that four-tuple in TIME-WAIT accepts its SYN (RFC 7323's PAWS
    /// would drop it, as RFC 6191 describes). A runtime keeps one per host and user in its run
    /// directory, readable only by that user.
    pub restart_key: Option<[u64; 2]>,
    /// How TCP connections behave: congestion control, timers, options, SYN cookies.
    pub tcp: crate::tcp::TcpConfig,
    /// How much fragment reassembly may hold.
    pub frag: crate::frag::FragLimits,
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            tcp_rx_buffer: 6 << 20,
            tcp_tx_buffer: 4 << 20,
            tcp_mem_limit: Some(DEFAULT_TCP_MEM_LIMIT),
            max_tcp: 262_144,
            backlog: 256,
            udp_packets: 256,
            udp_bytes: 256 * 1024,
            batch: 64,
            flows: 4096,
            core: 0,
            cores: 1,
            seed: None,
            key: None,
            restart_key: None,
            tcp: crate::tcp::TcpConfig::default(),
            frag: crate::frag::FragLimits::default(),
        }
    }
}

/// Errors of the protocol stage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StackError {
    /// The port already has a listener or socket.
    #[error("{proto} port {port} is already in use on this core")]
    InUse {
        /// "TCP" or "UDP".
        proto: &'static str,
        /// The port.
        port: u16,
    },
    /// Every ephemeral port this core may use is taken.
    #[error(
        "no free ephemeral {proto} port on core {core} (each core uses 1/{cores} of 49152-65535)"
    )]
    NoPort {
        /// "TCP" or "UDP".
        proto: &'static str,
        /// This core.
        core: usize,
        /// Cores sharing the range.
        cores: usize,
    },
    /// No owned address of the remote's family to connect from.
    #[error("no local {0} address to connect from: add one with .addr()")]
    NoAddress(&'static str),
    /// An address to listen or bind on that the stack does not own.
    #[error("{0} is not an owned address: use one of the runtime's, or the unspecified address")]
    NotOwned(std::net::IpAddr),
    /// The remote is on none of the interface's links and no route leads to it.
    #[error(
        "no route to {0}: it is on none of this interface's subnets; add a gateway \
         (Builder::gateway) or a route (Builder::route), or let the runtime read the kernel's"
    )]
    NoRoute(std::net::IpAddr),
    /// The core holds as many TCP connections as `StackConfig::max_tcp` allows.
    #[error(
        "core {core} holds {max} TCP connections, its limit (StackConfig::max_tcp): close some first"
    )]
    TooManyConnections {
        /// This core.
        core: usize,
        /// The limit.
        max: usize,
    },
    /// smoltcp refused an operation.
    #[error("{0}")]
    Refused(String),
}

impl From<StackError> for io::Error {
    fn from(e: StackError) -> io::Error {
        let kind = match e {
            StackError::InUse { .. } => io::ErrorKind::AddrInUse,
            StackError::NoPort { .. } | StackError::NoAddress(_) => io::ErrorKind::AddrNotAvailable,
            StackError::NoRoute(_) => io::ErrorKind::NetworkUnreachable,
            StackError::NotOwned(_) => io::ErrorKind::AddrNotAvailable,
            StackError::Refused(_) => io::ErrorKind::InvalidInput,
            StackError::TooManyConnections { .. } => io::ErrorKind::QuotaExceeded,
        };
        io::Error::new(kind, e)
    }
}

impl StackConfig {
    /// A fresh 128-bit master key from the OS (None when it has no randomness to give).
    pub fn random_key() -> Option<[u64; 2]> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).ok()?;
        let (a, c) = b.split_at(8);
        Some([
            u64::from_le_bytes(a.try_into().ok()?),
            u64::from_le_bytes(c.try_into().ok()?),
        ])
    }

    /// The seed to use: the configured one, or a fresh one from the OS (through the standard
    /// library's randomly keyed hasher, so this works on any OS).
    pub fn seed_or_random(&self) -> u64 {
        self.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x0063_6f72_6c61_6e65);
            h.finish()
        })
    }
}
