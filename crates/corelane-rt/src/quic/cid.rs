//! The connection IDs an endpoint gives out: each names the core that holds the connection
//! ([`corelane_stack::quic_cid`]), so a datagram that lands on another core's queue (the
//! client's address or port changed) is handed to it.

use corelane_stack::quic_cid::{CID_LEN, CidSteer};
use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use ring::rand::{SecureRandom, SystemRandom};

/// quinn-proto's generator of this core's IDs.
pub(crate) struct CoreCids {
    steer: CidSteer,
    rng: Nonces,
}

/// Where the IDs' nonces come from.
enum Nonces {
    /// The system's random source: what a run uses.
    System(SystemRandom),
    /// A seeded generator: a simulation's or a fuzz target's, so that a run replays.
    Seeded(corelane_xsk::SplitMix64),
}

impl CoreCids {
    pub(crate) fn new(steer: CidSteer) -> CoreCids {
        CoreCids {
            steer,
            rng: Nonces::System(SystemRandom::new()),
        }
    }

    /// IDs whose nonces come from `seed` (a simulation's or a fuzz target's: not secret).
    pub(crate) fn seeded(steer: CidSteer, seed: u64) -> CoreCids {
        CoreCids {
            steer,
            rng: Nonces::Seeded(corelane_xsk::SplitMix64(seed)),
        }
    }
}

impl ConnectionIdGenerator for CoreCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut nonce = [0u8; 7];
        let filled = match &mut self.rng {
            Nonces::System(r) => r.fill(&mut nonce).is_ok(),
            Nonces::Seeded(r) => {
                nonce.copy_from_slice(&r.draw().to_le_bytes()[..7]);
                true
            }
        };
        if !filled {
            // The system's random source failed (it does not, on Linux after boot): an ID from
            // the clock and a counter still names the core; only its unlinkability is lost.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            nonce.copy_from_slice(&t.to_le_bytes()[..7]);
        }
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
