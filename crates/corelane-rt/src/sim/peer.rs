//! The peer of a simulation: a host (corelane's stack on its own, as the stack's simulation
//! uses it for a kernel-like peer) that opens connections to the echo server at seeded times
//! and checks every byte that comes back.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::task::Poll;

use crate::host::mem::{MemLink, MemPort};
use corelane_stack::smoltcp::time::Instant;
use corelane_stack::smoltcp::wire::IpCidr;
use corelane_stack::{FlowId, Node, StackConfig};

use super::process::MTU;

/// The byte at `off` of connection `key`'s stream.
fn byte_at(key: u64, off: u64) -> u8 {
    let x = key
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(off.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    (x >> 56) as u8
}

/// Where one of the peer's connections stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    /// Not opened yet.
    Waiting,
    /// Open: sending and reading back.
    Open,
    /// Every byte came back once and in order, and the connection closed.
    Done,
    /// The connection ended abnormally (reset, timed out), with the error.
    Failed(String),
}

/// One connection of the peer.
#[derive(Debug)]
pub(super) struct Conn {
    key: u64,
    /// When it opens (simulated time since the start, in microseconds).
    open_at: i64,
    /// Bytes it sends (and expects back).
    total: u64,
    id: Option<FlowId>,
    sent: u64,
    recvd: u64,
    shut: bool,
    /// When a byte last came back (or the connection opened), in microseconds.
    progress_at: i64,
    pub(super) state: State,
}

/// How long a connection of the peer waits for a byte to come back before it gives up, as an
/// application's own timeout does (a server killed mid-request sends nothing more, and a peer
/// with nothing left to send never hears of it).
const GIVE_UP_US: i64 = 60_000_000;

/// The peer host.
pub(super) struct Peer {
    pub(super) node: Node<MemPort>,
    /// The link's other end: frames for the peer are put on it.
    pub(super) wire: MemPort,
    pub(super) conns: Vec<Conn>,
    server: SocketAddr,
    buf: Vec<u8>,
    sent: VecDeque<Vec<u8>>,
}

impl Peer {
    /// A peer at `addr` talking to `server`, with `conns` connections of (open time in
    /// microseconds, bytes) each.
    pub(super) fn new(addr: IpCidr, server: SocketAddr, seed: u64, conns: &[(i64, u64)]) -> Peer {
        let (mut io, wire) = MemLink {
            frames: 1024,
            frame_size: 2048,
            ring_size: 512,
        }
        .pair();
        io.set_capture(true);
        let mut node = Node::new(
            io,
            [2, 0, 0, 0, 0, 1],
            &[addr],
            MTU,
            StackConfig {
                seed: Some(seed),
                ..StackConfig::default()
            },
        );
        node.dev_mut().set_strict(true);
        Peer {
            node,
            wire,
            conns: conns
                .iter()
                .enumerate()
                .map(|(i, &(open_at, total))| Conn {
                    key: seed ^ (i as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d),
                    open_at,
                    total,
                    id: None,
                    sent: 0,
                    recvd: 0,
                    shut: false,
                    progress_at: 0,
                    state: State::Waiting,
                })
                .collect(),
            server,
            buf: vec![0u8; 8192],
            sent: VecDeque::new(),
        }
    }

    /// The peer's turn at `now`: its stack's, then each connection's sends and reads. Returns
    /// the frames it sent, and Err when a byte came back wrong.
    pub(super) fn turn(&mut self, now: Instant) -> Result<(bool, Vec<Vec<u8>>), String> {
        let busy = self.node.turn(now).busy();
        for (i, c) in self.conns.iter_mut().enumerate() {
            drive(&mut self.node, c, self.server, now, &mut self.buf)
                .map_err(|e| format!("peer connection {i}: {e}"))?;
        }
        self.node.dev_mut().io_mut().take_sent(&mut self.sent);
        Ok((busy, self.sent.drain(..).collect()))
    }

    /// The connections the server has answered on so far (a byte came back): its application
    /// had accepted them.
    pub(super) fn answered(&self) -> Vec<usize> {
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.recvd > 0)
            .map(|(i, _)| i)
            .collect()
    }

    /// Whether every connection has opened and ended.
    pub(super) fn finished(&self) -> bool {
        self.conns
            .iter()
            .all(|c| matches!(c.state, State::Done | State::Failed(_)))
    }

    /// What the peer's stack would sleep until (`Stack::sleep_deadline`), and the next
    /// connection to open.
    pub(super) fn next_deadline(&mut self) -> Option<Instant> {
        let open = self
            .conns
            .iter()
            .filter(|c| c.state == State::Waiting)
            .map(|c| Instant::from_micros(c.open_at))
            .min();
        match (self.node.stack.sleep_deadline(), open) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn drive(
    node: &mut Node<MemPort>,
    c: &mut Conn,
    server: SocketAddr,
    now: Instant,
    buf: &mut [u8],
) -> Result<(), String> {
    let stack = &mut node.stack;
    match c.state {
        State::Waiting if now.total_micros() >= c.open_at => {
            let (id, _) = stack
                .connect_tcp(server)
                .map_err(|e| format!("connect: {e}"))?;
            c.id = Some(id);
            c.state = State::Open;
            c.progress_at = now.total_micros();
        }
        State::Open => {}
        _ => return Ok(()),
    }
    let Some(id) = c.id else { return Ok(()) };
    match stack.tcp_state(id) {
        Some(corelane_stack::TcpState::SynSent | corelane_stack::TcpState::SynReceived) => {
            return Ok(());
        }
        Some(_) => {}
        None => {
            c.state = State::Failed("the flow is gone".into());
            return Ok(());
        }
    }
    let fail = |c: &mut Conn, stack: &mut corelane_stack::Stack, e: std::io::Error| {
        c.state = State::Failed(format!("{:?}: {e}", e.kind()));
        stack.release(id);
    };
    // Send what is left, in pieces the send buffer takes.
    while c.sent < c.total {
        let n = ((c.total - c.sent) as usize).min(buf.len());
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b = byte_at(c.key, c.sent + k as u64);
        }
        match stack.tcp_write(id, &buf[..n], None) {
            Poll::Pending => break,
            Poll::Ready(Ok(k)) => c.sent += k as u64,
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::NotConnected => break,
            Poll::Ready(Err(e)) => {
                fail(c, stack, e);
                return Ok(());
            }
        }
    }
    // Read back, checking each byte.
    loop {
        match stack.tcp_read(id, buf, None) {
            Poll::Pending => break,
            Poll::Ready(Ok(0)) => {
                if c.recvd != c.total {
                    return Err(format!(
                        "the server closed after {} of {} bytes came back",
                        c.recvd, c.total
                    ));
                }
                stack.release(id);
                c.state = State::Done;
                return Ok(());
            }
            Poll::Ready(Ok(n)) => {
                for (k, &b) in buf[..n].iter().enumerate() {
                    let off = c.recvd + k as u64;
                    if off >= c.total {
                        return Err(format!("byte {off} came back, only {} were sent", c.total));
                    }
                    let want = byte_at(c.key, off);
                    if b != want {
                        return Err(format!(
                            "byte {off} came back {b:#04x}, {want:#04x} was sent"
                        ));
                    }
                }
                c.recvd += n as u64;
                c.progress_at = now.total_micros();
            }
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::NotConnected => break,
            Poll::Ready(Err(e)) => {
                fail(c, stack, e);
                return Ok(());
            }
        }
    }
    if now.total_micros() - c.progress_at > GIVE_UP_US {
        stack.abort(id);
        stack.release(id);
        c.state = State::Failed(format!(
            "no byte came back for {} s ({} of {} did)",
            GIVE_UP_US / 1_000_000,
            c.recvd,
            c.total
        ));
        return Ok(());
    }
    // Everything came back: this side closes; the server's close ends the stream.
    if c.recvd == c.total && !c.shut {
        stack
            .tcp_shutdown(id)
            .map_err(|e| format!("shutdown: {e}"))?;
        c.shut = true;
    }
    Ok(())
}
