//! The address book: the addresses the runtime owns, as every core should have them, and a
//! generation bumped on each change, so a core compares one number per turn and brings its
//! stack in line only after a change.

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use corelane_stack::Stack;
use corelane_stack::smoltcp::wire::{IpAddress, IpCidr};

use crate::Error;
use crate::lock::lock;

/// The owned addresses and their generation.
#[derive(Debug, Default)]
pub(crate) struct AddrBook {
    list: Mutex<Vec<IpCidr>>,
    generation: AtomicU64,
}

impl AddrBook {
    pub(crate) fn new(list: Vec<IpCidr>) -> AddrBook {
        AddrBook {
            list: Mutex::new(list),
            generation: AtomicU64::new(0),
        }
    }

    /// The owned addresses now.
    pub(crate) fn list(&self) -> Vec<IpCidr> {
        lock(&self.list).clone()
    }

    /// Adds `cidr` once `own` (the XDP program's map) has taken its address. Refused, with the
    /// book unchanged: not unicast, already owned, more than [`corelane_stack::MAX_ADDRS`], or
    /// `own`'s error.
    pub(crate) fn add(
        &self,
        cidr: IpCidr,
        own: impl FnOnce(IpAddr) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let a = cidr.address();
        if a.is_unspecified() || a.is_multicast() || a.is_broadcast() {
            return Err(Error::Config(format!(
                "{cidr}: an owned address must be unicast"
            )));
        }
        let mut list = lock(&self.list);
        if list.iter().any(|c| c.address() == a) {
            return Err(Error::Config(format!("{a} is already owned")));
        }
        if list.len() >= corelane_stack::MAX_ADDRS {
            return Err(Error::Config(format!(
                "{cidr}: at most {} addresses",
                corelane_stack::MAX_ADDRS
            )));
        }
        own(IpAddr::from(a))?;
        list.push(cidr);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Removes address `a` once `disown` (the XDP program's map) has let it go. False when it
    /// was not owned; `disown`'s error leaves the book unchanged.
    pub(crate) fn remove(
        &self,
        a: IpAddr,
        disown: impl FnOnce(IpAddr) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        let mut list = lock(&self.list);
        let Some(at) = list.iter().position(|c| IpAddr::from(c.address()) == a) else {
            return Ok(false);
        };
        disown(a)?;
        list.remove(at);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }

    /// Brings `stack` in line with the book if it changed since `seen`; returns the addresses
    /// it newly took (for core 0 to announce).
    pub(crate) fn sync(&self, seen: &mut u64, stack: &mut Stack) -> Vec<IpAddress> {
        let Some(list) = self.changed_since(seen) else {
            return Vec::new();
        };
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
            if !stack.addrs().iter().any(|o| o.address() == c.address())
                && stack.add_addr(c).is_ok()
            {
                added.push(c.address());
            }
        }
        added
    }

    /// The list, when it changed since generation `seen` (which becomes the current one).
    fn changed_since(&self, seen: &mut u64) -> Option<Vec<IpCidr>> {
        let now = self.generation.load(Ordering::Acquire);
        if now == *seen {
            return None;
        }
        *seen = now;
        Some(self.list())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> IpCidr {
        s.parse()
            .unwrap_or_else(|_| panic!("{s}: not a test address"))
    }

    fn ip(s: &str) -> Result<IpAddr, Error> {
        s.parse()
            .map_err(|_| Error::Config(format!("{s}: not an address")))
    }

    #[test]
    fn a_change_is_seen_once_and_a_refusal_changes_nothing() -> Result<(), Error> {
        let book = AddrBook::new(vec![cidr("10.0.0.1/24")]);
        let mut seen = 0;
        assert!(
            book.changed_since(&mut seen).is_none(),
            "nothing changed yet"
        );
        book.add(cidr("10.0.0.2/24"), |_| Ok(()))?;
        assert_eq!(book.changed_since(&mut seen).map(|l| l.len()), Some(2));
        assert!(book.changed_since(&mut seen).is_none(), "seen once");

        let refused = book.add(cidr("10.0.0.3/24"), |_| {
            Err(Error::Config("map full".into()))
        });
        assert!(refused.is_err());
        let dup = book.add(cidr("10.0.0.2/16"), |_| panic!("the program is not asked"));
        assert!(dup.is_err_and(|e| e.to_string().contains("already owned")));
        let multicast = book.add(cidr("224.0.0.1/4"), |_| panic!("the program is not asked"));
        assert!(multicast.is_err());
        assert!(
            book.changed_since(&mut seen).is_none(),
            "refusals change nothing"
        );

        let kept = book.remove(ip("10.0.0.1")?, |_| Err(Error::Config("map busy".into())));
        assert!(kept.is_err());
        assert_eq!(book.list().len(), 2, "a refused removal keeps the address");
        assert!(!book.remove(ip("10.9.9.9")?, |_| Ok(()))?);
        assert!(book.remove(ip("10.0.0.1")?, |_| Ok(()))?);
        assert_eq!(book.list(), [cidr("10.0.0.2/24")]);
        assert!(book.changed_since(&mut seen).is_some());
        Ok(())
    }

    #[test]
    fn at_most_max_addrs() -> Result<(), Error> {
        let book = AddrBook::default();
        for i in 0..corelane_stack::MAX_ADDRS {
            book.add(
                cidr(&format!("10.1.{}.{}/16", i / 200, 1 + i % 200)),
                |_| Ok(()),
            )?;
        }
        let over = book.add(cidr("10.2.0.1/16"), |_| Ok(()));
        assert!(over.is_err_and(|e| e.to_string().contains("at most")));
        Ok(())
    }
}
