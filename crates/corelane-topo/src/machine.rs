//! The machine as the planner sees it: hardware threads with their core, caches, package and
//! NUMA node, the distances between nodes, and where the network devices sit.

use std::collections::BTreeSet;
use std::fmt;

use hwlocality::Topology;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::topology::builder::TypeFilter;

use crate::Error;

/// One cache a hardware thread sits under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cache {
    /// 1 for L1, 2 for L2, ...
    pub level: u8,
    /// Identifies this cache among the machine's caches.
    pub id: u64,
    /// Bytes, when hwloc knows.
    pub size: Option<u64>,
}

/// One hardware thread (a CPU the OS schedules on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cpu {
    /// The OS's CPU number (what `taskset` and `sched_setaffinity` take).
    pub os: usize,
    /// The physical core it belongs to (SMT siblings share it).
    pub core: usize,
    /// The package (socket).
    pub package: usize,
    /// The NUMA node (0-based index into the machine's nodes).
    pub node: usize,
    /// Data and unified caches above it, closest first.
    pub caches: Vec<Cache>,
}

/// What two CPUs have in common, closest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// The same hardware thread.
    SameCpu,
    /// SMT siblings of one core: they share its L1 and L2.
    SameCore,
    /// Different cores under a shared cache of this level.
    Cache {
        /// Cache level.
        level: u8,
        /// Its size, when known.
        size: Option<u64>,
    },
    /// The same package but no cache in common.
    Package,
    /// The same NUMA node but different packages.
    Node,
    /// Different NUMA nodes.
    Remote {
        /// The NUMA distance between them (10 = local), when known.
        distance: Option<u64>,
    },
}

impl Sharing {
    /// Orders sharings: lower is closer.
    pub fn rank(&self) -> u64 {
        match *self {
            Sharing::SameCpu => 0,
            Sharing::SameCore => 1,
            Sharing::Cache { level, .. } => 1 + u64::from(level),
            Sharing::Package => 20,
            Sharing::Node => 21,
            Sharing::Remote { distance } => 22 + distance.unwrap_or(20),
        }
    }

    /// True when the two CPUs share some cache (SMT siblings share L1 and L2).
    pub fn shares_cache(&self) -> bool {
        matches!(
            self,
            Sharing::SameCpu | Sharing::SameCore | Sharing::Cache { .. }
        )
    }
}

pub(crate) fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Sharing::SameCpu => write!(f, "the same CPU: share every cache"),
            Sharing::SameCore => write!(f, "SMT siblings of one core: share L1 and L2"),
            Sharing::Cache { level, size } => {
                write!(f, "share L{level}")?;
                if let Some(s) = size {
                    write!(f, " ({})", size_text(s))?;
                }
                Ok(())
            }
            Sharing::Package => write!(f, "same package, no shared cache"),
            Sharing::Node => write!(f, "same NUMA node, different packages, no shared cache"),
            Sharing::Remote { distance } => {
                write!(f, "different NUMA nodes, no shared cache")?;
                if let Some(d) = distance {
                    write!(f, " (distance {d})")?;
                }
                Ok(())
            }
        }
    }
}

/// Where a network device sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    /// Interface name.
    pub name: String,
    /// PCI address, for a PCI device.
    pub pci: Option<String>,
    /// The NUMA node it is attached to; None for a virtual device or when unknown.
    pub node: Option<usize>,
    /// Why the node is what it is, in words.
    pub locality: String,
}

/// The machine: its hardware threads, NUMA distances and devices.
#[derive(Debug, Clone)]
pub struct Machine {
    source: String,
    cpus: Vec<Cpu>,
    nodes: usize,
    distances: Option<Vec<Vec<u64>>>,
    nics: Vec<Nic>,
}

impl Machine {
    /// This machine, read by hwloc (with its PCI and network devices).
    pub fn this() -> Result<Machine, Error> {
        let topo = Topology::builder()
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| Error::Hwloc(e.to_string()))?
            .build()
            .map_err(|e| Error::Hwloc(e.to_string()))?;
        Machine::from_topology(&topo, "this machine".to_string())
    }

    /// A machine from an hwloc synthetic description, e.g. `"package:2 l2:2 core:2 pu:1"`
    /// (see hwloc's documentation of synthetic topologies).
    pub fn synthetic(description: &str) -> Result<Machine, Error> {
        let topo = Topology::builder()
            .from_synthetic(description)
            .map_err(|e| Error::Hwloc(format!("synthetic topology `{description}`: {e}")))?
            .build()
            .map_err(|e| Error::Hwloc(e.to_string()))?;
        Machine::from_topology(&topo, format!("synthetic `{description}`"))
    }

    /// A machine from hwloc XML (as `lstopo --of xml` writes it), including its distances and
    /// I/O devices.
    pub fn from_xml(xml: &str, name: &str) -> Result<Machine, Error> {
        let topo = Topology::builder()
            .from_xml(xml)
            .map_err(|e| Error::Hwloc(format!("XML topology {name}: {e}")))?
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| Error::Hwloc(e.to_string()))?
            .build()
            .map_err(|e| Error::Hwloc(e.to_string()))?;
        Machine::from_topology(&topo, format!("XML {name}"))
    }

    /// Reads what the planner needs out of an hwloc topology.
    fn from_topology(topo: &Topology, source: String) -> Result<Machine, Error> {
        let numa: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::NUMANode).collect();
        let node_os: Vec<usize> = numa
            .iter()
            .enumerate()
            .map(|(i, n)| n.os_index().unwrap_or(i))
            .collect();
        let node_of = |set_first: Option<usize>| {
            set_first
                .and_then(|os| node_os.iter().position(|&n| n == os))
                .unwrap_or(0)
        };
        let mut cpus = Vec::new();
        for pu in topo.objects_with_type(ObjectType::PU) {
            let os = pu.os_index().unwrap_or(pu.logical_index());
            let mut core = None;
            let mut package = None;
            let mut caches = Vec::new();
            for a in pu.ancestors() {
                match a.object_type() {
                    ObjectType::Core => {
                        core.get_or_insert(a.logical_index());
                    }
                    ObjectType::Package => {
                        package.get_or_insert(a.logical_index());
                    }
                    ObjectType::L1Cache
                    | ObjectType::L2Cache
                    | ObjectType::L3Cache
                    | ObjectType::L4Cache
                    | ObjectType::L5Cache => {
                        let (level, size) = match a.attributes() {
                            Some(ObjectAttributes::Cache(c)) => {
                                (c.depth() as u8, c.size().map(|s| s.get()))
                            }
                            _ => (0, None),
                        };
                        caches.push(Cache {
                            level,
                            id: a.global_persistent_index(),
                            size,
                        });
                    }
                    _ => {}
                }
            }
            let node = node_of(pu.nodeset().and_then(|s| s.first_set()).map(usize::from));
            cpus.push(Cpu {
                os,
                // A topology without cores: every thread is its own core.
                core: core.unwrap_or(10_000 + pu.logical_index()),
                package: package.unwrap_or(0),
                node,
                caches,
            });
        }
        if cpus.is_empty() {
            return Err(Error::Hwloc(format!("{source}: no CPUs found")));
        }
        cpus.sort_by_key(|c| c.os);
        let nodes = numa.len().max(1);
        let mut distances = None;
        if nodes > 1
            && let Ok(all) = topo.distances(None)
        {
            for d in all {
                let objs: Vec<Option<usize>> = d
                    .objects()
                    .map(|o| {
                        o.filter(|o| o.object_type() == ObjectType::NUMANode)
                            .and_then(|o| o.os_index())
                            .and_then(|os| node_os.iter().position(|&n| n == os))
                    })
                    .collect();
                if objs.len() != nodes || objs.iter().any(Option::is_none) {
                    continue;
                }
                let mut m = vec![vec![0u64; nodes]; nodes];
                for (i, row) in d.distances().chunks(nodes).enumerate() {
                    for (j, v) in row.iter().enumerate() {
                        if let (Some(a), Some(b)) = (objs[i], objs[j]) {
                            m[a][b] = *v;
                        }
                    }
                }
                distances = Some(m);
                break;
            }
        }
        let mut nics = Vec::new();
        for dev in topo.os_devices() {
            let Some(name) = dev.name().and_then(|n| n.to_str().ok()) else {
                continue;
            };
            let pci = dev.ancestors().find_map(|a| match a.attributes() {
                Some(ObjectAttributes::PCIDevice(p)) => Some(format!(
                    "{:04x}:{:02x}:{:02x}.{:x}",
                    p.domain(),
                    p.bus_id(),
                    p.bus_device(),
                    p.function()
                )),
                _ => None,
            });
            let Some(pci) = pci else { continue };
            let local = dev.first_non_io_ancestor();
            let node = local
                .and_then(|a| a.nodeset())
                .filter(|s| s.weight() == Some(1))
                .and_then(|s| s.first_set())
                .map(|i| node_of(Some(usize::from(i))));
            let locality = match node {
                Some(n) => format!("PCI device {pci} on NUMA node {n}"),
                None => format!("PCI device {pci}, close to every NUMA node"),
            };
            nics.push(Nic {
                name: name.to_string(),
                pci: Some(pci),
                node,
                locality,
            });
        }
        Ok(Machine {
            source,
            cpus,
            nodes,
            distances,
            nics,
        })
    }

    /// Where the machine description came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every hardware thread, by OS number.
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// One hardware thread by OS number.
    pub fn cpu(&self, os: usize) -> Option<&Cpu> {
        self.cpus.iter().find(|c| c.os == os)
    }

    /// NUMA nodes (at least 1).
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Physical cores.
    pub fn cores(&self) -> usize {
        self.cpus
            .iter()
            .map(|c| c.core)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// Packages (sockets).
    pub fn packages(&self) -> usize {
        self.cpus
            .iter()
            .map(|c| c.package)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// The NUMA distance between two nodes (10 = local), when the machine reports distances.
    pub fn node_distance(&self, a: usize, b: usize) -> Option<u64> {
        if a == b {
            return Some(10);
        }
        self.distances
            .as_ref()
            .and_then(|m| m.get(a).and_then(|r| r.get(b)).copied())
    }

    /// What two CPUs share. Unknown CPUs share nothing.
    pub fn sharing(&self, a: usize, b: usize) -> Sharing {
        let (Some(x), Some(y)) = (self.cpu(a), self.cpu(b)) else {
            return Sharing::Remote { distance: None };
        };
        if x.os == y.os {
            return Sharing::SameCpu;
        }
        if x.core == y.core {
            return Sharing::SameCore;
        }
        if let Some(c) = x
            .caches
            .iter()
            .find(|c| y.caches.iter().any(|d| d.id == c.id))
        {
            return Sharing::Cache {
                level: c.level,
                size: c.size,
            };
        }
        if x.package == y.package {
            return Sharing::Package;
        }
        if x.node == y.node {
            return Sharing::Node;
        }
        Sharing::Remote {
            distance: self.node_distance(x.node, y.node),
        }
    }

    /// Where network interface `name` sits: looked up by name, then by its PCI address
    /// (`bus_info`, as ethtool reports it). A device hwloc does not list (veth, a bridge, a
    /// device in another namespace) has no locality.
    pub fn nic(&self, name: &str, bus_info: Option<&str>) -> Nic {
        let bus = bus_info.filter(|b| !b.is_empty());
        if let Some(n) = self
            .nics
            .iter()
            .find(|n| n.name == name || (bus.is_some() && n.pci.as_deref() == bus))
        {
            return Nic {
                name: name.to_string(),
                ..n.clone()
            };
        }
        let locality = match bus {
            Some(b) => format!("device {b} not found by hwloc: locality unknown"),
            None => {
                "virtual device (no PCI bus): no NUMA locality, every core is as close".to_string()
            }
        };
        Nic {
            name: name.to_string(),
            pci: bus.map(str::to_string),
            node: None,
            locality,
        }
    }

    /// A network device placed on `node`, for planning against machines described without I/O.
    pub fn with_nic(mut self, name: &str, node: usize) -> Machine {
        self.nics.push(Nic {
            name: name.to_string(),
            pci: None,
            node: Some(node),
            locality: format!("given as attached to NUMA node {node}"),
        });
        self
    }

    /// Keeps only these CPUs (what the process may run on).
    pub fn restrict(&self, allowed: &[usize]) -> Vec<&Cpu> {
        self.cpus
            .iter()
            .filter(|c| allowed.contains(&c.os))
            .collect()
    }

    /// One paragraph: packages, cores, threads, nodes, caches.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{}: {} package(s), {} core(s), {} hardware thread(s), {} NUMA node(s)",
            self.source,
            self.packages(),
            self.cores(),
            self.cpus.len(),
            self.nodes
        );
        let mut levels: Vec<(u8, Option<u64>, usize, usize)> = Vec::new();
        for level in 1..=5u8 {
            let ids: BTreeSet<u64> = self
                .cpus
                .iter()
                .flat_map(|c| c.caches.iter().filter(|k| k.level == level).map(|k| k.id))
                .collect();
            if ids.is_empty() {
                continue;
            }
            let size = self
                .cpus
                .iter()
                .flat_map(|c| c.caches.iter())
                .find(|k| k.level == level)
                .and_then(|k| k.size);
            let per = self.cpus.len() / ids.len();
            levels.push((level, size, ids.len(), per));
        }
        if !levels.is_empty() {
            let parts: Vec<String> = levels
                .iter()
                .map(|(l, size, n, per)| {
                    let size = size
                        .map(|b| format!(" {}", size_text(b)))
                        .unwrap_or_default();
                    format!("{n} x L{l}{size} (one per {per} thread(s))")
                })
                .collect();
            s.push_str(&format!("; caches: {}", parts.join(", ")));
        }
        if let Some(m) = &self.distances {
            let rows: Vec<String> = m
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .collect();
            s.push_str(&format!("; NUMA distances [{}]", rows.join(" | ")));
        }
        s
    }
}
