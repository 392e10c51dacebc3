//! corelane: a user-space TCP/IP stack over Linux AF_XDP.
//!
//! An XDP program steers the frames for the addresses and ports an application owns to AF_XDP
//! sockets; everything else (ping, ssh, kernel listeners) goes to the kernel untouched. The
//! frames are processed by smoltcp-based protocol stages on the core that polls the socket.
//!
//! This release runs one [`Endpoint`] per process: one interface, every receive queue of it
//! served by the calling thread.
//!
//! ```no_run
//! use corelane::Endpoint;
//! let addr = "10.0.0.1/24".parse().expect("an address with prefix");
//! let mut ep = Endpoint::builder("veth0").addr(addr).build()?;
//! println!("{}", ep.describe());
//! let listener = ep.listen_tcp(7)?;
//! loop {
//!     ep.poll()?;
//!     while let Some(conn) = ep.stack_mut().accept(listener) {
//!         // read and write through ep.stack_mut().tcp(conn)
//! #       let _ = conn;
//!     }
//!     ep.egress()?;
//! #   break;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::net::IpAddr;

pub use corelane_stack::smoltcp;
pub use corelane_stack::{DeviceStats, ListenerId, Stack, StackConfig, StackError};
pub use corelane_xsk::{
    AttachMode, AttachedMode, BindMode, FrameCounts, MultiQueue, Proto, XdpCounters, XskConfig,
    XskQueue, ZeroCopy,
};
use smoltcp::iface::SocketHandle;
use smoltcp::time::Instant;
use smoltcp::wire::IpCidr;

/// Errors at the API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the AF_XDP layer: privileges, interface, XDP mode, socket binding.
    #[error(transparent)]
    Xsk(#[from] corelane_xsk::Error),
    /// From the protocol stage.
    #[error(transparent)]
    Stack(#[from] StackError),
    /// Bad configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// I/O on the rings.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Xsk(x) => x.into(),
            Error::Io(io) => io,
            Error::Stack(s @ StackError::InUse { .. }) => {
                io::Error::new(io::ErrorKind::AddrInUse, s)
            }
            other => io::Error::other(other),
        }
    }
}

/// Result with corelane's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to build an [`Endpoint`].
#[derive(Debug, Clone)]
pub struct EndpointBuilder {
    ifname: String,
    addrs: Vec<IpCidr>,
    queues: Option<Vec<u32>>,
    attach: AttachMode,
    xsk: XskConfig,
    stack: StackConfig,
}

impl EndpointBuilder {
    /// An address (with prefix) the endpoint owns. May repeat (IPv4 and IPv6, up to 4).
    /// Use an address the kernel does not also hold on this interface: frames for it, and ARP or
    /// NDP for it, go to corelane only.
    pub fn addr(mut self, cidr: IpCidr) -> Self {
        self.addrs.push(cidr);
        self
    }

    /// The receive queues to serve (default: all of them). Frames that arrive on a queue that is
    /// not served go to the kernel.
    pub fn queues(mut self, q: Vec<u32>) -> Self {
        self.queues = Some(q);
        self
    }

    /// XDP attach mode (default: native, falling back to generic).
    pub fn attach_mode(mut self, m: AttachMode) -> Self {
        self.attach = m;
        self
    }

    /// UMEM and ring sizes, and the zero-copy preference.
    pub fn xsk(mut self, c: XskConfig) -> Self {
        self.xsk = c;
        self
    }

    /// Socket buffer sizes, backlog and batch size.
    pub fn stack(mut self, c: StackConfig) -> Self {
        self.stack = c;
        self
    }

    /// Attaches the XDP program, binds the AF_XDP socket and starts the stack. On any error,
    /// whatever was set up is torn down again before the error is returned.
    pub fn build(self) -> Result<Endpoint> {
        if self.addrs.is_empty() {
            return Err(Error::Config(
                "no address: give the endpoint at least one address it owns (e.g. 10.0.0.1/24)"
                    .into(),
            ));
        }
        if self.addrs.len() > 4 {
            return Err(Error::Config("at most 4 addresses per endpoint".into()));
        }
        corelane_xsk::check_privileges()?;
        let queues = corelane_xsk::rx_queue_count(&self.ifname)?;
        let served = self.queues.clone().unwrap_or_else(|| (0..queues).collect());
        if served.is_empty() {
            return Err(Error::Config("no queue to serve".into()));
        }
        if let Some(q) = served.iter().find(|&&q| q >= queues) {
            return Err(Error::Config(format!(
                "{} has {queues} receive queue(s); queue {q} does not exist",
                self.ifname
            )));
        }
        let mac = corelane_xsk::mac_address(&self.ifname)?;
        let mtu = corelane_xsk::mtu(&self.ifname)? as usize;
        let mut steering = corelane_xsk::Steering::attach(&self.ifname, self.attach)?;
        let mut sockets = Vec::with_capacity(served.len());
        for &q in &served {
            sockets.push(XskQueue::open(&self.ifname, q, &self.xsk)?);
        }
        let io = MultiQueue::new(sockets);
        let capacity = corelane_xsk::FrameIo::frame_capacity(&io);
        if mtu + 14 > capacity {
            let fix = if mtu + 14 <= 4096 - 256 {
                "use 4096-byte frames (XskConfig::frame_size)".to_string()
            } else {
                format!(
                    "lower the MTU to at most {} (frames larger than a page are not supported)",
                    4096 - 256 - 14
                )
            };
            return Err(Error::Config(format!(
                "MTU {mtu} of {} does not fit a {}-byte frame; {fix}",
                self.ifname, self.xsk.frame_size
            )));
        }
        for q in io.queues() {
            steering.register(q.queue_id(), q.fd())?;
        }
        for a in &self.addrs {
            steering.own_addr(a.address().into())?;
        }
        let stack = Stack::new(io, mac, &self.addrs, mtu, self.stack);
        Ok(Endpoint {
            steering,
            stack,
            ifname: self.ifname,
            queues,
            addrs: self.addrs,
        })
    }
}

/// One interface queue served by corelane: the XDP program, the AF_XDP socket and the stack.
/// Dropping it detaches the program and closes the socket.
#[derive(Debug)]
pub struct Endpoint {
    // Field order: the stack (and its socket) close before the program is detached.
    stack: Stack<MultiQueue>,
    steering: corelane_xsk::Steering,
    ifname: String,
    queues: u32,
    addrs: Vec<IpCidr>,
}

impl Endpoint {
    /// Starts building an endpoint on interface `ifname`.
    pub fn builder(ifname: &str) -> EndpointBuilder {
        EndpointBuilder {
            ifname: ifname.to_string(),
            addrs: Vec::new(),
            queues: None,
            attach: AttachMode::Auto,
            xsk: XskConfig::default(),
            stack: StackConfig::default(),
        }
    }

    /// One line per fact: interface, XDP mode (and why, after a fallback), queues, bind mode,
    /// addresses.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "interface {}: XDP program attached in {} mode",
            self.ifname,
            self.steering.mode()
        );
        if let Some(why) = self.steering.fallback_reason() {
            s.push_str(&format!(" (native mode refused: {why})"));
        }
        let io = self.stack.io();
        let served: Vec<String> = io
            .queues()
            .iter()
            .map(|q| q.queue_id().to_string())
            .collect();
        let mode = io.queues()[0].mode();
        s.push_str(&format!(
            "\nqueues: {} on the interface; serving queue(s) {} on one core, one AF_XDP socket each, in {} mode",
            self.queues,
            served.join(","),
            mode
        ));
        if mode == BindMode::Copy {
            s.push_str(" (zero-copy not supported by this driver)");
        }
        if self.steering.mode() == AttachedMode::Generic && self.queues > 1 {
            s.push_str("\nnote: generic XDP on veth delivers every frame on queue 0");
        }
        let addrs: Vec<String> = self.addrs.iter().map(|a| a.to_string()).collect();
        s.push_str(&format!("\naddresses: {}", addrs.join(", ")));
        s
    }

    /// Listens on TCP `port` and steers it to this endpoint.
    pub fn listen_tcp(&mut self, port: u16) -> Result<ListenerId> {
        let id = self.stack.listen_tcp(port)?;
        self.steering.own_port(Proto::Tcp, port)?;
        Ok(id)
    }

    /// Binds UDP `port` and steers it to this endpoint.
    pub fn bind_udp(&mut self, port: u16) -> Result<SocketHandle> {
        let h = self.stack.bind_udp(port)?;
        self.steering.own_port(Proto::Udp, port)?;
        Ok(h)
    }

    /// Opens a TCP connection to `remote`; the local port is steered to this endpoint.
    pub fn connect_tcp(&mut self, remote: std::net::SocketAddr) -> Result<SocketHandle> {
        let h = self.stack.connect_tcp(remote, 0)?;
        let port = self
            .stack
            .tcp(h)
            .local_endpoint()
            .map(|e| e.port)
            .unwrap_or(0);
        self.steering.own_port(Proto::Tcp, port)?;
        Ok(h)
    }

    /// The stack, for socket access.
    pub fn stack_mut(&mut self) -> &mut Stack<MultiQueue> {
        &mut self.stack
    }

    /// One pass of the pipeline (see [`Stack::poll`]).
    pub fn poll(&mut self) -> Result<bool> {
        Ok(self.stack.poll(Instant::now())?)
    }

    /// Sends what the application queued since the last poll.
    pub fn egress(&mut self) -> Result<()> {
        Ok(self.stack.egress(Instant::now())?)
    }

    /// Sleeps until a frame arrives, the next protocol timer is due, or `max` passes.
    pub fn wait(&mut self, max: std::time::Duration) -> Result<()> {
        if self.stack.rx_pending() > 0 {
            return Ok(());
        }
        let timer = self
            .stack
            .poll_delay(Instant::now())
            .map(|d| std::time::Duration::from_micros(d.total_micros()))
            .unwrap_or(max)
            .min(max);
        let ms = timer.as_millis().min(i32::MAX as u128) as i32;
        self.stack.io_mut().wait(ms)?;
        Ok(())
    }

    /// The XDP program's counters.
    pub fn xdp_counters(&self) -> Result<XdpCounters> {
        Ok(self.steering.counters()?)
    }

    /// The device's counters.
    pub fn device_stats(&self) -> DeviceStats {
        self.stack.device_stats()
    }

    /// Owned addresses.
    pub fn addrs(&self) -> Vec<IpAddr> {
        self.addrs.iter().map(|c| c.address().into()).collect()
    }

    /// Resets open connections, gives every frame back and returns the final frame accounting.
    pub fn shutdown(mut self) -> Result<FrameCounts> {
        Ok(self.stack.shutdown(Instant::now())?)
    }
}
