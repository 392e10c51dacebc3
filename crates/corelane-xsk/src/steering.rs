//! The embedded XDP steering program: load, attach, and the maps that say what corelane owns.

use std::collections::HashMap as StdHashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use aya::Ebpf;
use aya::maps::{Array, HashMap, MapData, PerCpuArray, XskMap};
use aya::programs::{ProgramError, Xdp, XdpMode};

use corelane_frame::Proto;

use crate::attach::{attach, chain, load_detail};
use crate::caps::check_attach_privileges;
use crate::claim::Claim;
use crate::cookie::CookieParams;
use crate::error::Error;
use crate::grant::GrantClient;
use crate::netdev::check_interface;
pub use crate::program::{AttachedMode, XdpCounters};

#[path = "steering_maps.rs"]
mod maps;
#[path = "steering_mem.rs"]
mod mem;
#[path = "steering_upgrade.rs"]
mod upgrade;
use crate::vlan::Vlan;
pub use mem::{MemProgram, Verdict};
pub use upgrade::SteeringShare;

/// The compiled steering program (built from `crates/corelane-xsk/xdp/corelane.bpf.c` by `crates/corelane-xsk/xdp/build.sh`).
pub static XDP_OBJECT: &[u8] = include_bytes!("../xdp/corelane.bpf.o");

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

/// A `tcp_ports` entry's bits (`PORT_OWNED`, `PORT_COOKIES`).
const PORT_OWNED: u8 = 1;
const PORT_COOKIES: u8 = 2;

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
    via: Via,
}

enum Via {
    Program(Box<Program>),
    Grant(GrantClient),
    /// The in-memory program of a simulation.
    Mem(MemProgram),
}

/// The program and its maps, held by this process.
struct Program {
    ifname: String,
    owned_v4: HashMap<MapData, u32, u8>,
    owned_v6: HashMap<MapData, [u8; 16], u8>,
    tcp_ports: Array<MapData, u8>,
    udp_ports: Array<MapData, u8>,
    /// `XskMap`, typed at each use (`XskMap::try_from(&mut xsks)`), so that its descriptor
    /// can be shared without holding a second one.
    xsks: aya::maps::Map,
    upgrade: Array<MapData, [u32; 2]>,
    old_flows: HashMap<MapData, [u8; 20], u32>,
    stats: PerCpuArray<MapData, u64>,
    cookie_cfg: Array<MapData, CookieParams>,
    /// What shared addresses' neighbours said of themselves (IPv4 mapped -> MAC, padded).
    neighbours: HashMap<MapData, [u8; 16], u64>,
    /// Solicited-node multicast groups joined on the interface for owned IPv6 addresses, with
    /// how many addresses share each.
    groups: StdHashMap<[u8; 6], u32>,
    /// The interface's claim, told of every group joined and left (so a crash leaves none).
    claim: Option<Arc<Claim>>,
    /// The kernel's id of the loaded program (to find its link).
    prog_id: Option<u32>,
    /// The maps no typed field holds, when the program was adopted (`_ebpf` holds them
    /// otherwise).
    others: Vec<(&'static str, MapData)>,
    /// The program's link, when this process adopted the program from another one.
    _link: Option<std::os::fd::OwnedFd>,
    /// The keeper that answers for the runtime if it dies ([`Steering::linger_on_death`]).
    linger: Option<crate::linger::Linger>,
    // Dropped last: holds the program and its link (None when adopted: `_link` holds it).
    _ebpf: Option<Ebpf>,
}

/// The Ethernet address of IPv6 address `a`'s solicited-node group ff02::1:ffXX:XXXX
/// (RFC 4291 section 2.7.1, RFC 2464 section 7).
fn solicited_node_mac(a: [u8; 16]) -> [u8; 6] {
    [0x33, 0x33, 0xff, a[13], a[14], a[15]]
}

impl Drop for Program {
    fn drop(&mut self) {
        // A clean exit: the keeper goes first, so the program is detached with this.
        if self.linger.take().is_some()
            && let Some(c) = &self.claim
        {
            c.note_linger(None);
        }
        for mac in self.groups.keys() {
            let _ = crate::netdev::multicast(&self.ifname, *mac, false);
            if let Some(c) = &self.claim {
                c.note_group(*mac, false);
            }
        }
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
        vlan.check().map_err(Error::Config)?;
        check_attach_privileges()?;
        check_interface(ifname)?;
        let mut ebpf = Ebpf::load(XDP_OBJECT).map_err(|e| Error::Load(load_detail(&e)))?;
        // Before the program runs: what it answers leaves from this address, and only frames
        // sent to it are answered.
        let mac = crate::netdev::mac_address(ifname)?;
        let mut iface: Array<_, [u8; 12]> =
            Array::try_from(ebpf.map_mut("iface").ok_or(Error::Map {
                map: "iface",
                detail: "missing from the object".into(),
            })?)
            .map_err(map_err("iface"))?;
        iface
            .set(0, iface_entry(mac, vlan), 0)
            .map_err(map_err("iface"))?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| Error::Load(format!("program {PROGRAM} missing from the object")))?
            .try_into()
            .map_err(|e: ProgramError| Error::Load(chain(&e)))?;
        prog.load().map_err(|e| Error::Load(load_detail(&e)))?;
        let prog_id = prog.info().ok().map(|i| i.id());
        let (mode, fallback_reason) = match mode {
            AttachMode::Generic => {
                attach(prog, ifname, XdpMode::Skb)?;
                (AttachedMode::Generic, None)
            }
            AttachMode::Native => {
                attach(prog, ifname, XdpMode::Driver)?;
                (AttachedMode::Native, None)
            }
            AttachMode::Auto => match attach(prog, ifname, XdpMode::Driver) {
                Ok(()) => (AttachedMode::Native, None),
                Err(Error::XdpMode { detail, .. }) => {
                    attach(prog, ifname, XdpMode::Skb)?;
                    (AttachedMode::Generic, Some(detail))
                }
                Err(e) => return Err(e),
            },
        };
        // The NIC's VLAN filter must pass the VLAN's frames to the program.
        let vlan_filter = if vlan.id != 0 && vlan.service == 0 {
            let index = check_interface(ifname)?;
            crate::vlan_filter::VlanFilter::register(ifname, index, vlan.id)?
        } else {
            None
        };
        if let Some(f) = &vlan_filter {
            tracing::debug!(
                "{ifname}: VLAN {} registered with the NIC's filter by {}",
                vlan.id,
                f.name()
            );
        }
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or_else(|| Error::Map {
                map: name,
                detail: "missing from the object".into(),
            })
        };
        let program = Program {
            ifname: ifname.to_string(),
            owned_v4: HashMap::try_from(take(&mut ebpf, "owned_v4")?)
                .map_err(map_err("owned_v4"))?,
            owned_v6: HashMap::try_from(take(&mut ebpf, "owned_v6")?)
                .map_err(map_err("owned_v6"))?,
            tcp_ports: Array::try_from(take(&mut ebpf, "tcp_ports")?)
                .map_err(map_err("tcp_ports"))?,
            udp_ports: Array::try_from(take(&mut ebpf, "udp_ports")?)
                .map_err(map_err("udp_ports"))?,
            xsks: take(&mut ebpf, "xsks")?,
            upgrade: Array::try_from(take(&mut ebpf, "upgrade")?).map_err(map_err("upgrade"))?,
            old_flows: HashMap::try_from(take(&mut ebpf, "old_flows")?)
                .map_err(map_err("old_flows"))?,
            stats: PerCpuArray::try_from(take(&mut ebpf, "stats")?).map_err(map_err("stats"))?,
            cookie_cfg: Array::try_from(take(&mut ebpf, "cookie_cfg")?)
                .map_err(map_err("cookie_cfg"))?,
            neighbours: HashMap::try_from(take(&mut ebpf, "neighbours")?)
                .map_err(map_err("neighbours"))?,
            groups: StdHashMap::new(),
            claim: None,
            prog_id,
            others: Vec::new(),
            _link: None,
            linger: None,
            _ebpf: Some(ebpf),
        };
        Ok(Steering {
            ifname: ifname.to_string(),
            mode,
            fallback_reason,
            port_refs: StdHashMap::new(),
            shared: Default::default(),
            handed_on: false,
            vlan_filter,
            via: Via::Program(Box::new(program)),
        })
    }

    /// Steering through the broker `client` holds a grant from (`corelane-broker grant`): this
    /// process needs no privilege for it, and may steer only what the grant allows.
    pub fn granted(ifname: &str, client: GrantClient) -> Steering {
        Steering {
            ifname: ifname.to_string(),
            mode: client.mode(),
            fallback_reason: client.fallback_reason().map(str::to_string),
            port_refs: StdHashMap::new(),
            shared: Default::default(),
            handed_on: false,
            vlan_filter: None,
            via: Via::Grant(client),
        }
    }

    /// The broker's connection, when steering goes through a grant.
    pub fn grant(&self) -> Option<&GrantClient> {
        match &self.via {
            Via::Grant(g) => Some(g),
            Via::Program(_) | Via::Mem(_) => None,
        }
    }

    /// True when a broker holds the program and this process steers through its grant.
    pub fn is_granted(&self) -> bool {
        self.grant().is_some()
    }

    /// Records every multicast group this steering joins on the interface in `claim`, so a
    /// process that dies leaves none behind (the next runtime's claim leaves them). Under a
    /// grant the broker does this.
    pub fn set_claim(&mut self, claim: Arc<Claim>) {
        if let Via::Program(p) = &mut self.via {
            for mac in p.groups.keys() {
                claim.note_group(*mac, true);
            }
            // A claim taken after the keeper started (an upgrade's new process takes the
            // interface's record once the old one has gone).
            if let Some(l) = &p.linger {
                claim.note_linger(Some(l.pid()));
            }
            p.claim = Some(claim);
        }
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
        let Via::Program(p) = &mut self.via else {
            return Ok(());
        };
        if p.linger.is_some() || time.is_zero() {
            return Ok(());
        }
        // An adopted program (an upgrade) holds its link itself.
        let link = p
            .prog_id
            .and_then(|id| crate::linger::link_fds(id).into_iter().next())
            .or_else(|| {
                use std::os::fd::AsRawFd;
                p._link.as_ref().map(|l| l.as_raw_fd())
            })
            .ok_or_else(|| {
                Error::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the XDP program is not attached through a BPF link",
                ))
            })?;
        // What the keeper removes once its time is up: the dead runtime's statistics and
        // capture files (the claim record stays for the next runtime's undo).
        let tidy: Vec<std::path::PathBuf> = p
            .claim
            .iter()
            .flat_map(|c| [c.dir().join("stats"), c.dir().join("capture")])
            .collect();
        let keeper = crate::linger::Linger::start(link, time, &tidy).map_err(Error::Io)?;
        if let Some(c) = &p.claim {
            c.note_linger(Some(keeper.pid()));
        }
        p.linger = Some(keeper);
        Ok(())
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
        match &mut self.via {
            Via::Program(p) => p.own_addr(addr),
            Via::Grant(g) => g.own_addr(addr),
            Via::Mem(m) => {
                m.own_addr(addr, true);
                Ok(())
            }
        }
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
        match self.via {
            Via::Program(_) => self.shared.add(addr, self.port_refs.keys().copied())?,
            Via::Grant(_) | Via::Mem(_) => self.shared.add_elsewhere(addr),
        }
        let done = match &mut self.via {
            Via::Program(p) => p.own_addr_as(addr, true),
            Via::Grant(g) => g.own_shared_addr(addr),
            Via::Mem(m) => {
                m.own_addr_as(addr, true, true);
                Ok(())
            }
        };
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
            match &mut self.via {
                Via::Program(p) => p.disown_addr(addr),
                Via::Grant(g) => g.disown_addr(addr),
                Via::Mem(m) => {
                    m.own_addr(addr, false);
                    Ok(())
                }
            }
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
            if let Err(e) = self.set_port(proto, port, true) {
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
                self.set_port(proto, port, false)
            };
            self.shared.release(proto, port);
            return done;
        }
        Ok(())
    }

    fn set_port(&mut self, proto: Proto, port: u16, on: bool) -> Result<(), Error> {
        match &mut self.via {
            Via::Program(p) => p.set_port(proto, port, on),
            Via::Grant(g) => g.port(proto, port, on),
            Via::Mem(m) => {
                m.set_port(proto, port, on);
                Ok(())
            }
        }
    }

    /// Gives the program what it needs to answer SYNs with the stack's cookies. Returns false
    /// under a grant, where the broker holds the program and SYNs stay the stack's.
    pub fn set_cookie_params(&mut self, p: &CookieParams) -> Result<bool, Error> {
        match &mut self.via {
            Via::Program(prog) => {
                prog.cookie_cfg
                    .set(0, *p, 0)
                    .map_err(map_err("cookie_cfg"))?;
                Ok(true)
            }
            Via::Grant(_) | Via::Mem(_) => Ok(false),
        }
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
        match &mut self.via {
            Via::Program(prog) => {
                let v = if on {
                    PORT_OWNED | PORT_COOKIES
                } else {
                    PORT_OWNED
                };
                prog.tcp_ports
                    .set(u32::from(port), v, 0)
                    .map_err(map_err("tcp_ports"))?;
                Ok(true)
            }
            Via::Grant(_) | Via::Mem(_) => Ok(false),
        }
    }

    /// True when `port` is steered for `proto`.
    pub fn port_owned(&self, proto: Proto, port: u16) -> bool {
        self.port_refs.contains_key(&(proto, port))
    }

    /// Redirects frames arriving on `queue` to the AF_XDP socket `fd`. The kernel removes the
    /// entry itself when the socket closes.
    pub fn register(&mut self, queue: u32, fd: RawFd) -> Result<(), Error> {
        match &mut self.via {
            Via::Program(p) => XskMap::try_from(&mut p.xsks)
                .map_err(map_err("xsks"))?
                .set(queue, fd, 0)
                .map_err(map_err("xsks")),
            Via::Grant(g) => g.register(queue, fd),
            Via::Mem(m) => {
                m.register_in(0, queue, fd);
                Ok(())
            }
        }
    }

    /// The program's counters, summed over CPUs.
    pub fn counters(&self) -> Result<XdpCounters, Error> {
        match &self.via {
            Via::Program(p) => p.counters(),
            Via::Grant(g) => g.counters(),
            Via::Mem(m) => Ok(m.counters()),
        }
    }
}
