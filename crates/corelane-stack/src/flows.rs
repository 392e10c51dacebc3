//! The flow table of a [`Stack`](crate::Stack): a connection's addresses to the slot that holds
//! its socket. One hash lookup per frame (FxHash over the two endpoints), so the cost of finding
//! a flow does not grow with the number of open connections.

use std::collections::HashMap;

use rustc_hash::FxBuildHasher;

use crate::classify::FlowKey;

/// Maps a TCP connection's [`FlowKey`] to the stack's slot index for it.
#[derive(Debug, Default, Clone)]
pub struct FlowTable {
    map: HashMap<FlowKey, u32, FxBuildHasher>,
}

impl FlowTable {
    /// An empty table with room for `flows` entries before it grows.
    pub fn with_capacity(flows: usize) -> Self {
        FlowTable {
            map: HashMap::with_capacity_and_hasher(flows, FxBuildHasher),
        }
    }

    /// The slot of `key`'s flow, if the table has it.
    #[inline]
    pub fn get(&self, key: &FlowKey) -> Option<u32> {
        self.map.get(key).copied()
    }

    /// Records `key` at `slot`; returns the slot it replaced, if any.
    #[inline]
    pub fn insert(&mut self, key: FlowKey, slot: u32) -> Option<u32> {
        self.map.insert(key, slot)
    }

    /// Forgets `key`; returns its slot, if it was there.
    #[inline]
    pub fn remove(&mut self, key: &FlowKey) -> Option<u32> {
        self.map.remove(key)
    }

    /// Flows in the table.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when the table holds no flow.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::{IpAddress, IpEndpoint};

    fn key(i: u32) -> FlowKey {
        FlowKey {
            local: IpEndpoint::new(IpAddress::v4(10, 0, 0, 1), 80),
            remote: IpEndpoint::new(
                IpAddress::v4(10, (i >> 16) as u8, (i >> 8) as u8, i as u8),
                40000 + (i % 1000) as u16,
            ),
        }
    }

    #[test]
    fn insert_get_remove() {
        let mut t = FlowTable::with_capacity(4);
        for i in 0..1000 {
            assert_eq!(t.insert(key(i), i), None);
        }
        assert_eq!(t.len(), 1000);
        assert_eq!(t.get(&key(417)), Some(417));
        assert_eq!(t.insert(key(417), 5), Some(417));
        assert_eq!(t.remove(&key(417)), Some(5));
        assert_eq!(t.get(&key(417)), None);
        assert_eq!(t.len(), 999);
        // Same remote, other local port: a different flow.
        let mut k = key(1);
        k.local.port = 81;
        assert_eq!(t.get(&k), None);
    }
}
