//! A stack and its pipeline on one core with no other cores ([`Node`]), and two nodes back to
//! back over the in-memory link with a clock that jumps to the next deadline ([`Pair`]): what
//! tests, benchmarks and single-core tools drive.

use std::io;

use corelane_frame::{FrameCounts, FrameIo, MemLink, MemPort};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::IpCidr;

use crate::config::StackConfig;
use crate::device::XdpDevice;
use crate::pipeline::{Alone, Pipeline, Turn};
use crate::stack::Stack;

/// A stack and its pipeline driven together on one core, with no other cores to hand frames to.
#[derive(Debug)]
pub struct Node<P: FrameIo> {
    /// The protocol state.
    pub stack: Stack,
    /// The frame path: device, batch tuner, stage counters.
    pub pipe: Pipeline<P>,
}

impl<P: FrameIo> Node<P> {
    /// A node over `io` with IP MTU `mtu`, hardware address `mac` and the given addresses.
    pub fn new(io: P, mac: [u8; 6], addrs: &[IpCidr], mtu: usize, cfg: StackConfig) -> Self {
        let mut dev = XdpDevice::new(io, mtu, cfg.batch);
        let stack = Stack::new(
            &mut dev,
            mac,
            addrs,
            StackConfig {
                cores: 1,
                core: 0,
                ..cfg
            },
        );
        Node {
            stack,
            pipe: Pipeline::new(dev, None),
        }
    }

    /// The device.
    pub fn dev(&self) -> &XdpDevice<P> {
        &self.pipe.dev
    }

    /// The device, mutably (its frame I/O, counters and accounting).
    pub fn dev_mut(&mut self) -> &mut XdpDevice<P> {
        &mut self.pipe.dev
    }

    /// One turn of the pipeline ([`Pipeline::turn`]). Returns true when anything moved.
    ///
    /// # Errors
    /// When the transmit kick fails.
    pub fn poll(&mut self, now: Instant) -> io::Result<bool> {
        let turn = self.turn(now);
        match turn.tx_error {
            Some(e) => Err(e),
            None => Ok(turn.busy()),
        }
    }

    /// One turn of the pipeline, with what it did.
    pub fn turn(&mut self, now: Instant) -> Turn {
        self.pipe.turn(&mut self.stack, now, &mut Alone)
    }

    /// Resets every connection and gives every frame back; returns the frame accounting.
    ///
    /// # Errors
    /// When sending the resets fails.
    pub fn shutdown(&mut self, now: Instant) -> io::Result<FrameCounts> {
        self.stack.shutdown(now, &mut self.pipe.dev)
    }
}

/// Two nodes joined by an in-memory link, on a clock of their own that jumps to the next
/// deadline whenever both are idle: simulated seconds of timers cost a few turns, not
/// millions of fixed steps.
///
/// ```
/// use corelane_stack::{Pair, StackConfig};
/// use corelane_stack::smoltcp::time::Duration;
///
/// let mut p = Pair::new(StackConfig { seed: Some(1), ..StackConfig::default() });
/// p.a.stack.listen_tcp(7, None)?;
/// let (c, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
/// let open = p.drive(Duration::from_secs(5), |p| p.a.stack.accept(7).is_some())?;
/// assert!(open);
/// assert_eq!(p.b.stack.tcp_state(c).map(|s| s.to_string()), Some("ESTABLISHED".into()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Pair<P: FrameIo = MemPort> {
    /// The first node (10.9.0.1 by [`Pair::new`]).
    pub a: Node<P>,
    /// The second node (10.9.0.2 by [`Pair::new`]).
    pub b: Node<P>,
    now: Instant,
}

impl Pair<MemPort> {
    /// Node `a`'s TCP endpoint on port 7 as [`Pair::new`] addresses it.
    pub const A_ADDR: &'static str = "10.9.0.1:7";

    /// Two nodes over a default [`MemLink`], 10.9.0.1/24 and 10.9.0.2/24, MTU 1500, both with
    /// `cfg` (a fixed `cfg.seed` makes the run reproducible; `b` gets the seed plus one).
    pub fn new(cfg: StackConfig) -> Self {
        Pair::with(MemLink::default(), cfg, cfg)
    }

    /// Two nodes over `link`, `a` with `a_cfg` and `b` with `b_cfg`.
    pub fn with(link: MemLink, a_cfg: StackConfig, b_cfg: StackConfig) -> Self {
        let (x, y) = link.pair();
        Pair::over(x, y, a_cfg, b_cfg)
    }

    /// As [`Pair::with`], over a link that hands frames over without copying them
    /// ([`MemLink::pair_zero_copy`]): what runs is the two stacks' own work, as over a zero-copy
    /// device.
    pub fn zero_copy(link: MemLink, a_cfg: StackConfig, b_cfg: StackConfig) -> Self {
        let (x, y) = link.pair_zero_copy();
        Pair::over(x, y, a_cfg, b_cfg)
    }

    fn over(x: MemPort, y: MemPort, a_cfg: StackConfig, b_cfg: StackConfig) -> Self {
        let node = |io, last: u8, cfg: StackConfig| {
            let addr = smoltcp::wire::Ipv4Address::new(10, 9, 0, last);
            Node::new(
                io,
                [2, 0, 0, 0, 0, last],
                &[IpCidr::new(addr.into(), 24)],
                1500,
                cfg,
            )
        };
        let b_cfg = StackConfig {
            seed: b_cfg.seed.map(|s| s.wrapping_add(1)),
            ..b_cfg
        };
        Pair::from_nodes(node(x, 1, a_cfg), node(y, 2, b_cfg))
    }
}

impl<P: FrameIo> Pair<P> {
    /// Two nodes whose devices are already joined.
    pub fn from_nodes(a: Node<P>, b: Node<P>) -> Self {
        Pair {
            a,
            b,
            now: Instant::ZERO,
        }
    }

    /// The simulated time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// One turn of each node at the current time. Returns true when either did anything or
    /// has output queued.
    ///
    /// # Errors
    /// When a transmit kick fails.
    pub fn step(&mut self) -> io::Result<bool> {
        let a = self.a.poll(self.now)?;
        let b = self.b.poll(self.now)?;
        Ok(a || b || self.a.stack.egress_pending() || self.b.stack.egress_pending())
    }

    /// Moves the clock to the earlier of the two nodes' next deadlines, but not past `until`.
    /// Returns false when neither node has a deadline before `until` (nothing will happen).
    fn jump(&mut self, until: Instant) -> bool {
        let next = [self.a.stack.sleep_deadline(), self.b.stack.sleep_deadline()];
        jump_clock(&mut self.now, next, until)
    }

    /// Runs both nodes, calling `done` between steps, until it returns true or `limit` of
    /// simulated time has passed; whenever both nodes are idle the clock jumps to the next
    /// deadline. Returns whether `done` held.
    ///
    /// # Errors
    /// When a transmit kick fails.
    pub fn drive(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> io::Result<bool> {
        let end = self.now + limit;
        loop {
            if done(self) {
                return Ok(true);
            }
            if self.now >= end {
                return Ok(false);
            }
            // Idle with no deadline before the end: the clock is at the end, nothing can change.
            if !self.step()? && !self.jump(end) {
                return Ok(done(self));
            }
        }
    }

    /// Runs both nodes for `d` of simulated time, calling `each` between steps.
    ///
    /// # Errors
    /// When a transmit kick fails.
    pub fn drive_for(&mut self, d: Duration, mut each: impl FnMut(&mut Self)) -> io::Result<()> {
        self.drive(d, |p| {
            each(p);
            false
        })
        .map(|_| ())
    }
}

/// Moves a simulated clock to the earliest of `next`, but not past `until` (and at least a
/// microsecond on). Returns false when nothing is due before `until` (the clock is then there).
pub(crate) fn jump_clock(
    now: &mut Instant,
    next: impl IntoIterator<Item = Option<Instant>>,
    until: Instant,
) -> bool {
    match next.into_iter().flatten().min() {
        Some(t) if t <= until => {
            *now = t.max(*now + Duration::from_micros(1));
            true
        }
        _ => {
            *now = until.max(*now);
            false
        }
    }
}
