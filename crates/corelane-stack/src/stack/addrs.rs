//! The owned addresses and the routes: which address a packet leaves from, which next hop it
//! goes to, and the announcements that tell the link where an address is.

use corelane_frame::FrameIo;
use smoltcp::phy::Device;
use smoltcp::time::Instant;
use smoltcp::wire::{IpAddress, IpCidr};

use super::{Stack, ndisc};
use crate::config::StackError;
use crate::device::XdpDevice;
use crate::route::Route;

impl Stack {
    /// The owned addresses, with their prefixes.
    pub fn addrs(&self) -> &[IpCidr] {
        &self.addrs
    }

    /// True when `a` is an owned address.
    pub(super) fn owns(&self, a: IpAddress) -> bool {
        self.addrs.iter().any(|c| c.address() == a)
    }

    /// Takes another address (at most [`crate::MAX_ADDRS`]). The caller steers its frames
    /// here; [`Stack::announce`] tells the link.
    ///
    /// # Errors
    /// The address is already owned, unspecified or multicast, or the list is full.
    pub fn add_addr(&mut self, cidr: IpCidr) -> Result<(), StackError> {
        let a = cidr.address();
        if a.is_unspecified() || a.is_multicast() || a.is_broadcast() {
            return Err(StackError::Refused(format!(
                "{cidr}: an owned address must be unicast"
            )));
        }
        if self.owns(a) {
            return Err(StackError::Refused(format!("{a} is already owned")));
        }
        if self.addrs.len() >= crate::MAX_ADDRS {
            return Err(StackError::Refused(format!(
                "{cidr}: at most {} addresses",
                crate::MAX_ADDRS
            )));
        }
        self.addrs.push(cidr);
        Ok(())
    }

    /// Gives up address `a`; returns whether it was owned. Connections from it are left to
    /// end by their timers (their peers can no longer reach them).
    pub fn remove_addr(&mut self, a: IpAddress) -> bool {
        let before = self.addrs.len();
        self.addrs.retain(|c| c.address() != a);
        self.addrs.len() != before
    }

    /// Sends a gratuitous ARP (IPv4), or an MLDv2 report joining the solicited-node group and
    /// an unsolicited neighbour advertisement (IPv6), for every owned address, so that peers
    /// and switches learn at once which hardware address has it. Returns how many went out.
    pub fn announce<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>) -> usize {
        let all: Vec<IpAddress> = self.addrs.iter().map(|c| c.address()).collect();
        all.into_iter()
            .filter(|a| self.announce_addr(now, dev, *a))
            .count()
    }

    /// Joins `a`'s solicited-node group with an MLDv2 report (an IPv4 address needs none).
    fn join_group<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>, a: IpAddress) {
        if let IpAddress::Ipv6(v) = a {
            let f = ndisc::mld_report(self.mac, &[ndisc::solicited_node(v.octets())]);
            if let Some(tx) = dev.transmit(now) {
                smoltcp::phy::TxToken::consume(tx, f.len(), |b| b.copy_from_slice(&f));
            }
        }
    }

    /// Announces owned address `a` alone; false when no transmit frame was free.
    pub fn announce_addr<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        a: IpAddress,
    ) -> bool {
        self.join_group(now, dev, a);
        let f = ndisc::announcement(self.mac, a);
        match dev.transmit(now) {
            Some(tx) => {
                smoltcp::phy::TxToken::consume(tx, f.len(), |b| b.copy_from_slice(&f));
                true
            }
            None => false,
        }
    }

    /// The owned address datagrams and connections to `remote` leave from (see
    /// `local_addr_for`).
    ///
    /// # Errors
    /// No owned address of `remote`'s family.
    pub fn source_for(&self, remote: std::net::IpAddr) -> Result<std::net::IpAddr, StackError> {
        self.local_addr_for(remote.into()).map(Into::into)
    }

    /// The owned address to send to `remote` from: one whose subnet holds `remote`, else one
    /// whose subnet holds its next hop, else the first of its family.
    ///
    /// # Errors
    /// No owned address of `remote`'s family.
    pub(super) fn local_addr_for(&self, remote: IpAddress) -> Result<IpAddress, StackError> {
        let same =
            |c: &&IpCidr| std::mem::discriminant(&c.address()) == std::mem::discriminant(&remote);
        self.addrs
            .iter()
            .find(|c| c.contains_addr(&remote))
            .or_else(|| {
                let hop = self.routes.next_hop(remote)?;
                self.addrs.iter().find(|c| c.contains_addr(&hop))
            })
            .or_else(|| self.addrs.iter().find(same))
            .map(|c| c.address())
            .ok_or(StackError::NoAddress(match remote {
                IpAddress::Ipv4(_) => "IPv4",
                IpAddress::Ipv6(_) => "IPv6",
            }))
    }

    /// The next hop toward `remote`: itself when on a link of this interface, else by the
    /// route table; None without a route.
    pub(super) fn next_hop(&self, remote: IpAddress) -> Option<IpAddress> {
        if self.addrs.iter().any(|c| c.contains_addr(&remote)) {
            return Some(remote);
        }
        self.routes.next_hop(remote)
    }

    /// Adds a route: destinations in `dst` are reached through gateway `via` (on one of this
    /// interface's links), or directly on the link when `via` is None. A route for the same
    /// prefix is replaced. Connections already open keep the next hop they found.
    ///
    /// # Errors
    /// A gateway of the wrong family or not unicast, or a full table.
    pub fn add_route(&mut self, dst: IpCidr, via: Option<IpAddress>) -> Result<(), StackError> {
        self.routes.add(dst, via)
    }

    /// Removes the route for prefix `dst`; returns it if there was one.
    pub fn remove_route(&mut self, dst: IpCidr) -> Option<Route> {
        self.routes.remove(dst)
    }

    /// Replaces the route table (the kernel's routes changed while the runtime runs).
    /// Connections already open keep the next hop they found.
    pub fn set_routes(&mut self, table: crate::route::RouteTable) {
        self.routes = table;
    }

    /// The routes in force, in the order they were added.
    pub fn routes(&self) -> &[Route] {
        self.routes.routes()
    }
}
