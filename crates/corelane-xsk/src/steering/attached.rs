//! The program this process attached (or adopted from the process before it in an upgrade):
//! the aya object, its maps and what attaching it changed on the interface.

use std::collections::HashMap as StdHashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use aya::Ebpf;
use aya::maps::{Array, HashMap, MapData, PerCpuArray, XskMap};
use aya::programs::{ProgramError, Xdp, XdpMode};

use corelane_frame::Proto;

use super::{
    AttachMode, MAX_QUEUES, PROGRAM, Program, SteeringShare, XDP_OBJECT, XdpCounters, iface_entry,
    map_err,
};
use crate::attach::{attach, chain, load_detail};
use crate::caps::check_attach_privileges;
use crate::claim::Claim;
use crate::cookie::CookieParams;
use crate::error::Error;
use crate::netdev::check_interface;
use crate::program::AttachedMode;
use crate::vlan::Vlan;
use crate::vlan_filter::VlanFilter;

/// A `tcp_ports` entry's bits (`PORT_OWNED`, `PORT_COOKIES`).
const PORT_OWNED: u8 = 1;
const PORT_COOKIES: u8 = 2;

/// The program and its maps, held by this process.
pub(super) struct Attached {
    pub(super) ifname: String,
    pub(super) owned_v4: HashMap<MapData, u32, u8>,
    pub(super) owned_v6: HashMap<MapData, [u8; 16], u8>,
    pub(super) tcp_ports: Array<MapData, u8>,
    pub(super) udp_ports: Array<MapData, u8>,
    /// `XskMap`, typed at each use (`XskMap::try_from(&mut xsks)`), so that its descriptor
    /// can be shared without holding a second one.
    pub(super) xsks: aya::maps::Map,
    pub(super) upgrade: Array<MapData, [u32; 2]>,
    pub(super) old_flows: HashMap<MapData, [u8; 20], u32>,
    pub(super) stats: PerCpuArray<MapData, u64>,
    pub(super) cookie_cfg: Array<MapData, CookieParams>,
    /// What shared addresses' neighbours said of themselves (IPv4 mapped -> MAC, padded).
    pub(super) neighbours: HashMap<MapData, [u8; 16], u64>,
    /// Solicited-node multicast groups joined on the interface for owned IPv6 addresses, with
    /// how many addresses share each.
    pub(super) groups: StdHashMap<[u8; 6], u32>,
    /// The interface's claim, told of every group joined and left (so a crash leaves none).
    pub(super) claim: Option<Arc<Claim>>,
    /// The kernel's id of the loaded program (to find its link).
    pub(super) prog_id: Option<u32>,
    /// The maps no typed field holds, when the program was adopted (`_ebpf` holds them
    /// otherwise).
    pub(super) others: Vec<(&'static str, MapData)>,
    /// The program's link, when this process adopted the program from another one.
    pub(super) _link: Option<std::os::fd::OwnedFd>,
    /// The keeper that answers for the runtime if it dies ([`Steering::linger_on_death`]).
    pub(super) linger: Option<crate::linger::Linger>,
    // Dropped last: holds the program and its link (None when adopted: `_link` holds it).
    pub(super) _ebpf: Option<Ebpf>,
}

/// The Ethernet address of IPv6 address `a`'s solicited-node group ff02::1:ffXX:XXXX
/// (RFC 4291 section 2.7.1, RFC 2464 section 7).
pub(super) fn solicited_node_mac(a: [u8; 16]) -> [u8; 6] {
    [0x33, 0x33, 0xff, a[13], a[14], a[15]]
}

impl Drop for Attached {
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

impl Attached {
    /// Loads the embedded program and attaches it to `ifname` (see [`super::Steering::attach_vlan`]):
    /// the program, the mode it got, why native mode was refused (when it fell back), and the
    /// VLAN device that registers `vlan` with the NIC's filter.
    #[allow(clippy::type_complexity)]
    pub(super) fn attach(
        ifname: &str,
        mode: AttachMode,
        vlan: Vlan,
    ) -> Result<(Attached, AttachedMode, Option<String>, Option<VlanFilter>), Error> {
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
            VlanFilter::register(ifname, index, vlan.id)?
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
        let program = Attached {
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
        Ok((program, mode, fallback_reason, vlan_filter))
    }
}

impl Program for Attached {
    fn own_addr(&mut self, addr: IpAddr, shared: bool) -> Result<(), Error> {
        self.own_addr_as(addr, shared)
    }

    fn disown_addr(&mut self, addr: IpAddr) -> Result<(), Error> {
        Attached::disown_addr(self, addr)
    }

    fn set_port(&mut self, proto: Proto, port: u16, on: bool) -> Result<(), Error> {
        Attached::set_port(self, proto, port, on)
    }

    fn register_in(&mut self, generation: u32, queue: u32, fd: RawFd) -> Result<(), Error> {
        XskMap::try_from(&mut self.xsks)
            .map_err(map_err("xsks"))?
            .set(generation * MAX_QUEUES + queue, fd, 0)
            .map_err(map_err("xsks"))
    }

    fn set_upgrade(&mut self, current: u32, split: bool) -> Result<(), Error> {
        self.upgrade
            .set(0, [current, u32::from(split)], 0)
            .map_err(map_err("upgrade"))
    }

    fn upgrade_state(&mut self) -> Result<(u32, bool), Error> {
        let [current, split] = self.upgrade.get(&0, 0).map_err(map_err("upgrade"))?;
        Ok((current, split != 0))
    }

    fn keep_flow(&mut self, peer: SocketAddr, port: u16, generation: u32) -> Result<(), Error> {
        Attached::keep_flow(self, peer, port, generation)
    }

    fn forget_flow(&mut self, peer: SocketAddr, port: u16) -> Result<(), Error> {
        Attached::forget_flow(self, peer, port)
    }

    fn clear_flows(&mut self) -> Result<usize, Error> {
        Attached::clear_flows(self)
    }

    fn counters(&self) -> Result<XdpCounters, Error> {
        Attached::counters(self)
    }

    fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        Attached::neighbour(self, ip)
    }

    fn binds_placeholders(&self) -> bool {
        true
    }

    fn set_cookie_params(&mut self, p: &CookieParams) -> Result<bool, Error> {
        self.cookie_cfg
            .set(0, *p, 0)
            .map_err(map_err("cookie_cfg"))?;
        Ok(true)
    }

    fn set_syn_cookies(&mut self, port: u16, on: bool) -> Result<bool, Error> {
        let v = if on {
            PORT_OWNED | PORT_COOKIES
        } else {
            PORT_OWNED
        };
        self.tcp_ports
            .set(u32::from(port), v, 0)
            .map_err(map_err("tcp_ports"))?;
        Ok(true)
    }

    fn set_claim(&mut self, claim: Arc<Claim>) {
        for mac in self.groups.keys() {
            claim.note_group(*mac, true);
        }
        // A claim taken after the keeper started (an upgrade's new process takes the
        // interface's record once the old one has gone).
        if let Some(l) = &self.linger {
            claim.note_linger(Some(l.pid()));
        }
        self.claim = Some(claim);
    }

    fn linger_on_death(&mut self, time: Duration) -> Result<(), Error> {
        if self.linger.is_some() {
            return Ok(());
        }
        // An adopted program (an upgrade) holds its link itself.
        let link = self
            .prog_id
            .and_then(|id| crate::linger::link_fds(id).into_iter().next())
            .or_else(|| {
                use std::os::fd::AsRawFd;
                self._link.as_ref().map(|l| l.as_raw_fd())
            })
            .ok_or_else(|| {
                Error::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the XDP program is not attached through a BPF link",
                ))
            })?;
        // What the keeper removes once its time is up: the dead runtime's statistics and
        // capture files (the claim record stays for the next runtime's undo).
        let tidy: Vec<std::path::PathBuf> = self
            .claim
            .iter()
            .flat_map(|c| [c.dir().join("stats"), c.dir().join("capture")])
            .collect();
        let keeper = crate::linger::Linger::start(link, time, &tidy).map_err(Error::Io)?;
        if let Some(c) = &self.claim {
            c.note_linger(Some(keeper.pid()));
        }
        self.linger = Some(keeper);
        Ok(())
    }

    fn share(&mut self, mode: AttachedMode) -> Result<SteeringShare, Error> {
        self.share_as(mode)
    }

    fn shares_by_descriptors(&self) -> bool {
        true
    }
}
