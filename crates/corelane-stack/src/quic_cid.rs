//! QUIC connection IDs that name the core owning their connection, and the reading of that
//! name from a datagram.
//!
//! A QUIC packet after the handshake carries only the connection ID its receiver chose, not
//! the addresses the connection began with: a client behind a NAT that rebinds, or one that
//! migrates, sends from a new address and port, and the interface's hash may land its
//! datagrams on another core's queue. The server's cores choose IDs that say which of them
//! holds the connection, so whichever core receives a datagram hands it to its owner.
//!
//! An ID is [`CID_LEN`] bytes: a 7-byte nonce from a cryptographic source (bytes 1..8) and the
//! owning core masked by a keyed hash of the nonce (byte 0). Under a key nobody outside the
//! run knows, the masked byte looks random: an observer cannot tell which core an ID names,
//! nor link two IDs of a connection by it (RFC 9000, section 5.1).
//!
//! ```
//! use corelane_stack::quic_cid::CidSteer;
//!
//! let core2 = CidSteer::new((1, 2), 2, 4);
//! let cid = core2.cid([9, 8, 7, 6, 5, 4, 3]);
//! // A short-header packet: its first byte's top bit clear, the ID from byte 1.
//! let packet = [&[0x40][..], &cid, b"payload"].concat();
//! assert_eq!(CidSteer::new((1, 2), 0, 4).owner_of_datagram(&packet), Some(2));
//! ```

use crate::keyed::siphash;

/// Bytes of a connection ID that names its core.
pub const CID_LEN: usize = 8;

/// Makes and reads connection IDs naming cores of one run: the run's key, this core, and how
/// many cores the run has.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CidSteer {
    key: (u64, u64),
    core: u8,
    cores: u16,
}

impl std::fmt::Debug for CidSteer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("CidSteer")
            .field("core", &self.core)
            .field("cores", &self.cores)
            .finish_non_exhaustive()
    }
}

impl CidSteer {
    /// IDs naming core `core` of `cores` under `key`. A run of more than 256 cores names
    /// none: [`CidSteer::owner`] is then always None (every core keeps what it receives).
    pub fn new(key: (u64, u64), core: usize, cores: usize) -> CidSteer {
        let named = cores <= 256 && core < cores;
        CidSteer {
            key,
            core: if named { core as u8 } else { 0 },
            cores: if named { cores as u16 } else { 0 },
        }
    }

    /// The same run's IDs, made for core `core` (another core's view of the run).
    pub fn for_core(&self, core: usize) -> CidSteer {
        CidSteer::new(self.key, core, usize::from(self.cores))
    }

    /// The core the IDs made here name.
    pub fn core(&self) -> usize {
        usize::from(self.core)
    }

    /// Whether the IDs name cores at all (a run of more than 256 cores names none, and every
    /// core keeps what it receives).
    pub fn names_cores(&self) -> bool {
        self.cores != 0
    }

    /// The ID with `nonce` (seven bytes from a cryptographic random source) naming this core.
    pub fn cid(&self, nonce: [u8; 7]) -> [u8; CID_LEN] {
        let mut id = [0u8; CID_LEN];
        id[1..].copy_from_slice(&nonce);
        id[0] = self.core ^ self.mask(&nonce);
        id
    }

    /// The core connection ID `cid` names, when it is one of this run's and names a core
    /// it has (an ID from anywhere else names one at random, or none).
    pub fn owner(&self, cid: &[u8]) -> Option<usize> {
        if self.cores == 0 || cid.len() < CID_LEN {
            return None;
        }
        let nonce: [u8; 7] = cid[1..CID_LEN].try_into().ok()?;
        let core = usize::from(cid[0] ^ self.mask(&nonce));
        (core < usize::from(self.cores)).then_some(core)
    }

    /// The core a UDP payload names, when it is a QUIC short-header packet (the first byte's
    /// top bit clear) whose destination ID is one of this run's. Long-header packets name
    /// none: they belong to handshakes, whose address does not change (RFC 9000, 9), so they
    /// stay on the core the interface's hash picked.
    pub fn owner_of_datagram(&self, payload: &[u8]) -> Option<usize> {
        match payload.first() {
            Some(b) if b & 0x80 == 0 => self.owner(payload.get(1..1 + CID_LEN)?),
            _ => None,
        }
    }

    fn mask(&self, nonce: &[u8; 7]) -> u8 {
        let mut w = [0u8; 8];
        w[..7].copy_from_slice(nonce);
        siphash(self.key, &[0x6369_6473_7465_6572, u64::from_le_bytes(w)]) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_reads_the_core_an_id_names() {
        let cores = 5;
        for core in 0..cores {
            let maker = CidSteer::new((7, 11), core, cores);
            for n in 0..200u32 {
                let b = n.to_le_bytes();
                let cid = maker.cid([b[0], b[1], b[2], b[3], 1, 2, 3]);
                for reader in 0..cores {
                    let r = CidSteer::new((7, 11), reader, cores);
                    assert_eq!(r.owner(&cid), Some(core));
                    let short = [&[0x41][..], &cid, &[0; 20]].concat();
                    assert_eq!(r.owner_of_datagram(&short), Some(core));
                    let long = [&[0xc1][..], &cid, &[0; 20]].concat();
                    assert_eq!(r.owner_of_datagram(&long), None, "long headers stay");
                }
            }
        }
    }

    #[test]
    fn the_core_byte_looks_random_without_the_key() {
        // One core's IDs: byte 0 takes many values, not the core's index each time.
        let maker = CidSteer::new((3, 4), 1, 2);
        let mut seen = std::collections::HashSet::new();
        for n in 0..500u16 {
            let b = n.to_le_bytes();
            seen.insert(maker.cid([b[0], b[1], 0, 0, 0, 0, 0])[0]);
        }
        assert!(seen.len() > 100, "byte 0 took {} values", seen.len());
        // Under another key (a reader of a 256-core run, to which every first byte names a
        // core), one core's IDs name cores at random, not core 1 each time.
        let other = CidSteer::new((5, 6), 0, 256);
        let owners: std::collections::HashSet<_> = (0..500u16)
            .filter_map(|n| {
                let b = n.to_le_bytes();
                other.owner(&maker.cid([b[0], b[1], 0, 0, 0, 0, 0]))
            })
            .collect();
        assert!(
            owners.len() > 100,
            "another key read {} cores",
            owners.len()
        );
    }

    #[test]
    fn short_odd_and_foreign_payloads_name_no_core() {
        let r = CidSteer::new((1, 1), 0, 4);
        for p in [&[][..], &[0x40], &[0x40, 1, 2, 3], &[0x40; CID_LEN]] {
            assert_eq!(r.owner_of_datagram(p), None, "{p:?}");
        }
        // Ids naming cores past the run's count name none.
        let named = (0..=255u8)
            .filter_map(|b| r.owner(&[b, 1, 2, 3, 4, 5, 6, 7]))
            .count();
        assert_eq!(
            named, 4,
            "four of the 256 first bytes name one of four cores"
        );
        let big = CidSteer::new((1, 1), 0, 300);
        assert_eq!(big.owner(&[0; 8]), None);
        assert!(!big.names_cores() && r.names_cores());
    }
}
