//! What the simulated applications do: conversations between a client and a server, each side
//! a script of steps (send this much while receiving that much), every byte's value a function
//! of its stream and offset so the reader checks order and content as it reads.

use std::fmt::Write as _;
use std::task::Poll;

use smoltcp::time::{Duration, Instant};

use super::{SERVER, Sim};
use crate::{FlowId, Stack, TcpState};

/// The server's port.
const PORT: u16 = 7;

/// A workload's shape: how many connections and what flows on each, both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The client writes `bytes` while reading them back from an echo server.
    Echo {
        /// Connections at once.
        conns: u32,
        /// Bytes each client writes (and reads back).
        bytes: u64,
    },
    /// `rounds` requests with a body of `request` bytes, each answered with `response` bytes.
    Rpc {
        /// Connections at once.
        conns: u32,
        /// Requests per connection, one after the other.
        rounds: u32,
        /// Request body bytes.
        request: u64,
        /// Response bytes.
        response: u64,
    },
    /// Both sides write `bytes` at once and read the other's.
    BulkBoth {
        /// Connections at once.
        conns: u32,
        /// Bytes each side writes.
        bytes: u64,
    },
    /// `total` short connections, `parallel` at a time: one request and response each, then
    /// closed, the server closing first on half of them.
    Churn {
        /// Connections over the run.
        total: u32,
        /// Connections open at once.
        parallel: u32,
        /// Request bytes.
        request: u64,
        /// Response bytes.
        response: u64,
    },
}

impl Shape {
    /// The shapes the scenarios use.
    pub fn all() -> [Shape; 4] {
        [
            Shape::Echo {
                conns: 2,
                bytes: 256 * 1024,
            },
            Shape::Rpc {
                conns: 2,
                rounds: 4,
                request: 16 * 1024,
                response: 64 * 1024,
            },
            Shape::BulkBoth {
                conns: 1,
                bytes: 512 * 1024,
            },
            Shape::Churn {
                total: 48,
                parallel: 8,
                request: 2000,
                response: 8000,
            },
        ]
    }

    /// Its short name.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Echo { .. } => "echo",
            Shape::Rpc { .. } => "rpc",
            Shape::BulkBoth { .. } => "bulk-both",
            Shape::Churn { .. } => "churn",
        }
    }
}

/// The value of byte `off` of the stream with `key`.
fn byte_at(key: u64, off: u64) -> u8 {
    let x = (off ^ key.rotate_left(23)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8
}

/// One end of a conversation.
#[derive(Debug, Default)]
struct Side {
    id: Option<FlowId>,
    /// The key of what this side writes.
    key: u64,
    /// The key of what it reads.
    expect: u64,
    /// Steps left: (bytes to send, bytes to receive), both at once.
    steps: std::collections::VecDeque<(u64, u64)>,
    step_sent: u64,
    step_recvd: u64,
    sent: u64,
    recvd: u64,
    /// Writes back what it reads, all of it before it reads again (as `read` then `write_all`
    /// does: while the peer is slow to take it, this side's receive window fills).
    echo: bool,
    /// Read and not yet written back.
    pending: Vec<u8>,
    /// Shuts down writing only after the peer's end of stream.
    close_after_eof: bool,
    shut: bool,
    eof: bool,
    released: bool,
}

/// One connection's two ends.
#[derive(Debug, Default)]
struct Conv {
    client: Side,
    server: Side,
    port: u16,
    opened: bool,
    established: bool,
    /// Bytes delivered to either side, and when that last grew (or the handshake ended).
    delivered: u64,
    owed: u64,
    last_progress: Option<Instant>,
    /// The longest gap between deliveries once established and timed.
    worst: Duration,
}

/// A running workload: conversations, opened as its shape says, driven through both stacks'
/// socket calls.
#[derive(Debug)]
pub struct Workload {
    shape: Shape,
    convs: Vec<Conv>,
    parallel: usize,
    buf: Vec<u8>,
}

impl Workload {
    /// A workload of `shape`; `seed` keys its streams' content.
    pub fn new(shape: Shape, seed: u64) -> Workload {
        let (n, parallel) = match shape {
            Shape::Echo { conns, .. }
            | Shape::Rpc { conns, .. }
            | Shape::BulkBoth { conns, .. } => (conns, conns),
            Shape::Churn {
                total, parallel, ..
            } => (total, parallel),
        };
        let convs = (0..u64::from(n))
            .map(|i| {
                let mut c = Conv::default();
                c.client.key = seed ^ (2 * i + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                c.server.key = seed ^ (2 * i + 2).wrapping_mul(0x2545_f491_4f6c_dd1d);
                c.client.expect = c.server.key;
                c.server.expect = c.client.key;
                match shape {
                    Shape::Echo { bytes, .. } => {
                        c.client.steps.push_back((bytes, bytes));
                        c.server.steps.push_back((bytes, bytes));
                        c.server.echo = true;
                        c.client.expect = c.client.key;
                    }
                    Shape::Rpc {
                        rounds,
                        request,
                        response,
                        ..
                    } => {
                        for _ in 0..rounds {
                            c.client.steps.extend([(request, 0), (0, response)]);
                            c.server.steps.extend([(0, request), (response, 0)]);
                        }
                    }
                    Shape::BulkBoth { bytes, .. } => {
                        c.client.steps.push_back((bytes, bytes));
                        c.server.steps.push_back((bytes, bytes));
                    }
                    Shape::Churn {
                        request, response, ..
                    } => {
                        c.client.steps.extend([(request, 0), (0, response)]);
                        c.server.steps.extend([(0, request), (response, 0)]);
                        c.server.close_after_eof = i % 2 == 1;
                    }
                }
                c.owed = c
                    .client
                    .steps
                    .iter()
                    .chain(&c.server.steps)
                    .map(|s| s.1)
                    .sum();
                c
            })
            .collect();
        Workload {
            shape,
            convs,
            parallel: parallel.max(1) as usize,
            buf: vec![0; 64 * 1024],
        }
    }

    /// Bytes all readers are owed over the run.
    pub fn total(&self) -> u64 {
        self.convs.iter().map(|c| c.owed).sum()
    }

    /// True when every byte reached its reader.
    pub fn delivered_all(&self) -> bool {
        self.convs.iter().all(|c| c.delivered == c.owed)
    }

    /// True when every connection was shut down both ways and let go of by both sides.
    pub fn closed(&self) -> bool {
        self.convs
            .iter()
            .all(|c| c.client.released && c.server.released)
    }

    /// The longest gap between deliveries on an established connection.
    pub fn worst_stall(&self) -> Duration {
        self.convs.iter().map(|c| c.worst).max().unwrap_or_default()
    }

    /// The longest any unfinished connection has gone without progress, and whether it was
    /// established then.
    pub fn stall(&self, now: Instant) -> (Duration, bool) {
        self.stalled(now)
            .map(|(d, e, _)| (d, e))
            .unwrap_or_default()
    }

    /// The longest stall, whether that connection is established, and its index.
    fn stalled(&self, now: Instant) -> Option<(Duration, bool, usize)> {
        self.convs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.opened && c.delivered < c.owed)
            .filter_map(|(i, c)| c.last_progress.map(|t| (now - t, c.established, i)))
            .max_by_key(|(d, _, _)| *d)
    }

    /// Four back-to-back retransmission timeouts (1 + 2 + 4 + 8 of them) from the larger of
    /// the two ends' timeouts on the connection stalled longest, as RFC 6298 computes them
    /// (at least `rto_min`): what its stall may last when an end's estimate is far above the
    /// floor (a handshake answered by the peer's retransmitted SYN-ACK times a round trip of a
    /// second and more).
    pub fn stall_allowance(&self, sim: &mut Sim, rto_min: Duration) -> Duration {
        let Some((_, _, i)) = self.stalled(sim.now()) else {
            return Duration::ZERO;
        };
        let c = &self.convs[i];
        let rto = |stack: &mut Stack, id: Option<FlowId>| {
            id.and_then(|id| stack.tcp_info(id))
                .and_then(|t| Some(Duration::from(t.srtt? + t.rttvar? * 4)))
                .unwrap_or(rto_min)
                .max(rto_min)
        };
        let most =
            rto(&mut sim.client.stack, c.client.id).max(rto(&mut sim.server.stack, c.server.id));
        most * 15
    }

    /// Listens on the server.
    ///
    /// # Errors
    /// When the server cannot listen.
    pub fn start(&mut self, sim: &mut Sim) -> Result<(), String> {
        sim.server
            .stack
            .listen_tcp(PORT, None)
            .map_err(|e| format!("listen: {e}"))
    }

    /// Opens what is due, accepts, moves bytes through every socket and checks what is read.
    /// Returns the bytes delivered to readers so far.
    ///
    /// # Errors
    /// Bytes out of order or wrong, or a connection that failed.
    pub fn poll(&mut self, sim: &mut Sim) -> Result<u64, String> {
        let now = sim.now();
        // Open connections up to the parallel limit.
        let open = self
            .convs
            .iter()
            .filter(|c| c.opened && !c.client.released)
            .count();
        let mut room = self.parallel.saturating_sub(open);
        for (i, c) in self.convs.iter_mut().enumerate() {
            if room == 0 {
                break;
            }
            if c.opened {
                continue;
            }
            let remote = std::net::SocketAddr::from((SERVER.octets(), PORT));
            let (id, port) = sim
                .client
                .stack
                .connect_tcp(remote)
                .map_err(|e| format!("conn {i}: connect: {e}"))?;
            c.client.id = Some(id);
            c.port = port;
            c.opened = true;
            c.last_progress = Some(now);
            room -= 1;
        }
        // Accept, matching each connection to its conversation by the client's port.
        while let Some(id) = sim.server.stack.accept(PORT) {
            let port = sim.server.stack.tcp_addrs(id).map(|(_, r)| r.port());
            match self
                .convs
                .iter_mut()
                .find(|c| Some(c.port) == port && c.server.id.is_none())
            {
                Some(c) => c.server.id = Some(id),
                None => return Err(format!("accepted a connection from no client: {port:?}")),
            }
        }
        let buf = &mut self.buf;
        for (i, c) in self.convs.iter_mut().enumerate() {
            if !c.opened {
                continue;
            }
            let before = c.client.recvd + c.server.recvd;
            drive(&mut sim.client.stack, &mut c.client, buf)
                .map_err(|e| format!("conn {i} client: {e}"))?;
            drive(&mut sim.server.stack, &mut c.server, buf)
                .map_err(|e| format!("conn {i} server: {e}"))?;
            let after = c.client.recvd + c.server.recvd;
            // Judged by the data stall limit once both ends have timed a round trip: before
            // that their timers run from the initial timeout (RFC 6298 section 5.7).
            let timed = |stack: &mut Stack, id: Option<FlowId>| {
                id.and_then(|id| stack.tcp_info(id))
                    .is_some_and(|t| t.state != TcpState::SynSent && t.srtt.is_some())
            };
            if !c.established
                && timed(&mut sim.client.stack, c.client.id)
                && timed(&mut sim.server.stack, c.server.id)
            {
                c.established = true;
                c.last_progress = Some(now);
            }
            if after > before {
                if let Some(t) = c.last_progress.filter(|_| c.established) {
                    c.worst = c.worst.max(now - t);
                }
                c.last_progress = Some(now);
            }
            c.delivered = after;
        }
        Ok(self.convs.iter().map(|c| c.delivered).sum())
    }

    /// A line per unfinished connection (at most four): states and counts on both sides.
    pub fn describe(&self, sim: &mut Sim) -> String {
        let mut s = String::new();
        for (i, c) in self
            .convs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.opened && !(c.client.released && c.server.released))
            .take(4)
        {
            let st = |stack: &mut Stack, id: Option<FlowId>| {
                id.and_then(|id| stack.tcp_info(id))
                    .map_or("-".to_string(), |t| format!("{t:?}"))
            };
            let _ = write!(
                s,
                "[conn {i}: client sent {} recvd {} steps {:?} eof {} {}; server sent {} recvd \
                 {} steps {:?} eof {} {}] ",
                c.client.sent,
                c.client.recvd,
                c.client.steps.front(),
                c.client.eof,
                st(&mut sim.client.stack, c.client.id),
                c.server.sent,
                c.server.recvd,
                c.server.steps.front(),
                c.server.eof,
                st(&mut sim.server.stack, c.server.id),
            );
        }
        s
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }
}

/// Reads, checks, writes and closes as `side`'s script says.
fn drive(stack: &mut Stack, side: &mut Side, buf: &mut [u8]) -> Result<(), String> {
    let Some(id) = side.id else {
        return Ok(());
    };
    if side.released {
        return Ok(());
    }
    match stack.tcp_state(id) {
        Some(TcpState::SynSent | TcpState::SynReceived) => return Ok(()),
        None => return Err("the flow is gone".into()),
        _ => {}
    }
    // Read what arrived: what the step is owed, or, once the script is done, the end of the
    // stream. An echo first writes back what it read.
    loop {
        if !flush_echo(stack, id, side)? {
            break;
        }
        let want = side.steps.front().map_or(0, |&(_, r)| r - side.step_recvd);
        let mut want = want.min(buf.len() as u64) as usize;
        if want == 0 {
            if !side.steps.is_empty() || side.eof {
                break;
            }
            want = 1;
        }
        match stack.tcp_read(id, &mut buf[..want], None) {
            Poll::Pending => break,
            Poll::Ready(Err(e)) => return Err(format!("read: {e}")),
            Poll::Ready(Ok(0)) => {
                side.eof = true;
                break;
            }
            Poll::Ready(Ok(n)) => {
                let owed = side.steps.front().map_or(0, |s| s.1 - side.step_recvd);
                if n as u64 > owed {
                    return Err(format!(
                        "{n} bytes read where {owed} were owed (at offset {})",
                        side.recvd
                    ));
                }
                for (k, &b) in buf[..n].iter().enumerate() {
                    let off = side.recvd + k as u64;
                    let want = byte_at(side.expect, off);
                    if b != want {
                        return Err(format!("byte {off} is {b:#04x}, {want:#04x} was sent"));
                    }
                }
                side.recvd += n as u64;
                side.step_recvd += n as u64;
                if side.echo {
                    side.pending.extend_from_slice(&buf[..n]);
                }
            }
        }
        next_step(side);
    }
    // Write what the step still owes.
    while let Some(&(s, _)) = side.steps.front() {
        if side.echo || side.step_sent >= s {
            break;
        }
        let n = (s - side.step_sent).min(buf.len() as u64) as usize;
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b = byte_at(side.key, side.sent + k as u64);
        }
        match stack.tcp_write(id, &buf[..n], None) {
            Poll::Pending => break,
            Poll::Ready(Err(e)) => return Err(format!("write: {e}")),
            Poll::Ready(Ok(k)) => {
                side.sent += k as u64;
                side.step_sent += k as u64;
            }
        }
        next_step(side);
    }
    next_step(side);
    if side.steps.is_empty() && !side.shut && (!side.close_after_eof || side.eof) {
        stack
            .tcp_shutdown(id)
            .map_err(|e| format!("shutdown: {e}"))?;
        side.shut = true;
    }
    if side.shut && side.eof {
        stack.release(id);
        side.released = true;
    }
    Ok(())
}

/// Writes back what an echo read; true when nothing is left to write.
fn flush_echo(stack: &mut Stack, id: FlowId, side: &mut Side) -> Result<bool, String> {
    while !side.pending.is_empty() {
        match stack.tcp_write(id, &side.pending, None) {
            Poll::Pending => return Ok(false),
            Poll::Ready(Err(e)) => return Err(format!("echo write: {e}")),
            Poll::Ready(Ok(k)) => {
                side.pending.drain(..k);
                side.sent += k as u64;
                side.step_sent += k as u64;
            }
        }
    }
    next_step(side);
    Ok(true)
}

fn next_step(side: &mut Side) {
    while let Some(&(s, r)) = side.steps.front() {
        if side.step_sent < s || side.step_recvd < r {
            break;
        }
        side.steps.pop_front();
        side.step_sent = 0;
        side.step_recvd = 0;
    }
}
