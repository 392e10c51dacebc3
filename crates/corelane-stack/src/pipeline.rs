//! The one pipeline turn: RX batch, classify, handoff in, demux + protocol, egress, TX with one
//! kick, recycle, refill; with per-stage timing and the batch tuner. The runtime's cores, the
//! in-memory [`Node`](crate::Node), the benchmarks and the tests all run this code.

use std::io;
use std::time::Instant as StdInstant;

use corelane_frame::{FrameIo, Proto};
use smoltcp::time::Instant;

use crate::device::XdpDevice;
use crate::stack::Stack;
use crate::tune::BatchTuner;

/// A frame that no flow or listener of this stack claims, offered to [`Peers::unclaimed`].
#[derive(Debug, Clone, Copy)]
pub struct Unclaimed<'a> {
    /// TCP or UDP.
    pub proto: Proto,
    /// The frame's destination port (this side's port).
    pub local_port: u16,
    /// This stack listens on the port, but the segment is no SYN: the connection may live on
    /// another core.
    pub listening: bool,
    /// How many cores the frame was handed through already.
    pub hops: u8,
    /// The whole frame.
    pub bytes: &'a [u8],
}

/// What became of an [`Unclaimed`] frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Answer it here (a reset for TCP, ICMP port unreachable for UDP, or nothing).
    Answer,
    /// Another core took a copy; drop it here.
    HandedOff,
    /// It belongs to another core that could not take it now; drop it (counted).
    Dropped,
}

/// The other cores, as one core's pipeline sees them. Which core owns which port, and how far a
/// frame may travel, is the implementor's policy (the runtime's); the stack only asks.
///
/// [`Alone`] is the implementation for a single stack.
pub trait Peers {
    /// Frames other cores handed to this one: calls `inject(hops, bytes)` for each, at most
    /// `max`; returns how many.
    fn take_inbound(&mut self, max: usize, inject: &mut dyn FnMut(u8, &[u8])) -> usize;

    /// A frame no flow here claims: hand it on, or let this stack answer it.
    fn unclaimed(&mut self, frame: Unclaimed<'_>) -> Disposition;

    /// An ARP reply or neighbour advertisement arrived: other cores' neighbour caches may want
    /// it. Returns how many copies were handed on and how many could not be.
    fn neighbor_reply(&mut self, bytes: &[u8], hops: u8) -> (u64, u64);

    /// The turn is over: wake the cores that were handed frames.
    fn end_turn(&mut self);

    /// A frame a flow here takes, but that belongs to core `core` (a QUIC datagram whose
    /// connection ID names that core): hand it there, or say [`Disposition::Answer`] to keep
    /// it here (no such core). The default keeps it.
    fn hand_to(&mut self, core: usize, bytes: &[u8]) -> Disposition {
        let _ = (core, bytes);
        Disposition::Answer
    }
}

/// No other cores: nothing comes in, everything unclaimed is answered here.
#[derive(Debug, Clone, Copy, Default)]
pub struct Alone;

impl Peers for Alone {
    fn take_inbound(&mut self, _max: usize, _inject: &mut dyn FnMut(u8, &[u8])) -> usize {
        0
    }
    fn unclaimed(&mut self, _frame: Unclaimed<'_>) -> Disposition {
        Disposition::Answer
    }
    fn neighbor_reply(&mut self, _bytes: &[u8], _hops: u8) -> (u64, u64) {
        (0, 0)
    }
    fn end_turn(&mut self) {}
}

/// A pipeline times its stages on one turn in this many (and counts their items on every
/// turn): a clock read costs tens of nanoseconds and a timed turn takes seven; at one in 8
/// they were 7% of a one-connection request/response in memory (`reqresp`), at one in 32
/// under 2%.
pub const TIMED_EVERY: u64 = 32;

/// Frames and time spent in one stage of the pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stage {
    /// Frames (or flows, for egress) the stage handled.
    pub items: u64,
    /// Nanoseconds spent in the stage: by [`Pipeline::turn`], estimated from one turn in
    /// [`TIMED_EVERY`] (each timed turn counts for that many).
    pub nanos: u64,
}

impl Stage {
    /// Counts `items`; on a `timed` turn also the time since `since`, weighted by
    /// [`TIMED_EVERY`]. Returns the start of the next stage (`since` when not timed).
    fn sample(&mut self, items: usize, since: StdInstant, timed: bool) -> StdInstant {
        self.items += items as u64;
        if !timed {
            return since;
        }
        let now = StdInstant::now();
        self.nanos += (now - since).as_nanos() as u64 * TIMED_EVERY;
        now
    }

    /// Counts one sampled event standing for `weight` of them: `weight` items and `weight`
    /// times the time since `since`.
    pub fn record_weighted(&mut self, since: StdInstant, weight: u64) {
        self.items += weight;
        self.nanos += since.elapsed().as_nanos() as u64 * weight;
    }

    /// Counts `items` and the time since `since`; returns now, the start of the next stage.
    pub fn record(&mut self, items: usize, since: StdInstant) -> StdInstant {
        let now = StdInstant::now();
        self.items += items as u64;
        self.nanos += (now - since).as_nanos() as u64;
        now
    }

    /// Nanoseconds per item (0 when none).
    pub fn ns_per_item(&self) -> f64 {
        if self.items == 0 {
            0.0
        } else {
            self.nanos as f64 / self.items as f64
        }
    }
}

/// Counters of a [`Pipeline`]: turns, and per stage, frames (or flows) and time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Turns run.
    pub turns: u64,
    /// Turns that found work.
    pub busy_turns: u64,
    /// RX stage: frames taken from the RX ring.
    pub rx: Stage,
    /// Classify stage: frames parsed and checksum-verified.
    pub classify: Stage,
    /// Handoff in: frames taken from other cores.
    pub handoff_in: Stage,
    /// Flow demux and protocol (ingress) stage: frames processed.
    pub protocol: Stage,
    /// Egress stage: flows polled for output.
    pub egress: Stage,
    /// TX, recycle and refill stage: frames sent.
    pub tx: Stage,
}

/// What one turn did.
#[derive(Debug, Default)]
pub struct Turn {
    /// Frames pulled from the RX ring.
    pub pulled: usize,
    /// Frames taken from other cores.
    pub injected: usize,
    /// Frames the protocol stage consumed.
    pub consumed: usize,
    /// Flows polled for egress.
    pub polled: usize,
    /// Frames sent.
    pub sent: usize,
    /// The transmit kick failed (the turn still ran to its end; TCP retransmits).
    pub tx_error: Option<io::Error>,
}

impl Turn {
    /// True when anything moved.
    pub fn busy(&self) -> bool {
        self.pulled + self.injected + self.consumed + self.polled > 0
    }
}

/// Most frames taken from other cores in one turn.
const MAX_INBOUND: usize = 256;

/// One core's frame path: the device over its queue, the batch tuner, and the stage counters.
/// The [`Stack`] is passed to each turn, so a caller may keep it elsewhere (behind a lock the
/// application's sockets share, say).
#[derive(Debug)]
pub struct Pipeline<P: FrameIo> {
    /// The device moving frames.
    pub dev: XdpDevice<P>,
    /// Adapts the batch size turn by turn when set (Model-T); otherwise the batch is fixed.
    pub tuner: Option<BatchTuner>,
    stats: PipelineStats,
    /// The start of the last turn that read the clock (an untimed turn's stages need a
    /// value, and use none of it).
    last_start: StdInstant,
}

impl<P: FrameIo> Pipeline<P> {
    /// A pipeline over `dev`, with a fixed batch unless `tuner` is given.
    pub fn new(dev: XdpDevice<P>, tuner: Option<BatchTuner>) -> Self {
        Pipeline {
            dev,
            tuner,
            stats: PipelineStats::default(),
            last_start: StdInstant::now(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> PipelineStats {
        self.stats
    }

    /// One turn of the pipeline at time `now`. A failed transmit kick does not stop the turn:
    /// it is reported in [`Turn::tx_error`].
    pub fn turn(&mut self, stack: &mut Stack, now: Instant, peers: &mut dyn Peers) -> Turn {
        self.turn_from(stack, now, None, peers)
    }

    /// [`turn`](Pipeline::turn), with the wall clock as the caller read it just before
    /// (`started`: `Instant::now()`), for the stages' timing and the batch tuner; `None` reads
    /// it here where they need it. A runtime that reads the wall clock for the turn anyway saves
    /// a read per turn.
    pub fn turn_from(
        &mut self,
        stack: &mut Stack,
        now: Instant,
        started: Option<StdInstant>,
        peers: &mut dyn Peers,
    ) -> Turn {
        let dev = &mut self.dev;
        let st = &mut self.stats;
        st.turns += 1;
        let sent_before = dev.stats().tx_frames;
        if let Some(tu) = &self.tuner {
            dev.set_batch(tu.batch());
        }
        let timed = (st.turns - 1).is_multiple_of(TIMED_EVERY);
        // The clock is read only where something uses it: a timed turn, or the tuner (which
        // weighs the time of full turns). An untimed turn's stages take `start` as given.
        let start = if timed || self.tuner.is_some() {
            started.unwrap_or_else(StdInstant::now)
        } else {
            self.last_start
        };
        self.last_start = start;
        let pulled = dev.recv_batch();
        let t = st.rx.sample(pulled, start, timed);
        dev.classify_batch();
        let t = st.classify.sample(pulled, t, timed);
        let injected = peers.take_inbound(MAX_INBOUND, &mut |hops, bytes| {
            dev.inject(bytes, hops);
        });
        let t = st.handoff_in.sample(injected, t, timed);
        let consumed = stack.ingress(now, dev, peers);
        let t = st.protocol.sample(consumed, t, timed);
        let polled = stack.egress(now, dev);
        let t = st.egress.sample(polled, t, timed);
        let flushed = dev.flush();
        // Frames written by the protocol and egress stages this turn, sent by this flush.
        let sent = (dev.stats().tx_frames - sent_before) as usize;
        st.tx.sample(sent, t, timed);
        peers.end_turn();
        if let Some(tu) = self.tuner.as_mut() {
            // The tuner weighs the time of full batches only: a turn short of its batch (most
            // turns of a lightly loaded core) does not read the clock again.
            let full = (pulled + injected).max(sent) >= tu.batch();
            let busy = if full {
                start.elapsed().as_nanos() as u64
            } else {
                0
            };
            tu.observe(pulled + injected, sent, busy);
            // The kernel's drop counters may cost a system call: read them now and then.
            if st.turns.is_multiple_of(4096) {
                tu.observe_drops(dev.read_rx_drops());
                dev.io_mut().set_fill_target(tu.fill_target());
            }
        }
        let turn = Turn {
            pulled,
            injected,
            consumed,
            polled,
            sent,
            tx_error: flushed.err(),
        };
        st.busy_turns += u64::from(turn.busy());
        turn
    }
}
