//! Out-of-order data given up when in-order data needs the memory (Linux's
//! `tcp_prune_ofo_queue`). Under a memory cap, data parked past a hole on many connections
//! (a peer that never fills the hole can do it on purpose) would otherwise keep every other
//! connection's in-order data out for as long as it lasts. When a received segment is refused
//! room, the connections that have held out-of-order data longest lose it, a few per refusal
//! (constant work per frame, whatever the number of connections), and their senders send it
//! again; the refused segment comes again too and now fits.

use super::Stack;

/// Connections pruned at most per refused segment.
const PRUNE_PER_REFUSAL: usize = 8;
/// Enough given back once a refusal's pruning freed this much.
const ENOUGH: usize = 256 * 1024;

impl Stack {
    /// After a segment reached flow `i`: lists it if it now holds out-of-order data, and, if
    /// some segment was refused room, prunes.
    pub(super) fn after_tcp_input(&mut self, i: u32) {
        let generation = self.slots[i as usize].generation;
        if let Some(f) = self.slots[i as usize].flow.as_mut()
            && !f.ooo_listed
            && f.conn().is_some_and(|c| c.holds_out_of_order())
        {
            f.ooo_listed = true;
            self.ooo_holders.push_back((i, generation));
        }
        if self.mem.take_pressure() {
            self.prune_out_of_order();
        }
    }

    /// Drops the out-of-order data of the flows listed longest, until enough is given back.
    fn prune_out_of_order(&mut self) {
        let mut freed = 0;
        for _ in 0..PRUNE_PER_REFUSAL {
            let Some((i, generation)) = self.ooo_holders.pop_front() else {
                return;
            };
            let slot = &mut self.slots[i as usize];
            if slot.generation != generation {
                continue;
            }
            let Some(f) = slot.flow.as_mut() else {
                continue;
            };
            f.ooo_listed = false;
            let n = f.conn().map_or(0, |c| c.prune_out_of_order());
            if n > 0 {
                self.stats.tcp_ooo_pruned += 1;
                freed += n;
                if freed >= ENOUGH {
                    return;
                }
            }
        }
    }
}
