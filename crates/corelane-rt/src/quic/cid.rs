//! The connection IDs an endpoint gives out: each names the core that holds the connection
//! ([`corelane_stack::quic_cid`]), so a datagram that lands on another core's queue (the
//! client's address or port changed) is handed to it.

use corelane_stack::quic_cid::{CID_LEN, CidSteer};
use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use ring::rand::{SecureRandom, SystemRandom};

/// Where an ID's seven-byte nonce comes from: the system's random source in a run
/// ([`SystemNonces`]); a seeded generator in a simulation or a fuzz target, so that it
/// replays. None when the source failed.
pub(crate) trait Nonces: Send + Sync + 'static {
    fn nonce(&mut self) -> Option<[u8; 7]>;
}

/// The system's random source: what a run's IDs take.
pub(crate) struct SystemNonces(SystemRandom);

impl Nonces for SystemNonces {
    fn nonce(&mut self) -> Option<[u8; 7]> {
        let mut n = [0u8; 7];
        self.0.fill(&mut n).ok()?;
        Some(n)
    }
}

/// A seeded generator (not secret): a simulation's or a fuzz target's.
impl Nonces for corelane_xsk::SplitMix64 {
    fn nonce(&mut self) -> Option<[u8; 7]> {
        let mut n = [0u8; 7];
        n.copy_from_slice(&self.draw().to_le_bytes()[..7]);
        Some(n)
    }
}

/// quinn-proto's generator of this core's IDs, their nonces from `N`.
pub(crate) struct CoreCids<N: Nonces> {
    steer: CidSteer,
    nonces: N,
}

impl CoreCids<SystemNonces> {
    /// A run's: nonces from the system's random source.
    pub(crate) fn new(steer: CidSteer) -> Self {
        CoreCids::with_nonces(steer, SystemNonces(SystemRandom::new()))
    }
}

impl<N: Nonces> CoreCids<N> {
    pub(crate) fn with_nonces(steer: CidSteer, nonces: N) -> Self {
        CoreCids { steer, nonces }
    }
}

impl<N: Nonces> ConnectionIdGenerator for CoreCids<N> {
    fn generate_cid(&mut self) -> ConnectionId {
        let nonce = self.nonces.nonce().unwrap_or_else(|| {
            // The system's random source failed (it does not, on Linux after boot): an ID from
            // the clock still names the core; only its unlinkability is lost.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let mut n = [0u8; 7];
            n.copy_from_slice(&t.to_le_bytes()[..7]);
            n
        });
        ConnectionId::new(&self.steer.cid(nonce))
    }

    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        // An ID that names none of the run's cores is none of ours; in a run too large to
        // name its cores, any ID of the length is.
        if !self.steer.names_cores() {
            return if cid.len() == CID_LEN {
                Ok(())
            } else {
                Err(InvalidCid)
            };
        }
        self.steer.owner(cid).map(|_| ()).ok_or(InvalidCid)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ids_name_their_core_and_differ() {
        let steer = CidSteer::new((1, 2), 3, 4);
        let mut g = CoreCids::new(steer);
        let ids: Vec<ConnectionId> = (0..64).map(|_| g.generate_cid()).collect();
        for id in &ids {
            assert_eq!(id.len(), CID_LEN);
            assert_eq!(CidSteer::new((1, 2), 0, 4).owner(id), Some(3));
            assert!(g.validate(id).is_ok());
        }
        let distinct: std::collections::HashSet<_> = ids.iter().map(|i| i.to_vec()).collect();
        assert_eq!(distinct.len(), ids.len(), "every ID its own");
    }

    #[test]
    fn a_run_too_large_to_name_its_cores_still_takes_its_own_ids() {
        let mut g = CoreCids::new(CidSteer::new((1, 2), 3, 300));
        for _ in 0..16 {
            let id = g.generate_cid();
            assert!(g.validate(&id).is_ok(), "{id:?}");
        }
        assert!(g.validate(&ConnectionId::new(&[1, 2, 3, 4])).is_err());
    }
}
