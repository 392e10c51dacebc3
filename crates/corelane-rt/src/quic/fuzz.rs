//! The endpoint's demux as `corelane-fuzz` drives it (`--target quic`): datagrams from any
//! address into a server's state, every connection they start accepted, and a pass after
//! each, as the driver runs them. Not an API.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ServerConfig;
use super::driver::State;

/// A server endpoint's state with no socket under it: what it would send is dropped.
pub struct QuicServer {
    st: State,
    now: Instant,
}

impl std::fmt::Debug for QuicServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicServer").finish_non_exhaustive()
    }
}

impl QuicServer {
    /// A server with `config`, its keys fixed (a run is repeatable), on the wall clock
    /// moved on by hand ([`QuicServer::datagram`]).
    pub fn new(config: ServerConfig) -> QuicServer {
        let reset = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[7; 32]);
        let ep = quinn_proto::Endpoint::new(
            Arc::new(super::EndpointConfig::new(Arc::new(reset))),
            Some(Arc::new(config)),
            true,
            Some([9; 32]),
        );
        QuicServer {
            st: State::new(ep, crate::clock::Clock::default()),
            now: Instant::now(),
        }
    }

    /// `data` from port `from` of a client, `ms` milliseconds after the last one: handed to
    /// the state machine, any connection it starts accepted, then one pass.
    pub fn datagram(&mut self, from: u16, ms: u16, data: &[u8]) {
        self.now += Duration::from_millis(u64::from(ms));
        let peer = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), from);
        self.st.datagram(self.now, peer, data);
        self.st.accept_all();
        self.st.pass(self.now);
        self.st.drop_out();
    }

    /// Connections held.
    pub fn connections(&self) -> usize {
        self.st.conns.len()
    }
}
