//! The flow table of a [`Stack`](crate::Stack): a connection's addresses to the slot that holds
//! its socket. One hash lookup per frame (SipHash-1-3 over the two endpoints under a secret
//! key), so the cost of finding a flow does not grow with the number of open connections, and
//! a peer that cannot know the key cannot choose addresses and ports that collide. The last
//! flow found is remembered: a burst of one flow's frames (a bulk transfer's segments, the ACKs
//! coming back) is found by one comparison, without hashing.

use std::cell::Cell;
use std::collections::HashMap;

use crate::keyed::KeyedState;

use crate::classify::FlowKey;

/// Maps a TCP connection's [`FlowKey`] to the stack's slot index for it.
#[derive(Debug, Default, Clone)]
pub struct FlowTable {
    map: HashMap<FlowKey, u32, KeyedState>,
    /// The last flow found and its slot; cleared when that key is inserted or removed.
    last: Cell<Option<(FlowKey, u32)>>,
}

impl FlowTable {
    /// An empty table with room for `flows` entries before it grows, keyed by a fresh key
    /// from the OS.
    pub fn with_capacity(flows: usize) -> Self {
        FlowTable::keyed(flows, KeyedState::random())
    }

    /// An empty table with room for `flows` entries, hashing under `key`.
    pub fn keyed(flows: usize, key: KeyedState) -> Self {
        FlowTable {
            map: HashMap::with_capacity_and_hasher(flows, key),
            last: Cell::new(None),
        }
    }

    /// The slot of `key`'s flow, if the table has it.
    #[inline]
    pub fn get(&self, key: &FlowKey) -> Option<u32> {
        if let Some((k, slot)) = self.last.get()
            && k == *key
        {
            return Some(slot);
        }
        let slot = self.map.get(key).copied()?;
        self.last.set(Some((*key, slot)));
        Some(slot)
    }

    fn forget_last(&self, key: &FlowKey) {
        if self.last.get().is_some_and(|(k, _)| k == *key) {
            self.last.set(None);
        }
    }

    /// Records `key` at `slot`; returns the slot it replaced, if any.
    #[inline]
    pub fn insert(&mut self, key: FlowKey, slot: u32) -> Option<u32> {
        self.forget_last(&key);
        self.map.insert(key, slot)
    }

    /// Forgets `key`; returns its slot, if it was there.
    #[inline]
    pub fn remove(&mut self, key: &FlowKey) -> Option<u32> {
        self.forget_last(key);
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
        // Found again (remembered), then moved and removed: the remembered slot never outlives
        // its entry.
        assert_eq!(t.get(&key(417)), Some(417));
        assert_eq!(t.insert(key(417), 5), Some(417));
        assert_eq!(t.get(&key(417)), Some(5));
        assert_eq!(t.get(&key(417)), Some(5));
        assert_eq!(t.remove(&key(417)), Some(5));
        assert_eq!(t.get(&key(417)), None);
        assert_eq!(t.get(&key(418)), Some(418));
        assert_eq!(t.len(), 999);
        // Same remote, other local port: a different flow.
        let mut k = key(1);
        k.local.port = 81;
        assert_eq!(t.get(&k), None);
    }

    /// A key that counts how often it is compared: the work of a lookup.
    #[derive(Clone, Copy)]
    struct Counted(FlowKey);

    thread_local! {
        static COMPARES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    impl PartialEq for Counted {
        fn eq(&self, other: &Self) -> bool {
            COMPARES.with(|c| c.set(c.get() + 1));
            self.0 == other.0
        }
    }
    impl Eq for Counted {}
    impl std::hash::Hash for Counted {
        fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
            self.0.hash(h);
        }
    }

    /// Comparisons per lookup of each of `keys` in a map of them under `state`.
    fn compares_per_lookup<S: std::hash::BuildHasher>(keys: &[FlowKey], state: S) -> f64 {
        let mut m = HashMap::with_capacity_and_hasher(keys.len(), state);
        for (i, k) in keys.iter().enumerate() {
            m.insert(Counted(*k), i);
        }
        COMPARES.with(|c| c.set(0));
        for k in keys {
            assert!(m.contains_key(&Counted(*k)));
        }
        COMPARES.with(|c| c.get()) as f64 / keys.len() as f64
    }

    #[test]
    fn addresses_crafted_to_collide_cost_one_comparison_each() {
        use std::hash::BuildHasher;
        // What a peer could do against an unkeyed hash (FxHash, the table's hash before):
        // search offline for remote addresses and ports whose hashes share the bits the table
        // indexes by (the low 8 of a 256-bucket table) and the 7 it checks before comparing.
        let fx = rustc_hash::FxBuildHasher;
        let target = fx.hash_one(key(0));
        let same = |h: u64| h & 0xff == target & 0xff && h >> 57 == target >> 57;
        let crafted: Vec<FlowKey> = (0..u32::MAX)
            .map(key)
            .filter(|k| same(fx.hash_one(k)))
            .take(200)
            .collect();
        assert_eq!(crafted.len(), 200);
        let unkeyed = compares_per_lookup(&crafted, fx);
        assert!(
            unkeyed > 20.0,
            "the crafted keys collide without a key: {unkeyed}"
        );
        // The table's own hash, under a key the peer does not know: about one comparison.
        let keyed = compares_per_lookup(&crafted, KeyedState::random());
        assert!(keyed < 2.0, "{keyed} comparisons per lookup");
        let t = FlowTable::with_capacity(crafted.len());
        let _: &HashMap<FlowKey, u32, KeyedState> = &t.map;
    }
}
