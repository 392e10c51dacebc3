//! The in-memory host: its parts (the in-memory kernel, whose queues are AF_XDP queues over
//! memory; the in-memory program; the in-memory link a simulation's peers stand on), the one
//! place the lab (`crate::lab`) and the runtime simulation (`crate::sim`) take them from, and
//! its setup: a control plane over the in-memory program, on the clock the caller gives (the
//! wall's for a lab, a virtual one for a simulation).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use corelane_stack::smoltcp::wire::IpCidr;
pub(crate) use corelane_xsk::sim::{Misplaced, SimKernel};
pub(crate) use corelane_xsk::{
    MemLink, MemPort, MemProgram, PendingJoin, SplitMix64, XskConfig, XskQueue,
};

use crate::addrbook::AddrBook;
use crate::clock::Clock;
use crate::control::Shared;
use crate::cookies::XdpCookies;
use crate::handoff::Doorbell;
use crate::life::Life;
use crate::routing::RouteBook;
use crate::steward::Steer;
use crate::telemetry::Telemetry;

impl Shared {
    /// A control plane over the in-memory program `program` (a simulation's, a lab's), owning
    /// `addrs`, on `clock`, for one core whose application future runs until it drains.
    pub(crate) fn in_memory(
        program: &MemProgram,
        addrs: &[IpCidr],
        clock: &Clock,
    ) -> std::io::Result<Arc<Shared>> {
        let mut steering = program.steering("sim0");
        for a in addrs {
            steering
                .own_addr(a.address().into())
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        let shared = Arc::new(Shared {
            cookies: XdpCookies::new(Some(false), &steering, false),
            steer: Steer::new(steering),
            addrs: AddrBook::new(addrs.to_vec()),
            routes: RouteBook::new(Default::default()),
            life: Life::default(),
            telemetry: Telemetry::new(None, None),
            auto_ports: Mutex::new(Vec::new()),
            bells: vec![Doorbell::new()?],
            upgrades: Default::default(),
            clock: clock.clone(),
            no_socket_open: Default::default(),
        });
        shared.life.apps_running.store(1, Ordering::SeqCst);
        Ok(shared)
    }
}
