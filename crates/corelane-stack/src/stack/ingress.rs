//! Flow demux and protocol: each classified frame goes to its flow alone. TCP segments are
//! parsed once and given to the connection, UDP datagrams to their socket; ARP and NDP teach
//! the neighbour table and are answered for owned addresses; ICMP is answered (echo) or given
//! to the connection it is about; fragments are reassembled and the whole datagram delivered.

use corelane_frame::{FrameIo, Proto};
use smoltcp::time::Instant;

use super::{Flow, Sock, Stack};
use crate::classify::{Class, FlowKey};
use crate::device::XdpDevice;
use crate::frag::Reassembler;
use crate::pipeline::{Disposition, Peers, Unclaimed};
use crate::tcp::wire::{self, In, Path};
use crate::tcp::{Conn, TcpState};

/// Where the demux stage sends one frame.
enum Route {
    /// To the flow in this slot.
    Flow(u32),
    /// A SYN for a listener with room: a new flow.
    Open,
    /// A SYN for a listener whose SYN backlog is full but whose accept queue has room: a SYN
    /// cookie.
    Cookie,
    /// No flow here: offered to the other cores, else answered here.
    Unclaimed(Proto, u16, bool),
    /// A SYN for a four-tuple whose connection is over or in TIME-WAIT and no longer held:
    /// it reopens the four-tuple if RFC 6191 allows, else goes to that connection.
    Reopen(u32),
    /// A SYN for a listener whose accept queue is full: dropped, not reset (the peer retries).
    Drop,
    /// ARP or NDP; `true` for a reply the other cores' neighbour caches want too.
    Neighbor(bool),
    /// ICMP, fragments and the rest.
    Other,
}

/// What the ACK of a SYN cookie came to.
#[derive(Debug, PartialEq, Eq)]
enum Cookie {
    /// Not a valid cookie: a segment for no connection.
    Invalid,
    /// Valid, but the accept queue is full: dropped.
    Full,
    /// The connection is open.
    Opened,
}

impl Stack {
    fn route(&mut self, class: Class) -> Route {
        match class {
            Class::Tcp { key, syn } => {
                if let Some(i) = self.table.get(&key) {
                    return if syn && self.reusable(i) {
                        Route::Reopen(i)
                    } else {
                        Route::Flow(i)
                    };
                }
                let port = key.local.port;
                let listener = self
                    .listeners
                    .get(&port)
                    .filter(|l| l.addr.is_none_or(|a| a == key.local.addr));
                match listener {
                    Some(l) if syn => {
                        if self.tcp_conns >= self.cfg.max_tcp {
                            self.stats.tcp_conn_limited += 1;
                            Route::Drop
                        } else if l.ready.len() >= l.backlog {
                            self.stats.syn_dropped += 1;
                            Route::Drop
                        } else if l.half_open + l.ready.len() < l.backlog {
                            Route::Open
                        } else if self.cfg.tcp.syn_cookies {
                            Route::Cookie
                        } else {
                            self.stats.syn_dropped += 1;
                            Route::Drop
                        }
                    }
                    // Another core may hold this connection: its SYN may have reached that one.
                    Some(_) => Route::Unclaimed(Proto::Tcp, port, true),
                    None => Route::Unclaimed(Proto::Tcp, port, false),
                }
            }
            Class::Udp { key } => match self.udp.get(&key.local.port) {
                Some(&i) => Route::Flow(i),
                None => Route::Unclaimed(Proto::Udp, key.local.port, false),
            },
            Class::Neighbor { reply } => Route::Neighbor(reply),
            _ => Route::Other,
        }
    }

    /// The way back to whoever sent `inn`: to the hardware address it came from.
    fn reply_path(&self, inn: &In<'_>) -> Path {
        Path {
            src_mac: self.mac,
            dst_mac: inn.src_mac,
            local: inn.local,
            remote: inn.remote,
            ttl: super::DEFAULT_TTL,
            tos: 0,
        }
    }

    /// True for a TCP flow in TIME-WAIT (or closed) that the application no longer holds.
    fn reusable(&self, i: u32) -> bool {
        self.slots[i as usize].flow.as_ref().is_some_and(|f| {
            !f.held
                && f.listener.is_none()
                && matches!(&f.sock, Sock::Tcp(c) if matches!(c.state(), TcpState::TimeWait | TcpState::Closed))
        })
    }

    /// Whether the waiting SYN may end flow `i` (over or in TIME-WAIT, not held) and open its
    /// four-tuple anew ([`Conn::syn_may_reopen`]).
    fn syn_reopens<P: FrameIo>(&self, dev: &XdpDevice<P>, i: u32) -> bool {
        let Some(inn) = dev.front_bytes().and_then(wire::parse) else {
            return false;
        };
        self.slots[i as usize]
            .flow
            .as_ref()
            .is_some_and(|f| matches!(&f.sock, Sock::Tcp(c) if c.syn_may_reopen(&inn.seg)))
    }

    /// Gives the next waiting frame to flow `i` alone, then settles the flow and queues it for
    /// egress (its ACK, its reply).
    fn feed<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>, i: u32) {
        let Some(f) = self.slots[i as usize].flow.as_mut() else {
            dev.skip();
            return;
        };
        match &mut f.sock {
            Sock::Tcp(c) => {
                let mac = &mut f.mac;
                let parsed = dev.front_bytes().and_then(|frame| {
                    wire::with_parsed(frame, |inn| {
                        // Replies follow the path the peer's segments came by: learnt only
                        // from a segment that passed the sequence checks, so that a forged
                        // or replayed one cannot turn them elsewhere.
                        if c.input_in(now, inn) && *mac != Some(inn.src_mac) {
                            *mac = Some(inn.src_mac);
                        }
                    })
                });
                if parsed.is_none() {
                    self.stats.tcp_malformed += 1;
                }
                dev.consume();
                self.after_tcp_input(i);
            }
            Sock::Udp(_) => {
                if let Some(bytes) = dev.front_bytes() {
                    self.udp_deliver(now, i, bytes);
                }
                dev.consume();
                // A socket that only received has nothing to send: no egress pass.
                return;
            }
        }
        self.settle(i);
        self.queue_egress(i);
    }

    /// The next waiting frame is ICMP, a fragment or something else no flow takes: an echo
    /// request is answered, an error goes to its connection, a fragment to reassembly; the
    /// rest is dropped.
    fn other<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        peers: &mut dyn Peers,
        hops: u8,
    ) {
        if self.echo(dev) || self.icmp_error(now, dev, peers, hops) {
            return;
        }
        let whole = match dev.front_bytes() {
            Some(b) if Reassembler::is_fragment(b) => self.frag.push(b, now),
            _ => {
                self.stats.no_flow += 1;
                None
            }
        };
        dev.consume();
        if let Some(w) = whole {
            self.deliver_whole(now, dev, &w);
        }
    }

    /// A reassembled datagram: to its UDP socket or TCP connection, or answered (echo).
    fn deliver_whole<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>, frame: &[u8]) {
        match crate::classify::classify(frame) {
            Class::Udp { key } => match self.udp.get(&key.local.port) {
                Some(&i) => self.udp_deliver(now, i, frame),
                None => self.stats.reassembled_unclaimed += 1,
            },
            Class::Tcp { key, .. } => match (self.table.get(&key), wire::parse(frame)) {
                (Some(i), Some(inn)) => {
                    if let Some(c) = self.slots[i as usize].flow.as_mut().and_then(|f| f.conn()) {
                        let _ = c.input_in(now, &inn);
                    }
                    self.after_tcp_input(i);
                    self.settle(i);
                    self.queue_egress(i);
                }
                _ => self.stats.reassembled_unclaimed += 1,
            },
            Class::Other => {
                if !self.echo_frame(dev, frame) {
                    self.stats.reassembled_unclaimed += 1;
                }
            }
            _ => self.stats.reassembled_unclaimed += 1,
        }
    }

    /// A TCP segment no connection here claims and no other core took: the ACK of a SYN
    /// cookie opens its connection; anything else but a reset is answered with one.
    fn answer_tcp<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>, listening: bool) {
        self.stats.no_flow += 1;
        if self.quiet {
            dev.consume();
            return;
        }
        let Some(inn) = dev.front_bytes().and_then(wire::parse) else {
            self.stats.tcp_malformed += 1;
            dev.consume();
            return;
        };
        if listening && self.open_from_cookie(now, &inn) != Cookie::Invalid {
            dev.consume();
            return;
        }
        if let Some(rst) = wire::reset_for(&inn.seg) {
            let path = self.reply_path(&inn);
            // The frame is read; the reset is built from copies of what it said.
            dev.consume();
            if Self::send_segment(dev, &path, &rst) {
                self.tcp_done.resets_out += 1;
            }
            return;
        }
        dev.consume();
    }

    /// Opens the connection a valid SYN cookie in this ACK stands for (RFC 4987), if the
    /// listener's accept queue has room; with the queue full the ACK is dropped (the peer's
    /// next segment tries again), as a full accept queue drops SYNs.
    fn open_from_cookie(&mut self, now: Instant, inn: &In<'_>) -> Cookie {
        let seg = &inn.seg;
        let (Some(ack), smoltcp::wire::TcpControl::None | smoltcp::wire::TcpControl::Psh) =
            (seg.ack_number, seg.control)
        else {
            return Cookie::Invalid;
        };
        let port = inn.local.port;
        let Some(l) = self.listeners.get(&port) else {
            return Cookie::Invalid;
        };
        // No cookie sent lately: none to check (and no keyed hash for a stray ACK).
        if l.cookies_until.is_none_or(|t| now > t) {
            return Cookie::Invalid;
        }
        let full = l.ready.len() >= l.backlog;
        let peer_isn = crate::tcp::Seq(seg.seq_number.0 as u32).minus(1);
        let ours = crate::tcp::Seq(ack.0 as u32).minus(1);
        let Some(info) = self
            .secret
            .check_cookie(inn.local, inn.remote, peer_isn, ours, now)
        else {
            return Cookie::Invalid;
        };
        if full {
            self.stats.accept_queue_full += 1;
            return Cookie::Full;
        }
        if self.tcp_conns >= self.cfg.max_tcp {
            self.stats.tcp_conn_limited += 1;
            return Cookie::Full;
        }
        let sizes = self.sizes(inn.remote.addr);
        let mut conn = Conn::from_cookie(
            self.tcp_cfg.clone(),
            &self.secret,
            (inn.local, inn.remote),
            seg,
            info,
            sizes,
            now,
        );
        conn.input_in(now, inn);
        self.tcp_done.cookies_ok += 1;
        let i = self.adopt(conn, inn.src_mac);
        // Already established: straight to the accept queue.
        self.settle(i);
        Cookie::Opened
    }

    /// A passive open's connection in a new flow of its listener, counted as half-open until
    /// `settle` sees it established, and queued for its first output.
    fn adopt(&mut self, conn: Conn, mac: [u8; 6]) -> u32 {
        let key = FlowKey {
            local: conn.local(),
            remote: conn.remote(),
        };
        let port = key.local.port;
        let i = self.insert_tcp(conn, |f: &mut Flow| {
            f.key = Some(key);
            f.listener = Some(port);
            f.mac = Some(mac);
            f.passive = true;
        });
        *self.passive.entry(port).or_insert(0) += 1;
        self.table.insert(key, i);
        if let Some(l) = self.listeners.get_mut(&port) {
            l.half_open += 1;
        }
        self.stats.syn_accepted += 1;
        self.queue_egress(i);
        i
    }

    /// A SYN past the SYN backlog: a SYN-ACK whose ISN is a cookie, nothing kept.
    fn send_cookie<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>) {
        let Some(inn) = dev.front_bytes().and_then(wire::parse) else {
            self.stats.tcp_malformed += 1;
            dev.consume();
            return;
        };
        let sizes = self.sizes(inn.remote.addr);
        let out = crate::tcp::cookie_syn_ack(
            &self.cfg.tcp,
            &self.secret,
            (inn.local, inn.remote),
            &inn.seg,
            sizes,
            now,
        );
        let path = self.reply_path(&inn);
        let port = inn.local.port;
        dev.consume();
        if Self::send_segment(dev, &path, &out) {
            self.tcp_done.cookies_sent += 1;
            self.note_cookie_port(now, port);
        }
    }

    /// A SYN for a listener with room: a connection in SYN-RECEIVED in a new flow.
    fn open<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>) {
        let Some(inn) = dev.front_bytes().and_then(wire::parse) else {
            self.stats.tcp_malformed += 1;
            dev.consume();
            return;
        };
        let sizes = self.sizes(inn.remote.addr);
        let mut conn = Conn::accept(
            self.tcp_cfg.clone(),
            &self.secret,
            (inn.local, inn.remote),
            &inn.seg,
            sizes,
            now,
        );
        conn.ecn_on_syn(inn.ecn);
        let mac = inn.src_mac;
        dev.consume();
        self.adopt(conn, mac);
    }

    /// Flow demux and protocol stages over the frames `dev` has classified: each frame goes to
    /// its flow alone. A frame no flow here claims is offered to `peers` (the other cores)
    /// before it is answered here, and a neighbour reply is shown to them too. Returns how
    /// many frames were consumed.
    pub fn ingress<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        peers: &mut dyn Peers,
    ) -> usize {
        self.clock = self.clock.max(now);
        let mut n = 0;
        while let Some((class, hops)) = dev.peek() {
            n += 1;
            match self.route(class) {
                Route::Flow(i) => {
                    self.stats.demux_hits += 1;
                    if self.steer_udp(dev, peers, i, hops) {
                        continue;
                    }
                    self.feed(now, dev, i);
                }
                Route::Reopen(i) => {
                    // The old flow has nothing left to deliver: freed, the SYN is routed
                    // again (to its listener).
                    if self.syn_reopens(dev, i) {
                        self.free(i);
                        n -= 1;
                        continue;
                    }
                    self.feed(now, dev, i);
                }
                // Quiet (an upgrade's old process): no new connection, and no refusal either.
                Route::Open | Route::Cookie if self.quiet => {
                    self.stats.syn_dropped += 1;
                    dev.consume();
                }
                Route::Open => self.open(now, dev),
                Route::Cookie => self.send_cookie(now, dev),
                Route::Unclaimed(proto, local_port, listening) => {
                    // A cookie's ACK is opened on the core that got it: every core shares
                    // the secret.
                    if proto == Proto::Tcp
                        && listening
                        && let Some(inn) = dev.front_bytes().and_then(wire::parse)
                        && self.open_from_cookie(now, &inn) != Cookie::Invalid
                    {
                        dev.consume();
                        continue;
                    }
                    let disposition = dev.front_bytes().map_or(Disposition::Answer, |bytes| {
                        peers.unclaimed(Unclaimed {
                            proto,
                            local_port,
                            listening,
                            hops,
                            bytes,
                        })
                    });
                    match disposition {
                        Disposition::Answer if proto == Proto::Tcp => {
                            self.answer_tcp(now, dev, false)
                        }
                        Disposition::Answer => {
                            self.stats.no_flow += 1;
                            self.udp_unreachable(now, dev);
                            dev.skip();
                        }
                        Disposition::HandedOff => {
                            self.stats.handed_off += 1;
                            dev.skip();
                        }
                        Disposition::Dropped => {
                            self.stats.handoff_dropped += 1;
                            dev.skip();
                        }
                    }
                }
                Route::Drop => dev.skip(),
                Route::Other => self.other(now, dev, peers, hops),
                Route::Neighbor(reply) => {
                    let learnt = dev
                        .front_bytes()
                        .is_some_and(|bytes| self.neigh.snoop(bytes, now));
                    if reply && let Some(bytes) = dev.front_bytes() {
                        let (handed, dropped) = peers.neighbor_reply(bytes, hops);
                        self.stats.handed_off += handed;
                        self.stats.handoff_dropped += dropped;
                    }
                    self.neighbor_answer(now, dev);
                    if learnt {
                        // Flows waiting for a next hop's address: poll them now.
                        for i in std::mem::take(&mut self.unresolved) {
                            self.queue_egress(i);
                        }
                    }
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::Seq;
    use crate::tcp::wire::{ACK, Out};
    use smoltcp::wire::{IpCidr, IpEndpoint, Ipv4Address};

    /// The ACK a client at 10.9.0.2:40000 sends for the SYN-ACK whose ISN was `cookie`.
    fn cookie_ack(cookie: Seq, peer_isn: Seq) -> Vec<u8> {
        let path = Path {
            src_mac: [2, 0, 0, 0, 0, 2],
            dst_mac: [2, 0, 0, 0, 0, 1],
            local: IpEndpoint::new(Ipv4Address::new(10, 9, 0, 2).into(), 40000),
            remote: IpEndpoint::new(Ipv4Address::new(10, 9, 0, 1).into(), 7),
            ttl: 64,
            tos: 0,
        };
        let seg = Out {
            seq: peer_isn.plus(1),
            ack: Some(cookie.plus(1)),
            flags: ACK,
            window: 1000,
            ..Out::default()
        };
        let mut buf = vec![0u8; seg.frame_len(&path)];
        wire::write(&mut buf, &path, &seg, false);
        buf
    }

    #[test]
    fn a_cookie_is_checked_only_while_its_listener_recently_sent_cookies() {
        let (x, _y) = corelane_frame::MemLink::default().pair();
        let cfg = crate::StackConfig {
            seed: Some(5),
            ..crate::StackConfig::default()
        };
        let v4 = IpCidr::new(Ipv4Address::new(10, 9, 0, 1).into(), 24);
        let mut node = crate::Node::new(x, [2, 0, 0, 0, 0, 1], &[v4], 1500, cfg);
        let st = &mut node.stack;
        assert!(st.listen_tcp(7, None).is_ok());
        let now = Instant::from_secs(10);
        let (local, remote) = (
            IpEndpoint::new(Ipv4Address::new(10, 9, 0, 1).into(), 7),
            IpEndpoint::new(Ipv4Address::new(10, 9, 0, 2).into(), 40000),
        );
        // A valid cookie (another core of the same stack, sharing the secret, could have sent
        // it), arriving where no cookie was sent lately: not even checked.
        let peer_isn = Seq(1000);
        let cookie = st.secret.cookie(local, remote, peer_isn, 1460, now);
        let frame = cookie_ack(cookie, peer_isn);
        let inn = wire::parse(&frame).expect("the ACK parses");
        assert_eq!(st.open_from_cookie(now, &inn), Cookie::Invalid);
        // Once told that cookies went out for the port, it opens the connection.
        st.cookies_sent_for(7, now);
        assert_eq!(st.open_from_cookie(now, &inn), Cookie::Opened);
        // Two minutes after the last cookie, a fresh one is not checked either.
        let later =
            now + super::super::cookies::COOKIE_LIFE + smoltcp::time::Duration::from_secs(1);
        let peer_isn = Seq(5000);
        let cookie = st.secret.cookie(local, remote, peer_isn, 1460, later);
        let frame = cookie_ack(cookie, peer_isn);
        let inn = wire::parse(&frame).expect("the ACK parses");
        assert_eq!(st.open_from_cookie(later, &inn), Cookie::Invalid);
    }
}
