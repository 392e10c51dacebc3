//! Owned addresses changed while the runtime runs: a handle for any thread updates the XDP
//! program's address maps and a shared list; each core brings its stack in line with the list
//! at its next turn (one atomic load per turn when nothing changed).

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use corelane_stack::Stack;
use corelane_stack::smoltcp::wire::IpAddress;

use crate::Error;
use crate::cidr::{Cidr, IntoCidr};
use crate::launch::Shared;

/// Adds and removes owned addresses of a running [`Runtime`](crate::Runtime), from any thread.
///
/// ```no_run
/// # use corelane_rt as corelane;
/// use corelane::parse_cidr;
/// let rt = corelane::Runtime::builder("eth0").addr(parse_cidr("10.0.0.5/24")?).build()?;
/// let addrs = rt.addr_handle();
/// let added = std::thread::spawn(move || addrs.add(parse_cidr("10.0.0.6/24")?));
/// # let _ = added;
/// # Ok::<(), corelane::Error>(())
/// ```
#[derive(Clone)]
pub struct AddrHandle(pub(crate) Weak<Shared>);

impl std::fmt::Debug for AddrHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddrHandle")
            .field("addrs", &self.list())
            .finish()
    }
}

impl AddrHandle {
    /// The owned addresses now.
    pub fn list(&self) -> Vec<Cidr> {
        let Some(shared) = self.0.upgrade() else {
            return Vec::new();
        };
        shared
            .addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|c| Cidr::from_smoltcp(*c))
            .collect()
    }

    /// Takes `cidr`'s address: the XDP program steers its frames at once, every core answers
    /// for it from its next turn, and core 0 announces it (gratuitous ARP or unsolicited
    /// neighbour advertisement).
    ///
    /// # Errors
    /// Not a unicast address, already owned, more than [`corelane_stack::MAX_ADDRS`], or the
    /// XDP program's map refused it.
    pub fn add(&self, cidr: impl IntoCidr) -> Result<(), Error> {
        let cidr = cidr.into_cidr()?.to_smoltcp();
        let a = cidr.address();
        if a.is_unspecified() || a.is_multicast() || a.is_broadcast() {
            return Err(Error::Config(format!(
                "{cidr}: an owned address must be unicast"
            )));
        }
        let shared = self.shared()?;
        let mut list = shared.addrs.lock().unwrap_or_else(|p| p.into_inner());
        if list.iter().any(|c| c.address() == a) {
            return Err(Error::Config(format!("{a} is already owned")));
        }
        if list.len() >= corelane_stack::MAX_ADDRS {
            return Err(Error::Config(format!(
                "{cidr}: at most {} addresses",
                corelane_stack::MAX_ADDRS
            )));
        }
        let ip = IpAddr::from(a);
        shared.steer(move |s| s.own_addr(ip))??;
        list.push(cidr);
        drop(list);
        changed(&shared);
        Ok(())
    }

    /// Gives up address `a`: its frames go to the kernel again and no core answers for it.
    /// Returns whether it was owned. Connections from it end by their timers.
    ///
    /// # Errors
    /// The XDP program's map refused the change.
    pub fn remove(&self, a: IpAddr) -> Result<bool, Error> {
        let shared = self.shared()?;
        let mut list = shared.addrs.lock().unwrap_or_else(|p| p.into_inner());
        let before = list.len();
        list.retain(|c| IpAddr::from(c.address()) != a);
        if list.len() == before {
            return Ok(false);
        }
        shared.steer(move |s| s.disown_addr(a))??;
        drop(list);
        changed(&shared);
        Ok(true)
    }

    fn shared(&self) -> Result<Arc<Shared>, Error> {
        self.0.upgrade().ok_or_else(|| {
            Error::Config("the runtime has ended: its addresses can no longer change".into())
        })
    }
}

fn changed(shared: &Shared) {
    shared.addrs_gen.fetch_add(1, Ordering::SeqCst);
    for b in &shared.bells {
        b.ring_always();
    }
}

/// Brings `stack` in line with the shared list if it changed since `seen`; returns the
/// addresses it newly took (for core 0 to announce).
pub(crate) fn sync(shared: &Shared, seen: &mut u64, stack: &mut Stack) -> Vec<IpAddress> {
    let now = shared.addrs_gen.load(Ordering::Acquire);
    if now == *seen {
        return Vec::new();
    }
    *seen = now;
    let list = shared
        .addrs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let gone: Vec<IpAddress> = stack
        .addrs()
        .iter()
        .map(|c| c.address())
        .filter(|a| !list.iter().any(|c| c.address() == *a))
        .collect();
    for a in gone {
        stack.remove_addr(a);
    }
    let mut added = Vec::new();
    for c in list {
        if !stack.addrs().iter().any(|o| o.address() == c.address()) && stack.add_addr(c).is_ok() {
            added.push(c.address());
        }
    }
    added
}
