//! Placement policies and the planner that turns one into lanes: which CPU runs the protocol
//! for which queue, and which CPU runs the application beside it.

use std::fmt;

use crate::Error;
use crate::machine::{Cpu, Machine, Nic, Sharing};

/// Where the protocol and the application run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Placement {
    /// Protocol and application on one CPU per lane: packet data stays in that core's caches
    /// and nothing crosses cores. Cheapest per byte up to what one core can carry.
    #[default]
    SameCore,
    /// The protocol on one CPU and the application on another that shares the closest cache
    /// level with it (SMT siblings, else a shared L2, else L3): more cycles per lane, for a
    /// small cross-core cost.
    SharedCache,
    /// The protocol on one CPU and the application on a CPU that shares as little as possible
    /// with it (another package or NUMA node when there is one): the layout to compare against,
    /// or for an application that would otherwise thrash the protocol's caches.
    Spread,
    /// The fewest same-core lanes that carry `target_bits_per_sec` when each carries about
    /// `per_core_bits_per_sec`, packed close together; [`Plan::grow`] adds the next core.
    Fewest {
        /// The load to carry.
        target_bits_per_sec: u64,
        /// What one lane carries (measure it: see the bulk example).
        per_core_bits_per_sec: u64,
    },
    /// Given CPUs: lane `i` runs its protocol on `protocol[i]` and its application on
    /// `application[i]` (the same CPU when `application` is empty).
    Explicit {
        /// Protocol CPU per lane.
        protocol: Vec<usize>,
        /// Application CPU per lane; empty for the same CPUs.
        application: Vec<usize>,
    },
}

impl Placement {
    /// Parses `same-core`, `shared-cache`, `spread`, `fewest:<Gbit/s>[:<Gbit/s per core>]` or a
    /// CPU list `0,2,4` (protocol and application together) or `0,2/1,3` (protocol/application).
    pub fn parse(s: &str) -> Result<Placement, Error> {
        let bad = |why: &str| {
            Error::Plan(format!(
                "placement `{s}`: {why}; expected same-core, shared-cache, spread, \
                 fewest:<Gbit/s>[:<Gbit/s per core>], or CPU lists like 0,2 or 0,2/1,3"
            ))
        };
        let gbit = |t: &str| {
            t.parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0 && v.is_finite())
                .map(|v| (v * 1e9) as u64)
                .ok_or_else(|| bad("not a rate in Gbit/s"))
        };
        let cpus = |t: &str| {
            t.split(',')
                .map(|c| {
                    c.trim()
                        .parse::<usize>()
                        .map_err(|_| bad("not a CPU number"))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        match s {
            "same-core" | "samecore" => Ok(Placement::SameCore),
            "shared-cache" | "sharedcache" => Ok(Placement::SharedCache),
            "spread" => Ok(Placement::Spread),
            _ if s.starts_with("fewest") => {
                let mut parts = s.split(':').skip(1);
                let target = gbit(parts.next().ok_or_else(|| bad("no target rate"))?)?;
                let per = match parts.next() {
                    Some(p) => gbit(p)?,
                    None => DEFAULT_PER_CORE_BITS,
                };
                Ok(Placement::Fewest {
                    target_bits_per_sec: target,
                    per_core_bits_per_sec: per,
                })
            }
            _ if s.starts_with(|c: char| c.is_ascii_digit()) => {
                let (p, a) = s.split_once('/').unwrap_or((s, ""));
                let protocol = cpus(p)?;
                let application = if a.is_empty() { Vec::new() } else { cpus(a)? };
                Ok(Placement::Explicit {
                    protocol,
                    application,
                })
            }
            _ => Err(bad("unknown policy")),
        }
    }

    /// The policy's name, as [`Placement::parse`] reads it.
    pub fn name(&self) -> &'static str {
        match self {
            Placement::SameCore => "same-core",
            Placement::SharedCache => "shared-cache",
            Placement::Spread => "spread",
            Placement::Fewest { .. } => "fewest",
            Placement::Explicit { .. } => "explicit",
        }
    }
}

/// What one lane carries when nothing better is known: 2.5 Gbit/s, about what one core moves
/// through the bulk example over veth in copy mode.
pub const DEFAULT_PER_CORE_BITS: u64 = 2_500_000_000;

/// One lane: a queue, the CPU that runs its protocol and the CPU that runs its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// The interface queue it serves.
    pub queue: u32,
    /// CPU running the pipeline (RX, protocol, TX).
    pub protocol_cpu: usize,
    /// CPU running the application's tasks (the same as `protocol_cpu` for same-core lanes).
    pub app_cpu: usize,
    /// What the two CPUs share.
    pub sharing: Sharing,
    /// The NUMA distance from the protocol CPU to the NIC (None when the NIC has no node).
    pub nic_distance: Option<u64>,
}

impl Lane {
    /// True when the application runs on a CPU of its own.
    pub fn split(&self) -> bool {
        self.protocol_cpu != self.app_cpu
    }
}

/// The result of planning: lanes in queue order, and why.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The policy planned for.
    pub placement: Placement,
    /// One per queue.
    pub lanes: Vec<Lane>,
    /// The network device.
    pub nic: Nic,
    /// The machine, in one line.
    pub machine: String,
    /// Why the plan is what it is, one reason per line.
    pub reasons: Vec<String>,
    /// Protocol CPUs the plan would add next, in order ([`Plan::grow`]).
    pub spare: Vec<usize>,
}

impl Plan {
    /// Protocol CPUs, in lane order.
    pub fn protocol_cpus(&self) -> Vec<usize> {
        self.lanes.iter().map(|l| l.protocol_cpu).collect()
    }

    /// Application CPUs, in lane order.
    pub fn app_cpus(&self) -> Vec<usize> {
        self.lanes.iter().map(|l| l.app_cpu).collect()
    }

    /// True when any lane runs its application on a separate CPU.
    pub fn split(&self) -> bool {
        self.lanes.iter().any(Lane::split)
    }

    /// The plan with one more same-core lane, on the next CPU in placement order (None when
    /// no CPU is left). This is how [`Placement::Fewest`] grows with the load.
    pub fn grow(&self, machine: &Machine) -> Option<Plan> {
        let cpu = *self.spare.first()?;
        let mut next = self.clone();
        next.spare.remove(0);
        next.lanes
            .push(lane(machine, &self.nic, self.lanes.len() as u32, cpu, cpu));
        next.reasons.push(format!(
            "grown to {} lane(s): CPU {cpu} is the closest unused one",
            next.lanes.len()
        ));
        Some(next)
    }
}

fn lane(machine: &Machine, nic: &Nic, queue: u32, p: usize, a: usize) -> Lane {
    let nic_distance = nic.node.and_then(|n| {
        machine
            .cpu(p)
            .and_then(|c| machine.node_distance(c.node, n))
    });
    Lane {
        queue,
        protocol_cpu: p,
        app_cpu: a,
        sharing: machine.sharing(p, a),
        nic_distance,
    }
}

/// What to plan for.
#[derive(Debug, Clone)]
pub struct Request {
    /// Lanes (queues) wanted; None for as many as the policy fits on the allowed CPUs.
    pub lanes: Option<usize>,
    /// At most this many lanes (the interface's queue limit), when `lanes` is None.
    pub max_lanes: Option<usize>,
    /// CPUs the process may use (OS numbers).
    pub allowed: Vec<usize>,
    /// The network device.
    pub nic: Nic,
}

/// CPUs in placement order: NIC-local nodes first (by NUMA distance), then package, core and
/// thread, with one thread per core before any SMT sibling.
fn ordered<'m>(machine: &'m Machine, allowed: &[usize], nic: &Nic) -> Vec<&'m Cpu> {
    let mut cpus = machine.restrict(allowed);
    // Unknown distances between different nodes count as one hop (20).
    let dist = |c: &Cpu| {
        nic.node
            .map_or(0, |n| machine.node_distance(c.node, n).unwrap_or(20))
    };
    // Rank of a thread within its core: 0 for the first thread, 1 for its sibling, ...
    let sibling_rank = |c: &Cpu| {
        machine
            .cpus()
            .iter()
            .filter(|o| o.core == c.core && o.os < c.os)
            .count()
    };
    cpus.sort_by_cached_key(|c| (sibling_rank(c), dist(c), c.node, c.package, c.core, c.os));
    cpus
}

/// Plans `placement` on `machine` for `request`.
pub fn plan(machine: &Machine, placement: &Placement, request: &Request) -> Result<Plan, Error> {
    let nic = request.nic.clone();
    let order = ordered(machine, &request.allowed, &nic);
    if order.is_empty() {
        return Err(Error::Plan(format!(
            "none of the allowed CPUs {:?} is on the machine ({} CPUs)",
            request.allowed,
            machine.cpus().len()
        )));
    }
    // Lanes: as asked, else the policy's default within the queue limit.
    let cap = |fit: usize, default: usize| {
        let n = request
            .lanes
            .unwrap_or_else(|| request.max_lanes.map_or(default, |m| default.min(m)).max(1));
        if n == 0 {
            Err(Error::Plan("zero lanes asked for".into()))
        } else if n > fit {
            Err(Error::Plan(format!(
                "{} lane(s) asked for, but the {} placement fits only {fit} on the allowed CPUs {:?}",
                n,
                placement.name(),
                request.allowed
            )))
        } else {
            Ok(n)
        }
    };
    let physical = order
        .iter()
        .map(|c| c.core)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let mut reasons = Vec::new();
    match &nic.node {
        Some(n) => reasons.push(format!(
            "{} is on NUMA node {n}: CPUs of that node come first",
            nic.name
        )),
        None => reasons.push(format!("{}: {}", nic.name, nic.locality)),
    }
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    let mut spare = Vec::new();
    match placement {
        Placement::SameCore | Placement::Fewest { .. } => {
            let n = match placement {
                Placement::Fewest {
                    target_bits_per_sec,
                    per_core_bits_per_sec,
                } => {
                    let per = (*per_core_bits_per_sec).max(1);
                    let need = target_bits_per_sec.div_ceil(per).max(1) as usize;
                    let n = need
                        .min(request.lanes.unwrap_or(order.len()))
                        .min(order.len());
                    reasons.push(format!(
                        "{:.2} Gbit/s at about {:.2} Gbit/s per core needs {need} core(s); {n} planned",
                        *target_bits_per_sec as f64 / 1e9,
                        per as f64 / 1e9
                    ));
                    if n < need {
                        reasons.push(format!(
                            "only {n} CPU(s) allowed: the target may not be reached"
                        ));
                    }
                    n
                }
                _ => cap(order.len(), physical)?,
            };
            pairs.extend(order.iter().take(n).map(|c| (c.os, c.os)));
            spare = order.iter().skip(n).map(|c| c.os).collect();
            reasons.push(
                "protocol and application share each lane's CPU: frames and socket buffers stay in \
                 that core's caches, and nothing crosses cores"
                    .to_string(),
            );
            if n > physical {
                reasons.push(format!(
                    "{n} lanes on {physical} physical core(s): some lanes are SMT siblings and \
                     share a core's execution units"
                ));
            } else {
                reasons.push("one lane per physical core; SMT siblings left idle".to_string());
            }
        }
        Placement::SharedCache | Placement::Spread => {
            let n = cap(order.len() / 2, order.len() / 2)?;
            let closest = matches!(placement, Placement::SharedCache);
            let mut free: Vec<&Cpu> = order.clone();
            let mut no_choice = true;
            for _ in 0..n {
                // The protocol CPU: the first free one in placement order (NIC-local first).
                let p = free.remove(0);
                let pos = (0..free.len())
                    .min_by_key(|&i| {
                        let r = machine.sharing(p.os, free[i].os).rank();
                        (if closest { r } else { u64::MAX - r }, i)
                    })
                    .ok_or_else(|| Error::Plan("no CPU left for an application".into()))?;
                let ranks = free.iter().map(|c| machine.sharing(p.os, c.os).rank());
                no_choice &= ranks.clone().min() == ranks.max();
                let a = free.remove(pos);
                pairs.push((p.os, a.os));
            }
            spare = free.iter().map(|c| c.os).collect();
            if closest {
                reasons.push(
                    "each protocol CPU gets the free CPU that shares the closest cache with it \
                     (SMT sibling, then L2, then L3): socket data crosses between them through \
                     that cache"
                        .to_string(),
                );
            } else {
                reasons.push(
                    "each protocol CPU gets the free CPU that shares the least with it (another \
                     package or NUMA node when there is one): socket data crosses the \
                     interconnect, the costly layout the seed experiments measured"
                        .to_string(),
                );
            }
            if no_choice {
                reasons.push(
                    "every free CPU shares the same with its protocol CPU: shared-cache and \
                     spread choose alike on this machine"
                        .to_string(),
                );
            }
        }
        Placement::Explicit {
            protocol,
            application,
        } => {
            if protocol.is_empty() {
                return Err(Error::Plan("explicit placement with no CPU".into()));
            }
            if !application.is_empty() && application.len() != protocol.len() {
                return Err(Error::Plan(format!(
                    "{} protocol CPU(s) but {} application CPU(s): give one each per lane",
                    protocol.len(),
                    application.len()
                )));
            }
            if let Some(n) = request.lanes
                && n != protocol.len()
            {
                return Err(Error::Plan(format!(
                    "{n} lane(s) asked for but {} CPU(s) given",
                    protocol.len()
                )));
            }
            let app = if application.is_empty() {
                protocol
            } else {
                application
            };
            for (i, (&p, &a)) in protocol.iter().zip(app).enumerate() {
                for c in [p, a] {
                    if machine.cpu(c).is_none() {
                        return Err(Error::Plan(format!(
                            "CPU {c} does not exist ({} CPUs: 0-{})",
                            machine.cpus().len(),
                            machine.cpus().len().saturating_sub(1)
                        )));
                    }
                    if !request.allowed.contains(&c) {
                        return Err(Error::Plan(format!(
                            "CPU {c} is not one this process may run on (allowed: {:?})",
                            request.allowed
                        )));
                    }
                }
                if protocol[..i].contains(&p) {
                    return Err(Error::Plan(format!(
                        "CPU {p} runs the protocol of two lanes: one protocol CPU per lane"
                    )));
                }
                pairs.push((p, a));
            }
            reasons.push("CPUs as given".to_string());
        }
    }
    let lanes: Vec<Lane> = pairs
        .iter()
        .enumerate()
        .map(|(i, &(p, a))| lane(machine, &nic, i as u32, p, a))
        .collect();
    if let Some(node) = nic.node {
        let far: Vec<usize> = lanes
            .iter()
            .filter(|l| l.nic_distance.is_some_and(|d| d > 10))
            .map(|l| l.protocol_cpu)
            .collect();
        if !far.is_empty() {
            reasons.push(format!(
                "protocol CPU(s) {far:?} are not on the NIC's node {node}: every frame crosses \
                 the interconnect"
            ));
        }
    }
    Ok(Plan {
        placement: placement.clone(),
        lanes,
        nic,
        machine: machine.summary(),
        reasons,
        spare,
    })
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "machine: {}", self.machine)?;
        writeln!(f, "NIC {}: {}", self.nic.name, self.nic.locality)?;
        writeln!(
            f,
            "placement {}: {} lane(s)",
            self.placement.name(),
            self.lanes.len()
        )?;
        for (i, l) in self.lanes.iter().enumerate() {
            let nic = match l.nic_distance {
                Some(d) => format!("NUMA distance to the NIC {d}"),
                None => "no NUMA distance to the NIC".to_string(),
            };
            if l.split() {
                writeln!(
                    f,
                    "  lane {i}: queue {} -> protocol on CPU {}, application on CPU {}: {}; {nic}",
                    l.queue, l.protocol_cpu, l.app_cpu, l.sharing
                )?;
            } else {
                writeln!(
                    f,
                    "  lane {i}: queue {} -> protocol and application on CPU {} (same core: share L1, L2 and every cache above); {nic}",
                    l.queue, l.protocol_cpu
                )?;
            }
        }
        for r in &self.reasons {
            writeln!(f, "why: {r}")?;
        }
        if !self.spare.is_empty() {
            let shown: Vec<String> = self.spare.iter().take(8).map(|c| c.to_string()).collect();
            let more = if self.spare.len() > 8 { ", ..." } else { "" };
            writeln!(f, "next CPUs, in order: {}{more}", shown.join(", "))?;
        }
        Ok(())
    }
}
