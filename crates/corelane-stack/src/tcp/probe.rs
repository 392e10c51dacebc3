//! The loss probe (RFC 8985 section 7) as a part the connection owns. Outside recovery it is
//! the tail loss probe: armed 2 SRTT after a transmission (plus the peer's worst delayed ACK
//! when a single segment is out), once. In recovery, when `TcpConfig::recovery_probe` allows,
//! a probe after 2 SRTT without news and a second twice as late: a recovery whose
//! retransmissions were lost again otherwise waits for the retransmission timer.
//!
//! The connection tells the probe what happened (`arm` after a transmission or progress,
//! `progress`, `disarm`) and asks, when the timer has fired, whether a probe is due (`take`)
//! and which segment it sends (`target`); the probe knows nothing of the connection.
//!
//! No probe is armed while the peer's window is shut: its silence then is not loss, and the
//! persist timer (the retransmission timer, backing off) is what probes a shut window (RFC
//! 9293 section 3.8.6.1). A loss probe there only sent the probe's byte again into the same
//! shut window, twice per backoff.

use smoltcp::time::{Duration, Instant};

/// Probes sent into one silence of a recovery before the retransmission timer is left to it.
const RECOVERY_PROBES: u8 = 2;

/// The shortest probe timeout: Linux's floor (two jiffies at 1000 Hz). At a veth's 100 us
/// round trip twice the SRTT is far less; a larger floor made each tail loss of a small
/// response cost more than the peer's own recovery would.
pub(crate) const PTO_MIN: Duration = Duration::from_millis(2);

/// The peer's worst delayed ACK (RFC 9293 section 3.8.6.3), waited for when it may have
/// nothing to report at once.
const DELAYED_ACK_MAX: Duration = Duration::from_millis(200);

/// What the connection knows when it arms the probe.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arming {
    /// The peer sends SACK (a probe without it could not tell what it repaired).
    pub(crate) sack: bool,
    /// A recovery episode is on.
    pub(crate) recovering: bool,
    /// Probes in recovery are allowed (`TcpConfig::recovery_probe`).
    pub(crate) in_recovery: bool,
    /// The smoothed round trip, when there is a sample.
    pub(crate) srtt: Option<Duration>,
    /// The retransmission timeout: a probe is never later.
    pub(crate) rto: Duration,
    /// A single segment is outstanding.
    pub(crate) one_segment: bool,
    /// Something was SACKed or deemed lost (a peer with holes ACKs at once).
    pub(crate) holes: bool,
    /// The peer advertised a shut (zero) window.
    pub(crate) window_shut: bool,
}

/// The probe's timer and count.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LossProbe {
    at: Option<Instant>,
    due: bool,
    out: u8,
}

impl LossProbe {
    /// Arms the timer as `a` allows: none past the episode's probes (one outside recovery),
    /// none without SACK or an RTT sample; at least `PTO_MIN`, doubled per probe already
    /// out, never later than the RTO. Against a shut window it disarms.
    pub(crate) fn arm(&mut self, a: Arming, now: Instant) {
        if a.window_shut {
            self.at = None;
            return;
        }
        let most = if a.recovering { RECOVERY_PROBES } else { 1 };
        if !a.sack || self.out >= most || (a.recovering && !a.in_recovery) {
            return;
        }
        let Some(srtt) = a.srtt else {
            return;
        };
        let mut pto = srtt * 2;
        if a.one_segment && !(a.recovering && a.holes) {
            pto += DELAYED_ACK_MAX;
        }
        let pto = (pto.max(PTO_MIN) * (1 << self.out.min(4))).min(a.rto);
        self.at = Some(now + pto);
    }

    /// No probe: everything was acknowledged, recovery began, or the connection ended.
    pub(crate) fn disarm(&mut self) {
        self.at = None;
    }

    /// Progress (new data acknowledged, or a SACK in recovery): the next probe is the
    /// first again.
    pub(crate) fn progress(&mut self) {
        self.out = 0;
    }

    /// A retransmission timeout: the probe is off and its count starts again.
    pub(crate) fn on_rto(&mut self) {
        self.at = None;
        self.out = 0;
    }

    /// When the timer fires.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.at
    }

    /// The clock: a probe is due once the timer has passed with something in flight.
    pub(crate) fn on_time(&mut self, now: Instant, in_flight: bool) {
        if self.at.is_some_and(|t| t <= now) {
            self.at = None;
            self.due |= in_flight;
        }
    }

    /// A probe waits to be sent.
    pub(crate) fn is_due(&self) -> bool {
        self.due
    }

    /// Takes the due probe, counting it; false when none is due.
    pub(crate) fn take(&mut self) -> bool {
        let due = std::mem::take(&mut self.due);
        if due {
            self.out = self.out.saturating_add(1);
        }
        due
    }

    /// Forgets the timer and a due probe (the connection's timers were cleared).
    pub(crate) fn clear(&mut self) {
        self.at = None;
        self.due = false;
    }

    /// For tests that want no probe in the way.
    #[cfg(test)]
    pub(crate) fn exhaust(&mut self) {
        self.at = None;
        self.out = u8::MAX;
    }
}

/// The segment a due probe sends again, given the first hole (in recovery), whether new data
/// may go, and the newest segment not delivered: in recovery the hole first, else, with no new
/// data, the newest in flight (whatever the peer reports of it is news to RACK); outside
/// recovery nothing (new data, else the last segment, see `output`).
pub(crate) fn target<S>(
    recovering: bool,
    hole: Option<S>,
    new_data: bool,
    newest: impl FnOnce() -> Option<S>,
) -> Option<S> {
    match hole {
        None if recovering && !new_data => newest(),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arming() -> Arming {
        Arming {
            sack: true,
            recovering: false,
            in_recovery: true,
            srtt: Some(Duration::from_millis(10)),
            rto: Duration::from_millis(300),
            one_segment: false,
            holes: false,
            window_shut: false,
        }
    }

    #[test]
    fn a_tail_probe_is_two_srtt_out_once() {
        let t0 = Instant::from_millis(1000);
        let mut p = LossProbe::default();
        p.arm(arming(), t0);
        assert_eq!(p.deadline(), Some(t0 + Duration::from_millis(20)));
        p.on_time(t0 + Duration::from_millis(19), true);
        assert!(!p.is_due(), "not before its time");
        p.on_time(t0 + Duration::from_millis(20), true);
        assert!(p.take() && !p.take(), "due once");
        assert_eq!(p.deadline(), None);
        // Outside recovery one probe is all until progress.
        p.arm(arming(), t0);
        assert_eq!(p.deadline(), None);
        p.progress();
        p.arm(arming(), t0);
        assert!(p.deadline().is_some());
    }

    #[test]
    fn one_segment_out_waits_for_the_delayed_ack_unless_the_peer_has_holes() {
        let t0 = Instant::from_millis(0);
        let mut p = LossProbe::default();
        let one = Arming {
            one_segment: true,
            ..arming()
        };
        p.arm(one, t0);
        assert_eq!(p.deadline(), Some(t0 + Duration::from_millis(220)));
        p.arm(
            Arming {
                recovering: true,
                holes: true,
                ..one
            },
            t0,
        );
        assert_eq!(p.deadline(), Some(t0 + Duration::from_millis(20)));
    }

    #[test]
    fn recovery_allows_two_probes_each_twice_as_late_never_past_the_rto() {
        let t0 = Instant::from_millis(0);
        let rec = Arming {
            recovering: true,
            ..arming()
        };
        let mut p = LossProbe::default();
        p.arm(rec, t0);
        p.on_time(t0 + Duration::from_millis(20), true);
        assert!(p.take());
        p.arm(rec, t0);
        assert_eq!(p.deadline(), Some(t0 + Duration::from_millis(40)));
        p.on_time(t0 + Duration::from_millis(40), true);
        assert!(p.take());
        p.arm(rec, t0);
        assert_eq!(p.deadline(), None, "two per silence");
        p.progress();
        let slow = Arming {
            srtt: Some(Duration::from_millis(400)),
            ..rec
        };
        p.arm(slow, t0);
        assert_eq!(
            p.deadline(),
            Some(t0 + Duration::from_millis(300)),
            "the RTO caps it"
        );
        // Not in recovery without the option, not without SACK or a sample, and at least the floor.
        let mut q = LossProbe::default();
        q.arm(
            Arming {
                in_recovery: false,
                ..rec
            },
            t0,
        );
        q.arm(
            Arming {
                sack: false,
                ..arming()
            },
            t0,
        );
        q.arm(
            Arming {
                srtt: None,
                ..arming()
            },
            t0,
        );
        assert_eq!(q.deadline(), None);
        q.arm(
            Arming {
                srtt: Some(Duration::from_micros(100)),
                ..arming()
            },
            t0,
        );
        assert_eq!(q.deadline(), Some(t0 + PTO_MIN));
    }

    #[test]
    fn nothing_in_flight_makes_no_probe_due_and_a_timeout_resets_the_count() {
        let t0 = Instant::from_millis(0);
        let mut p = LossProbe::default();
        p.arm(arming(), t0);
        p.on_time(t0 + Duration::from_secs(1), false);
        assert!(!p.take());
        p.arm(arming(), t0);
        p.on_time(t0 + Duration::from_secs(1), true);
        assert!(p.take());
        p.on_rto();
        p.arm(arming(), t0);
        assert!(p.deadline().is_some(), "counted again from the timeout");
        p.clear();
        assert!(p.deadline().is_none() && !p.is_due());
    }

    #[test]
    fn a_shut_window_arms_no_probe_in_or_out_of_recovery() {
        let t0 = Instant::from_millis(0);
        for recovering in [false, true] {
            let mut p = LossProbe::default();
            let a = Arming {
                recovering,
                ..arming()
            };
            p.arm(a, t0);
            assert!(p.deadline().is_some());
            // The peer's window shut while the probe was armed: the probe is off.
            p.arm(
                Arming {
                    window_shut: true,
                    ..a
                },
                t0,
            );
            assert_eq!(p.deadline(), None, "recovering: {recovering}");
            p.on_time(t0 + Duration::from_secs(1), true);
            assert!(!p.take());
            // It opened again: the probe is armed as before.
            p.arm(a, t0);
            assert!(p.deadline().is_some());
        }
    }

    #[test]
    fn the_target_is_the_hole_then_the_newest_in_recovery() {
        assert_eq!(target(true, Some(1), false, || Some(9)), Some(1));
        assert_eq!(target(true, None, false, || Some(9)), Some(9));
        assert_eq!(
            target(true, None, true, || Some(9)),
            None,
            "new data goes instead"
        );
        assert_eq!(target(false, None, false, || Some(9)), None);
    }
}
