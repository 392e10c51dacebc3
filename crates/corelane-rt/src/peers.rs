//! Which core owns a frame: the runtime's multi-core policy, given to each core's pipeline as
//! its [`Peers`].
//!
//! - A destination port from the ephemeral range belongs to core `port % cores`: connections a
//!   core opens take their local port that way (the stack's share of the range), so the peer's
//!   replies reach their core whichever queue they land on.
//! - A segment for a listening port that no flow claims (not a SYN) goes around the ring of
//!   cores once, `hops` counting the cores it passed, before it is answered with a reset: its
//!   SYN may have reached another core.
//! - ARP replies and neighbour advertisements are copied to every other core once.

use std::sync::Arc;

use corelane_stack::{Disposition, EPHEMERAL_START, Peers, Unclaimed};

use crate::handoff::{Consumer, Doorbell, Producer};

/// The core that owns flows whose local port is `port`, seen from core `me` of `cores`.
pub(crate) fn owner_of_port(port: u16, me: usize, cores: usize) -> usize {
    if port >= EPHEMERAL_START {
        usize::from(port) % cores
    } else {
        me
    }
}

/// One core's view of the others: its inbound rings, its outbound rings and their doorbells.
pub(crate) struct CorePeers {
    me: usize,
    cores: usize,
    inbound: Vec<Consumer>,
    /// Indexed by destination core; None for this core.
    outbound: Vec<Option<Producer>>,
    bells: Vec<Arc<Doorbell>>,
    rung: Vec<bool>,
}

impl CorePeers {
    pub(crate) fn new(
        me: usize,
        inbound: Vec<Consumer>,
        outbound: Vec<Option<Producer>>,
        bells: Vec<Arc<Doorbell>>,
    ) -> Self {
        CorePeers {
            me,
            cores: bells.len().max(1),
            inbound,
            outbound,
            rung: vec![false; bells.len()],
            bells,
        }
    }

    /// True when another core handed this one frames not yet taken.
    pub(crate) fn inbound_waiting(&self) -> bool {
        self.inbound.iter().any(|c| !c.is_empty())
    }

    /// This core's doorbell.
    pub(crate) fn bell(&self) -> Arc<Doorbell> {
        self.bells[self.me].clone()
    }

    fn push(&mut self, to: usize, hops: u8, bytes: &[u8]) -> bool {
        let ok = self
            .outbound
            .get_mut(to)
            .and_then(Option::as_mut)
            .is_some_and(|p| p.push(hops, bytes));
        if ok {
            self.rung[to] = true;
        }
        ok
    }

    fn hand(&mut self, to: usize, hops: u8, bytes: &[u8]) -> Disposition {
        if self.push(to, hops, bytes) {
            Disposition::HandedOff
        } else {
            Disposition::Dropped
        }
    }
}

impl Peers for CorePeers {
    fn take_inbound(&mut self, max: usize, inject: &mut dyn FnMut(u8, &[u8])) -> usize {
        let mut n = 0;
        for c in &mut self.inbound {
            while n < max && c.pop(|hops, bytes| inject(hops, bytes)) {
                n += 1;
            }
        }
        n
    }

    fn unclaimed(&mut self, f: Unclaimed<'_>) -> Disposition {
        if f.listening {
            if usize::from(f.hops) + 1 < self.cores {
                return self.hand((self.me + 1) % self.cores, f.hops + 1, f.bytes);
            }
            return Disposition::Answer;
        }
        let owner = owner_of_port(f.local_port, self.me, self.cores);
        if owner != self.me && f.hops == 0 {
            return self.hand(owner, 1, f.bytes);
        }
        Disposition::Answer
    }

    fn neighbor_reply(&mut self, bytes: &[u8], hops: u8) -> (u64, u64) {
        if hops != 0 {
            return (0, 0);
        }
        let (mut handed, mut dropped) = (0, 0);
        let me = self.me;
        for c in (0..self.cores).filter(|&c| c != me) {
            if self.push(c, 1, bytes) {
                handed += 1;
            } else {
                dropped += 1;
            }
        }
        (handed, dropped)
    }

    fn hand_to(&mut self, core: usize, bytes: &[u8]) -> Disposition {
        if core == self.me || core >= self.cores {
            return Disposition::Answer;
        }
        self.hand(core, 1, bytes)
    }

    fn end_turn(&mut self) {
        for (to, r) in self.rung.iter_mut().enumerate() {
            if std::mem::take(r) {
                self.bells[to].ring();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelane_stack::Proto;

    fn peers(me: usize, cores: usize) -> (CorePeers, Vec<Consumer>) {
        let mut outbound = Vec::new();
        let mut theirs = Vec::new();
        for to in 0..cores {
            if to == me {
                outbound.push(None);
            } else {
                let (p, c) = crate::handoff::channel(8, 0);
                outbound.push(Some(p));
                theirs.push(c);
            }
        }
        let bells = (0..cores).map(|_| Doorbell::new().unwrap()).collect();
        (CorePeers::new(me, Vec::new(), outbound, bells), theirs)
    }

    fn frame(port: u16, listening: bool, hops: u8) -> Unclaimed<'static> {
        Unclaimed {
            proto: Proto::Tcp,
            local_port: port,
            listening,
            hops,
            bytes: b"frame",
        }
    }

    #[test]
    fn an_ephemeral_port_goes_to_its_owner_once() {
        let (mut p, mut theirs) = peers(0, 2);
        // 49153 % 2 == 1: core 1's connection.
        assert_eq!(p.unclaimed(frame(49153, false, 0)), Disposition::HandedOff);
        assert!(theirs[0].pop(|hops, b| assert_eq!((hops, b), (1, &b"frame"[..]))));
        // Already handed once: answered here, never bounced back.
        assert_eq!(p.unclaimed(frame(49153, false, 1)), Disposition::Answer);
        // Its own port, or a fixed one: answered here.
        assert_eq!(p.unclaimed(frame(49152, false, 0)), Disposition::Answer);
        assert_eq!(p.unclaimed(frame(80, false, 0)), Disposition::Answer);
    }

    #[test]
    fn a_stray_segment_for_a_listener_goes_round_the_ring_once() {
        let (mut p, mut theirs) = peers(1, 3);
        assert_eq!(p.unclaimed(frame(80, true, 0)), Disposition::HandedOff);
        // Core 1's next is core 2, the second of the others.
        assert!(theirs[1].pop(|hops, _| assert_eq!(hops, 1)));
        assert_eq!(p.unclaimed(frame(80, true, 1)), Disposition::HandedOff);
        assert_eq!(p.unclaimed(frame(80, true, 2)), Disposition::Answer);
    }

    #[test]
    fn a_full_ring_drops_and_says_so() {
        let (mut p, _theirs) = peers(0, 2);
        let sent = (0..20)
            .filter(|_| p.unclaimed(frame(49153, false, 0)) == Disposition::HandedOff)
            .count();
        assert!(sent < 20);
        assert_eq!(p.unclaimed(frame(49153, false, 0)), Disposition::Dropped);
    }

    #[test]
    fn neighbour_replies_reach_every_other_core_once() {
        let (mut p, mut theirs) = peers(0, 3);
        assert_eq!(p.neighbor_reply(b"arp", 0), (2, 0));
        assert_eq!(
            p.neighbor_reply(b"arp", 1),
            (0, 0),
            "a copy is not copied again"
        );
        for c in &mut theirs {
            assert!(c.pop(|_, b| assert_eq!(b, b"arp")));
            assert!(c.is_empty());
        }
    }
}
