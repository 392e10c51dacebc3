//! Pacing: a connection's segments leave spread over the round trip at a rate derived from its
//! congestion window, not in one burst per ACK, so a queue on the path fills more slowly and a
//! shallow one drops less. The rate is twice a window per RTT in slow start and 1.2 times in
//! congestion avoidance (Linux's pacing ratios); bursts of a millisecond of that rate (or of
//! the configured segments, when more) pass unpaced. What the rate comes from (the window, the
//! round trip) is the connection's; the clock is this module's.

use smoltcp::time::{Duration, Instant};

/// The least time a paced burst covers: about a millisecond of the pacing rate, the size of burst
/// Linux allows a paced flow (its pacing shift of 10). At `burst` segments alone, a path whose
/// turns take longer than that many segment gaps (veth in copy mode: the peer's receive runs
/// inside our transmit call) would be held to `burst` segments per turn.
const BURST_TIME_NS: f64 = 1_000_000.0;

fn now_ns(now: Instant) -> u64 {
    now.total_micros().max(0) as u64 * 1000
}

/// What the pacing rate is made of, as the connection has it now.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    /// The congestion window, bytes.
    pub(crate) cwnd: usize,
    /// The round trip the window is spread over.
    pub(crate) rtt: Duration,
    /// In slow start (the window doubles each round trip).
    pub(crate) slow_start: bool,
    /// Bytes of a full segment.
    pub(crate) smss: usize,
    /// Segments a burst may hold at least.
    pub(crate) burst: usize,
}

impl Rate {
    /// Bytes per nanosecond.
    fn per_ns(&self) -> f64 {
        let factor = if self.slow_start { 2.0 } else { 1.2 };
        self.cwnd as f64 * factor / (self.rtt.total_micros().max(1) as f64 * 1000.0)
    }
}

/// The pacing clock of one connection.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pacer {
    /// When the next segment may leave, in nanoseconds of the stack's clock.
    next_ns: u64,
    /// A segment waited for the clock: the connection wants a turn when it allows one.
    blocked: bool,
}

/// A pass's pacing rate in bytes per nanosecond and its burst allowance in nanoseconds: the
/// window and round trip do not change while a connection sends, so an output pass works
/// them out once, not once a segment (kept by the pass, not the connection).
pub(crate) type Step = Option<(f64, u64)>;

impl Pacer {
    /// Whether a segment may leave at `now`. When not, the pacer remembers that one waits.
    pub(crate) fn allows(&mut self, now: Instant) -> bool {
        let ok = self.next_ns <= now_ns(now);
        self.blocked |= !ok;
        ok
    }

    /// A new output pass: nothing waits yet.
    pub(crate) fn new_pass(&mut self) {
        self.blocked = false;
    }

    /// When a segment that waited may leave (None: none waits).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.blocked
            .then(|| Instant::from_micros((self.next_ns / 1000) as i64 + 1))
    }

    /// `bytes` left at `now`: moves the clock past them at `rate`, allowing its burst.
    #[cfg(test)]
    pub(crate) fn sent(&mut self, now: Instant, bytes: usize, rate: Rate) {
        self.sent_in_pass(now, bytes, &mut None, || Some(rate));
    }

    /// `sent`, with the rate asked for once a pass: `rate` is called when `step` holds none
    /// yet (the pass's first segment), and nothing is paced when it gives none.
    pub(crate) fn sent_in_pass(
        &mut self,
        now: Instant,
        bytes: usize,
        step: &mut Step,
        rate: impl FnOnce() -> Option<Rate>,
    ) {
        let (per_ns, burst) = match *step {
            Some(step) => step,
            None => {
                let Some(rate) = rate() else {
                    return;
                };
                let per_ns = rate.per_ns();
                // The burst allowance: `burst` segments, or the pacing rate's worth of
                // BURST_TIME when that is more (a fast path's turns take longer than `burst`
                // segments' gaps, and a fixed count would cap the rate at `burst` segments
                // per turn).
                let burst =
                    ((rate.burst.max(1) * rate.smss) as f64 / per_ns).max(BURST_TIME_NS) as u64;
                *step.insert((per_ns, burst))
            }
        };
        let gap = (bytes as f64 / per_ns) as u64;
        let t = now_ns(now);
        self.next_ns = self.next_ns.max(t.saturating_sub(burst)) + gap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(slow_start: bool) -> Rate {
        // 100 segments of 1,000 bytes per 10 ms: 10 MB/s at ratio 1.
        Rate {
            cwnd: 100_000,
            rtt: Duration::from_millis(10),
            slow_start,
            smss: 1000,
            burst: 10,
        }
    }

    #[test]
    fn a_burst_passes_then_segments_are_spread() {
        let t0 = Instant::from_millis(1000);
        let mut p = Pacer::default();
        // Congestion avoidance: 12 MB/s, a 1 ms burst allowance (12 kB, more than 10 segments).
        let mut sent = 0;
        while p.allows(t0) {
            p.sent(t0, 1000, rate(false));
            sent += 1;
            assert!(sent < 100, "the clock never stops a burst");
        }
        assert_eq!(
            sent, 13,
            "a millisecond of the rate, and the segment that crossed it"
        );
        let Some(at) = p.deadline() else {
            panic!("a segment waits for the clock");
        };
        assert!(at > t0 && at <= t0 + Duration::from_micros(100), "{at}");
        assert!(p.allows(at));
        p.sent(at, 1000, rate(false));
        assert!(!p.allows(at), "one segment per gap after the burst");
    }

    #[test]
    fn slow_start_paces_at_twice_the_window_rate() {
        let t0 = Instant::from_millis(1000);
        let (mut ss, mut ca) = (Pacer::default(), Pacer::default());
        for _ in 0..100 {
            ss.sent(t0, 1000, rate(true));
            ca.sent(t0, 1000, rate(false));
        }
        // 100 kB: 5 ms at 20 MB/s, 8.3 ms at 12 MB/s (less the burst allowance each).
        let (s, c) = (ss.next_ns - now_ns(t0), ca.next_ns - now_ns(t0));
        assert!((3_900_000..=4_100_000).contains(&s), "{s}");
        assert!((7_200_000..=7_400_000).contains(&c), "{c}");
        ss.new_pass();
        assert_eq!(ss.deadline(), None, "nothing waits in a new pass");
    }
}
