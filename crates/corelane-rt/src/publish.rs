//! Live statistics for readers outside the process (`corelane-stat`, the metrics endpoint):
//! each core writes its counters into its own slot of the interface's stats file every
//! [`corelane_stat::PUBLISH_INTERVAL_MS`], and a snapshot of its connections when a reader asks.
//! Nothing happens per frame.

use std::time::{Duration, Instant};

use crate::host::{FrameCounts, XdpCounters};
use corelane_stack::{Stack, TcpState};
use corelane_stat::{Conn, CoreWriter};

use crate::lane::CoreStats;

/// The counters every core publishes, in slot order. Names ending in `_ns` are nanoseconds;
/// levels (`frames_*`, `batch_*`, `fill_target`, `flows`, `neighbors`, `wake_cost_ns`,
/// `spin_ns`: see
/// [`corelane_stat::is_gauge`]) go up and down, the rest count up.
pub(crate) const NAMES: &[&str] = &[
    "turns",
    "busy_turns",
    "stage_rx_items",
    "stage_rx_ns",
    "stage_classify_items",
    "stage_classify_ns",
    "stage_handoff_in_items",
    "stage_handoff_in_ns",
    "stage_protocol_items",
    "stage_protocol_ns",
    "stage_egress_items",
    "stage_egress_ns",
    "stage_tx_items",
    "stage_tx_ns",
    "stage_tasks_items",
    "stage_tasks_ns",
    "parks",
    "restarts",
    "rx_frames",
    "rx_delivered",
    "rx_bad_checksum",
    "rx_malformed",
    "tx_frames",
    "tx_no_frame",
    "tx_batches",
    "tx_oversize",
    "rx_oversize",
    "rx_ring_drops",
    "batch_current",
    "batch_settled",
    "fill_target",
    "frames_free",
    "frames_fill",
    "frames_rx",
    "frames_in_use",
    "frames_tx",
    "frames_completion",
    "frames_away",
    "frames_total",
    "handed_off",
    "handoff_dropped",
    "no_flow",
    "syn_accepted",
    "syn_dropped",
    "accept_queue_full",
    "established",
    "flows",
    "neighbors",
    "tcp_segs_in",
    "tcp_segs_out",
    "tcp_bytes_in",
    "tcp_bytes_out",
    "tcp_retrans_segs",
    "tcp_rto_expiries",
    "tcp_fast_recoveries",
    "tcp_resets_in",
    "tcp_resets_out",
    "tcp_cookies_sent",
    "tcp_timeouts",
    "udp_rx",
    "udp_tx",
    "udp_rx_dropped",
    "frag_fragments",
    "frag_reassembled",
    "frag_evicted",
    "icmp_echoes",
    "xdp_steered",
    "xdp_passed",
    "xdp_malformed",
    "xdp_no_socket",
    "xdp_syn_cookies",
    "xdp_closed_port_resets",
    "xdp_port_unreachables",
    "xdp_unreachables_limited",
    "xdp_resets_limited",
    "tcp_mem_bytes",
    "tcp_mem_limited",
    "tcp_mem_dropped",
    "tcp_conn_limited",
    "tcp_ooo_pruned",
    "rx_wait_woken_items",
    "rx_wait_woken_ns",
    "rx_wait_awake_items",
    "rx_wait_awake_ns",
    "tcp_syn_timeouts",
    "tcp_syn_old_acks",
    "udp_quic_steered",
    "queue_registrations",
    "queue_unregistrations",
    "wake_cost_ns",
    "spin_ns",
];

fn values(st: &CoreStats, frames: FrameCounts, xdp: Option<XdpCounters>) -> Vec<u64> {
    let p = &st.pipeline;
    let (d, s, t) = (&st.device, &st.stack, &st.stack.tcp);
    let x = xdp.unwrap_or_default();
    let u = |n: usize| n as u64;
    vec![
        p.turns,
        p.busy_turns,
        p.rx.items,
        p.rx.nanos,
        p.classify.items,
        p.classify.nanos,
        p.handoff_in.items,
        p.handoff_in.nanos,
        p.protocol.items,
        p.protocol.nanos,
        p.egress.items,
        p.egress.nanos,
        p.tx.items,
        p.tx.nanos,
        st.tasks.items,
        st.tasks.nanos,
        st.parks,
        st.restarts,
        d.rx_frames,
        d.rx_delivered,
        d.rx_bad_checksum,
        d.rx_malformed,
        d.tx_frames,
        d.tx_no_frame,
        d.tx_batches,
        d.tx_oversize,
        d.rx_oversize,
        d.rx_ring_drops,
        u(st.batch.current),
        u(st.batch.settled),
        u(st.batch.fill_target),
        u(frames.free),
        u(frames.fill),
        u(frames.rx),
        u(frames.in_use),
        u(frames.tx),
        u(frames.completion),
        u(frames.away),
        u(frames.total),
        s.handed_off,
        s.handoff_dropped,
        s.no_flow,
        s.syn_accepted,
        s.syn_dropped,
        s.accept_queue_full,
        s.established,
        s.flows,
        s.neighbors,
        t.segs_in,
        t.segs_out,
        t.bytes_in,
        t.bytes_out,
        t.retrans_segs,
        t.rto_expiries,
        t.fast_recoveries,
        t.resets_in,
        t.resets_out,
        t.cookies_sent,
        t.timeouts,
        s.udp.rx,
        s.udp.tx,
        s.udp.rx_dropped,
        s.frag.fragments,
        s.frag.reassembled,
        s.frag.evicted,
        s.icmp_echoes,
        x.steered,
        x.passed,
        x.malformed,
        x.no_socket,
        x.syn_cookies,
        x.closed_port_resets,
        x.port_unreachables,
        x.unreachables_limited,
        x.resets_limited,
        s.tcp_mem,
        s.tcp_mem_limited,
        s.tcp_mem_dropped,
        s.tcp_conn_limited,
        s.tcp_ooo_pruned,
        st.rx_wait_woken.items,
        st.rx_wait_woken.nanos,
        st.rx_wait_awake.items,
        st.rx_wait_awake.nanos,
        t.syn_timeouts,
        t.syn_old_acks,
        s.udp.steered,
        st.queue_registrations,
        st.queue_unregistrations,
        st.wake_cost.map_or(0, |d| d.as_nanos() as u64),
        st.spin.as_nanos() as u64,
    ]
}

fn state_index(s: TcpState) -> u8 {
    match s {
        TcpState::Closed => 0,
        TcpState::Listen => 1,
        TcpState::SynSent => 2,
        TcpState::SynReceived => 3,
        TcpState::Established => 4,
        TcpState::FinWait1 => 5,
        TcpState::FinWait2 => 6,
        TcpState::CloseWait => 7,
        TcpState::Closing => 8,
        TcpState::LastAck => 9,
        TcpState::TimeWait => 10,
        _ => u8::MAX,
    }
}

/// One core's publishing: when it is due, and the writer of its slot.
#[derive(Debug)]
pub(crate) struct Publish {
    writer: CoreWriter,
    index: usize,
    next: Instant,
}

impl Publish {
    /// Core `index`'s publisher, first due at `now` (the host's clock).
    pub(crate) fn new(writer: CoreWriter, index: usize, now: Instant) -> Publish {
        Publish {
            writer,
            index,
            next: now,
        }
    }

    /// The longest an idle core may sleep and still publish on time.
    pub(crate) fn interval() -> Duration {
        Duration::from_millis(corelane_stat::PUBLISH_INTERVAL_MS)
    }

    /// Whether the interval has passed at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Publishes (call when [`due`](Self::due)): the counters (`stats` with the stack's
    /// brought up to date; core 0 adds the XDP program's), and the connections if a reader
    /// asked.
    pub(crate) fn tick(
        &mut self,
        now: Instant,
        mut stats: CoreStats,
        stack: &mut Stack,
        frames: impl FnOnce() -> FrameCounts,
        xdp: impl FnOnce() -> Option<XdpCounters>,
    ) {
        self.next = now + Self::interval();
        stats.stack = stack.stats();
        let xdp = if self.index == 0 { xdp() } else { None };
        self.writer.publish(&values(&stats, frames(), xdp));
        if self.writer.conns_wanted() {
            let mut conns = Vec::with_capacity(stack.flow_count());
            let core = self.index;
            stack.each_tcp(|local, remote, i| {
                conns.push(Conn {
                    core,
                    state: state_index(i.state),
                    local,
                    remote,
                    bytes_in: i.stats.bytes_in,
                    bytes_out: i.stats.bytes_out,
                    retrans: i.stats.retrans_segs,
                    srtt: i.srtt,
                    rttvar: i.rttvar,
                    cwnd: i.cwnd as u64,
                    send_queue: i.send_queue as u64,
                    recv_queue: i.recv_queue as u64,
                    snd_window: i.snd_window as u64,
                    rcv_window: i.rcv_window as u64,
                });
            });
            self.writer.publish_conns(conns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_a_value_and_names_are_unique() {
        let v = values(&CoreStats::default(), FrameCounts::default(), None);
        assert_eq!(v.len(), NAMES.len());
        let mut sorted = NAMES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), NAMES.len());
        assert_eq!(
            corelane_stat::TCP_STATES[state_index(TcpState::TimeWait) as usize],
            "TIME-WAIT"
        );
    }

    #[test]
    fn the_queue_registrations_and_the_spin_are_published_under_their_names() {
        let st = CoreStats {
            queue_registrations: 7,
            queue_unregistrations: 5,
            wake_cost: Some(Duration::from_micros(12)),
            spin: Duration::from_micros(48),
            ..CoreStats::default()
        };
        let v = values(&st, FrameCounts::default(), None);
        let at = |name: &str| v[NAMES.iter().position(|n| *n == name).unwrap()];
        assert_eq!(at("queue_registrations"), 7);
        assert_eq!(at("queue_unregistrations"), 5);
        assert_eq!(at("wake_cost_ns"), 12_000);
        assert_eq!(at("spin_ns"), 48_000);
        // Levels, not counts: a reader must not take a rate of them.
        assert!(corelane_stat::is_gauge("wake_cost_ns") && corelane_stat::is_gauge("spin_ns"));
        assert!(!corelane_stat::is_gauge("queue_registrations"));
        // No wake-up measured yet reads as zero.
        let v = values(&CoreStats::default(), FrameCounts::default(), None);
        assert_eq!(
            v[NAMES.iter().position(|n| *n == "wake_cost_ns").unwrap()],
            0
        );
    }
}
