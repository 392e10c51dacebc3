//! The endpoint's state and its driver: the task that feeds the state machine the datagrams
//! that come in, runs its timers, and sends what its connections may send.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quinn_proto::{
    ClientConfig, ConnectError, ConnectionError, ConnectionHandle, DatagramEvent, Event, VarInt,
};

use super::Shared;
use crate::net::UdpSocket;

/// Connections a client has begun and the application has not yet accepted, at most: past
/// these a new one is refused (a flood of first packets holds no more).
const MAX_INCOMING: usize = 256;
/// Datagrams one connection builds at most in one call (the state machine's GSO batch).
const BATCH: usize = 16;
/// The largest UDP payload read.
const MAX_DATAGRAM: usize = 65535;

/// Datagrams to send, in one buffer the driver keeps from pass to pass (no allocation per
/// datagram): each a destination, its bytes' range and its ECN bits.
#[derive(Default)]
pub(crate) struct Outgoing {
    bytes: Vec<u8>,
    sends: Vec<(SocketAddr, std::ops::Range<usize>, u8)>,
}

impl Outgoing {
    /// The datagram `t` the state machine wrote into `buf`, cut into its segments when it
    /// holds several.
    fn push(&mut self, t: &quinn_proto::Transmit, buf: &[u8]) {
        let data = &buf[..t.size.min(buf.len())];
        let seg = t.segment_size.unwrap_or(t.size).max(1);
        let ecn = t.ecn.map_or(0, |e| e as u8);
        for d in data.chunks(seg) {
            let at = self.bytes.len();
            self.bytes.extend_from_slice(d);
            self.sends.push((t.destination, at..at + d.len(), ecn));
        }
    }

    fn is_empty(&self) -> bool {
        self.sends.is_empty()
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.sends.clear();
    }
}

/// Hashes a connection handle (a small integer the state machine hands out and reuses, never
/// anything from the wire) by one multiplication: the endpoint's table is looked up several
/// times a datagram.
#[derive(Default, Clone, Copy)]
pub(crate) struct HandleHasher(u64);

impl std::hash::Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The endpoint's table's hasher.
pub(crate) type Handles = BuildHasherDefault<HandleHasher>;

/// One connection as the endpoint holds it.
pub(crate) struct Conn {
    pub(crate) c: quinn_proto::Connection,
    pub(crate) connected: bool,
    pub(crate) lost: Option<ConnectionError>,
    /// Tasks waiting on the connection (its handshake, a stream, an accept): woken at each of
    /// its events.
    wakers: Vec<Waker>,
    /// In the next pass's list.
    queued: bool,
    /// Its entry in the endpoint's timers.
    armed: Option<Instant>,
}

impl Conn {
    /// `cx`'s task is woken at the connection's next event.
    pub(crate) fn wait(&mut self, cx: &Context<'_>) {
        if !self.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            self.wakers.push(cx.waker().clone());
        }
    }

    fn wake(&mut self) {
        for w in self.wakers.drain(..) {
            w.wake();
        }
    }
}

/// The endpoint: its state machine, its connections, the connections waiting to be
/// accepted.
pub(crate) struct State {
    ep: quinn_proto::Endpoint,
    pub(crate) client_config: Option<ClientConfig>,
    pub(crate) conns: HashMap<ConnectionHandle, Conn, Handles>,
    incoming: VecDeque<quinn_proto::Incoming>,
    accept_waker: Option<Waker>,
    idle_waker: Option<Waker>,
    closed: bool,
    /// What the state machine asked to send, not yet sent.
    out: Outgoing,
    /// The connections the next pass looks at: those a datagram, a timer or a handle touched
    /// (a pass costs what moved, not what the table holds).
    dirty: Vec<ConnectionHandle>,
    /// Every connection's next timer, earliest first: one entry per connection (re-arming
    /// replaces it), so the set holds what the table holds, not what the timers did.
    timers: BTreeSet<(Instant, ConnectionHandle)>,
    buf: Vec<u8>,
    clock: crate::clock::Clock,
    /// Why each connection let go ended, as it went (a simulation reads them).
    #[cfg(feature = "sim")]
    pub(crate) ended: Vec<(ConnectionHandle, ConnectionError)>,
}

impl State {
    pub(crate) fn new(ep: quinn_proto::Endpoint, clock: crate::clock::Clock) -> State {
        State {
            ep,
            client_config: None,
            conns: HashMap::default(),
            incoming: VecDeque::new(),
            accept_waker: None,
            idle_waker: None,
            closed: false,
            out: Outgoing::default(),
            dirty: Vec::new(),
            timers: BTreeSet::new(),
            buf: Vec::new(),
            clock,
            #[cfg(feature = "sim")]
            ended: Vec::new(),
        }
    }

    /// Connection `h` has something to do: the next pass looks at it.
    pub(crate) fn mark(&mut self, h: ConnectionHandle) {
        if let Some(conn) = self.conns.get_mut(&h)
            && !conn.queued
        {
            conn.queued = true;
            self.dirty.push(h);
        }
    }

    /// The core's clock now.
    pub(crate) fn now(&self) -> Instant {
        self.clock.now()
    }

    pub(crate) fn connect(
        &mut self,
        config: ClientConfig,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<ConnectionHandle, ConnectError> {
        if self.closed {
            return Err(ConnectError::EndpointStopping);
        }
        let now = self.now();
        let (h, c) = self.ep.connect(now, config, addr, server_name)?;
        self.insert(h, c);
        Ok(h)
    }

    pub(crate) fn accept(
        &mut self,
        incoming: quinn_proto::Incoming,
    ) -> Result<ConnectionHandle, ConnectionError> {
        let now = self.now();
        self.buf.clear();
        match self.ep.accept(incoming, now, &mut self.buf, None) {
            Ok((h, c)) => {
                self.insert(h, c);
                Ok(h)
            }
            Err(e) => {
                if let Some(t) = e.response {
                    self.queue(&t);
                }
                Err(e.cause)
            }
        }
    }

    /// Answers with a Retry (the client must come back with a token that proves its
    /// address); the Incoming back when it may not be retried (it came with a token).
    pub(crate) fn retry(
        &mut self,
        incoming: quinn_proto::Incoming,
    ) -> Result<(), Box<quinn_proto::Incoming>> {
        self.buf.clear();
        match self.ep.retry(incoming, &mut self.buf) {
            Ok(t) => {
                self.queue(&t);
                Ok(())
            }
            Err(e) => Err(Box::new(e.into_incoming())),
        }
    }

    pub(crate) fn refuse(&mut self, incoming: quinn_proto::Incoming) {
        self.buf.clear();
        let t = self.ep.refuse(incoming, &mut self.buf);
        self.queue(&t);
    }

    fn insert(&mut self, h: ConnectionHandle, c: quinn_proto::Connection) {
        self.conns.insert(
            h,
            Conn {
                c,
                connected: false,
                lost: None,
                wakers: Vec::new(),
                queued: false,
                armed: None,
            },
        );
        self.mark(h);
    }

    pub(crate) fn poll_incoming(
        &mut self,
        cx: &Context<'_>,
    ) -> Poll<Option<quinn_proto::Incoming>> {
        if let Some(i) = self.incoming.pop_front() {
            return Poll::Ready(Some(i));
        }
        if self.closed {
            return Poll::Ready(None);
        }
        self.accept_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    pub(crate) fn poll_idle(&mut self, cx: &Context<'_>) -> Poll<()> {
        if self.conns.is_empty() {
            return Poll::Ready(());
        }
        self.idle_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    pub(crate) fn close_all(&mut self, code: VarInt, reason: &[u8]) {
        self.closed = true;
        let now = self.now();
        let reason = Bytes::copy_from_slice(reason);
        for conn in self.conns.values_mut() {
            conn.c.close(now, code, reason.clone());
        }
        let all: Vec<ConnectionHandle> = self.conns.keys().copied().collect();
        for h in all {
            self.mark(h);
        }
        while let Some(i) = self.incoming.pop_front() {
            self.buf.clear();
            let t = self.ep.refuse(i, &mut self.buf);
            self.queue(&t);
        }
        if let Some(w) = self.accept_waker.take() {
            w.wake();
        }
    }

    /// The datagram `t` the state machine wrote into `buf`, queued to be sent (cut into its
    /// segments when it holds several).
    fn queue(&mut self, t: &quinn_proto::Transmit) {
        self.out.push(t, &self.buf);
    }

    /// Accepts every connection waiting (the fuzz target's application).
    pub(crate) fn accept_all(&mut self) {
        while let Some(i) = self.incoming.pop_front() {
            let _ = self.accept(i);
        }
    }

    /// Entries in the timers (one per connection at most: a simulation checks it).
    #[cfg(feature = "sim")]
    pub(crate) fn timers_held(&self) -> usize {
        self.timers.len()
    }

    /// What the state machine asked to send, dropped.
    pub(crate) fn drop_out(&mut self) {
        self.out.clear();
    }

    /// What the state machine asked to send, each datagram handed to `send` with its
    /// destination (a simulation's driver), then dropped.
    #[cfg(feature = "sim")]
    pub(crate) fn take_out(&mut self, mut send: impl FnMut(SocketAddr, &[u8], u8)) {
        for (to, r, ecn) in &self.out.sends {
            send(*to, &self.out.bytes[r.clone()], *ecn);
        }
        self.out.clear();
    }

    /// A datagram from `from`, with ECN bits `ecn` as received.
    pub(crate) fn datagram(&mut self, now: Instant, from: SocketAddr, ecn: u8, data: &[u8]) {
        self.buf.clear();
        let ecn = quinn_proto::EcnCodepoint::from_bits(ecn);
        match self
            .ep
            .handle(now, from, None, ecn, BytesMut::from(data), &mut self.buf)
        {
            Some(DatagramEvent::ConnectionEvent(h, ev)) => {
                if let Some(conn) = self.conns.get_mut(&h) {
                    conn.c.handle_event(ev);
                }
                self.mark(h);
            }
            Some(DatagramEvent::NewConnection(i)) => {
                if self.closed || self.incoming.len() >= MAX_INCOMING {
                    self.refuse(i);
                } else {
                    self.incoming.push_back(i);
                    if let Some(w) = self.accept_waker.take() {
                        w.wake();
                    }
                }
            }
            Some(DatagramEvent::Response(t)) => self.queue(&t),
            None => {}
        }
    }

    /// One pass over the connections something touched (a datagram, a handle, a timer come
    /// due): each one's timers, the events between it and the endpoint, its application's
    /// events (the tasks waiting on it woken), and the datagrams it may send now. Returns the
    /// earliest timer left.
    pub(crate) fn pass(&mut self, now: Instant) -> Option<Instant> {
        while let Some(&(t, h)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            if let Some(c) = self.conns.get_mut(&h) {
                c.armed = None;
            }
            self.mark(h);
        }
        let handles = std::mem::take(&mut self.dirty);
        for h in handles {
            let Some(conn) = self.conns.get_mut(&h) else {
                continue;
            };
            conn.queued = false;
            if conn.c.poll_timeout().is_some_and(|t| t <= now) {
                conn.c.handle_timeout(now);
            }
            while let Some(ev) = conn.c.poll_endpoint_events() {
                if let Some(back) = self.ep.handle_event(h, ev) {
                    conn.c.handle_event(back);
                }
            }
            let mut woke = false;
            while let Some(ev) = conn.c.poll() {
                match ev {
                    Event::Connected => conn.connected = true,
                    Event::ConnectionLost { reason } => conn.lost = Some(reason),
                    _ => {}
                }
                woke = true;
            }
            if woke {
                conn.wake();
            }
            loop {
                self.buf.clear();
                let Some(t) = conn.c.poll_transmit(now, BATCH, &mut self.buf) else {
                    break;
                };
                self.out.push(&t, &self.buf);
            }
            if conn.c.is_drained() {
                if conn.lost.is_none() {
                    conn.lost = Some(ConnectionError::LocallyClosed);
                }
                conn.wake();
                #[cfg(feature = "sim")]
                if let Some(why) = &conn.lost {
                    self.ended.push((h, why.clone()));
                }
                if let Some(old) = conn.armed {
                    self.timers.remove(&(old, h));
                }
                self.conns.remove(&h);
                continue;
            }
            let timer = conn.c.poll_timeout();
            if timer != conn.armed {
                if let Some(old) = conn.armed {
                    self.timers.remove(&(old, h));
                }
                if let Some(t) = timer {
                    self.timers.insert((t, h));
                }
                conn.armed = timer;
            }
        }
        if self.conns.is_empty()
            && let Some(w) = self.idle_waker.take()
        {
            w.wake();
        }
        self.timers.first().map(|&(t, _)| t)
    }
}

/// The endpoint's driver, a task of its core: until every handle of the endpoint is gone
/// and every connection has ended.
pub(crate) async fn drive(shared: Weak<Shared>, socket: UdpSocket) {
    let mut rx = vec![0u8; MAX_DATAGRAM];
    let mut out = Outgoing::default();
    let mut orphaned = false;
    loop {
        let Some(sh) = shared.upgrade() else {
            return;
        };
        let next = {
            let mut st = sh.lock();
            let now = st.now();
            loop {
                match socket.try_recv_from_ecn(&mut rx) {
                    Ok((n, from, ecn)) => st.datagram(now, from, ecn, &rx[..n]),
                    // NotConnected: none waits and the runtime is shutting down. The
                    // connections finish in its drain (their handles end them).
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::NotConnected
                        ) =>
                    {
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("quic endpoint {}: receive: {e}", sh.local);
                        break;
                    }
                }
            }
            // Only the driver holds the endpoint: no handle is left to use a connection.
            if Arc::strong_count(&sh) == 1 && !orphaned {
                orphaned = true;
                st.close_all(VarInt::from_u32(0), b"");
            }
            let next = st.pass(now);
            std::mem::swap(&mut out, &mut st.out);
            if orphaned && st.conns.is_empty() && out.is_empty() {
                return;
            }
            next.map(|t| t.saturating_duration_since(now))
        };
        for (to, r, ecn) in &out.sends {
            if let Err(e) = socket.send_to_ecn(&out.bytes[r.clone()], *to, *ecn).await {
                tracing::debug!("quic endpoint {}: send to {to}: {e}", sh.local);
            }
        }
        out.clear();
        wait(&sh, &socket, next).await;
    }
}

/// Until a datagram is waiting, a handle asks for a pass, or `timer` has run.
async fn wait(sh: &Shared, socket: &UdpSocket, timer: Option<Duration>) {
    let mut sleep = std::pin::pin!(tokio::time::sleep(
        timer.unwrap_or(Duration::from_secs(3600))
    ));
    std::future::poll_fn(|cx| {
        *sh.driver.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        if sh.pass_asked.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        if socket.poll_datagram(cx).is_ready() {
            return Poll::Ready(());
        }
        sleep.as_mut().poll(cx)
    })
    .await
}
