//! The retransmission timer's estimator (RFC 6298): SRTT and RTTVAR from samples taken under
//! Karn's rule (never from a retransmitted segment), RTO = SRTT + 4 RTTVAR, clamped between a
//! configurable floor (200 ms by default, as Linux; RFC 6298 allows 1 s) and a ceiling, and
//! doubled on each expiry.

use smoltcp::time::Duration;

/// RFC 6298's estimator, in microseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rtt {
    srtt: Option<u64>,
    rttvar: u64,
    min_rtt: u64,
    backoff: u32,
    /// The only sample is the handshake's.
    provisional: bool,
    min: u64,
    max: u64,
    initial: u64,
}

impl Rtt {
    /// A fresh estimator: RTO = `initial` until the first sample.
    pub(crate) fn new(min: Duration, max: Duration, initial: Duration) -> Rtt {
        Rtt {
            srtt: None,
            rttvar: 0,
            min_rtt: u64::MAX,
            backoff: 0,
            provisional: false,
            min: min.total_micros(),
            max: max.total_micros().max(min.total_micros()),
            initial: initial.total_micros(),
        }
    }

    /// Takes the handshake's sample: the first, and provisional. A handshake's answer may come
    /// from the peer's own retransmission of its SYN-ACK, a second or more after the SYN that
    /// seemed to be sent once; a first data sample under a quarter of it replaces it instead
    /// of being averaged with it (which would leave a timeout of seconds for many round
    /// trips).
    pub(crate) fn sample_handshake(&mut self, rtt: Duration) {
        self.sample(rtt);
        self.provisional = true;
    }

    /// Takes one sample (RFC 6298 section 2.2 and 2.3) and ends any backoff.
    pub(crate) fn sample(&mut self, rtt: Duration) {
        let r = rtt.total_micros().max(1);
        let provisional = std::mem::take(&mut self.provisional);
        match self.srtt {
            Some(s) if provisional && r < s / 4 => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
                self.min_rtt = r;
            }
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let err = s.abs_diff(r);
                self.rttvar = (3 * self.rttvar + err) / 4;
                self.srtt = Some((7 * s + r) / 8);
            }
        }
        self.min_rtt = self.min_rtt.min(r);
        self.backoff = 0;
    }

    /// One ACK's samples: `long` (its oldest segment's) for SRTT and RTTVAR, `short` (its
    /// newest's) for the minimum.
    pub(crate) fn sample_span(&mut self, long: Duration, short: Duration) {
        self.sample(long);
        self.min_rtt = self.min_rtt.min(short.total_micros().max(1));
    }

    /// The smoothed RTT, if any sample was taken.
    pub(crate) fn srtt(&self) -> Option<Duration> {
        self.srtt.map(Duration::from_micros)
    }

    /// The RTT variation (RTTVAR), once a sample was taken.
    pub(crate) fn rttvar(&self) -> Option<Duration> {
        self.srtt.map(|_| Duration::from_micros(self.rttvar))
    }

    /// The smallest sample seen.
    pub(crate) fn min_rtt(&self) -> Option<Duration> {
        (self.min_rtt != u64::MAX).then(|| Duration::from_micros(self.min_rtt))
    }

    /// The retransmission timeout, backoff included.
    pub(crate) fn rto(&self) -> Duration {
        let base = match self.srtt {
            // G, the clock granularity, is 1 µs here: K * RTTVAR dominates.
            // An ambiguous handshake sample never makes the timer slower than none would.
            Some(s) if self.provisional => {
                (s + (4 * self.rttvar).max(1)).clamp(self.min, self.initial.max(self.min))
            }
            Some(s) => (s + (4 * self.rttvar).max(1)).clamp(self.min, self.max),
            None => self.initial,
        };
        Duration::from_micros(base.saturating_mul(1 << self.backoff.min(20)).min(self.max))
    }

    /// The timer expired: back off (RFC 6298 5.5).
    pub(crate) fn back_off(&mut self) {
        self.backoff = (self.backoff + 1).min(20);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_far_smaller_first_data_sample_replaces_the_handshake_sample() {
        let mut r = Rtt::new(ms(200), ms(60_000), ms(1000));
        r.sample_handshake(ms(1002));
        assert_eq!(r.rto(), ms(1000), "no slower than the initial timeout");
        r.sample(ms(2));
        assert_eq!((r.srtt(), r.rto()), (Some(ms(2)), ms(200)));
        // A comparable one is averaged in, as any sample.
        let mut r = Rtt::new(ms(200), ms(60_000), ms(1000));
        r.sample_handshake(ms(40));
        r.sample(ms(20));
        assert_eq!(r.srtt(), Some(Duration::from_micros(37_500)));
        r.sample(ms(1));
        assert_eq!(r.srtt(), Some(Duration::from_micros(32_937)));
    }

    #[test]
    fn follows_rfc_6298_with_a_floor_and_backoff() {
        let mut r = Rtt::new(ms(200), ms(60_000), ms(1000));
        assert_eq!(r.rto(), ms(1000));
        r.sample(ms(100));
        // SRTT 100, RTTVAR 50: 100 + 200 = 300.
        assert_eq!(r.rto(), ms(300));
        r.sample(ms(100));
        // RTTVAR 37.5: 100 + 150 = 250.
        assert_eq!(r.rto(), ms(250));
        for _ in 0..20 {
            r.sample(ms(1));
        }
        assert_eq!(r.rto(), ms(200), "the floor holds");
        r.back_off();
        r.back_off();
        assert_eq!(r.rto(), ms(800));
        for _ in 0..30 {
            r.back_off();
        }
        assert_eq!(r.rto(), ms(60_000), "the ceiling holds");
        r.sample(ms(1));
        assert_eq!(r.rto(), ms(200), "a sample ends the backoff");
        assert_eq!(r.min_rtt(), Some(ms(1)));
    }
}
