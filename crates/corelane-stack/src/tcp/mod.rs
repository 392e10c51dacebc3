//! corelane's TCP engine, sans-IO: a connection is a state machine fed parsed segments and the
//! time, asked for the segments it wants to send, and asked when it next needs the time. It
//! knows nothing of frames, flows or cores; the [`Stack`](crate::Stack) around it demuxes,
//! builds frames and runs timers.
//!
//! Written from the RFCs: RFC 9293 (the state machine), RFC 6298 (the retransmission timer,
//! with a 200 ms floor by default), RFC 5681, RFC 6582 and RFC 9438 (NewReno and CUBIC), RFC
//! 2018 and RFC 6675 (SACK and its scoreboard), RFC 8985 (RACK-TLP), RFC 6937 (proportional rate
//! reduction), RFC 7323 (window scale, timestamps, PAWS), RFC 6528 (initial sequence numbers),
//! RFC 5961 (blind in-window attacks), RFC 4987 (SYN cookies) and RFC 5482's user timeout.
//!
//! - `seq`: wrapping sequence numbers; `ring`: the lazily allocated byte rings;
//! - `rtt`: the RFC 6298 estimator; `cc`: CUBIC and NewReno; `board`: the send scoreboard and
//!   RACK; `secret`: SipHash-keyed ISNs, timestamp offsets and SYN cookies;
//! - `conn`: a connection's state; `types`: `TcpState` and `TcpStats`; `user`: what the
//!   application calls; `input`: segment arrival; `output`: what to send now; `timers`: the
//!   deadlines; `wire`: segments to and from frames, checksum fused with the copy.

mod admit;
mod board;
#[cfg(test)]
mod board_bounds;
mod board_box;
#[cfg(test)]
mod board_model;
#[cfg(test)]
mod board_tests;
mod cc;
#[cfg(test)]
mod conformance;
#[cfg(test)]
mod conformance_dsack;
#[cfg(test)]
mod conformance_ecn;
#[cfg(test)]
mod conformance_memory;
#[cfg(test)]
mod conformance_pacing;
#[cfg(test)]
mod conformance_recovery;
#[cfg(test)]
mod conformance_spurious;
#[cfg(test)]
mod conformance_timeouts;
#[cfg(test)]
mod conformance_urgent;
#[cfg(test)]
mod conformance_window;
#[cfg(test)]
mod conformance_wrap;
mod conn;
mod dsack;
pub(crate) mod due;
mod ecn;
mod end;
#[cfg(test)]
mod fuzz;
mod header;
mod icmp;
mod input;
mod order;
pub(crate) mod output;
mod pacing;
mod probe;
mod recv;
mod reorder;
mod ring;
mod rtt;
mod secret;
mod seq;
mod sndwnd;
mod timers;
mod types;
mod user;
pub(crate) mod wire;

pub use cc::Congestion;
pub(crate) use conn::{Conn, Sizes};
pub use conn::{TcpState, TcpStats};
pub use ecn::EcnMode;
pub(crate) use header::{cookie_syn_ack, cookie_window};
pub use icmp::{IcmpError, MIN_PMTU_V4, MIN_PMTU_V6};
pub(crate) use ring::{MemBudget, SMALL as SMALL_BUFFER};
pub(crate) use secret::{IdGen, Secret};
pub use seq::Seq;
pub(crate) use wire::verify as verify_checksum;

use std::time::Duration;

/// How a stack's TCP connections behave. Every field has a default fit for a data centre or
/// the Internet; a test may shorten the timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConfig {
    /// The congestion controller of new connections (each socket may change its own).
    pub congestion: Congestion,
    /// The floor of the retransmission timeout (RFC 6298 allows 1 s; Linux uses 200 ms).
    pub rto_min: Duration,
    /// The ceiling of the retransmission timeout, backoff included.
    pub rto_max: Duration,
    /// The timeout before the first RTT sample (RFC 6298: 1 s).
    pub rto_initial: Duration,
    /// How long an ACK may wait for a second segment or for data to ride on.
    pub ack_delay: Duration,
    /// How many times a SYN or SYN-ACK is sent before the attempt fails.
    pub syn_retries: u32,
    /// How long sent data may go unacknowledged before the connection is reset and freed
    /// (RFC 5482's user timeout; RFC 1122's R2 is at least 100 s). The default, about 15
    /// minutes, is what Linux's 15 retries with a 200 ms first timeout come to; each socket may
    /// set its own.
    pub user_timeout: Duration,
    /// TIME-WAIT's length when both sides use timestamps (PAWS rejects old duplicates).
    pub time_wait: Duration,
    /// TIME-WAIT's length without timestamps.
    pub time_wait_no_ts: Duration,
    /// How long a connection the application let go of may wait in FIN-WAIT-2 for the peer's
    /// FIN.
    pub fin_wait_2: Duration,
    /// Keep-alive probes sent without an answer before the connection is dropped.
    pub keepalive_probes: u32,
    /// The receive window a connection starts with; it grows toward the measured
    /// bandwidth-delay product, up to the stack's `tcp_rx_buffer`.
    pub rx_initial: usize,
    /// Pace segments at a rate derived from the window and the RTT, in bursts of `burst`
    /// segments (or about a millisecond of the rate, when that is more), instead of sending a
    /// whole window at once.
    pub pacing: bool,
    /// Segments sent back to back before pacing waits, at rates where a millisecond carries
    /// fewer.
    pub burst: usize,
    /// Offer SACK (RFC 2018).
    pub sack: bool,
    /// Offer timestamps (RFC 7323).
    pub timestamps: bool,
    /// Answer SYNs past a listener's SYN backlog with SYN cookies instead of dropping them.
    pub syn_cookies: bool,
    /// Explicit Congestion Notification (RFC 3168): accepted when a peer asks by default.
    pub ecn: EcnMode,
    /// Probe a silent flight during loss recovery, not only at its tail: when nothing is
    /// delivered for two smoothed RTTs (at least 10 ms) while recovering, send one segment
    /// more (the next hole, else new data, else the newest segment in flight), so that its
    /// SACK lets RACK find a lost retransmission instead of the retransmission timer and its
    /// doubling; if that brings nothing either, a second probe twice as late, then the timer.
    /// RFC 8985 arms its tail loss probe only outside recovery; on a path losing several
    /// percent the whole of a recovery's small window is lost often enough that each such
    /// event costs a timeout or two. At most two segments per silence, within the peer's
    /// window.
    pub recovery_probe: bool,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            congestion: Congestion::Cubic,
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(60),
            rto_initial: Duration::from_secs(1),
            ack_delay: Duration::from_millis(1),
            syn_retries: 6,
            user_timeout: Duration::from_secs(924),
            time_wait: Duration::from_secs(1),
            time_wait_no_ts: Duration::from_secs(8),
            fin_wait_2: Duration::from_secs(60),
            keepalive_probes: 9,
            rx_initial: 64 * 1024,
            pacing: true,
            burst: 16,
            sack: true,
            timestamps: true,
            syn_cookies: true,
            ecn: EcnMode::Accept,
            recovery_probe: true,
        }
    }
}
