//! Opening a run from its configuration: the checks, the queues, the XDP program, the
//! sockets and the control plane.

use std::io;
use std::sync::{Arc, Mutex};

use crate::access::Access;
use crate::addrbook::AddrBook;
use crate::builder::Builder;
use crate::control::Shared;
use crate::cookies::XdpCookies;
use crate::launch::{LaneSocket, Runtime};
use crate::life::Life;
use crate::queues::{RestoreQueues, queues_needed};
use crate::routing::RouteBook;
use crate::steward::Steer;
use crate::telemetry::Telemetry;
use crate::{Error, handoff};

impl Builder {
    /// Checks the configuration, attaches the XDP program and owns the addresses. The AF_XDP
    /// sockets are opened by each core when [`Runtime::run`](crate::Runtime::run) starts it.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// use corelane::{PollMode, Runtime};
    /// let rt = Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .cores(2)
    ///     .poll_mode(PollMode::Busy)
    ///     .build()?;
    /// println!("{}", rt.describe());
    /// # Ok::<(), corelane::Error>(())
    /// ```
    ///
    /// # Errors
    /// Each names the cause and the fix: no address, too many addresses, missing privileges, no
    /// such interface, too few queues for the cores (when the driver cannot raise them), an MTU
    /// that does not fit a frame, or a driver that refuses the XDP program.
    pub fn build(mut self) -> Result<Runtime, Error> {
        let _say = crate::say::enter(&crate::say::dispatch());
        if let Some(bad) = self.invalid.first() {
            return Err(Error::Config(bad.clone()));
        }
        if self.addrs.is_empty() {
            return Err(Error::Config(
                "no address: give the runtime at least one address it owns (e.g. 10.0.0.1/24)"
                    .into(),
            ));
        }
        if self.addrs.len() > corelane_stack::MAX_ADDRS {
            return Err(Error::Config(format!(
                "{} addresses: at most {} per runtime",
                self.addrs.len(),
                corelane_stack::MAX_ADDRS
            )));
        }
        // Taking over from a running process: its program, and its queues below.
        let taken = match &self.upgrade_from {
            Some((path, optional)) => {
                crate::host::xsk::join::Joining::connect(path, &self.ifname, *optional)?
            }
            None => None,
        };
        let (access, mut joining) = match taken {
            Some((access, joining)) => (access, Some(joining)),
            None => {
                // The UMEMs' locked memory, checked with the privileges: one lane's, times the
                // lanes asked for (the plan, made once the interface is claimed, may add more;
                // the sockets check the exact amount).
                let lanes = self
                    .queues
                    .as_ref()
                    .map(Vec::len)
                    .or(self.lanes)
                    .unwrap_or(1);
                let umem = u64::from(self.xsk.frames) * u64::from(self.xsk.frame_bytes());
                (
                    Access::get(&self.ifname, self.xdp, umem * lanes as u64)?,
                    None,
                )
            }
        };
        let (mut plan, channels) = self.make_plan()?;
        self.tcp_mem_default(plan.lanes.len());
        let publisher = self.publisher(&access, plan.lanes.len());
        let metrics = match (self.metrics, &publisher) {
            (Some(addr), Some(p)) => Some(crate::metrics::Metrics::serve(addr, p.path(), || {
                // The kernel does not refuse dropping.
                let _ = corelane_xsk::retain_caps(&[]);
            })?),
            (Some(_), None) => {
                return Err(Error::Config(
                    "metrics need the published statistics (publish_stats(true))".into(),
                ));
            }
            (None, _) => None,
        };
        if let Some(claim) = access.claim()
            && !claim.undone().is_empty()
        {
            plan.reasons.push(format!(
                "a corelane process died on {} without cleaning up; undone: {}",
                self.ifname,
                claim.undone().join(", ")
            ));
        }
        // An address the kernel holds too would be answered twice (ARP, TCP resets from the
        // kernel for corelane's connections): refused, unless shared (corelane then takes only
        // its ports there).
        // On any of the kernel's interfaces: it answers for its addresses on all of them (a
        // VLAN device's over this interface among them).
        let held = corelane_xsk::kernel_addrs_anywhere()?;
        let shared: Vec<std::net::IpAddr> = self
            .addrs
            .iter()
            .map(|c| std::net::IpAddr::from(c.address()))
            .filter(|a| held.iter().any(|(h, _, _)| h == a))
            .collect();
        if let (Some(&a), false) = (shared.first(), self.share_kernel_addrs) {
            let (prefix, dev) = held
                .iter()
                .find(|(h, _, _)| *h == a)
                .map_or((0, self.ifname.as_str()), |(_, p, d)| (*p, d.as_str()));
            return Err(Error::Config(format!(
                "{a} is the kernel's address on {dev}: the kernel and corelane would both answer \
                 for it; share it (Builder::share_kernel_addrs(true), `--shared` in the \
                 examples: corelane takes only the ports it serves), or give corelane an address \
                 the kernel does not hold (or remove it from the kernel: ip addr del \
                 {a}/{prefix} dev {dev})"
            )));
        }
        let kernel = match self.kernel_routes {
            true => corelane_xsk::kernel_routes(&self.ifname)?,
            false => Vec::new(),
        };
        let routes = crate::routing::resolve(&self.ifname, &self.addrs, &kernel, &self.routes)?;
        let nqueues = channels.map_or(1, |c| c.rx_queues());
        let need = queues_needed(&plan);
        let mut restore = None;
        if need > nqueues {
            let cores = plan.lanes.len();
            let raised = channels
                .filter(|c| c.max_rx_queues() >= need)
                .map(|c| access.set_queues(&self.ifname, c, need));
            match raised {
                Some(Ok(old)) => {
                    plan.reasons.push(format!(
                        "{} had {nqueues} receive queue(s): raised to {need} for this run \
                         (ethtool -L), restored at the end",
                        self.ifname
                    ));
                    restore = old;
                }
                other => {
                    let why = match other {
                        Some(Err(e)) => format!("setting its queues failed: {e}"),
                        _ => format!(
                            "its driver allows at most {}",
                            channels.map_or(1, |c| c.max_rx_queues())
                        ),
                    };
                    return Err(Error::Config(format!(
                        "{} has {nqueues} receive queue(s), too few for {cores} core(s) (queue {} \
                         does not exist) and {why}; run fewer cores or give it more queues \
                         (ethtool -L {} combined {need}, or a veth made with \
                         numrxqueues/numtxqueues)",
                        self.ifname,
                        need - 1,
                        self.ifname,
                    )));
                }
            }
        }
        let mut nqueues = nqueues.max(need);
        let mut lowered_from = None;
        if need < nqueues
            && self.queues.is_none()
            && let Some(c) = channels
        {
            // Queues nobody serves would pass their frames to the kernel, which does not hold
            // the addresses: connections whose frames land there would fail. Fewer queues for
            // the run, so every frame reaches a served one.
            match access.set_queues(&self.ifname, c, need) {
                Ok(old) => {
                    plan.reasons.push(format!(
                        "{} had {nqueues} receive queue(s): lowered to {need} for this run, so \
                         none goes unserved (ethtool -L), restored at the end",
                        self.ifname
                    ));
                    restore = old;
                    lowered_from = Some(nqueues);
                    nqueues = need;
                }
                Err(e) => tracing::warn!(
                    "{}: lowering its receive queues to {need} failed ({e})",
                    self.ifname
                ),
            }
        }
        if (nqueues as usize) > plan.lanes.len() {
            tracing::warn!(
                "{} has {nqueues} receive queues and {} are served: frames on the others go to \
                 the kernel (it holds none of the owned addresses: connections whose frames land \
                 there fail). Serve every queue (.cores({nqueues})), or steer the traffic to the \
                 served queues (ethtool -X / -N)",
                self.ifname,
                plan.lanes.len()
            );
        }
        let restore = RestoreQueues::new(&self.ifname, restore, access.claim().cloned());
        let mac = corelane_xsk::mac_address(&self.ifname)?;
        let mtu = (corelane_xsk::mtu(&self.ifname)? as usize).saturating_sub(self.vlan.mtu_cost());
        // Attach first: a driver that refuses the program (in native mode, say) explains more
        // than the frame size does.
        let mut steering = access.steering(&self.ifname, self.attach, self.vlan)?;
        if let Some(why) = steering.fallback_reason() {
            tracing::warn!(
                "{}",
                generic_fallback(&self.ifname, why, lowered_from.map(|f| (f, nqueues)))
            );
        }
        if let Err(e) = steering.linger_on_death(self.death_linger) {
            tracing::warn!(
                "{}: nothing will answer for this server if it dies ({e}): its peers wait for \
                 their timeouts",
                self.ifname
            );
        }
        crate::access::fit_frames(&self.ifname, mtu, self.vlan.tag_bytes(), &mut self.xsk)?;
        for a in &self.addrs {
            let a = std::net::IpAddr::from(a.address());
            if shared.contains(&a) {
                steering.own_shared_addr(a)?;
            } else {
                steering.own_addr(a)?;
            }
        }
        if !shared.is_empty() {
            plan.reasons.push(format!(
                "shared with the kernel: {} (corelane serves only its ports there)",
                shared
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let lanes: Vec<(u32, usize)> = plan
            .lanes
            .iter()
            .map(|l| (l.queue, l.protocol_cpu))
            .collect();
        let sockets: Vec<LaneSocket> = match &mut joining {
            Some(j) => j
                .join(&self.ifname, &lanes, &mut steering)?
                .into_iter()
                .map(|j| LaneSocket::Joining(Box::new(j)))
                .collect(),
            None => crate::access::open_sockets(&self.ifname, &lanes, &self.xsk, &mut steering)?
                .into_iter()
                .map(|q| LaneSocket::Open(Box::new(q)))
                .collect(),
        };
        let upgrade_listener = match &self.upgrades {
            Some((path, _)) => Some(crate::host::xsk::handover::Listener::open(path)?),
            None => None,
        };
        if !self.keep_capabilities {
            crate::access::drop_capabilities(steering.is_granted(), !shared.is_empty())?;
        }
        let bells = plan
            .lanes
            .iter()
            .map(|_| handoff::Doorbell::new())
            .collect::<io::Result<Vec<_>>>()?;
        let veth_native = steering.mode() == corelane_xsk::AttachedMode::Native
            && corelane_xsk::driver_info(steering.ifname()).is_ok_and(|d| d.driver == "veth");
        let shared = Arc::new(Shared {
            cookies: XdpCookies::new(self.xdp_cookies, &steering, veth_native),
            steer: Steer::new(steering),
            addrs: AddrBook::new(self.addrs.clone()),
            routes: RouteBook::new(routes.clone()),
            life: Life::default(),
            telemetry: Telemetry::new(publisher, metrics),
            auto_ports: Mutex::new(Vec::new()),
            bells,
            upgrades: Default::default(),
            clock: Default::default(),
            no_socket_open: Default::default(),
        });
        // One secret for every core: a SYN cookie issued on one core validates on any (the ACK
        // of a cookie may be answered by whichever core the segment reaches last), and ISNs
        // and timestamp offsets stay per four-tuple, not per core.
        let mut cfg = self;
        // Taking over, the old process's: its cookies and connections stay valid here.
        // A 128-bit key from the OS, unless the configuration fixed a seed (reproducible runs).
        match &joining {
            Some(j) => j.extras.secret.apply(&mut cfg.stack),
            None if cfg.stack.seed.is_none() && cfg.stack.key.is_none() => {
                match corelane_stack::StackConfig::random_key() {
                    Some(k) => cfg.stack.key = Some(k),
                    None => {
                        tracing::warn!(
                            "the OS gave no random bytes: the run's secret is seeded from the std \
                             library"
                        );
                        cfg.stack.seed = Some(cfg.stack.seed_or_random());
                    }
                }
            }
            None => {}
        }
        if cfg.stack.seed.is_none() && cfg.stack.restart_key.is_none() {
            cfg.stack.restart_key = restart_key(shared.steer.read().grant());
        }
        Ok(Runtime {
            shared,
            cfg,
            plan,
            nqueues,
            mac,
            mtu,
            routes,
            sockets: Mutex::new(sockets.into_iter().map(Some).collect()),
            upgrade_listener,
            joining: Mutex::new(joining),
            _restore: restore,
        })
    }
}

/// The key this host's runtimes of this user keep across restarts (`StackConfig::restart_key`):
/// the broker's for this user under a grant, else in the run directory; or None with a line
/// that says what a restart then risks.
fn restart_key(grant: Option<&corelane_xsk::GrantClient>) -> Option<[u64; 2]> {
    let dir = corelane_stat::run_dir();
    let key = match grant {
        Some(g) => g.restart_key().map_err(|e| e.to_string()),
        None => corelane_stat::restart_key(&dir).map_err(|e| format!("in {}: {e}", dir.display())),
    };
    match key {
        Ok(k) => Some(k),
        Err(e) => {
            tracing::info!(
                "no restart key ({e}): this run draws its own ISN and timestamp keys, so a peer \
                 that still holds one of the last run's connections in TIME-WAIT may answer a \
                 new SYN to it with the old connection's ACK (reset, and the SYN sent again at \
                 once)"
            );
            None
        }
    }
}

/// The line that says why XDP runs in generic mode after the driver refused native mode
/// (`why`); `lowered`: this run lowered the interface's receive queues (from, to). A veth
/// takes native XDP only with at least as many receive queues as its peer has transmit
/// queues: one lowered for fewer cores falls back for that reason, which the kernel's
/// "No space left on device" does not say.
pub(crate) fn generic_fallback(ifname: &str, why: &str, lowered: Option<(u32, u32)>) -> String {
    let veth = corelane_xsk::driver_info(ifname).is_ok_and(|d| d.driver == "veth");
    let mut s = format!(
        "{ifname}: the driver refused native XDP ({why}); the program runs in generic mode, \
         which copies every frame into a kernel buffer first (slower)"
    );
    if veth && why.contains("No space left on device") {
        match lowered {
            Some((from, to)) => s.push_str(&format!(
                ". A veth takes native XDP only with at least as many receive queues as its peer \
                 has transmit queues, and this run lowered {ifname}'s receive queues from {from} \
                 to {to} for its {to} core(s): serve {from} cores (Builder::cores({from})), or \
                 give the peer {to} transmit queue(s) (ethtool -L PEER tx {to}, in the peer's \
                 namespace)"
            )),
            None => s.push_str(
                ". A veth takes native XDP only with at least as many receive queues as its \
                 peer has transmit queues: give the peer fewer (ethtool -L PEER tx N) or this \
                 end more (ethtool -L IF rx N)",
            ),
        }
    } else {
        s.push_str(
            "; Builder::attach_mode(AttachMode::Generic) asks for it and silences this line",
        );
    }
    s
}
