//! The IP options of a flow's packets: TTL (hop limit) and type of service (traffic class).

use std::io;

use super::socket::gone;
use super::{FlowId, Stack};

impl Stack {
    /// Sets the TTL (IPv4) or hop limit (IPv6) of TCP flow `id`'s packets (1..=255).
    ///
    /// # Errors
    /// `InvalidInput` for 0 or more than 255; `NotConnected` when the flow is gone.
    pub fn tcp_set_ttl(&mut self, id: FlowId, ttl: u32) -> io::Result<()> {
        let ttl = u8::try_from(ttl)
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a TTL is 1 to 255"))?;
        let f = self.flow(id).ok_or_else(gone)?;
        f.ttl = ttl;
        Ok(())
    }

    /// The TTL (IPv4) or hop limit (IPv6) of TCP flow `id`'s packets.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_ttl(&mut self, id: FlowId) -> io::Result<u32> {
        Ok(u32::from(self.flow(id).ok_or_else(gone)?.ttl))
    }

    /// Sets the IPv4 type of service or IPv6 traffic class of flow `id`'s packets (`IP_TOS`,
    /// `IPV6_TCLASS`). A TCP connection's ECN bits stay the stack's (as the kernel's): only
    /// the upper six (DSCP) reach the wire, and all eight read back.
    ///
    /// # Errors
    /// `InvalidInput` for more than 255; `NotConnected` when the flow is gone.
    pub fn set_tos(&mut self, id: FlowId, tos: u32) -> io::Result<()> {
        let tos = u8::try_from(tos).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "a TOS or traffic class is 0 to 255",
            )
        })?;
        self.flow(id).ok_or_else(gone)?.tos = tos;
        Ok(())
    }

    /// What [`set_tos`](Self::set_tos) set for flow `id` (0 unless set).
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tos(&mut self, id: FlowId) -> io::Result<u32> {
        Ok(u32::from(self.flow(id).ok_or_else(gone)?.tos))
    }
}
