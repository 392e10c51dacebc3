//! The endpoint's demux as `corelane-fuzz` drives it (`--target quic`): datagrams from any
//! address, steered as a core's stack steers them (one naming the other core of the run is
//! handed there, so this endpoint never sees it), into a server's state with the connection
//! IDs a run gives out, every connection they start accepted, and a pass after each, as the
//! driver runs them. Not an API.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use corelane_stack::quic_cid::CidSteer;

use super::ServerConfig;
use super::cid::CoreCids;
use super::driver::State;

/// A server endpoint's state with no socket under it: what it would send is dropped.
pub struct QuicServer {
    st: State,
    steer: CidSteer,
    now: Instant,
    handed: u64,
}

impl std::fmt::Debug for QuicServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicServer").finish_non_exhaustive()
    }
}

impl QuicServer {
    /// A server with `config` on core 0 of two, its keys fixed (a run is repeatable), on the
    /// wall clock moved on by hand ([`QuicServer::datagram`]).
    pub fn new(config: ServerConfig) -> QuicServer {
        let steer = CidSteer::new((1, 2), 0, 2);
        let ep = super::state_machine(
            ([7; 32], [8; 32]),
            Some(config),
            move || CoreCids::with_nonces(steer, corelane_xsk::SplitMix64(9)),
            Some([9; 32]),
        );
        QuicServer {
            st: State::new(ep, crate::clock::Clock::default()),
            steer,
            now: Instant::now(),
            handed: 0,
        }
    }

    /// `data` from port `from` of a client, `ms` milliseconds after the last one: steered,
    /// and unless it names the other core, handed to the state machine, any connection it
    /// starts accepted, then one pass.
    pub fn datagram(&mut self, from: u16, ms: u16, data: &[u8]) {
        self.now += Duration::from_millis(u64::from(ms));
        if self
            .steer
            .owner_of_datagram(data)
            .is_some_and(|c| c != self.steer.core())
        {
            self.handed += 1;
            return;
        }
        let peer = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), from);
        self.st.datagram(self.now, peer, 0, data);
        self.st.accept_all();
        self.st.pass(self.now);
        self.st.drop_out();
    }

    /// Datagrams that named the other core (steered away, not seen here).
    pub fn handed(&self) -> u64 {
        self.handed
    }

    /// Connections held.
    pub fn connections(&self) -> usize {
        self.st.conns.len()
    }
}
