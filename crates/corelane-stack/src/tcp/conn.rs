//! A connection: its state, its buffers and timers, and what the application calls on it.

use std::io;
use std::task::Waker;

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpAddress, IpEndpoint, TcpRepr};

use super::TcpConfig;
use super::board_box::BoardBox;
use super::cc::{Cc, Congestion};
use super::dsack::Dsacks;
use super::due::Due;
use super::probe::LossProbe;
use super::ring::Ring;
use super::rtt::Rtt;
use super::secret::{CookieInfo, Secret};
use super::seq::Seq;
pub(crate) use super::types::ConnStats;
pub use super::types::{TcpState, TcpStats};

/// Loss recovery in progress.
#[derive(Debug, Clone, Copy)]
pub(super) struct Recovery {
    /// Recovery ends when this is acknowledged (RFC 6675's RecoveryPoint).
    pub recover: Seq,
    /// After a timeout the window slow-starts; after a fast retransmit PRR sets it.
    pub timeout: bool,
    pub prr_delivered: usize,
    pub prr_out: usize,
    pub recover_fs: usize,
}

impl Recovery {
    /// An episode that slow-starts from the window it has, with no PRR: after a retransmission
    /// timeout, or for segments cut by a smaller path MTU. It ends when `recover` is
    /// acknowledged.
    pub(super) fn without_prr(recover: Seq) -> Recovery {
        Recovery {
            recover,
            timeout: true,
            prr_delivered: 0,
            prr_out: 0,
            recover_fs: 0,
        }
    }
}

/// The controller as it was before a fast recovery, and that episode's retransmissions not
/// yet reported as duplicates: when the last is, every retransmission was spurious and the
/// reduction is undone (RFC 2883 section 5, in the manner of RFC 3708's detection).
#[derive(Debug, Clone)]
pub(super) struct Undo {
    pub prior: Cc,
    pub left: u32,
    /// SND.UNA when the episode began: D-SACKs below it are of older segments.
    pub from: Seq,
    /// This side's TSval when the episode's first retransmission was sent.
    pub retx_ts: Option<u32>,
    /// An ACK covered a retransmission and echoed a timestamp no older than `retx_ts`: the
    /// retransmission may have been needed, so the echo proves nothing for this episode.
    pub echoed_retx: bool,
}

/// What one side learnt from the other's SYN.
#[derive(Debug, Clone, Copy)]
pub(super) struct Peer {
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
    pub sack: bool,
    pub ts: Option<u32>,
}

impl Peer {
    pub(super) fn of(seg: &TcpRepr<'_>) -> Peer {
        Peer {
            mss: seg.max_seg_size,
            wscale: seg.window_scale,
            sack: seg.sack_permitted,
            ts: seg.timestamp.map(|t| t.tsval),
        }
    }
}

/// Sizes a connection is opened with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// MSS this side can receive (its MTU less the headers).
    pub mss: u16,
    /// Largest receive window.
    pub rx_max: usize,
    /// Largest send buffer.
    pub tx_max: usize,
}

/// A connection.
pub(crate) struct Conn {
    pub(super) state: TcpState,
    pub(super) cfg: std::sync::Arc<TcpConfig>,
    pub(super) local: IpEndpoint,
    pub(super) remote: IpEndpoint,
    pub(super) sizes: Sizes,
    // Send side.
    pub(super) iss: Seq,
    pub(super) snd_una: Seq,
    pub(super) snd_nxt: Seq,
    pub(super) snd_wnd: usize,
    pub(super) max_snd_wnd: usize,
    pub(super) snd_wl1: Seq,
    pub(super) snd_wl2: Seq,
    pub(super) snd: Ring,
    pub(super) close_requested: bool,
    pub(super) fin_seq: Option<Seq>,
    /// Payload of a full segment with the timestamps: the segment size in force.
    pub(super) smss: usize,
    /// Options and payload a segment may carry: the MSS (RFC 6691) or what the path MTU leaves.
    pub(super) seg_room: usize,
    pub(super) snd_wscale: u8,
    // Receive side.
    pub(super) irs: Seq,
    pub(super) rcv_nxt: Seq,
    pub(super) rcv: Ring,
    pub(super) rcv_cap: usize,
    pub(super) rcv_adv: Seq,
    pub(super) rcv_wscale: u8,
    /// The last window this side advertised was zero: nothing past it is taken until a
    /// segment advertises room again (`rcv_window_now`).
    pub(super) rcv_shut: bool,
    pub(super) ooo: Vec<(Seq, Seq)>,
    /// Starts of the out-of-order arrivals not yet reported in a SACK block, newest last.
    pub(super) sack_fresh: Vec<Seq>,
    /// Data that arrived again since the last ACK: the next ones report it first (D-SACKs,
    /// RFC 2883), so that the peer learns its retransmissions were spurious.
    pub(super) dsack: Dsacks,
    pub(super) peer_fin: Option<Seq>,
    /// `RCV.UP`: the sequence number after the urgent data the peer last pointed to, while
    /// some of it is still unread (RFC 9293 3.8.5, MUST-30/31; RFC 6093's reading).
    pub(super) rcv_up: Option<Seq>,
    pub(super) fin_rcvd: bool,
    pub(super) last_ack_sent: Seq,
    // Options.
    pub(super) sack_ok: bool,
    pub(super) wscale_ok: bool,
    pub(super) ts_ok: bool,
    pub(super) ts_recent: u32,
    pub(super) ts_recent_at: Instant,
    pub(super) ts_offset: u32,
    // What to send.
    pub(super) syn_due: bool,
    pub(super) rst_due: bool,
    /// A bare reset owed for an unacceptable ACK, with this sequence number.
    pub(super) rst_due_for: Option<Seq>,
    pub(super) ack_now: bool,
    pub(super) dupacks_owed: u8,
    pub(super) unacked_segs: u32,
    /// `RCV.NXT` when the latest second in-order segment arrived: what a pure ACK says while
    /// an odd segment after it waits (see `ack_header`).
    pub(super) ack_point: Option<Seq>,
    pub(super) win_probe_due: bool,
    pub(super) keep_probe_due: bool,
    // Timers.
    pub(super) rtt: Rtt,
    pub(super) rto_at: Due,
    /// The loss probe's timer and count.
    pub(super) probe: LossProbe,
    pub(super) reo_at: Due,
    pub(super) ack_at: Due,
    pub(super) keep_at: Due,
    pub(super) end_at: Due,
    /// When emptied buffers are given back (see `Conn::trim`).
    pub(super) trim_at: Due,
    /// The trim timer is the short one, for small buffers only.
    pub(super) trim_short: bool,
    /// The pacing clock.
    pub(super) pacer: super::pacing::Pacer,
    pub(super) syn_sent_at: Due,
    pub(super) syn_tries: u32,
    pub(super) last_progress: Instant,
    pub(super) keepalive: Option<Duration>,
    /// How long sent data may go unacknowledged (RFC 5482); from the configuration, or set on
    /// the socket.
    pub(super) user_timeout: Duration,
    /// The last ICMP error that did not end the connection at once (a host or network
    /// unreachable): what a timeout reports instead of `TimedOut` (RFC 1122 section 4.2.3.9).
    pub(super) soft_error: Option<io::ErrorKind>,
    pub(super) keep_probes: u32,
    pub(super) challenge_at: Instant,
    /// When an ACK last answered a segment without data that was outside the window or
    /// failed PAWS (at most one per `OOW_ACK_GAP`).
    pub(super) oow_ack_at: Due,
    pub(super) challenges: u8,
    // Congestion and loss recovery.
    pub(super) board: BoardBox,
    pub(super) cc: Cc,
    pub(super) recovery: Option<Recovery>,
    pub(super) rack: Option<(Instant, Seq)>,
    pub(super) rack_rtt: Duration,
    pub(super) reordering: bool,
    /// RACK's reordering window in quarters of the minimum RTT (RFC 8985 section 6.2).
    pub(super) reo_mult: u8,
    /// The round a D-SACK last widened the window in: widened again once this is acked.
    pub(super) reo_round: Option<Seq>,
    /// Recoveries since the last D-SACK; after 16 the window is back to one quarter.
    pub(super) reo_quiet: u8,
    /// The latest an original segment was seen to arrive behind a later one, in
    /// microseconds past the round trip of that later one (what RACK's window would have
    /// had to be to wait for it); forgotten with the window's widening.
    pub(super) reo_late_us: u32,
    /// The highest sequence delivered so far (RACK.fack).
    pub(super) rack_fack: Option<Seq>,
    /// What undoes the last fast recovery's reduction if it proves spurious.
    pub(super) undo: Option<Box<Undo>>,
    pub(super) dupacks: u32,
    pub(super) peak_flight: usize,
    pub(super) ecn: super::ecn::Ecn,
    // Receive window auto-tuning.
    pub(super) rcv_space: usize,
    pub(super) rcv_space_at: Instant,
    pub(super) rcv_rtt_ms: u32,
    // The application.
    pub(super) nodelay: bool,
    pub(super) orphan: bool,
    pub(super) error: Option<io::ErrorKind>,
    pub(super) rx_waker: Option<Waker>,
    pub(super) tx_waker: Option<Waker>,
    pub(crate) stats: ConnStats,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("state", &self.state)
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("snd_una", &self.snd_una)
            .field("snd_nxt", &self.snd_nxt)
            .field("rcv_nxt", &self.rcv_nxt)
            .field("cwnd", &self.cc.cwnd)
            .finish_non_exhaustive()
    }
}

/// The smallest window scale that lets `window` bytes be advertised.
pub(super) fn scale_for(window: usize) -> u8 {
    let mut s = 0u8;
    while s < 14 && (window >> s) > 0xffff {
        s += 1;
    }
    s
}

/// The MSS assumed when the peer sends none (RFC 9293 section 3.7.1, RFC 8200 section 5).
pub(super) fn default_mss(remote: IpAddress) -> u16 {
    match remote {
        IpAddress::Ipv4(_) => 536,
        IpAddress::Ipv6(_) => 1220,
    }
}

impl Conn {
    fn new(
        cfg: std::sync::Arc<TcpConfig>,
        secret: &Secret,
        local: IpEndpoint,
        remote: IpEndpoint,
        sizes: Sizes,
        now: Instant,
    ) -> Conn {
        let iss = secret.isn(local, remote, now);
        let rcv_cap = cfg.rx_initial.clamp(1, sizes.rx_max.max(1));
        let c = &*cfg;
        let rtt = Rtt::new(c.rto_min.into(), c.rto_max.into(), c.rto_initial.into());
        Conn {
            state: TcpState::Closed,
            local,
            remote,
            sizes,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: Seq(0),
            snd_wl2: Seq(0),
            snd: Ring::default(),
            close_requested: false,
            fin_seq: None,
            smss: usize::from(default_mss(remote.addr)),
            seg_room: usize::from(default_mss(remote.addr)),
            snd_wscale: 0,
            irs: Seq(0),
            rcv_nxt: Seq(0),
            rcv_up: None,
            rcv: Ring::default(),
            rcv_cap,
            rcv_adv: Seq(0),
            rcv_wscale: scale_for(sizes.rx_max),
            rcv_shut: false,
            ooo: Vec::new(),
            sack_fresh: Vec::new(),
            dsack: Dsacks::default(),
            peer_fin: None,
            fin_rcvd: false,
            last_ack_sent: Seq(0),
            sack_ok: false,
            wscale_ok: false,
            ts_ok: false,
            ts_recent: 0,
            ts_recent_at: now,
            ts_offset: secret.ts_offset(local, remote),
            syn_due: false,
            rst_due: false,
            rst_due_for: None,
            ack_now: false,
            dupacks_owed: 0,
            unacked_segs: 0,
            ack_point: None,
            win_probe_due: false,
            keep_probe_due: false,
            rtt,
            rto_at: Due::NONE,
            probe: LossProbe::default(),
            reo_at: Due::NONE,
            ack_at: Due::NONE,
            keep_at: Due::NONE,
            end_at: Due::NONE,
            trim_at: Due::NONE,
            trim_short: false,
            pacer: Default::default(),
            syn_sent_at: Due::NONE,
            syn_tries: 0,
            last_progress: now,
            keepalive: None,
            user_timeout: cfg.user_timeout.into(),
            soft_error: None,
            keep_probes: 0,
            challenge_at: now,
            oow_ack_at: Due::NONE,
            challenges: 0,
            board: BoardBox::default(),
            cc: Cc::new(cfg.congestion, usize::from(default_mss(remote.addr))),
            recovery: None,
            rack: None,
            rack_rtt: Duration::ZERO,
            reordering: false,
            reo_mult: 1,
            reo_round: None,
            reo_quiet: 0,
            reo_late_us: 0,
            rack_fack: None,
            undo: None,
            dupacks: 0,
            peak_flight: 0,
            ecn: Default::default(),
            rcv_space: 0,
            rcv_space_at: now,
            rcv_rtt_ms: 0,
            nodelay: true,
            orphan: false,
            error: None,
            rx_waker: None,
            tx_waker: None,
            stats: ConnStats::default(),
            // Last: the fields above read it.
            cfg,
        }
    }

    /// An active open: SYN-SENT, the SYN due.
    pub(crate) fn connect(
        cfg: impl Into<std::sync::Arc<TcpConfig>>,
        secret: &Secret,
        local: IpEndpoint,
        remote: IpEndpoint,
        sizes: Sizes,
        now: Instant,
    ) -> Conn {
        let mut c = Conn::new(cfg.into(), secret, local, remote, sizes, now);
        c.state = TcpState::SynSent;
        c.syn_due = true;
        c.snd_nxt = c.iss;
        c
    }

    /// A passive open from a SYN: SYN-RECEIVED, the SYN-ACK due.
    pub(crate) fn accept(
        cfg: impl Into<std::sync::Arc<TcpConfig>>,
        secret: &Secret,
        inn: (IpEndpoint, IpEndpoint),
        syn: &TcpRepr<'_>,
        sizes: Sizes,
        now: Instant,
    ) -> Conn {
        let mut c = Conn::new(cfg.into(), secret, inn.0, inn.1, sizes, now);
        c.state = TcpState::SynReceived;
        c.irs = Seq(syn.seq_number.0 as u32);
        c.rcv_nxt = c.irs.plus(1);
        c.rcv_adv = c.rcv_nxt;
        c.negotiate(Peer::of(syn), now);
        c.snd_wnd = usize::from(syn.window_len);
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = c.irs;
        c.syn_due = true;
        c
    }

    /// A connection rebuilt from the ACK of a SYN cookie: ESTABLISHED at once. The ACK itself
    /// is then fed to [`Conn::input`] (it may carry data).
    pub(crate) fn from_cookie(
        cfg: impl Into<std::sync::Arc<TcpConfig>>,
        secret: &Secret,
        inn: (IpEndpoint, IpEndpoint),
        ack: &TcpRepr<'_>,
        info: CookieInfo,
        sizes: Sizes,
        now: Instant,
    ) -> Conn {
        let mut c = Conn::new(cfg.into(), secret, inn.0, inn.1, sizes, now);
        let seq = Seq(ack.seq_number.0 as u32);
        c.irs = seq.minus(1);
        c.rcv_nxt = seq;
        c.rcv_adv = seq;
        c.iss = Seq(ack.ack_number.map_or(0, |a| a.0 as u32)).minus(1);
        c.snd_una = c.iss.plus(1);
        c.snd_nxt = c.snd_una;
        c.snd_wl1 = c.irs;
        c.snd_wl2 = c.snd_una;
        // The SYN's options rode in the timestamp this side sent (see `Secret::cookie`).
        let opts = ack.timestamp.map(|t| t.tsecr & 0x1f);
        let peer = Peer {
            mss: Some(info.mss),
            wscale: opts.and_then(|o| (o & 0xf != 0xf).then_some((o & 0xf) as u8)),
            sack: opts.is_some_and(|o| o & 0x10 != 0),
            ts: ack.timestamp.map(|t| t.tsval),
        };
        if peer.wscale.is_none() {
            c.rcv_wscale = 0;
        }
        c.negotiate(peer, now);
        c.snd_wnd = usize::from(ack.window_len) << c.snd_wscale;
        c.max_snd_wnd = c.snd_wnd;
        c.state = TcpState::Established;
        c
    }

    /// Applies the options of the peer's SYN.
    pub(super) fn negotiate(&mut self, peer: Peer, now: Instant) {
        self.wscale_ok = peer.wscale.is_some();
        match peer.wscale {
            Some(s) => self.snd_wscale = s.min(14),
            None => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
            }
        }
        self.sack_ok = self.cfg.sack && peer.sack;
        self.ts_ok = self.cfg.timestamps && peer.ts.is_some();
        if let Some(ts) = peer.ts {
            self.ts_recent = ts;
            self.ts_recent_at = now;
        }
        let peer_mss = usize::from(peer.mss.unwrap_or_else(|| default_mss(self.remote.addr)));
        let mss = peer_mss.min(usize::from(self.sizes.mss)).max(64);
        self.seg_room = mss;
        self.smss = mss - self.fixed_options_len();
        self.cc.set_mss(self.smss);
        self.rcv_cap = self.rcv_cap.min(self.rcv_max());
    }

    /// Something is due to be sent (then an unknown next hop must be resolved first).
    pub(crate) fn wants_output(&self) -> bool {
        self.syn_due
            || self.rst_due
            || self.rst_due_for.is_some()
            || self.ack_now
            || self.dupacks_owed > 0
            || self.unsent() > 0
            || (self.close_requested && self.fin_seq.is_none())
            || self.board.lost() > 0
            || self.probe.is_due()
            || self.keep_probe_due
            || self.win_probe_due
    }

    /// This side's endpoint.
    pub(crate) fn local(&self) -> IpEndpoint {
        self.local
    }

    /// The peer's endpoint.
    pub(crate) fn remote(&self) -> IpEndpoint {
        self.remote
    }

    /// The largest receive window this connection may advertise: the configured most, or
    /// what fits 16 bits when window scaling is off.
    pub(super) fn rcv_max(&self) -> usize {
        if self.rcv_wscale == 0 {
            self.sizes.rx_max.min(0xffff)
        } else {
            self.sizes.rx_max
        }
    }

    /// The state.
    pub(crate) fn state(&self) -> TcpState {
        self.state
    }

    /// The error that ended the connection, if one did.
    pub(crate) fn error(&self) -> Option<io::ErrorKind> {
        self.error
    }

    /// The smoothed RTT.
    pub(crate) fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// The congestion window, bytes.
    pub(crate) fn cwnd(&self) -> usize {
        self.cc.cwnd
    }

    /// The congestion controller.
    pub(crate) fn congestion(&self) -> Congestion {
        self.cc.algo()
    }

    /// Switches congestion controller.
    pub(crate) fn set_congestion(&mut self, c: Congestion) {
        self.cc.set_algo(c);
    }

    /// The receive window in force (it grows with auto-tuning).
    pub(crate) fn rcv_window(&self) -> usize {
        self.rcv_cap
    }

    /// The peer's window, bytes.
    pub(crate) fn snd_window(&self) -> usize {
        self.snd_wnd
    }

    pub(super) fn wake_rx(&mut self) {
        if let Some(w) = self.rx_waker.take() {
            w.wake();
        }
    }

    pub(super) fn wake_tx(&mut self) {
        if let Some(w) = self.tx_waker.take() {
            w.wake();
        }
    }

    /// This side's timestamp clock (RFC 7323: milliseconds, offset per four-tuple).
    pub(super) fn ts_now(&self, now: Instant) -> u32 {
        (now.total_millis() as u32).wrapping_add(self.ts_offset)
    }

    /// The window the receive side can take from `RCV.NXT` on.
    pub(super) fn rcv_room(&self) -> usize {
        self.rcv_cap.saturating_sub(self.rcv.len())
    }

    /// The sequence number of the first byte in the send ring: `SND.UNA`, or the byte after
    /// the SYN while the SYN is unacknowledged.
    pub(super) fn data_base(&self) -> Seq {
        // Not `max(SND.UNA, ISS + 1)`: sequence order is modular, and 2 GiB into a transfer
        // SND.UNA compares before ISS + 1 again (which once made every byte past 2 GiB come
        // from the wrong place in the ring).
        if self.snd_una == self.iss
            && matches!(self.state, TcpState::SynSent | TcpState::SynReceived)
        {
            self.iss.plus(1)
        } else {
            self.snd_una
        }
    }

    /// Data queued and never sent.
    pub(super) fn unsent(&self) -> usize {
        if self.fin_seq.is_some() {
            return 0;
        }
        self.snd
            .len()
            .saturating_sub(self.snd_nxt.since(self.data_base()))
    }
}
