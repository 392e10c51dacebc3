//! The embedded XDP steering program: load, attach, and the maps that say what corelane owns.

//!
//! [`Steering`] keeps what every way of steering shares (the ports' references, the shared
//! addresses' placeholders, the hand-over to a new process) and writes the program's maps
//! through a [`Program`]: the program this process attached (`attached.rs`), a grant broker's
//! (`granted.rs`), or the in-memory program of a simulation (`mem.rs`).

use std::collections::HashMap as StdHashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use corelane_frame::Proto;

use crate::claim::Claim;
use crate::cookie::CookieParams;
use crate::error::Error;
use crate::grant::GrantClient;
pub use crate::program::{AttachedMode, XdpCounters};

mod attached;
mod granted;
mod maps;
#[cfg(any(test, feature = "sim"))]
mod mem;
#[cfg(any(test, feature = "sim"))]
mod mem_model;
mod upgrade;
#[cfg(test)]
mod upgrade_tests;
use crate::vlan::Vlan;
#[cfg(any(test, feature = "sim"))]
pub use mem::{MemProgram, Verdict};
pub use upgrade::SteeringShare;

/// The compiled steering program (built from `crates/corelane-xsk/xdp/corelane.bpf.c` by `crates/corelane-xsk/xdp/build.sh`).
pub static XDP_OBJECT: &[u8] = include_bytes!("../../xdp/corelane.bpf.o");

/// The steering program's name in the object.
pub const PROGRAM: &str = "corelane_steer";
/// Most addresses of each family the program can own (`MAX_ADDRS` in `crates/corelane-xsk/xdp/corelane.bpf.c`).
pub const MAX_ADDRS: u32 = 64;
/// Most queues the program can redirect to a socket (`MAX_QUEUES`).
pub const MAX_QUEUES: u32 = 64;
/// Generations of sockets the program steers between during an upgrade (`GENERATIONS`).
pub const GENERATIONS: u32 = 2;
/// Most connections an old generation keeps during an upgrade (`MAX_OLD_FLOWS`).
pub const MAX_OLD_FLOWS: u32 = 65536;
/// Counter slots of its `stats` map, in [`XdpCounters`] order (`STAT_MAX`).
pub const STAT_SLOTS: usize = 9;
/// The maps the loader takes from the object and the entries each has. A test reads the
/// compiled object and checks every one, so the C program and this crate cannot drift apart.
pub const MAPS: [(&str, u32); 12] = [
    ("owned_v4", MAX_ADDRS),
    ("owned_v6", MAX_ADDRS),
    ("tcp_ports", 65536),
    ("udp_ports", 65536),
    ("xsks", GENERATIONS * MAX_QUEUES),
    ("upgrade", 1),
    ("old_flows", MAX_OLD_FLOWS),
    ("stats", STAT_SLOTS as u32),
    ("cookie_cfg", 1),
    ("unreach_rate", 2),
    ("iface", 1),
    ("neighbours", MAX_NEIGHBOURS),
];
/// Most neighbours of shared addresses the program notes (`MAX_NEIGHBOURS`).
pub const MAX_NEIGHBOURS: u32 = 4096;

/// The program's `iface` entry (`struct iface_cfg`): the hardware address, 1 (set), the
/// 802.1Q VLAN served and the 802.1ad service VLAN around it (0: none; native byte order).
pub fn iface_entry(mac: [u8; 6], vlan: Vlan) -> [u8; 12] {
    let mut v = [0u8; 12];
    v[..6].copy_from_slice(&mac);
    v[6] = 1;
    v[8..10].copy_from_slice(&vlan.id.to_ne_bytes());
    v[10..12].copy_from_slice(&vlan.service.to_ne_bytes());
    v
}

/// How to attach the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// Native (driver) mode; fall back to generic mode and report it when the driver refuses.
    #[default]
    Auto,
    /// Native mode or an error.
    Native,
    /// Generic (skb) mode: works everywhere, slower, and delivers everything on queue 0 on veth.
    Generic,
}

/// The steering program on one interface: attached by this process ([`Steering::attach`]), or
/// held by a grant broker that this process asks ([`Steering::granted`]). Dropping it detaches
/// the program (or ends the grant's session); the attachment is a BPF link, so the kernel also
/// detaches it if the process dies.
pub struct Steering {
    ifname: String,
    mode: AttachedMode,
    fallback_reason: Option<String>,
    port_refs: StdHashMap<(Proto, u16), u32>,
    /// The addresses the kernel holds too, and the ports held on them.
    shared: crate::shared::SharedPorts,
    /// The program was handed on to a new process ([`Steering::hand_on`]): ports and
    /// addresses this process gives up stay steered, for the new one.
    handed_on: bool,
    /// The VLAN device that registers the served VLAN with the NIC's filter (this process
    /// attached the program).
    vlan_filter: Option<crate::vlan_filter::VlanFilter>,
    program: Box<dyn Program>,
}

/// What holds the program's maps, as [`Steering`] writes and reads them: the program this
/// process attached or adopted ([`attached::Attached`]), a grant broker's session
/// ([`GrantClient`]), or the in-memory program of a simulation ([`MemProgram`]). Each
/// answers for the maps only: reference counts, placeholders and the hand-over are
/// [`Steering`]'s, the same for all of them.
///
/// A second backend (another device's steering: a NIC's flow rules, say) is a fourth
/// implementation; nothing above `Steering` changes.
pub(crate) trait Program: Send {
    /// Steers frames for `addr`: all of them, or, `shared` with the kernel, only those for
    /// owned ports and the ICMP errors about them.
    fn own_addr(&mut self, addr: IpAddr, shared: bool) -> Result<(), Error>;
    /// Stops steering frames for `addr`.
    fn disown_addr(&mut self, addr: IpAddr) -> Result<(), Error>;
    /// Steers `proto` port `port` (on owned addresses), or stops.
    fn set_port(&mut self, proto: Proto, port: u16, on: bool) -> Result<(), Error>;
    /// Redirects `queue`'s frames to socket `fd` of `generation` (checked in range).
    fn register_in(&mut self, generation: u32, queue: u32, fd: RawFd) -> Result<(), Error>;
    /// [`Program::register_in`] generation 0.
    fn register(&mut self, queue: u32, fd: RawFd) -> Result<(), Error> {
        self.register_in(0, queue, fd)
    }
    /// Which generation gets the frames, and whether kept connections are split off.
    fn set_upgrade(&mut self, current: u32, split: bool) -> Result<(), Error>;
    /// What [`Program::set_upgrade`] last set.
    fn upgrade_state(&mut self) -> Result<(u32, bool), Error>;
    /// Keeps the connection from `peer` to `port` with `generation` while the split is on.
    fn keep_flow(&mut self, peer: SocketAddr, port: u16, generation: u32) -> Result<(), Error>;
    /// Stops keeping that connection.
    fn forget_flow(&mut self, peer: SocketAddr, port: u16) -> Result<(), Error>;
    /// Forgets every kept connection; how many there were.
    fn clear_flows(&mut self) -> Result<usize, Error>;
    /// The program's counters.
    fn counters(&self) -> Result<XdpCounters, Error>;
    /// What a shared address's neighbour `ip` last said of itself, when recent.
    fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]>;
    /// True when the placeholders of a shared address's ports are this process's to bind (a
    /// broker binds them for its grants; a simulation has no kernel to bind them in).
    fn binds_placeholders(&self) -> bool {
        false
    }
    /// Gives the program the stack's cookie parameters; false where the SYNs stay the
    /// stack's (under a grant, in memory).
    fn set_cookie_params(&mut self, _params: &CookieParams) -> Result<bool, Error> {
        Ok(false)
    }
    /// Has the program answer bare SYNs to an owned `port` with cookies, or stop; false
    /// where it cannot.
    fn set_syn_cookies(&mut self, _port: u16, _on: bool) -> Result<bool, Error> {
        Ok(false)
    }
    /// Records what the program changes on the interface in `claim`.
    fn set_claim(&mut self, _claim: Arc<Claim>) {}
    /// Keeps the program answering for `time` after this process dies.
    fn linger_on_death(&mut self, _time: Duration) -> Result<(), Error> {
        Ok(())
    }
    /// The broker's connection, under a grant.
    fn grant(&self) -> Option<&GrantClient> {
        None
    }
    /// The program as descriptors for a new process ([`Steering::share`]).
    fn share(&mut self, mode: AttachedMode) -> Result<SteeringShare, Error>;
    /// True when [`Program::share`] gives descriptors (see [`Steering::shares_by_descriptors`]).
    fn shares_by_descriptors(&self) -> bool {
        false
    }
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering")
            .field("ifname", &self.ifname)
            .field("mode", &self.mode)
            .field("granted", &self.is_granted())
            .finish_non_exhaustive()
    }
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |e| Error::Map {
        map,
        detail: e.to_string(),
    }
}

impl Steering {
    /// A steering over `program`, with nothing owned yet.
    fn over(
        ifname: &str,
        mode: AttachedMode,
        fallback_reason: Option<String>,
        program: Box<dyn Program>,
    ) -> Steering {
        Steering {
            ifname: ifname.to_string(),
            mode,
            fallback_reason,
            port_refs: StdHashMap::new(),
            shared: Default::default(),
            handed_on: false,
            vlan_filter: None,
            program,
        }
    }

    /// Loads the embedded program and attaches it to `ifname` (in the caller's namespace).
    pub fn attach(ifname: &str, mode: AttachMode) -> Result<Self, Error> {
        Self::attach_vlan(ifname, mode, Vlan::default())
    }

    /// [`Steering::attach`] for the frames of `vlan` only (an 802.1Q VLAN, or one inside an
    /// 802.1ad service VLAN; `Vlan::default()`: untagged frames, as `attach`): the program
    /// takes the tags off the VLAN's frames before steering them and leaves untagged frames
    /// and other VLANs' to the kernel. What the sockets send must carry the tags
    /// (`corelane_stack`'s device adds them).
    pub fn attach_vlan(ifname: &str, mode: AttachMode, vlan: Vlan) -> Result<Self, Error> {
        let (program, mode, fallback_reason, vlan_filter) =
            attached::Attached::attach(ifname, mode, vlan)?;
        let mut s = Steering::over(ifname, mode, fallback_reason, Box::new(program));
        s.vlan_filter = vlan_filter;
        Ok(s)
    }

    /// Steering through the broker `client` holds a grant from (`corelane-broker grant`): this
    /// process needs no privilege for it, and may steer only what the grant allows.
    pub fn granted(ifname: &str, client: GrantClient) -> Steering {
        let (mode, reason) = (client.mode(), client.fallback_reason().map(str::to_string));
        Steering::over(ifname, mode, reason, Box::new(client))
    }

    /// The broker's connection, when steering goes through a grant.
    pub fn grant(&self) -> Option<&GrantClient> {
        self.program.grant()
    }

    /// True when a broker holds the program and this process steers through its grant.
    pub fn is_granted(&self) -> bool {
        self.grant().is_some()
    }

    /// Records every multicast group this steering joins on the interface in `claim`, so a
    /// process that dies leaves none behind (the next runtime's claim leaves them). Under a
    /// grant the broker does this.
    pub fn set_claim(&mut self, claim: Arc<Claim>) {
        self.program.set_claim(claim);
    }

    /// Keeps the program answering for `time` after this process dies, however it dies: a
    /// reset for every TCP segment to an owned address, port unreachable for every UDP
    /// datagram, so that no peer waits for a timeout (see the `linger` module: a keeper
    /// process holds the program's link). Nothing changes while the process lives; a clean
    /// exit (dropping this) ends the keeper first. Only for a program this process attached
    /// (under a grant the broker does it); recorded in the claim, so the next runtime ends a
    /// keeper at once.
    ///
    /// # Errors
    /// The program is not attached through a BPF link (kernels before 5.9), or the keeper
    /// could not be started.
    pub fn linger_on_death(&mut self, time: Duration) -> Result<(), Error> {
        if time.is_zero() {
            return Ok(());
        }
        self.program.linger_on_death(time)
    }

    /// The interface the program is attached to.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Native or generic.
    pub fn mode(&self) -> AttachedMode {
        self.mode
    }

    /// Why native mode was refused, when [`AttachMode::Auto`] fell back to generic mode.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// Steers frames for `addr` (and ARP or NDP for it) to the stack.
    pub fn own_addr(&mut self, addr: IpAddr) -> Result<(), Error> {
        self.program.own_addr(addr, false)
    }

    /// Steers the frames for `addr`'s owned ports (and the ICMP errors about them) to the
    /// stack, where the kernel holds `addr` too and keeps the rest: its ARP or NDP, ping, its
    /// other ports (see `crates/corelane-xsk/src/shared.rs`). Each owned port is held in the
    /// kernel by a placeholder socket on `addr`, so that no kernel socket takes it.
    ///
    /// # Errors
    /// [`Error::KernelPort`] naming the kernel socket that holds an owned port already.
    pub fn own_shared_addr(&mut self, addr: IpAddr) -> Result<(), Error> {
        // Under a grant the broker holds the placeholders (its session's end gives them back);
        // a simulation has no kernel to hold them in.
        if self.program.binds_placeholders() {
            self.shared.add(addr, self.port_refs.keys().copied())?;
        } else {
            self.shared.add_elsewhere(addr);
        }
        let done = self.program.own_addr(addr, true);
        if done.is_err() {
            self.shared.remove(addr);
        }
        done
    }

    /// True when a shared address has its ports held by this process (owning a port then
    /// binds a placeholder socket).
    pub fn has_shared(&self) -> bool {
        self.shared.any()
    }

    /// True when `addr` was owned as a shared address.
    pub fn is_shared(&self, addr: IpAddr) -> bool {
        self.shared.is_shared(addr)
    }

    /// Stops steering frames for `addr`, then gives its placeholders back (never before).
    pub fn disown_addr(&mut self, addr: IpAddr) -> Result<(), Error> {
        let done = if self.handed_on {
            Ok(())
        } else {
            self.program.disown_addr(addr)
        };
        self.shared.remove(addr);
        done
    }

    /// Steers `proto` segments to `port` on owned addresses. Ports are reference counted: each
    /// socket that opens the port calls this, and [`Steering::release_port`] when it closes.
    pub fn own_port(&mut self, proto: Proto, port: u16) -> Result<(), Error> {
        let refs = self.port_refs.get(&(proto, port)).copied().unwrap_or(0);
        if refs == 0 {
            self.shared.hold(proto, port)?;
            if let Err(e) = self.program.set_port(proto, port, true) {
                self.shared.release(proto, port);
                return Err(e);
            }
        }
        self.port_refs.insert((proto, port), refs + 1);
        Ok(())
    }

    /// Drops one reference to `port`; the last one stops steering it.
    pub fn release_port(&mut self, proto: Proto, port: u16) -> Result<(), Error> {
        let Some(refs) = self.port_refs.get_mut(&(proto, port)) else {
            return Ok(());
        };
        *refs -= 1;
        if *refs == 0 {
            self.port_refs.remove(&(proto, port));
            // Unsteered before the placeholder goes: no kernel socket holds a port steered here.
            let done = if self.handed_on {
                Ok(())
            } else {
                self.program.set_port(proto, port, false)
            };
            self.shared.release(proto, port);
            return done;
        }
        Ok(())
    }

    /// Gives the program what it needs to answer SYNs with the stack's cookies. Returns false
    /// under a grant, where the broker holds the program and SYNs stay the stack's.
    pub fn set_cookie_params(&mut self, p: &CookieParams) -> Result<bool, Error> {
        self.program.set_cookie_params(p)
    }

    /// Has the program answer bare SYNs to TCP `port` with a SYN cookie (on), or steer them to
    /// the stack again (off). Needs [`Steering::set_cookie_params`] first. Does nothing for a
    /// port that is not steered, and returns false under a grant.
    ///
    /// On veth in native mode the answer goes out through the peer's XDP receive path, which
    /// the kernel runs only when the peer has an XDP program or GRO on (`ethtool -K PEER gro
    /// on`); otherwise it is dropped.
    pub fn set_syn_cookies(&mut self, port: u16, on: bool) -> Result<bool, Error> {
        if !self.port_owned(Proto::Tcp, port) {
            return Ok(false);
        }
        self.program.set_syn_cookies(port, on)
    }

    /// True when `port` is steered for `proto`.
    pub fn port_owned(&self, proto: Proto, port: u16) -> bool {
        self.port_refs.contains_key(&(proto, port))
    }

    /// Redirects frames arriving on `queue` to the AF_XDP socket `fd`. The kernel removes the
    /// entry itself when the socket closes.
    pub fn register(&mut self, queue: u32, fd: RawFd) -> Result<(), Error> {
        self.program.register(queue, fd)
    }

    /// The program's counters, summed over CPUs.
    pub fn counters(&self) -> Result<XdpCounters, Error> {
        self.program.counters()
    }

    /// The hardware address a neighbour of a shared address gave for `ip` in its last ARP or
    /// NDP frame to or about that address (frames the kernel answers; the program notes what
    /// they say). None when none was seen. Under a grant the broker is asked.
    pub fn shared_neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        self.program.neighbour(ip)
    }
}
