//! UDP datagrams steered by what they carry: a socket marked for QUIC hands a short-header
//! packet whose connection ID names another core to that core (see [`crate::quic_cid`]), so
//! a client whose address or port changes keeps its connection on the core that holds it.

use std::io;

use corelane_frame::FrameIo;

use super::{FlowId, Sock, Stack};
use crate::device::XdpDevice;
use crate::pipeline::{Disposition, Peers};
use crate::quic_cid::CidSteer;

impl Stack {
    /// Makes and reads the connection IDs that name this stack's core among the run's
    /// (`StackConfig::core` of `StackConfig::cores`), under a key drawn from the stack's
    /// master key: every core of a run reads the others' IDs.
    pub fn quic_cid_steer(&self) -> CidSteer {
        CidSteer::new(self.secret.quic_cid_key(), self.cfg.core, self.cfg.cores)
    }

    /// Marks UDP flow `id` as a QUIC endpoint's (`on`) or not: a short-header datagram to it
    /// whose connection ID names another core of the run ([`Stack::quic_cid_steer`]) is
    /// handed to that core ([`Peers::hand_to`]) instead of being delivered here.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone or is not UDP.
    pub fn udp_steer_quic(&mut self, id: FlowId, on: bool) -> io::Result<()> {
        let steer = on.then(|| self.quic_cid_steer());
        let s = self
            .udp_sock(id)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?;
        s.steer = steer;
        Ok(())
    }

    /// The frame in front of `dev` is for UDP flow `i`: when the flow is steered and the
    /// datagram's connection ID names another core, it is handed there (or dropped, counted,
    /// when that core cannot take it now) and true returned. A frame another core handed
    /// here already (`hops` > 0) stays.
    pub(super) fn steer_udp<P: FrameIo>(
        &mut self,
        dev: &mut XdpDevice<P>,
        peers: &mut dyn Peers,
        i: u32,
        hops: u8,
    ) -> bool {
        if hops != 0 {
            return false;
        }
        let steer = match self.slots[i as usize].flow.as_ref().map(|f| &f.sock) {
            Some(Sock::Udp(s)) => s.steer,
            _ => None,
        };
        let Some(steer) = steer else { return false };
        let Some(bytes) = dev.front_bytes() else {
            return false;
        };
        let owner = super::udp::parse(bytes).and_then(|(.., p)| steer.owner_of_datagram(p));
        let Some(owner) = owner.filter(|&o| o != steer.core()) else {
            return false;
        };
        match peers.hand_to(owner, bytes) {
            Disposition::Answer => return false,
            Disposition::HandedOff => {
                self.stats.handed_off += 1;
                if let Some(s) = self.udp_sock_at(i) {
                    s.stats.steered += 1;
                }
            }
            Disposition::Dropped => self.stats.handoff_dropped += 1,
        }
        dev.skip();
        true
    }
}
