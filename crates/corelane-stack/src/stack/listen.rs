//! Listeners: a SYN queue and an accept queue per port, and wake-one accept.

use std::collections::VecDeque;
use std::io;
use std::task::Waker;
use std::time::Duration;

use corelane_frame::Proto;

use super::{FlowId, Stack};
use crate::config::StackError;

/// One listening port's backlog and waiters.
#[derive(Debug)]
pub(super) struct Listener {
    pub(super) backlog: usize,
    pub(super) half_open: usize,
    pub(super) ready: VecDeque<FlowId>,
    pub(super) waiters: VecDeque<(u64, Waker)>,
    /// What every accepted connection starts with.
    pub(super) options: AcceptOptions,
    /// Only connections to this owned address (None: to any).
    pub(super) addr: Option<smoltcp::wire::IpAddress>,
    /// Until when an ACK may carry one of this listener's SYN cookies (a cookie lives at most
    /// `COOKIE_LIFE` after it was sent); None: it never sent one.
    pub(super) cookies_until: Option<smoltcp::time::Instant>,
}

/// Socket options a listener gives each connection it accepts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcceptOptions {
    /// Keep-alive interval (None: off).
    pub keepalive: Option<Duration>,
    /// User timeout (None: the configured default).
    pub user_timeout: Option<Duration>,
    /// TTL (IPv4) or hop limit (IPv6) of the connection's packets (None: 64).
    pub ttl: Option<u8>,
    /// Type of service (IPv4) or traffic class (IPv6) of the connection's packets (0).
    pub tos: u8,
}

impl Stack {
    /// Listens for TCP connections on `port` on every owned address, with `backlog` connections
    /// at most half-open or waiting to be accepted (None: the configured default).
    pub fn listen_tcp(&mut self, port: u16, backlog: Option<usize>) -> Result<(), StackError> {
        self.listen_tcp_on(None, port, backlog)
    }

    /// As [`Stack::listen_tcp`], for connections to owned address `addr` only (None: any).
    ///
    /// # Errors
    /// The port is taken, or `addr` is not an owned address.
    pub fn listen_tcp_on(
        &mut self,
        addr: Option<smoltcp::wire::IpAddress>,
        port: u16,
        backlog: Option<usize>,
    ) -> Result<(), StackError> {
        if let Some(a) = addr
            && !self.owns(a)
        {
            return Err(StackError::NotOwned(a.into()));
        }
        if self.listeners.contains_key(&port) || self.ports.contains(&(Proto::Tcp, port)) {
            return Err(StackError::InUse { proto: "TCP", port });
        }
        self.listeners.insert(
            port,
            Listener {
                backlog: backlog.unwrap_or(self.cfg.backlog).max(1),
                half_open: 0,
                ready: VecDeque::new(),
                waiters: VecDeque::new(),
                options: AcceptOptions::default(),
                addr,
                cookies_until: None,
            },
        );
        Ok(())
    }

    /// Stops listening on `port`: connections not yet accepted are reset, waiting accepts woken.
    pub fn unlisten(&mut self, port: u16) {
        let Some(l) = self.listeners.remove(&port) else {
            return;
        };
        for (_, w) in l.waiters {
            w.wake();
        }
        for id in l.ready {
            self.abort(id);
            self.release(id);
        }
        let pending: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| {
                self.slots[i as usize]
                    .flow
                    .as_ref()
                    .is_some_and(|f| f.listener == Some(port))
            })
            .collect();
        for i in pending {
            let Some(f) = self.slots[i as usize].flow.as_mut() else {
                continue;
            };
            f.listener = None;
            if let Some(c) = f.conn() {
                c.abort();
            }
            self.queue_egress(i);
        }
    }

    /// Sets the options every connection the listener on `port` accepts from now on starts
    /// with (those already in the accept queue included).
    ///
    /// # Errors
    /// `NotConnected` when `port` has no listener.
    pub fn set_accept_options(&mut self, port: u16, options: AcceptOptions) -> io::Result<()> {
        let l = self.listeners.get_mut(&port).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                format!("no listener on port {port}"),
            )
        })?;
        l.options = options;
        for id in l.ready.clone() {
            self.apply_options(id, options);
        }
        Ok(())
    }

    /// The options the listener on `port` gives the connections it accepts (None: no
    /// listener there).
    pub fn accept_options(&self, port: u16) -> Option<AcceptOptions> {
        self.listeners.get(&port).map(|l| l.options)
    }

    /// Gives accepted connection `id` the listener's options.
    pub(super) fn apply_options(&mut self, id: FlowId, options: AcceptOptions) {
        let now = self.clock;
        if let Some(f) = self.flow(id) {
            if let Some(ttl) = options.ttl {
                f.ttl = ttl;
            }
            f.tos = options.tos;
        }
        if let Some(c) = self.flow(id).and_then(|f| f.conn()) {
            if let Some(k) = options.keepalive {
                c.set_keepalive(Some(k.into()), now);
            }
            if let Some(u) = options.user_timeout {
                c.set_user_timeout(u.into());
            }
        }
    }

    /// Closes the listener on `port` (as [`Stack::unlisten`]) for good. Returns true when the
    /// caller may stop steering the port now; false while connections it accepted are still
    /// open: the port is then given back through [`Stack::take_freed_ports`] when the last of
    /// them is freed, so they are not cut off from their peers.
    pub fn close_listener(&mut self, port: u16) -> bool {
        self.unlisten(port);
        if self.passive.contains_key(&port) {
            self.release_pending.insert(port);
            false
        } else {
            true
        }
    }

    /// Begins a graceful shutdown: every listener closes (waiting accepts return an error, new
    /// SYNs are answered with a reset), and a UDP receive that would wait returns an error
    /// instead (datagrams already queued are still delivered). Connections go on.
    pub fn begin_drain(&mut self) {
        self.draining = true;
        for port in self.listening_ports() {
            self.unlisten(port);
        }
        for slot in &mut self.slots {
            if let Some(super::Flow {
                sock: super::Sock::Udp(u),
                ..
            }) = slot.flow.as_mut()
            {
                u.wake_rx();
            }
        }
    }

    /// While `on`, takes no new connection and refuses none: a SYN to a listener is dropped
    /// unanswered (counted in `syn_dropped`), and so is a TCP segment no connection claims,
    /// instead of being answered with a reset. Connections a listener has half open or queued
    /// complete and are accepted as before. For an upgrade: the process handing its queues to
    /// a new one lets a SYN that reaches it go unanswered (the peer retries, and the retry
    /// reaches the new process), and closes its listeners once they are idle
    /// ([`Stack::listeners_idle`]).
    pub fn set_quiet(&mut self, on: bool) {
        self.quiet = on;
    }

    /// True when no listener has a connection half open or waiting to be accepted: closing
    /// them would refuse none.
    pub fn listeners_idle(&self) -> bool {
        self.listeners
            .values()
            .all(|l| l.half_open == 0 && l.ready.is_empty())
    }

    /// The ports with a listener.
    pub fn listening_ports(&self) -> Vec<u16> {
        self.listeners.keys().copied().collect()
    }

    /// True when `port` has a listener.
    pub fn is_listening(&self, port: u16) -> bool {
        self.listeners.contains_key(&port)
    }

    /// Takes the next established connection of the listener on `port`.
    pub fn accept(&mut self, port: u16) -> Option<FlowId> {
        let l = self.listeners.get_mut(&port)?;
        let id = l.ready.pop_front()?;
        // More connections are waiting: pass the baton to the next waiter.
        if !l.ready.is_empty()
            && let Some((_, w)) = l.waiters.pop_front()
        {
            self.stats.accept_wakeups += 1;
            w.wake();
        }
        Some(id)
    }

    /// Registers accept waiter `waiter` (any id unique per listener) to be woken, alone, when a
    /// connection is ready. Registering the same id again replaces its waker in place.
    pub fn accept_wait(&mut self, port: u16, waiter: u64, waker: &Waker) {
        let Some(l) = self.listeners.get_mut(&port) else {
            waker.wake_by_ref();
            return;
        };
        match l.waiters.iter_mut().find(|(id, _)| *id == waiter) {
            Some((_, w)) => w.clone_from(waker),
            None => l.waiters.push_back((waiter, waker.clone())),
        }
    }

    /// Withdraws accept waiter `waiter`; if connections are waiting, the next waiter is woken.
    pub fn accept_cancel(&mut self, port: u16, waiter: u64) {
        let Some(l) = self.listeners.get_mut(&port) else {
            return;
        };
        l.waiters.retain(|(id, _)| *id != waiter);
        if !l.ready.is_empty()
            && let Some((_, w)) = l.waiters.pop_front()
        {
            self.stats.accept_wakeups += 1;
            w.wake();
        }
    }

    /// Connections waiting in the accept queue of the listener on `port`.
    pub fn accept_queue_len(&self, port: u16) -> usize {
        self.listeners.get(&port).map_or(0, |l| l.ready.len())
    }
}
