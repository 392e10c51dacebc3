//! Congestion control: CUBIC (RFC 9438) by default, NewReno (RFC 5681, RFC 6582) on request.
//! Both share slow start and the reaction to a retransmission timeout; they differ in how the
//! window grows in congestion avoidance and how far it falls on a loss. During loss recovery the
//! window is set by proportional rate reduction (RFC 6937) in the connection, not here.

use smoltcp::time::{Duration, Instant};

/// Which congestion controller a connection runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Congestion {
    /// CUBIC (RFC 9438), as Linux by default.
    #[default]
    Cubic,
    /// NewReno (RFC 5681 and RFC 6582).
    NewReno,
}

impl std::str::FromStr for Congestion {
    type Err = String;

    fn from_str(s: &str) -> Result<Congestion, String> {
        match s.to_ascii_lowercase().as_str() {
            "cubic" => Ok(Congestion::Cubic),
            "newreno" | "reno" => Ok(Congestion::NewReno),
            other => Err(format!(
                "unknown congestion control {other:?} (cubic or newreno)"
            )),
        }
    }
}

/// CUBIC's constants (RFC 9438 section 4).
const BETA: f64 = 0.7;
const C: f64 = 0.4;

/// A connection's congestion window and the controller's state.
#[derive(Debug, Clone)]
pub(crate) struct Cc {
    algo: Congestion,
    mss: usize,
    /// The congestion window, bytes.
    pub(crate) cwnd: usize,
    /// The slow start threshold, bytes.
    pub(crate) ssthresh: usize,
    /// NewReno: bytes acknowledged toward the next increase.
    acked_acc: usize,
    // CUBIC, in segments.
    w_max: f64,
    k: f64,
    epoch: Option<Instant>,
    w_est: f64,
    cwnd_prior: f64,
}

impl Cc {
    /// A controller with RFC 6928's initial window of 10 segments.
    pub(crate) fn new(algo: Congestion, mss: usize) -> Cc {
        let mss = mss.max(64);
        Cc {
            algo,
            mss,
            cwnd: 10 * mss,
            ssthresh: usize::MAX,
            acked_acc: 0,
            w_max: 0.0,
            k: 0.0,
            epoch: None,
            w_est: 0.0,
            cwnd_prior: 0.0,
        }
    }

    /// The algorithm in force.
    pub(crate) fn algo(&self) -> Congestion {
        self.algo
    }

    /// Switches algorithm, keeping the window.
    pub(crate) fn set_algo(&mut self, algo: Congestion) {
        self.algo = algo;
        self.epoch = None;
    }

    /// The segment size changed (the handshake's MSS).
    pub(crate) fn set_mss(&mut self, mss: usize) {
        let mss = mss.max(64);
        if self.cwnd == 10 * self.mss {
            self.cwnd = 10 * mss;
        }
        self.mss = mss;
    }

    /// True in slow start.
    pub(crate) fn slow_start(&self) -> bool {
        self.cwnd < self.ssthresh
    }

    /// `acked` new bytes were acknowledged outside loss recovery. `limited`: the sender did not
    /// use its window (then the window does not grow, RFC 7661's idea).
    pub(crate) fn on_ack(&mut self, now: Instant, acked: usize, srtt: Duration, limited: bool) {
        if limited || acked == 0 {
            return;
        }
        if self.slow_start() {
            let room = self.ssthresh - self.cwnd;
            let grow = acked.min(room);
            self.cwnd += grow;
            let rest = acked - grow;
            if rest == 0 {
                return;
            }
            return self.avoid(now, rest, srtt);
        }
        self.avoid(now, acked, srtt);
    }

    fn avoid(&mut self, now: Instant, acked: usize, srtt: Duration) {
        match self.algo {
            Congestion::NewReno => {
                self.acked_acc += acked;
                if self.acked_acc >= self.cwnd {
                    self.acked_acc -= self.cwnd;
                    self.cwnd += self.mss;
                }
            }
            Congestion::Cubic => self.cubic(now, acked, srtt),
        }
    }

    fn cubic(&mut self, now: Instant, acked: usize, srtt: Duration) {
        let mss = self.mss as f64;
        let cwnd = self.cwnd as f64 / mss;
        let epoch = *self.epoch.get_or_insert_with(|| {
            // A new epoch: from a loss (w_max set there) or from the end of slow start.
            if self.w_max < cwnd {
                self.w_max = cwnd;
                self.k = 0.0;
            }
            self.w_est = cwnd;
            now
        });
        let t = (now - epoch).total_micros() as f64 / 1e6;
        let rtt = srtt.total_micros() as f64 / 1e6;
        let w = |t: f64| C * (t - self.k).powi(3) + self.w_max;
        let target = w(t + rtt).clamp(cwnd, 1.5 * cwnd);
        // The Reno-friendly estimate (RFC 9438 section 4.3).
        let alpha = if self.w_est >= self.cwnd_prior {
            1.0
        } else {
            3.0 * (1.0 - BETA) / (1.0 + BETA)
        };
        let segs = acked as f64 / mss;
        self.w_est += alpha * segs / cwnd;
        let next = if w(t) < self.w_est {
            self.w_est
        } else {
            cwnd + (target - cwnd) * segs / cwnd
        };
        self.cwnd = ((next * mss) as usize).max(self.cwnd).max(2 * self.mss);
    }

    /// A loss was detected (fast recovery begins) with `flight` bytes outstanding: set the
    /// threshold the window is reduced to. Returns the new ssthresh.
    pub(crate) fn on_loss(&mut self, flight: usize) -> usize {
        let cwnd = self.cwnd.max(flight.min(self.cwnd));
        self.ssthresh = match self.algo {
            Congestion::NewReno => (flight / 2).max(2 * self.mss),
            Congestion::Cubic => {
                let segs = cwnd as f64 / self.mss as f64;
                // Fast convergence (RFC 9438 section 4.7).
                self.w_max = if segs < self.w_max {
                    segs * (1.0 + BETA) / 2.0
                } else {
                    segs
                };
                self.cwnd_prior = segs;
                let reduced = (segs * BETA).max(2.0);
                self.k = ((self.w_max - reduced).max(0.0) / C).cbrt();
                self.epoch = None;
                ((reduced * self.mss as f64) as usize).max(2 * self.mss)
            }
        };
        self.acked_acc = 0;
        self.ssthresh
    }

    /// The retransmission timer expired: one segment of window, slow start up to half of what
    /// was in flight (RFC 5681 section 3.1).
    pub(crate) fn on_rto(&mut self, flight: usize) {
        self.on_loss(flight);
        self.cwnd = self.mss;
        self.acked_acc = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: usize = 1000;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms as i64)
    }

    #[test]
    fn slow_start_doubles_then_newreno_adds_a_segment_per_window() {
        let mut c = Cc::new(Congestion::NewReno, MSS);
        assert_eq!(c.cwnd, 10 * MSS);
        c.on_ack(at(0), 10 * MSS, Duration::from_millis(10), false);
        assert_eq!(c.cwnd, 20 * MSS);
        assert_eq!(c.on_loss(20 * MSS), 10 * MSS);
        c.cwnd = c.ssthresh;
        c.on_ack(at(10), 10 * MSS, Duration::from_millis(10), false);
        assert_eq!(c.cwnd, 11 * MSS);
        c.on_ack(at(10), 10 * MSS, Duration::from_millis(10), true);
        assert_eq!(
            c.cwnd,
            11 * MSS,
            "an application-limited sender does not grow"
        );
        c.on_rto(11 * MSS);
        assert_eq!((c.cwnd, c.ssthresh), (MSS, 5500));
    }

    #[test]
    fn cubic_backs_off_by_beta_and_returns_to_w_max_after_k() {
        let mut c = Cc::new(Congestion::Cubic, MSS);
        c.cwnd = 100 * MSS;
        c.ssthresh = 100 * MSS;
        let th = c.on_loss(100 * MSS);
        assert_eq!(th, 70 * MSS);
        c.cwnd = th;
        // K = cbrt(30 / 0.4) = 4.2 s: after K the window is back near w_max.
        let rtt = Duration::from_millis(100);
        let mut now = 0;
        while now < 4300 {
            c.on_ack(at(now), c.cwnd, rtt, false);
            now += 100;
        }
        let w = c.cwnd / MSS;
        assert!((95..=110).contains(&w), "cwnd {w} segments after K");
        // A second loss below w_max converges fast: w_max shrinks below the window.
        c.cwnd = 90 * MSS;
        c.on_loss(90 * MSS);
        assert!(c.w_max < 90.0);
    }
}
