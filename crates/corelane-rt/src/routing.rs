//! The routes a runtime uses: the kernel's for its interface (read over netlink at build time,
//! unless turned off), then the builder's, which replace a kernel route for the same prefix.

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use corelane_stack::Stack;
use corelane_stack::route::RouteTable;
use corelane_stack::smoltcp::wire::{IpAddress, IpCidr};

use crate::Error;
use crate::host::KernelRoute;
use crate::lock::lock;

/// A route the application asked for with [`Builder::gateway`](crate::Builder::gateway) or
/// [`Builder::route`](crate::Builder::route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub(crate) dst: IpCidr,
    pub(crate) via: IpAddr,
}

/// The table every core's stack starts with: the `kernel`'s routes out of `ifname` (as the
/// host read them; none when they are not followed), then the application's.
pub(crate) fn resolve(
    ifname: &str,
    addrs: &[IpCidr],
    kernel: &[KernelRoute],
    wanted: &[Wanted],
) -> Result<RouteTable, Error> {
    let mut table = RouteTable::default();
    for r in kernel {
        let dst = IpCidr::new(r.dst.into(), r.prefix);
        let via = r.via.map(IpAddress::from);
        // The owned subnets are on the link already.
        if via.is_none() && addrs.iter().any(|a| a.contains_subnet(&dst)) {
            continue;
        }
        if let Some(g) = via
            && !on_link(addrs, &table, g)
        {
            tracing::warn!(
                "kernel route {r} on {ifname}: its gateway is on none of the runtime's \
                 subnets ({}), so corelane cannot reach it; skipped",
                list(addrs)
            );
            continue;
        }
        if let Err(e) = table.add(dst, via) {
            tracing::warn!("kernel route {r} on {ifname} skipped: {e}");
        }
    }
    for w in wanted {
        let via = IpAddress::from(w.via);
        if !on_link(addrs, &table, via) {
            return Err(Error::Config(format!(
                "gateway {} (for {}) is on none of the runtime's subnets ({}): a gateway must \
                 be reachable on the link; add an address in its subnet with .addr()",
                w.via,
                w.dst,
                list(addrs)
            )));
        }
        table.add(w.dst, Some(via))?;
    }
    Ok(table)
}

/// True when `g` is in the subnet of an owned address or of an on-link route.
/// Whether gateway `g` is reachable on the link: in an owned subnet, behind an on-link route,
/// or an IPv6 link-local address (every IPv6 link has them: a router advertises itself from
/// one).
fn on_link(addrs: &[IpCidr], table: &RouteTable, g: IpAddress) -> bool {
    let link_local =
        matches!(g, IpAddress::Ipv6(a) if a.octets()[0] == 0xfe && a.octets()[1] & 0xc0 == 0x80);
    link_local
        || addrs.iter().any(|c| c.contains_addr(&g))
        || table.lookup(g).is_some_and(|r| r.via.is_none())
}

/// The routes every core should use, and a generation bumped on each change: the kernel's
/// routes are read again when they change while the runtime runs (`cores.rs` watches), and
/// each core compares one number per turn.
#[derive(Debug, Default)]
pub(crate) struct RouteBook {
    table: Mutex<RouteTable>,
    generation: AtomicU64,
}

impl RouteBook {
    pub(crate) fn new(table: RouteTable) -> RouteBook {
        RouteBook {
            table: Mutex::new(table),
            generation: AtomicU64::new(0),
        }
    }

    /// Puts `table` in force; false when it is the table in force already.
    pub(crate) fn replace(&self, table: RouteTable) -> bool {
        let mut t = lock(&self.table);
        if *t == table {
            return false;
        }
        *t = table;
        self.generation.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// The table in force.
    pub(crate) fn table(&self) -> RouteTable {
        lock(&self.table).clone()
    }

    /// Gives `stack` the table in force if it changed since generation `seen`.
    pub(crate) fn sync(&self, seen: &mut u64, stack: &mut Stack) -> bool {
        let now = self.generation.load(Ordering::Acquire);
        if now == *seen {
            return false;
        }
        *seen = now;
        stack.set_routes(self.table());
        true
    }
}

fn list(addrs: &[IpCidr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p<T: std::str::FromStr>(s: &str) -> Result<T, String> {
        s.parse().map_err(|_| format!("{s} does not parse"))
    }

    #[test]
    fn a_gateway_off_every_owned_subnet_is_refused_with_the_fix() -> Result<(), String> {
        let addrs = [p::<IpCidr>("10.1.0.5/24")?, p("fd00:1::5/64")?];
        let ok = [
            Wanted {
                dst: p("0.0.0.0/0")?,
                via: p("10.1.0.1")?,
            },
            Wanted {
                dst: p("::/0")?,
                via: p("fd00:1::1")?,
            },
        ];
        let t = resolve("lo", &addrs, &[], &ok).map_err(|e| e.to_string())?;
        assert_eq!(t.routes().len(), 2);
        assert_eq!(t.routes()[0].to_string(), "default via 10.1.0.1");
        let bad = [Wanted {
            dst: p("0.0.0.0/0")?,
            via: p("10.2.0.1")?,
        }];
        match resolve("lo", &addrs, &[], &bad) {
            Err(Error::Config(m)) => {
                assert!(m.contains("10.2.0.1") && m.contains(".addr()"), "{m}")
            }
            other => return Err(format!("expected a configuration error, got {other:?}")),
        }
        let family = [Wanted {
            dst: p("::/0")?,
            via: p("10.1.0.1")?,
        }];
        assert!(resolve("lo", &addrs, &[], &family).is_err());
        Ok(())
    }

    #[test]
    fn a_link_local_gateway_is_on_the_link() -> Result<(), String> {
        // What a router advertisement gives: a default route via the router's link-local
        // address, in none of the owned subnets.
        let addrs = [p::<IpCidr>("fd00:1::5/64")?];
        let ra = [Wanted {
            dst: p("::/0")?,
            via: p("fe80::1")?,
        }];
        let t = resolve("lo", &addrs, &[], &ra).map_err(|e| e.to_string())?;
        assert_eq!(t.routes()[0].to_string(), "default via fe80::1");
        Ok(())
    }

    #[test]
    fn a_changed_table_replaces_the_one_in_force() -> Result<(), String> {
        let mut first = RouteTable::default();
        first
            .add(p("0.0.0.0/0")?, Some(p("10.1.0.1")?))
            .map_err(|e| e.to_string())?;
        let book = RouteBook::new(first.clone());
        assert!(!book.replace(first.clone()), "the same table is no change");
        let mut second = first.clone();
        second
            .add(p("::/0")?, Some(p("fe80::1")?))
            .map_err(|e| e.to_string())?;
        assert!(book.replace(second.clone()));
        assert_eq!(book.table(), second);
        Ok(())
    }
}
