//! The program's side of an upgrade: the two generations of sockets and the connections an
//! old generation keeps (`xsks`, `upgrade`, `old_flows` in `crates/corelane-xsk/xdp/corelane.bpf.c`), and the
//! program itself handed to the new process ([`Steering::share`], [`Steering::adopt`]).

use std::collections::HashMap as StdHashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd, RawFd};

use aya::maps::{Array, HashMap, IterableMap, Map, MapData, PerCpuArray};

use super::attached::Attached;
use super::{GENERATIONS, MAPS, MAX_QUEUES, Steering, map_err};
use crate::error::Error;
use crate::program::AttachedMode;

/// What another process needs to steer with the program this one attached (an upgrade): a
/// descriptor of each of its maps and of its link, which keeps it attached as long as one is
/// open. Made by [`Steering::share`], taken by [`Steering::adopt`].
#[derive(Debug)]
pub struct SteeringShare {
    /// Each map of [`MAPS`], by name.
    pub maps: Vec<(String, OwnedFd)>,
    /// The program's BPF link.
    pub link: OwnedFd,
    /// How the program is attached.
    pub mode: AttachedMode,
}

/// The map data of the kinds the program has.
fn data(m: &Map) -> Option<&MapData> {
    match m {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::XskMap(d) => Some(d),
        _ => None,
    }
}

impl Attached {
    /// Map `name`'s data, wherever this program holds it.
    fn map_data(&self, name: &str) -> Option<&MapData> {
        Some(match name {
            "owned_v4" => self.owned_v4.map(),
            "owned_v6" => self.owned_v6.map(),
            "tcp_ports" => self.tcp_ports.map(),
            "udp_ports" => self.udp_ports.map(),
            "upgrade" => self.upgrade.map(),
            "old_flows" => self.old_flows.map(),
            "stats" => self.stats.map(),
            "cookie_cfg" => self.cookie_cfg.map(),
            "neighbours" => self.neighbours.map(),
            "xsks" => data(&self.xsks)?,
            other => match &self._ebpf {
                Some(e) => data(e.map(other)?)?,
                None => &self.others.iter().find(|(n, _)| *n == other)?.1,
            },
        })
    }
}

impl Steering {
    /// Redirects frames arriving on `queue` to the AF_XDP socket `fd` of `generation` (0 or
    /// 1): during an upgrade the old and the new process each have a socket on every queue
    /// (see [`Steering::set_upgrade`]). [`Steering::register`] is generation 0.
    pub fn register_in(&mut self, generation: u32, queue: u32, fd: RawFd) -> Result<(), Error> {
        if generation >= GENERATIONS || queue >= MAX_QUEUES {
            return Err(Error::Config(format!(
                "generation {generation} queue {queue}: the program has {GENERATIONS} \
                 generations of {MAX_QUEUES} queues"
            )));
        }
        self.program.register_in(generation, queue, fd)
    }

    /// Which generation's sockets get the frames: `current` gets all of them, except, while
    /// `split` is true, the TCP segments of connections kept for an older generation
    /// ([`Steering::keep_flow`]).
    pub fn set_upgrade(&mut self, current: u32, split: bool) -> Result<(), Error> {
        if current >= GENERATIONS {
            return Err(Error::Config(format!(
                "generation {current}: the program has {GENERATIONS}"
            )));
        }
        self.program.set_upgrade(current, split)
    }

    /// Keeps the TCP connection from `peer` to local `port` with `generation` while an
    /// upgrade splits the frames ([`Steering::set_upgrade`]).
    pub fn keep_flow(&mut self, peer: SocketAddr, port: u16, generation: u32) -> Result<(), Error> {
        self.program.keep_flow(peer, port, generation)
    }

    /// Stops keeping the connection from `peer` to `port` (it closed, or the upgrade ended).
    pub fn forget_flow(&mut self, peer: SocketAddr, port: u16) -> Result<(), Error> {
        self.program.forget_flow(peer, port)
    }

    /// Which generation gets the frames and whether the split is on (see
    /// [`Steering::set_upgrade`]).
    pub fn upgrade_state(&mut self) -> Result<(u32, bool), Error> {
        self.program.upgrade_state()
    }

    /// Forgets every connection kept for an old generation (the upgrade is over). Returns how
    /// many there were (under a grant, 0: the broker forgets them when the split ends).
    pub fn clear_flows(&mut self) -> Result<usize, Error> {
        self.program.clear_flows()
    }

    /// This process has handed the program on to a new one ([`Steering::share`]) and is
    /// leaving: from now on the ports and addresses it gives up stay steered (the new process
    /// serves them too); its own references are still counted.
    pub fn hand_on(&mut self) {
        self.handed_on = true;
        // The VLAN stays registered with the NIC's filter for the new process.
        if let Some(f) = &mut self.vlan_filter {
            f.keep();
        }
    }

    /// The upgrade was called off after [`Steering::hand_on`]: the ports and addresses this
    /// process gives up from now on stop being steered again.
    pub fn hand_back(&mut self) {
        self.handed_on = false;
    }

    /// Whether the program goes to a new process as descriptors ([`Steering::share`]): true
    /// for a program this process attached or adopted; a broker's stays the broker's, and an
    /// in-memory program is the same object for both processes.
    pub fn shares_by_descriptors(&self) -> bool {
        self.program.shares_by_descriptors()
    }
}

impl Attached {
    pub(super) fn keep_flow(
        &mut self,
        peer: SocketAddr,
        port: u16,
        generation: u32,
    ) -> Result<(), Error> {
        self.old_flows
            .insert(flow_key(peer, port), generation, 0)
            .map_err(map_err("old_flows"))
    }

    pub(super) fn forget_flow(&mut self, peer: SocketAddr, port: u16) -> Result<(), Error> {
        match self.old_flows.remove(&flow_key(peer, port)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err("old_flows")(e)),
        }
    }

    pub(super) fn clear_flows(&mut self) -> Result<usize, Error> {
        let keys: Vec<[u8; 20]> = self.old_flows.keys().filter_map(Result::ok).collect();
        for k in &keys {
            match self.old_flows.remove(k) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err("old_flows")(e)),
            }
        }
        Ok(keys.len())
    }
}

/// The program's `struct flow_key` for a connection from `peer` to local `port`: the peer's
/// address in 16 bytes (IPv4 as ::ffff:a.b.c.d), its port and the local port, ports in network
/// byte order.
fn flow_key(peer: SocketAddr, port: u16) -> [u8; 20] {
    let addr = match peer.ip() {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    let mut k = [0u8; 20];
    k[..16].copy_from_slice(&addr);
    k[16..18].copy_from_slice(&peer.port().to_be_bytes());
    k[18..].copy_from_slice(&port.to_be_bytes());
    k
}

impl Steering {
    /// The program and its maps, for a new process to [`adopt`](Steering::adopt) (descriptors
    /// to pass it, `SCM_RIGHTS`). Only for a program this process attached.
    pub fn share(&mut self) -> Result<SteeringShare, Error> {
        self.program.share(self.mode)
    }

    /// Steers with the program another process attached to `ifname` and shared
    /// ([`Steering::share`]): the maps are the same, and the program stays attached while
    /// either process holds its link. The ports and addresses the other process owns are
    /// owned here too, without a reference each: this process adds its own.
    pub fn adopt(ifname: &str, share: SteeringShare) -> Result<Steering, Error> {
        let mut maps: StdHashMap<String, OwnedFd> = share.maps.into_iter().collect();
        let mut take = |name: &'static str| -> Result<MapData, Error> {
            let fd = maps.remove(name).ok_or(Error::Map {
                map: name,
                detail: "not among the maps shared".into(),
            })?;
            MapData::from_fd(fd).map_err(map_err(name))
        };
        macro_rules! typed {
            ($name:literal, $variant:ident, $ty:ident) => {
                $ty::try_from(Map::$variant(take($name)?)).map_err(map_err($name))?
            };
        }
        let program = Attached {
            ifname: ifname.to_string(),
            owned_v4: typed!("owned_v4", HashMap, HashMap),
            owned_v6: typed!("owned_v6", HashMap, HashMap),
            tcp_ports: typed!("tcp_ports", Array, Array),
            udp_ports: typed!("udp_ports", Array, Array),
            xsks: Map::XskMap(take("xsks")?),
            upgrade: typed!("upgrade", Array, Array),
            old_flows: typed!("old_flows", HashMap, HashMap),
            stats: typed!("stats", PerCpuArray, PerCpuArray),
            cookie_cfg: typed!("cookie_cfg", Array, Array),
            neighbours: typed!("neighbours", LruHashMap, HashMap),
            groups: StdHashMap::new(),
            claim: None,
            prog_id: None,
            // Kept to be shared on with the rest.
            others: vec![
                ("iface", take("iface")?),
                ("unreach_rate", take("unreach_rate")?),
            ],
            _link: Some(share.link),
            linger: None,
            _ebpf: None,
        };
        Ok(Steering::over(ifname, share.mode, None, Box::new(program)))
    }
}

impl Attached {
    /// Descriptors of the program's maps and link (see [`Steering::share`]).
    pub(super) fn share_as(&self, mode: AttachedMode) -> Result<SteeringShare, Error> {
        let maps = MAPS
            .iter()
            .map(|&(name, _)| {
                let d = self.map_data(name).ok_or(Error::Map {
                    map: name,
                    detail: "not held by this program".into(),
                })?;
                let fd = d.fd().as_fd().try_clone_to_owned().map_err(Error::Io)?;
                Ok((name.to_string(), fd))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let link = match (&self._link, self.prog_id) {
            (Some(l), _) => l.try_clone().map_err(Error::Io)?,
            (None, Some(id)) => crate::linger::dup_link(id).map_err(Error::Io)?,
            (None, None) => {
                return Err(Error::Config("the program's id is unknown".into()));
            }
        };
        Ok(SteeringShare { maps, link, mode })
    }
}
