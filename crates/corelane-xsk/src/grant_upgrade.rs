//! A granted server's upgrade requests: what `Steering`'s upgrade methods ask the broker for
//! when it holds the program (`steering/upgrade.rs`).

use std::net::SocketAddr;
use std::os::fd::RawFd;

use super::{GrantClient, Request};
use crate::error::Error;

impl GrantClient {
    /// Hands the broker the AF_XDP socket `fd` for `queue` in `generation`.
    pub(crate) fn register_in(&self, generation: u32, queue: u32, fd: RawFd) -> Result<(), Error> {
        self.ask(
            &Request::Queue {
                queue,
                generation: Some(generation),
            },
            Some(fd),
        )
        .map(drop)
    }

    /// The program's current generation and whether the split is on.
    pub(crate) fn upgrade_state(&self) -> Result<(u32, bool), Error> {
        let text = self.ask(&Request::UpgradeState, None)?;
        let mut w = text.split_whitespace().map(str::parse::<u32>);
        match (w.next(), w.next()) {
            (Some(Ok(current)), Some(Ok(split))) => Ok((current, split != 0)),
            _ => Err(Error::Grant(format!(
                "the broker answered `{text}` for the upgrade's state"
            ))),
        }
    }

    /// Makes `current` the generation that gets the frames, with the split on or off; off,
    /// the broker forgets every kept connection.
    pub(crate) fn set_upgrade(&self, current: u32, split: bool) -> Result<(), Error> {
        self.ask(&Request::Upgrade { current, split }, None)
            .map(drop)
    }

    /// Keeps the connection from `peer` to local `port` with `generation` while the split is on.
    pub(crate) fn keep_flow(
        &self,
        peer: SocketAddr,
        port: u16,
        generation: u32,
    ) -> Result<(), Error> {
        self.ask(
            &Request::Keep {
                peer,
                port,
                generation,
            },
            None,
        )
        .map(drop)
    }

    /// Stops keeping the connection from `peer` to `port`.
    pub(crate) fn forget_flow(&self, peer: SocketAddr, port: u16) -> Result<(), Error> {
        self.ask(&Request::Forget { peer, port }, None).map(drop)
    }
}
