//! Egress and timers: only flows with work are polled, and each flow's next deadline sits in a
//! heap.

use std::cmp::Reverse;
use std::io;

use corelane_frame::{FrameCounts, FrameIo};
use smoltcp::time::{Duration, Instant};

use super::{FlowId, Sock, Stack};
use crate::device::XdpDevice;
use crate::tcp::TcpState;
use crate::tcp::due::Due;

impl Stack {
    /// Egress stage: polls the flows that received frames, were written to, or whose timer is
    /// due, and schedules each one's next timer. Returns how many flows were polled.
    pub fn egress<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>) -> usize {
        self.clock = self.clock.max(now);
        self.wake_memory_waiters();
        while let Some(&Reverse((t, index, generation))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let slot = &mut self.slots[index as usize];
            if slot.generation == generation
                && let Some(f) = slot.flow.as_mut()
                && f.deadline == Due::from(Some(t))
            {
                f.deadline = Due::NONE;
                self.stats.timers_fired += 1;
                self.queue_egress(index);
            }
        }
        let mut list = std::mem::replace(&mut self.egress, std::mem::take(&mut self.egress_spare));
        let polled = list.len();
        // A flow may emit at most this many frames per pass, so one bulk sender cannot starve
        // the others; it stays queued for the next pass.
        let budget = self.cfg.batch.max(8);
        for &index in &list {
            let generation = self.slots[index as usize].generation;
            let Some(f) = self.slots[index as usize].flow.as_mut() else {
                continue;
            };
            f.queued = false;
            self.stats.egress_polls += 1;
            let mut emitted = 0;
            let at = match &mut f.sock {
                Sock::Udp(_) => self.udp_output(now, dev, index, budget, &mut emitted),
                Sock::Tcp(c) => {
                    c.on_time(now);
                    let unresolved = f.mac.is_none() && c.wants_output();
                    if unresolved && !self.resolve(now, dev, index) {
                        // Polled again when the address is learnt, or on this retry timer.
                        self.retry_at(index, now + Duration::from_millis(200));
                        continue;
                    }
                    self.tcp_output(now, dev, index, budget, &mut emitted)
                }
            };
            let Some(f) = self.slots[index as usize].flow.as_mut() else {
                continue;
            };
            if emitted == budget {
                f.queued = true;
                self.egress.push(index);
            } else if let Some(t) = at
                && f.deadline.is_none_or(|d| t < d)
            {
                f.deadline = Due::from(Some(t));
                self.timers.push(Reverse((t, index, generation)));
            }
            self.settle(index);
        }
        list.clear();
        self.egress_spare = list;
        polled
    }

    /// Runs TCP flow `index`'s output into transmit frames; returns when it next needs the
    /// clock.
    fn tcp_output<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        index: u32,
        budget: usize,
        emitted: &mut usize,
    ) -> Option<Instant> {
        let mac = self.mac;
        let f = self.slots[index as usize].flow.as_mut()?;
        let path = Self::path_of(mac, f);
        let Sock::Tcp(c) = &mut f.sock else {
            return None;
        };
        let mut starved = false;
        if let Some(path) = path {
            *emitted = c.output(now, budget, &mut |out| {
                let sent = Self::send_segment(dev, &path, out);
                starved |= !sent;
                sent
            });
        }
        // A segment found no free transmit frame: again on the next pass, by when the frames
        // sent have completed (as a UDP socket's parked datagrams are). Its own timers would
        // not do: a connection with nothing in flight has none but the keepalive's.
        let poll_at = c.poll_at();
        f.retry = Due::from(starved.then_some(now));
        earliest(poll_at, f.retry.get())
    }

    /// Sets flow `index`'s retry to `t`, and its timer (unless an earlier one is set).
    fn retry_at(&mut self, index: u32, t: Instant) {
        let generation = self.slots[index as usize].generation;
        if let Some(f) = self.slots[index as usize].flow.as_mut() {
            f.retry = Due::from(Some(t));
            if f.deadline.is_none_or(|d| t < d) {
                f.deadline = Due::from(Some(t));
                self.timers.push(Reverse((t, index, generation)));
            }
        }
    }

    /// True when flows wait for an egress pass (the application wrote, or a pass ran out of
    /// budget).
    pub fn egress_pending(&self) -> bool {
        !self.egress.is_empty() || self.memory_freed_for_waiters()
    }

    /// Flow `id`'s writer waits: if for memory (the cap refused its buffer room), it is woken
    /// when some is given back.
    pub(super) fn wait_for_memory(&mut self, id: FlowId) {
        let blocked = self.conn(id).is_some_and(|c| c.write_blocked_by_memory());
        if blocked && !self.mem_waiters.contains(&id.index) {
            self.mem_waiters.push(id.index);
        }
    }

    /// Writers wait for memory and a buffer's worth is free again.
    fn memory_freed_for_waiters(&self) -> bool {
        !self.mem_waiters.is_empty() && !self.mem.over(crate::tcp::SMALL_BUFFER)
    }

    fn wake_memory_waiters(&mut self) {
        if !self.memory_freed_for_waiters() {
            return;
        }
        for index in std::mem::take(&mut self.mem_waiters) {
            if let Some(c) = self.slots[index as usize]
                .flow
                .as_mut()
                .and_then(|f| f.conn())
            {
                c.wake_writer();
            }
        }
    }

    /// The earliest flow timer, if any (it may be one that no longer matters: waking early is
    /// harmless).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.peek().map(|r| r.0.0)
    }

    /// The earliest flow timer that still matters, for a core about to sleep until it. A
    /// flow's timer stays in the heap when its connection's next deadline moves later (a
    /// delayed ACK that the answer carried, a probe the peer's ACK made moot), and a core that
    /// slept until it woke for nothing: a wake-up per request of a request/response
    /// connection whose requests come further apart than the ACK delay. Such timers at the
    /// top are taken out here and the connection's real deadline put in their place; the
    /// rest wait until they come up. Called once per sleep, not per frame: each call takes
    /// out what earlier arms left, so its work is bounded by them.
    pub fn sleep_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, index, generation))) = self.timers.peek() {
            let slot = &mut self.slots[index as usize];
            let Some(f) = slot
                .flow
                .as_mut()
                .filter(|f| slot.generation == generation && f.deadline == Due::from(Some(t)))
            else {
                // Superseded: the egress pass would drop it when it came up.
                self.timers.pop();
                continue;
            };
            // What the connection needs the clock for, and any retry the stack set for it
            // (the resolution's, or a pass that found no free frame): neither is among the
            // connection's own deadlines.
            let Sock::Tcp(c) = &f.sock else {
                return Some(t);
            };
            match earliest(c.poll_at(), f.retry.get()) {
                Some(real) if real <= t => return Some(t),
                real => {
                    self.timers.pop();
                    f.deadline = Due::from(real);
                    if let Some(real) = real {
                        self.timers.push(Reverse((real, index, generation)));
                    }
                }
            }
        }
        None
    }

    /// True when nothing is left to finish: no flow is held by the application, and every TCP
    /// connection has ended or waits in TIME-WAIT (what a runtime that is ending lingers for).
    pub fn settled(&self) -> bool {
        self.slots.iter().filter_map(|s| s.flow.as_ref()).all(|f| {
            !f.held
                && match &f.sock {
                    Sock::Tcp(c) => matches!(c.state(), TcpState::TimeWait | TcpState::Closed),
                    Sock::Udp(_) => true,
                }
        })
    }

    /// Ends everything at once: every connection is reset, the resets sent, and every frame
    /// given back. Returns the final frame accounting; `StackStats::reset_at_stop` counts the
    /// connections that were still open.
    pub fn shutdown<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
    ) -> io::Result<FrameCounts> {
        for port in self.listeners.keys().copied().collect::<Vec<_>>() {
            self.unlisten(port);
        }
        // As a process's exit closes a kernel socket: a connection with nothing unread and
        // everything it sent acknowledged ends with a FIN; the others are reset.
        let mut quiet = Vec::new();
        for i in 0..self.slots.len() as u32 {
            if let Some(f) = self.slots[i as usize].flow.as_mut() {
                if let Some(c) = f.conn() {
                    if c.quiet_at_stop() {
                        c.close_at_stop();
                        self.stats.fin_at_stop += 1;
                        quiet.push(i);
                    } else {
                        if !matches!(c.state(), TcpState::TimeWait | TcpState::Closed) {
                            self.stats.reset_at_stop += 1;
                        }
                        c.abort();
                    }
                }
                self.queue_egress(i);
            }
        }
        while self.egress_pending() {
            self.egress(now, dev);
            dev.flush()?;
        }
        for i in quiet {
            if let Some(c) = self.slots[i as usize].flow.as_mut().and_then(|f| f.conn()) {
                c.forget();
            }
        }
        dev.drain()?;
        Ok(dev.io_mut().counts())
    }
}

/// The earlier of two optional instants.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;

    use smoltcp::time::Duration;

    use crate::tcp::due::Due;

    /// A connection with bytes it may not send yet (the peer's window is shut) wants output,
    /// but a timer it no longer needs is still not slept until: only a retry the stack set
    /// (the resolution's, a pass short of frames) is kept beyond the connection's own
    /// deadlines.
    #[test]
    fn a_stale_timer_of_a_connection_with_unsent_bytes_is_not_slept_until()
    -> Result<(), Box<dyn std::error::Error>> {
        let (mut p, s, _) = crate::tests_sleep::connected()?;
        // The client never reads: its window shuts with the server's bytes unsent.
        crate::tests_sleep::write_unread(&mut p, s, &[7u8; 1 << 20], Duration::from_secs(1))?;
        let info = p.a.stack.tcp_info(s).ok_or("no server connection")?;
        assert!(info.snd_window == 0 && info.send_queue > 0, "{info:?}");
        let needed = p.a.stack.sleep_deadline().ok_or("no persist timer")?;

        // A timer the connection armed and no longer needs (as a delayed ACK that an answer
        // carried leaves), due before what it does need.
        let stale = p.now() + Duration::from_micros(10);
        assert!(stale < needed);
        let stack = &mut p.a.stack;
        let slot = &mut stack.slots[s.index as usize];
        let f = slot.flow.as_mut().ok_or("no flow")?;
        f.deadline = Due::from(Some(stale));
        stack
            .timers
            .push(Reverse((stale, s.index, slot.generation)));
        assert_eq!(
            stack.sleep_deadline(),
            Some(needed),
            "slept until a stale timer"
        );

        // A retry the stack set is kept, though the connection's deadlines do not cover it.
        stack.retry_at(s.index, stale);
        assert_eq!(stack.sleep_deadline(), Some(stale), "a retry was dropped");
        Ok(())
    }
}
