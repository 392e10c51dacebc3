//! How to build a [`Runtime`](crate::Runtime): the interface, addresses, placement, sizes and modes.

use std::time::Duration;

use corelane_stack::StackConfig;
use corelane_stack::smoltcp::wire::IpCidr;

use crate::cidr::IntoCidr;
use corelane_topo::{Machine, Placement, Plan};
use corelane_xsk::{AttachMode, Channels, XskConfig};

use crate::access::Access;
use crate::cpu::allowed_cpus;
use crate::queues::queues_needed;
use crate::{Error, PollMode};

/// How to build a [`Runtime`](crate::Runtime).
#[derive(Debug, Clone)]
pub struct Builder {
    pub(crate) ifname: String,
    pub(crate) addrs: Vec<IpCidr>,
    /// What `addr` or `route` could not take, reported by `build`.
    pub(crate) invalid: Vec<String>,
    pub(crate) placement: Placement,
    pub(crate) lanes: Option<usize>,
    pub(crate) queues: Option<Vec<u32>>,
    pub(crate) attach: AttachMode,
    pub(crate) vlan: corelane_xsk::Vlan,
    pub(crate) xsk: XskConfig,
    pub(crate) stack: StackConfig,
    pub(crate) poll: PollMode,
    pub(crate) handoff_slots: usize,
    pub(crate) linger: Duration,
    pub(crate) adaptive_batch: bool,
    pub(crate) routes: Vec<crate::routing::Wanted>,
    pub(crate) kernel_routes: bool,
    /// Addresses the kernel holds are shared with it rather than refused.
    pub(crate) share_kernel_addrs: bool,
    pub(crate) on_panic: crate::OnPanic,
    pub(crate) publish_stats: bool,
    pub(crate) metrics: Option<std::net::SocketAddr>,
    pub(crate) xdp: crate::Xdp,
    pub(crate) keep_capabilities: bool,
    /// How long the program answers for the runtime once it died (`builder_life.rs`).
    pub(crate) death_linger: Duration,
    pub(crate) xdp_cookies: Option<bool>,
    /// The TCP memory cap follows the machine's memory (neither it nor a whole
    /// `StackConfig` was given).
    pub(crate) tcp_mem_auto: bool,
    pub(crate) default_signals: bool,
    /// Where this runtime hands over to a new process, and the grace it drains for.
    pub(crate) upgrades: Option<(std::path::PathBuf, Duration)>,
    /// Where the runtime this one takes over from listens, and whether one must.
    pub(crate) upgrade_from: Option<(std::path::PathBuf, bool)>,
}

/// Bytes in flight for `bits_per_sec` over a round trip of `rtt`: the socket buffer size that
/// lets one connection fill the path.
pub fn bandwidth_delay_product(bits_per_sec: u64, rtt: Duration) -> usize {
    ((bits_per_sec as u128 * rtt.as_nanos()) / 8 / 1_000_000_000) as usize
}

impl Builder {
    /// An address (with prefix) the runtime owns. May repeat (IPv4 and IPv6, up to
    /// [`corelane_stack::MAX_ADDRS`]). Use an address the kernel does not also hold on this
    /// interface: frames for it, and ARP or NDP for it, go to corelane only.
    pub fn addr(mut self, cidr: impl IntoCidr) -> Self {
        match cidr.into_cidr() {
            Ok(c) => self.addrs.push(c.to_smoltcp()),
            Err(e) => self.invalid.push(config_message(e)),
        }
        self
    }

    /// The default gateway of its family (IPv4 or IPv6; may be given once for each): every
    /// destination on none of the owned subnets is reached through it. Same as
    /// `route("0.0.0.0/0", gw)` or `route("::/0", gw)`. The gateway must be on an owned
    /// subnet. Replaces the kernel's default route of that family.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// let rt = corelane::Runtime::builder("eth0")
    ///     .addr("10.1.0.5/24")
    ///     .gateway("10.1.0.1".parse().expect("an address"))
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn gateway(self, gw: std::net::IpAddr) -> Self {
        let any: std::net::IpAddr = match gw {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
        };
        self.route((any, 0), gw)
    }

    /// Destinations in `prefix` are reached through gateway `via` (on an owned subnet); the
    /// longest matching prefix wins. Replaces a kernel route for the same prefix.
    pub fn route(mut self, prefix: impl IntoCidr, via: std::net::IpAddr) -> Self {
        match prefix.into_cidr() {
            Ok(c) => self.routes.push(crate::routing::Wanted {
                dst: c.to_smoltcp(),
                via,
            }),
            Err(e) => self.invalid.push(config_message(e)),
        }
        self
    }

    /// Whether to follow the kernel's routes through the interface (default on): its default
    /// gateway and other unicast routes of the main table, read over netlink when the runtime
    /// is built, as `ip route show dev IF` lists them, and read again whenever they change
    /// while it runs (a router advertisement, `ip route add`, a DHCP client), the routes given
    /// with [`route`](Self::route) kept over the kernel's for the same prefix. Connections
    /// already open keep their next hop. [`Runtime::describe`](crate::Runtime::describe)
    /// prints the routes in use at the start.
    pub fn kernel_routes(mut self, on: bool) -> Self {
        self.kernel_routes = on;
        self
    }

    /// Whether an owned address the kernel holds too is shared with it (default off: refused,
    /// as both would answer for it). Shared, corelane takes only the TCP and UDP ports it
    /// serves there, on the interface's own MAC, and the kernel keeps everything else of the
    /// address: ARP and NDP, ping, ssh and its other listeners, its own connections, and the
    /// answers for closed ports. This is how a host with one address (a cloud VM's NIC) has
    /// corelane serve port 443 while ssh keeps port 22.
    ///
    /// Each port corelane serves on a shared address is held in the kernel by a socket bound
    /// to it that never listens, so no kernel socket can take the port, by `bind` or as an
    /// ephemeral port; the kernel gets it back when the port closes or the process ends in
    /// any way. A port a kernel socket holds already is refused (`AddrInUse`), naming the
    /// socket's process. Ports below 1024 keep `CAP_NET_BIND_SERVICE` for the run (under a
    /// grant the broker holds them). Fragmented datagrams to a shared address are the
    /// kernel's: a fragment does not say its port.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// // 10.0.0.5/24 is eth0's only address; sshd keeps port 22, corelane serves 443.
    /// let rt = corelane::Runtime::builder("eth0")
    ///     .addr("10.0.0.5/24")
    ///     .share_kernel_addrs(true)
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn share_kernel_addrs(mut self, on: bool) -> Self {
        self.share_kernel_addrs = on;
        self
    }

    /// What a panic in a core's future does (default [`OnPanic::RestartCore`](crate::OnPanic):
    /// the future runs again and the core keeps serving; [`OnPanic::StopRuntime`](crate::OnPanic)
    /// stops everything and `run` returns the panic as an error).
    pub fn on_panic(mut self, p: crate::OnPanic) -> Self {
        self.on_panic = p;
        self
    }

    /// CPUs to run on, one core (thread, queue) each, protocol and application together: the
    /// same as `placement(Placement::Explicit { protocol: cpus, application: vec![] })`.
    pub fn cpus(mut self, cpus: Vec<usize>) -> Self {
        self.placement = Placement::Explicit {
            protocol: cpus,
            application: Vec::new(),
        };
        self
    }

    /// Where the protocol and the application run (default [`Placement::SameCore`]); the plan
    /// is made from the machine hwloc reads, NIC-local CPUs first. [`Runtime::plan`](crate::Runtime::plan) shows it.
    pub fn placement(mut self, p: Placement) -> Self {
        self.placement = p;
        self
    }

    /// How many cores (lanes: one queue, one protocol thread each) to run (default: one per
    /// physical core the process may use, up to the interface's receive queues). When the
    /// interface has fewer queues and its driver allows more, they are raised (ethtool -L)
    /// for the run.
    pub fn cores(mut self, n: usize) -> Self {
        self.lanes = Some(n);
        self
    }

    /// The receive queues the cores serve, in core order (default: 0, 1, ...).
    pub fn queues(mut self, q: Vec<u32>) -> Self {
        self.queues = Some(q);
        self
    }

    /// XDP attach mode (default: native, falling back to generic).
    pub fn attach_mode(mut self, m: AttachMode) -> Self {
        self.attach = m;
        self
    }

    /// Where the XDP program comes from (default [`Xdp::Auto`](crate::Xdp::Auto): through the
    /// grant of a `corelane-broker grant` serving the interface when one does, attached by the
    /// runtime otherwise). Under a grant the process needs only `CAP_NET_RAW` and locked
    /// memory, and may steer only the addresses and ports granted.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// // As an unprivileged user, with `corelane-broker grant veth0 --addr 10.0.0.1 --tcp 7
    /// // --user $USER` running as root:
    /// let rt = corelane::Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .xdp(corelane::Xdp::Granted)
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn xdp(mut self, x: crate::Xdp) -> Self {
        self.xdp = x;
        self
    }

    /// Serves 802.1Q VLAN `id` (1 to 4094) on the interface instead of its untagged frames:
    /// the XDP program steers only frames carrying the tag (taking it off), leaves untagged
    /// frames and other VLANs to the kernel, and every frame the runtime sends carries the tag.
    /// The addresses given with [`Builder::addr`] are the VLAN's; the interface's MTU is the
    /// VLAN's as well (the tag is not counted, as for a kernel VLAN device). Under a grant
    /// broker the broker's program must serve the same VLAN (`corelane-broker grant --vlan`).
    ///
    /// ```no_run
    /// # mod corelane { pub use corelane_rt::*; }
    /// let rt = corelane::Runtime::builder("eth0").vlan(100).addr("10.100.0.3/24").build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn vlan(mut self, id: u16) -> Self {
        self.vlan.id = id;
        self
    }

    /// Serves the VLAN inside 802.1ad service VLAN `id` (1 to 4094; QinQ): the frames carry an
    /// outer tag (TPID 0x88a8) with `id` around the 802.1Q tag of [`Builder::vlan`] (or none
    /// when no VLAN is set). The program steers only frames with both tags, taking both off,
    /// and every frame sent carries both. A link lets a frame exceed its MTU by one tag's 4
    /// bytes, not two: the runtime's IP MTU is the interface's less 4 (set the MTU 4 bytes
    /// higher on the path to carry full 1500-byte packets). Under a grant broker the broker
    /// must serve the same tags (`corelane-broker grant --vlan ID --service-vlan ID`).
    ///
    /// ```no_run
    /// # mod corelane { pub use corelane_rt::*; }
    /// let rt = corelane::Runtime::builder("eth0")
    ///     .service_vlan(200)
    ///     .vlan(100)
    ///     .addr("10.100.0.3/24")
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn service_vlan(mut self, id: u16) -> Self {
        self.vlan.service = id;
        self
    }

    /// UMEM and ring sizes, the frame size and the zero-copy preference. With the default
    /// frame size (0), frames are 2048 bytes, or 4096 when the interface's MTU needs them
    /// (above 1778 bytes).
    pub fn xsk(mut self, c: XskConfig) -> Self {
        self.xsk = c;
        self
    }

    /// Protocol settings: socket buffers, backlog, batch size, flow table size, memory and
    /// connection caps (taken as given: `tcp_mem_limit` no longer follows the machine).
    pub fn stack(mut self, c: StackConfig) -> Self {
        self.stack = c;
        self.tcp_mem_auto = false;
        self
    }

    /// Caps TCP socket buffers at a bandwidth-delay product (window scaling follows). Below
    /// the cap each connection's buffers follow its own window (the send buffer two congestion
    /// windows, the receive window twice what arrives per round trip); the default caps are
    /// Linux's, 6 MiB to receive and 4 MiB to send.
    pub fn bdp(mut self, bits_per_sec: u64, rtt: Duration) -> Self {
        let b = bandwidth_delay_product(bits_per_sec, rtt).clamp(4096, 64 << 20);
        self.stack.tcp_rx_buffer = b;
        self.stack.tcp_tx_buffer = b;
        self
    }

    /// The congestion controller of new TCP connections (default CUBIC); each stream may
    /// change its own with [`TcpStream::set_congestion`](crate::net::TcpStream::set_congestion).
    ///
    /// ```no_run
    /// # mod corelane { pub use corelane_rt::*; pub use corelane_stack::Congestion; }
    /// use corelane::{Congestion, Runtime};
    /// let rt = Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .congestion(Congestion::NewReno)
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn congestion(mut self, c: corelane_stack::Congestion) -> Self {
        self.stack.tcp.congestion = c;
        self
    }

    /// Default TCP listen backlog.
    pub fn backlog(mut self, n: usize) -> Self {
        self.stack.backlog = n;
        self
    }

    /// How idle cores wait (default: adaptive, 200 µs spin).
    pub fn poll_mode(mut self, m: PollMode) -> Self {
        self.poll = m;
        self
    }

    /// Model-T batching (on by default): the batch size and the fill ring's occupancy adapt
    /// turn by turn to the load, keeping a batch's working set within the core's L2 (see
    /// [`corelane_stack::BatchTuner`]); `StackConfig::batch` is then the largest batch. Off:
    /// every turn uses `StackConfig::batch`.
    pub fn adaptive_batch(mut self, on: bool) -> Self {
        self.adaptive_batch = on;
        self
    }

    /// Frames each cross-core ring holds (default 1024).
    pub fn handoff_slots(mut self, n: usize) -> Self {
        self.handoff_slots = n;
        self
    }

    /// Publishes live statistics for readers outside the process (default on): each core
    /// writes its counters into its own slot of `/run/corelane/net-COOKIE/IFNAME/stats` every
    /// 100 ms (never per frame), and its connections when a reader asks. `corelane-stat` and
    /// [`metrics`](Self::metrics) read it.
    pub fn publish_stats(mut self, on: bool) -> Self {
        self.publish_stats = on;
        self
    }

    /// Serves the live statistics in Prometheus' text format at `http://ADDR/metrics`, from a
    /// thread on the kernel's network stack (a management address, not the one corelane
    /// owns), e.g. `"127.0.0.1:9464"`. Off by default; needs [`publish_stats`](Self::publish_stats).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// let rt = corelane::Runtime::builder("eth0")
    ///     .addr("10.0.0.1/24")
    ///     .metrics("127.0.0.1:9464")
    ///     .build()?;
    /// // curl -s http://127.0.0.1:9464/metrics | grep corelane_rx_frames_total
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn metrics(mut self, addr: impl crate::net::ToSocketAddr) -> Self {
        match addr.to_socket_addr() {
            Ok(a) => self.metrics = Some(a),
            Err(e) => self.invalid.push(format!("metrics address: {e}")),
        }
        self
    }

    /// How long a core keeps running after its task ends, so closed connections can finish
    /// (default 200 ms). [`StopHandle::stop`](crate::StopHandle::stop) resets them instead;
    /// [`StopHandle::shutdown`](crate::StopHandle::shutdown) gives them its grace instead.
    pub fn linger(mut self, d: Duration) -> Self {
        self.linger = d;
        self
    }

    /// The placement plan [`Builder::build`] would follow, from the machine hwloc reads and the
    /// interface's queues, without attaching anything or changing the interface (needs no
    /// privileges). Prints as an explanation.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// let plan = corelane::Runtime::builder("eth0").cores(2).plan()?;
    /// println!("{plan}");
    /// # Ok::<(), corelane::Error>(())
    /// ```
    ///
    /// # Errors
    /// No such interface, a machine hwloc cannot read, or a placement that does not fit it.
    pub fn plan(&self) -> Result<Plan, Error> {
        let (mut plan, channels) = self.make_plan()?;
        let nqueues = channels.map_or(1, |c| c.rx_queues());
        let need = queues_needed(&plan);
        if need > nqueues {
            let max = channels.map_or(1, |c| c.max_rx_queues());
            plan.reasons.push(if max >= need {
                format!(
                    "{} has {nqueues} receive queue(s): build() raises them to {need} for the run",
                    self.ifname
                )
            } else {
                format!(
                    "{} has {nqueues} receive queue(s) and allows at most {max}: build() refuses \
                     {} core(s)",
                    self.ifname,
                    plan.lanes.len()
                )
            });
        }
        Ok(plan)
    }

    pub(crate) fn make_plan(&self) -> Result<(Plan, Option<Channels>), Error> {
        corelane_xsk::check_interface(&self.ifname)?;
        let channels = corelane_xsk::channels(&self.ifname)?;
        let nqueues = channels.map_or(1, |c| c.rx_queues());
        let machine = Machine::this()?;
        let driver = corelane_xsk::driver_info(&self.ifname).unwrap_or_default();
        let lanes = self.queues.as_ref().map(Vec::len).or(self.lanes);
        if lanes == Some(0) {
            return Err(Error::Config("no core to run on".into()));
        }
        let mut plan = corelane_topo::plan(
            &machine,
            &self.placement,
            &corelane_topo::Request {
                lanes,
                max_lanes: Some(nqueues as usize),
                allowed: allowed_cpus(),
                nic: machine.nic(&self.ifname, Some(&driver.bus_info)),
            },
        )?;
        if let Some(q) = &self.queues {
            for (lane, q) in plan.lanes.iter_mut().zip(q) {
                lane.queue = *q;
            }
        }
        Ok((plan, channels))
    }

    /// The stats file's writer, in the claim's directory (None when switched off, or when it
    /// cannot be made: the run goes on without it, warned).
    pub(crate) fn publisher(
        &self,
        access: &Access,
        cores: usize,
    ) -> Option<corelane_stat::Publisher> {
        if !self.publish_stats {
            return None;
        }
        let cap = self.stack.flows.clamp(1, 1 << 16);
        match access.publisher(&self.ifname, cores, cap) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!("{}: live statistics off: {e}", self.ifname);
                None
            }
        }
    }
}

/// What a configuration error says, without the "invalid configuration" that `build` puts in
/// front of it once.
fn config_message(e: Error) -> String {
    match e {
        Error::Config(m) => m,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_address_is_named_once_with_its_fix() {
        let e = crate::Runtime::builder("lo")
            .addr("10.91.0.3")
            .build()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("10.91.0.3"), "{e}");
        assert_eq!(e.matches("invalid configuration").count(), 1, "{e}");
    }
}
