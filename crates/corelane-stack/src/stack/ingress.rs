//! Flow demux and protocol: each classified frame goes to its flow's socket alone.

use corelane_frame::{FrameIo, Proto};
use smoltcp::time::Instant;

use super::{Stack, new_tcp};
use crate::classify::{Class, FlowKey};
use crate::device::XdpDevice;
use crate::pipeline::{Disposition, Peers, Unclaimed};

/// Where the demux stage sends one frame.
enum Route {
    /// To the flow in this slot.
    Flow(u32),
    /// A SYN for a listener with room: a new flow.
    Open(u16, FlowKey),
    /// No flow here: offered to the other cores, else answered here.
    Unclaimed(Proto, u16, bool),
    /// A SYN past the backlog: dropped, not reset (the peer retries).
    Drop,
    /// ARP or NDP; `true` for a reply the other cores' neighbour caches want too.
    Neighbor(bool),
    /// ICMP, fragments and the rest: smoltcp's interface answers.
    Interface,
}

impl Stack {
    fn route(&mut self, class: Class) -> Route {
        match class {
            Class::Tcp { key, syn } => {
                if let Some(i) = self.table.get(&key) {
                    return Route::Flow(i);
                }
                let port = key.local.port;
                match self.listeners.get(&port) {
                    Some(l) if syn => {
                        if l.half_open + l.ready.len() >= l.backlog {
                            self.stats.syn_dropped += 1;
                            Route::Drop
                        } else {
                            Route::Open(port, key)
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
            _ => Route::Interface,
        }
    }

    /// Gives the next waiting frame to flow `i`'s socket alone, then settles the flow and queues
    /// it for egress (its ACK, its reply).
    fn feed<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>, i: u32) {
        let Some(f) = self.slots[i as usize].flow.as_mut() else {
            dev.skip();
            return;
        };
        self.iface.poll_ingress_single(now, dev, &mut f.set);
        self.settle(i);
        self.queue_egress(i);
    }

    /// The next waiting frame to smoltcp's interface with no socket: it answers ARP, NDP and
    /// ICMP echo, resets a segment for no connection, or drops it.
    fn answer<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>) {
        self.stats.no_flow += 1;
        self.iface.poll_ingress_single(now, dev, &mut self.empty);
    }

    /// Flow demux and protocol stages over the frames `dev` has classified: each frame goes to
    /// its flow's socket alone. A frame no flow here claims is offered to `peers` (the other
    /// cores) before it is answered here, and a neighbour reply is shown to them too. Returns how
    /// many frames were consumed.
    pub fn ingress<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        peers: &mut dyn Peers,
    ) -> usize {
        let mut n = 0;
        while let Some((class, hops)) = dev.peek() {
            n += 1;
            match self.route(class) {
                Route::Flow(i) => {
                    self.stats.demux_hits += 1;
                    self.feed(now, dev, i);
                }
                Route::Open(port, key) => {
                    let mut s = new_tcp(&self.cfg);
                    if s.listen(port).is_err() {
                        dev.skip();
                        continue;
                    }
                    let i = self.insert(s, Proto::Tcp, port, |f| {
                        f.key = Some(key);
                        f.listener = Some(port);
                    });
                    self.table.insert(key, i);
                    if let Some(l) = self.listeners.get_mut(&port) {
                        l.half_open += 1;
                    }
                    self.stats.syn_accepted += 1;
                    self.feed(now, dev, i);
                }
                Route::Unclaimed(proto, local_port, listening) => {
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
                        Disposition::Answer => self.answer(now, dev),
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
                Route::Interface => self.answer(now, dev),
                Route::Neighbor(reply) => {
                    if reply && let Some(bytes) = dev.front_bytes() {
                        let (handed, dropped) = peers.neighbor_reply(bytes, hops);
                        self.stats.handed_off += handed;
                        self.stats.handoff_dropped += dropped;
                    }
                    self.answer(now, dev);
                    // Flows waiting for this neighbour have a timer; poll them now.
                    for i in 0..self.slots.len() as u32 {
                        if self.slots[i as usize]
                            .flow
                            .as_ref()
                            .is_some_and(|f| f.deadline.is_some())
                        {
                            self.queue_egress(i);
                        }
                    }
                }
            }
        }
        n
    }
}
