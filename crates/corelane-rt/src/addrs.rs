//! Owned addresses changed while the runtime runs: a handle for any thread updates the XDP
//! program's address maps and a shared list; each core brings its stack in line with the list
//! at its next turn (one atomic load per turn when nothing changed).

use std::net::IpAddr;
use std::sync::{Arc, Weak};

use crate::Error;
use crate::cidr::{Cidr, IntoCidr};
use crate::control::Shared;

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
            .list()
            .into_iter()
            .map(Cidr::from_smoltcp)
            .collect()
    }

    /// Takes `cidr`'s address: the XDP program steers its frames at once, every core answers
    /// for it from its next turn, and core 0 announces it (gratuitous ARP or unsolicited
    /// neighbour advertisement).
    ///
    /// # Errors
    /// Not a unicast address, already owned, more than [`corelane_stack::MAX_ADDRS`], or the
    /// XDP program's map refused it; [`Error::Ended`] once the runtime has ended.
    pub fn add(&self, cidr: impl IntoCidr) -> Result<(), Error> {
        let cidr = cidr.into_cidr()?.to_smoltcp();
        let shared = self.shared()?;
        let steer = shared.steer.clone();
        shared
            .addrs
            .add(cidr, move |ip| Ok(steer.run(move |s| s.own_addr(ip))??))?;
        shared.ring_all();
        Ok(())
    }

    /// Gives up address `a`: its frames go to the kernel again and no core answers for it.
    /// Returns whether it was owned. Connections from it end by their timers.
    ///
    /// # Errors
    /// The XDP program's map refused the change.
    pub fn remove(&self, a: IpAddr) -> Result<bool, Error> {
        let shared = self.shared()?;
        let steer = shared.steer.clone();
        let owned = shared
            .addrs
            .remove(a, move |ip| Ok(steer.run(move |s| s.disown_addr(ip))??))?;
        if owned {
            shared.ring_all();
        }
        Ok(owned)
    }

    fn shared(&self) -> Result<Arc<Shared>, Error> {
        self.0
            .upgrade()
            .ok_or_else(|| Error::Ended("its addresses can no longer change".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_outliving_its_runtime_says_the_runtime_ended() -> Result<(), Error> {
        let gone = AddrHandle(Weak::new());
        assert!(gone.list().is_empty());
        match gone.add(crate::parse_cidr("10.0.0.6/24")?) {
            Err(Error::Ended(m)) => assert!(m.contains("addresses"), "{m}"),
            other => panic!("expected Error::Ended, got {other:?}"),
        }
        let e = gone.remove(
            "10.0.0.6"
                .parse()
                .map_err(|_| Error::Config("address".into()))?,
        );
        assert!(matches!(e, Err(Error::Ended(_))), "{e:?}");
        assert!(
            e.map_err(|e| e.to_string())
                .err()
                .is_some_and(|m| m.starts_with("the runtime has ended: ")),
        );
        Ok(())
    }
}
