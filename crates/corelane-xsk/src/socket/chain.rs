//! Packets longer than one UMEM frame (multi-buffer AF_XDP, `XDP_USE_SG`): the kernel hands a
//! jumbo frame over as a chain of descriptors, each but the last marked `XDP_PKT_CONTD`, and
//! takes one back the same way.
//!
//! The stack reads and writes a packet as one slice, so a chained packet's bytes are gathered
//! into one buffer on receive ([`Chain::append`]) and cut into frame-sized pieces on transmit
//! ([`pieces`]). The frames that carry the pieces stay in the frame ledger one by one: each is
//! received, sent and completed like any other.

#![allow(unsafe_code)] // Pieces are read from and written to the UMEM.

use std::collections::VecDeque;

use super::ring::Desc;
use super::{XskFrame, XskQueue};

/// `options` bit of a descriptor followed by more of the same packet.
pub(crate) const XDP_PKT_CONTD: u32 = 1;

/// The most descriptors one packet may take (the kernel's limit is `MAX_SKB_FRAGS + 1`, 18 by
/// default); a longer chain is dropped.
pub const MAX_PIECES: usize = 17;

/// Gather buffers kept for reuse per queue (each up to a few jumbo frames long).
pub(crate) const SPARE_CHAINS: usize = 32;

/// A packet that spans more than one UMEM frame: its bytes in one buffer, and the indices of the
/// frames after the first that hold (on receive) or will hold (on transmit) its pieces.
#[derive(Debug, Default)]
pub(crate) struct Chain {
    pub(crate) bytes: Vec<u8>,
    pub(crate) rest: Vec<u32>,
}

impl Chain {
    /// A chain that starts with `first`, the bytes of its first frame.
    pub(crate) fn start(first: &[u8]) -> Box<Chain> {
        let mut bytes = Vec::with_capacity(first.len() * 3);
        bytes.extend_from_slice(first);
        Box::new(Chain {
            bytes,
            rest: Vec::new(),
        })
    }

    /// Adds the next frame `index` of the chain, holding `piece`. Returns false when the chain
    /// has grown past [`MAX_PIECES`] (the frame is recorded all the same, so that it is freed
    /// with the others).
    pub(crate) fn append(&mut self, index: u32, piece: &[u8]) -> bool {
        self.rest.push(index);
        if self.rest.len() >= MAX_PIECES {
            return false;
        }
        self.bytes.extend_from_slice(piece);
        true
    }

    /// Pieces the packet needs at `capacity` bytes a frame.
    pub(crate) fn pieces(&self, capacity: usize) -> usize {
        pieces(self.bytes.len(), capacity)
    }
}

/// Frames a packet of `len` bytes takes at `capacity` bytes a frame (at least one).
pub(crate) fn pieces(len: usize, capacity: usize) -> usize {
    len.div_ceil(capacity.max(1)).max(1)
}

/// The `k`-th piece of `bytes` at `capacity` bytes a frame, and the descriptor options it
/// carries (`XDP_PKT_CONTD` on all but the last).
pub(crate) fn piece(bytes: &[u8], capacity: usize, k: usize) -> (&[u8], u32) {
    let start = (k * capacity).min(bytes.len());
    let end = (start + capacity).min(bytes.len());
    let last = end == bytes.len();
    (&bytes[start..end], if last { 0 } else { XDP_PKT_CONTD })
}

impl XskQueue {
    /// Bytes of packet one frame holds.
    pub(super) fn one_frame(&self) -> usize {
        self.frame_size - 256
    }

    /// Descriptors `f` takes on the TX ring.
    pub(super) fn pieces_of(&self, f: &XskFrame) -> usize {
        f.chain.as_ref().map_or(1, |c| c.pieces(self.one_frame()))
    }

    /// `bytes_mut` for a packet longer than one frame (or one that arrived so): the bytes the
    /// frame holds so far are kept, and the length set to `len`.
    pub(super) fn chained_bytes_mut<'a>(
        &'a self,
        frame: &'a mut XskFrame,
        len: usize,
    ) -> &'a mut [u8] {
        let len = len.min(self.max_packet);
        if frame.chain.is_none() {
            // SAFETY: the frame is a unique handle user space holds (the caller checked its
            // UMEM), so the kernel does not write it meanwhile.
            let first = unsafe { self.umem.bytes(frame.desc.addr, frame.desc.len as usize) };
            frame.chain = Some(Chain::start(first));
        }
        let c = frame.chain.as_mut().map(|c| &mut c.bytes);
        match c {
            Some(bytes) => {
                bytes.resize(len, 0);
                bytes
            }
            None => &mut [],
        }
    }

    /// Takes one received descriptor: a whole packet is moved to `out` (true); a piece of a
    /// chained one is added to the packet being gathered.
    pub(super) fn take_rx(&mut self, desc: Desc, out: &mut VecDeque<XskFrame>) -> bool {
        let index = self.index_of(desc.addr);
        if let Err(e) = self.received(index) {
            // The kernel returned a frame we never gave it: report and skip rather than alias
            // a frame that is in use elsewhere.
            tracing::error!("queue {}: {e}", self.queue_id);
            return false;
        }
        let more = desc.options & XDP_PKT_CONTD != 0;
        // A gather buffer from the spares, taken before the UMEM is borrowed.
        let spare = if more && self.partial.is_none() {
            self.spare_chains.pop()
        } else {
            None
        };
        // SAFETY: the descriptor came from this socket's RX ring, so it names a frame of this
        // UMEM that the kernel has handed to user space (the ledger has it InUse now).
        let piece = unsafe { self.umem.bytes(desc.addr, desc.len as usize) };
        let frame = match self.partial.take() {
            None if !more => XskFrame {
                desc,
                umem: self.id,
                index,
                chain: None,
            },
            None => XskFrame {
                desc,
                umem: self.id,
                index,
                chain: Some(match spare {
                    Some(mut c) => {
                        c.bytes.extend_from_slice(piece);
                        c
                    }
                    None => Chain::start(piece),
                }),
            },
            Some(mut f) => {
                if let Some(c) = f.chain.as_mut() {
                    c.append(index, piece);
                }
                f
            }
        };
        if more {
            self.partial = Some(frame);
            return false;
        }
        let whole = frame
            .chain
            .as_ref()
            .is_none_or(|c| c.rest.len() < MAX_PIECES);
        if !whole {
            tracing::warn!(
                "queue {}: a packet in more than {MAX_PIECES} frames dropped",
                self.queue_id
            );
            self.free_one(frame);
            return false;
        }
        out.push_back(frame);
        true
    }

    /// Gives `f`'s frames back to the free list (and its gather buffer to the spares).
    pub(super) fn free_one(&mut self, f: XskFrame) {
        let rest = f.chain.iter().flat_map(|c| c.rest.iter().copied());
        for i in std::iter::once(f.index).chain(rest) {
            self.let_go(i);
        }
        if let Some(c) = f.chain {
            self.keep_spare(c);
        }
    }

    /// Keeps a chained packet's buffer for the next one received (at most [`SPARE_CHAINS`]),
    /// so that jumbo frames are gathered without an allocation each.
    pub(super) fn keep_spare(&mut self, mut c: Box<Chain>) {
        if self.spare_chains.len() < SPARE_CHAINS {
            c.bytes.clear();
            c.rest.clear();
            self.spare_chains.push(c);
        }
    }

    /// Writes chained packet `f` into its frames, taking free frames for pieces it lacks (and
    /// giving back those it no longer needs), and its descriptors into `scratch` from `at`.
    /// Returns how many, or None when they would not fit `room` or the UMEM has no free frame.
    pub(super) fn lay_out_chain(
        &mut self,
        f: &mut XskFrame,
        room: usize,
        at: usize,
    ) -> Option<usize> {
        let cap = self.one_frame();
        let c = f.chain.as_mut()?;
        let n = c.pieces(cap);
        if n > room {
            return None;
        }
        for i in c.rest.drain((n - 1).min(c.rest.len())..) {
            if let Err(e) = self.pool.free(i) {
                tracing::error!("queue {}: {e}", self.queue_id);
            }
        }
        while c.rest.len() + 1 < n {
            let mut got = None;
            self.pool.alloc(1, |i| got = Some(i));
            c.rest.push(got?);
        }
        for k in 0..n {
            let (bytes, options) = piece(&c.bytes, cap, k);
            let mut desc = match k {
                0 => f.desc,
                _ => self.template(c.rest[k - 1]),
            };
            desc.len = bytes.len() as u32;
            // SAFETY: `desc` names a frame of this UMEM that user space holds (the packet's
            // own frame, or one just taken off the free list), which no one else refers to.
            let dst = unsafe { self.umem.bytes_mut(desc.addr, bytes.len()) };
            let n = dst.len().min(bytes.len());
            dst[..n].copy_from_slice(&bytes[..n]);
            desc.options = options;
            self.scratch[at + k] = desc;
        }
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_is_cut_into_pieces_that_rebuild_it() {
        let bytes: Vec<u8> = (0..9014u32).map(|i| (i % 251) as u8).collect();
        let cap = 3840;
        let n = pieces(bytes.len(), cap);
        assert_eq!(n, 3);
        let mut again = Chain::default();
        for k in 0..n {
            let (p, opts) = piece(&bytes, cap, k);
            assert_eq!(opts == XDP_PKT_CONTD, k + 1 < n, "piece {k}");
            if k == 0 {
                again = *Chain::start(p);
            } else {
                assert!(again.append(k as u32, p));
            }
        }
        assert_eq!(again.bytes, bytes);
        assert_eq!(again.rest, vec![1, 2]);
        assert_eq!(again.pieces(cap), 3);
    }

    #[test]
    fn exact_multiples_and_small_packets() {
        assert_eq!(pieces(0, 3840), 1);
        assert_eq!(pieces(60, 3840), 1);
        assert_eq!(pieces(3840, 3840), 1);
        assert_eq!(pieces(3841, 3840), 2);
        let b = [1u8; 7680];
        assert_eq!(piece(&b, 3840, 0).1, XDP_PKT_CONTD);
        assert_eq!(piece(&b, 3840, 1), (&b[3840..], 0));
    }

    #[test]
    fn a_chain_longer_than_the_kernel_makes_is_refused() {
        let mut c = Chain::start(&[0; 10]);
        let ok = (1..=MAX_PIECES as u32)
            .map(|i| c.append(i, &[0; 10]))
            .collect::<Vec<_>>();
        assert!(ok[..MAX_PIECES - 2].iter().all(|&b| b));
        assert!(!ok[MAX_PIECES - 1]);
        assert_eq!(c.rest.len(), MAX_PIECES, "every frame kept to be freed");
    }
}
