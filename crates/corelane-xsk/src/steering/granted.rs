//! Steering under a grant: every change to the maps is a request to the broker that holds the
//! program (`crate::grant`), which checks it against the grant.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

use corelane_frame::Proto;

use super::{Program, SteeringShare, XdpCounters};
use crate::error::Error;
use crate::grant::GrantClient;
use crate::program::AttachedMode;

impl Program for GrantClient {
    fn own_addr(&mut self, addr: IpAddr, shared: bool) -> Result<(), Error> {
        if shared {
            self.own_shared_addr(addr)
        } else {
            GrantClient::own_addr(self, addr)
        }
    }

    fn disown_addr(&mut self, addr: IpAddr) -> Result<(), Error> {
        GrantClient::disown_addr(self, addr)
    }

    fn set_port(&mut self, proto: Proto, port: u16, on: bool) -> Result<(), Error> {
        self.port(proto, port, on)
    }

    fn register(&mut self, queue: u32, fd: RawFd) -> Result<(), Error> {
        GrantClient::register(self, queue, fd)
    }

    fn register_in(&mut self, generation: u32, queue: u32, fd: RawFd) -> Result<(), Error> {
        GrantClient::register_in(self, generation, queue, fd)
    }

    fn set_upgrade(&mut self, current: u32, split: bool) -> Result<(), Error> {
        GrantClient::set_upgrade(self, current, split)
    }

    fn upgrade_state(&mut self) -> Result<(u32, bool), Error> {
        GrantClient::upgrade_state(self)
    }

    fn keep_flow(&mut self, peer: SocketAddr, port: u16, generation: u32) -> Result<(), Error> {
        GrantClient::keep_flow(self, peer, port, generation)
    }

    fn forget_flow(&mut self, peer: SocketAddr, port: u16) -> Result<(), Error> {
        GrantClient::forget_flow(self, peer, port)
    }

    /// The broker forgets them itself when the split ends.
    fn clear_flows(&mut self) -> Result<usize, Error> {
        Ok(0)
    }

    fn counters(&self) -> Result<XdpCounters, Error> {
        GrantClient::counters(self)
    }

    fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        GrantClient::neighbour(self, ip)
    }

    fn grant(&self) -> Option<&GrantClient> {
        Some(self)
    }

    fn share(&mut self, _mode: AttachedMode) -> Result<SteeringShare, Error> {
        Err(Error::Config(
            "sharing the program needs the program's maps, which the grant broker holds".into(),
        ))
    }
}
