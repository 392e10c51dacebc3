//! Routes: which next hop a destination off this host's links is reached through. The longest
//! matching prefix wins; among equal prefixes, the route added first.
//!
//! ```
//! use corelane_stack::route::RouteTable;
//! # fn p<T: std::str::FromStr>(s: &str) -> Result<T, String> {
//! #     s.parse().map_err(|_| format!("{s} does not parse"))
//! # }
//! let mut t = RouteTable::default();
//! t.add(p("0.0.0.0/0")?, Some(p("10.1.0.1")?))?;
//! t.add(p("192.168.7.0/24")?, Some(p("10.1.0.254")?))?;
//! t.add(p("172.16.0.0/16")?, None)?; // on the link, no gateway
//! assert_eq!(t.next_hop(p("192.168.7.9")?), Some(p("10.1.0.254")?));
//! assert_eq!(t.next_hop(p("8.8.8.8")?), Some(p("10.1.0.1")?));
//! assert_eq!(t.next_hop(p("172.16.3.4")?), Some(p("172.16.3.4")?));
//! assert_eq!(t.next_hop(p("fd00::1")?), None); // no IPv6 route
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use smoltcp::wire::{IpAddress, IpCidr};

use crate::config::StackError;

/// Most routes a table holds (each stack mirrors the gateway routes into smoltcp's interface,
/// whose table has this size).
pub const MAX_ROUTES: usize = 64;

/// One route: destinations in `dst` are reached through `via`, or directly on the link when
/// `via` is None.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The destination prefix.
    pub dst: IpCidr,
    /// The gateway, on one of this host's links; None: the destinations are on the link.
    pub via: Option<IpAddress>,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dst.prefix_len() == 0 {
            f.write_str("default")?;
        } else {
            write!(f, "{}", self.dst)?;
        }
        match self.via {
            Some(g) => write!(f, " via {g}"),
            None => f.write_str(" on-link"),
        }
    }
}

/// A table of [`Route`]s, IPv4 and IPv6 together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    /// Adds a route. A route for a prefix already present replaces it.
    ///
    /// # Errors
    /// A gateway of the other family than the prefix, an unspecified or multicast gateway, or
    /// a full table ([`MAX_ROUTES`]).
    pub fn add(&mut self, dst: IpCidr, via: Option<IpAddress>) -> Result<(), StackError> {
        if let Some(g) = via {
            let same_family = matches!(
                (dst, g),
                (IpCidr::Ipv4(_), IpAddress::Ipv4(_)) | (IpCidr::Ipv6(_), IpAddress::Ipv6(_))
            );
            if !same_family {
                return Err(StackError::Refused(format!(
                    "route {dst} via {g}: the gateway must be of the prefix's family"
                )));
            }
            if g.is_unspecified() || g.is_multicast() || g.is_broadcast() {
                return Err(StackError::Refused(format!(
                    "route {dst} via {g}: the gateway must be a unicast address"
                )));
            }
        }
        // Keep the prefix in its canonical form (host bits cleared), so equal prefixes compare
        // equal.
        let dst = canonical(dst);
        let route = Route { dst, via };
        if let Some(r) = self.routes.iter_mut().find(|r| r.dst == dst) {
            *r = route;
            return Ok(());
        }
        if self.routes.len() >= MAX_ROUTES {
            return Err(StackError::Refused(format!(
                "route {route}: the table is full ({MAX_ROUTES} routes)"
            )));
        }
        self.routes.push(route);
        Ok(())
    }

    /// Removes the route for prefix `dst`; returns it if there was one.
    pub fn remove(&mut self, dst: IpCidr) -> Option<Route> {
        let dst = canonical(dst);
        let i = self.routes.iter().position(|r| r.dst == dst)?;
        Some(self.routes.remove(i))
    }

    /// The routes, in the order they were added.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The route `remote` takes: the longest matching prefix.
    pub fn lookup(&self, remote: IpAddress) -> Option<&Route> {
        let mut best: Option<&Route> = None;
        for r in &self.routes {
            if r.dst.contains_addr(&remote)
                && best.is_none_or(|b| r.dst.prefix_len() > b.dst.prefix_len())
            {
                best = Some(r);
            }
        }
        best
    }

    /// The next hop toward `remote` by this table: its route's gateway, or `remote` itself for
    /// an on-link route; None without a route. (On-link destinations of the host's own
    /// addresses are the caller's to check first.)
    pub fn next_hop(&self, remote: IpAddress) -> Option<IpAddress> {
        self.lookup(remote).map(|r| r.via.unwrap_or(remote))
    }
}

/// `c` with its host bits cleared.
pub(crate) fn canonical(c: IpCidr) -> IpCidr {
    match c {
        IpCidr::Ipv4(v) => IpCidr::Ipv4(v.network()),
        IpCidr::Ipv6(v) => {
            let bits = u128::from_be_bytes(v.address().octets());
            let mask = u128::MAX
                .checked_shl(128 - u32::from(v.prefix_len()))
                .unwrap_or(0);
            let addr = smoltcp::wire::Ipv6Address::from_octets((bits & mask).to_be_bytes());
            IpCidr::new(IpAddress::Ipv6(addr), v.prefix_len())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    fn p<T: std::str::FromStr>(s: &str) -> std::result::Result<T, String> {
        s.parse().map_err(|_| format!("{s} does not parse"))
    }

    #[test]
    fn the_longest_prefix_wins_and_a_prefix_is_replaced() -> Result {
        let mut t = RouteTable::default();
        t.add(p("::/0")?, Some(p("fd00:1::1")?))?;
        t.add(p("fd00:9::/32")?, Some(p("fd00:1::9")?))?;
        t.add(p("fd00:9:1::/48")?, Some(p("fd00:1::8")?))?;
        assert_eq!(t.next_hop(p("fd00:9:1::5")?), Some(p("fd00:1::8")?));
        assert_eq!(t.next_hop(p("fd00:9:2::5")?), Some(p("fd00:1::9")?));
        assert_eq!(t.next_hop(p("2001:db8::1")?), Some(p("fd00:1::1")?));
        assert_eq!(t.next_hop(p("10.0.0.1")?), None);
        // Host bits do not make a new prefix: this replaces the /32.
        t.add(p("fd00:9::77/32")?, Some(p("fd00:1::7")?))?;
        assert_eq!(t.routes().len(), 3);
        assert_eq!(t.next_hop(p("fd00:9:2::5")?), Some(p("fd00:1::7")?));
        assert!(t.remove(p("fd00:9::/32")?).is_some());
        assert_eq!(t.next_hop(p("fd00:9:2::5")?), Some(p("fd00:1::1")?));
        Ok(())
    }

    #[test]
    fn a_bad_gateway_or_a_full_table_is_refused() -> Result {
        let mut t = RouteTable::default();
        assert!(t.add(p("0.0.0.0/0")?, Some(p("fd00::1")?)).is_err());
        assert!(t.add(p("0.0.0.0/0")?, Some(p("0.0.0.0")?)).is_err());
        assert!(t.add(p("0.0.0.0/0")?, Some(p("224.0.0.1")?)).is_err());
        for i in 0..MAX_ROUTES {
            t.add(p(&format!("10.{i}.0.0/16"))?, None)?;
        }
        let e = t.add(p("192.168.0.0/16")?, None);
        assert!(
            e.is_err_and(|e| e.to_string().contains("full")),
            "a full table says so"
        );
        assert_eq!(t.routes()[0].to_string(), "10.0.0.0/16 on-link");
        Ok(())
    }
}
