//! The applications on both ends of the simulation, over the connections an endpoint's state
//! holds (quinn-proto's stream calls, as the handles make them): the client sends streams and
//! checks each one comes back whole; the server echoes every stream it is given.

use std::time::Instant;

use bytes::Bytes;
use quinn_proto::{ConnectionHandle, Dir, ReadError, ReadableError, StreamId, VarInt, WriteError};

use super::super::driver::State;

/// Largest read at once.
const READ: usize = 64 * 1024;

/// One stream the client sends and reads back.
struct Sent {
    id: StreamId,
    data: Vec<u8>,
    written: usize,
    finished: bool,
    back: Vec<u8>,
    done: bool,
}

/// The client: opens its streams once connected, writes each, reads each echo, and closes the
/// connection when every echo is back.
pub(super) struct Client {
    pub(super) h: ConnectionHandle,
    sizes: Vec<usize>,
    seed: u8,
    streams: Vec<Sent>,
    pub(super) closed: bool,
}

/// `n` bytes of a pattern that differs at every offset of a stream.
fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

impl Client {
    pub(super) fn new(h: ConnectionHandle, sizes: Vec<usize>, seed: u8) -> Client {
        Client {
            h,
            sizes,
            seed,
            streams: Vec::new(),
            closed: false,
        }
    }

    /// Bytes sent on every stream (and to come back).
    pub(super) fn bytes(&self) -> u64 {
        self.sizes.iter().map(|&n| n as u64).sum()
    }

    /// Every echo back whole.
    pub(super) fn all_back(&self) -> bool {
        self.streams.len() == self.sizes.len() && self.streams.iter().all(|s| s.done)
    }

    /// Streams opened.
    pub(super) fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Bytes read back so far.
    pub(super) fn read_back(&self) -> u64 {
        self.streams.iter().map(|s| s.back.len() as u64).sum()
    }

    /// What the client does now; an error when an echo is not what was sent.
    pub(super) fn run(&mut self, st: &mut State, now: Instant) -> Result<(), String> {
        let Some(conn) = st.conns.get_mut(&self.h) else {
            return Ok(());
        };
        if !conn.connected || self.closed {
            return Ok(());
        }
        let c = &mut conn.c;
        while self.streams.len() < self.sizes.len() {
            let Some(id) = c.streams().open(Dir::Bi) else {
                break;
            };
            let k = self.streams.len();
            self.streams.push(Sent {
                id,
                data: pattern(self.seed.wrapping_add(k as u8), self.sizes[k]),
                written: 0,
                finished: false,
                back: Vec::new(),
                done: false,
            });
        }
        for s in &mut self.streams {
            while s.written < s.data.len() {
                match c.send_stream(s.id).write(&s.data[s.written..]) {
                    Ok(n) => s.written += n,
                    Err(WriteError::Blocked) => break,
                    Err(e) => return Err(format!("write on {}: {e}", s.id)),
                }
            }
            if s.written == s.data.len() && !s.finished {
                c.send_stream(s.id)
                    .finish()
                    .map_err(|e| format!("finish {}: {e}", s.id))?;
                s.finished = true;
            }
            if !s.done {
                let finished = read(c, s.id, &mut s.back)?;
                if s.back.len() > s.data.len() || s.back[..] != s.data[..s.back.len()] {
                    return Err(format!(
                        "stream {}: the echo differs from what was sent by byte {}",
                        s.id,
                        s.back
                            .iter()
                            .zip(&s.data)
                            .take_while(|(a, b)| a == b)
                            .count()
                    ));
                }
                if finished {
                    if s.back.len() != s.data.len() {
                        return Err(format!(
                            "stream {}: the echo ended at {} of {} bytes",
                            s.id,
                            s.back.len(),
                            s.data.len()
                        ));
                    }
                    s.done = true;
                }
            }
        }
        if self.all_back() {
            c.close(now, VarInt::from_u32(0), Bytes::from_static(b"done"));
            self.closed = true;
        }
        st.mark(self.h);
        Ok(())
    }
}

/// Reads what stream `id` has into `into`: true once the stream is finished and read.
fn read(c: &mut quinn_proto::Connection, id: StreamId, into: &mut Vec<u8>) -> Result<bool, String> {
    let mut rs = c.recv_stream(id);
    let mut chunks = match rs.read(true) {
        Ok(ch) => ch,
        Err(ReadableError::ClosedStream) => return Ok(true),
        Err(e) => return Err(format!("read {id}: {e}")),
    };
    let mut finished = false;
    let mut failed = None;
    loop {
        match chunks.next(READ) {
            Ok(Some(chunk)) => into.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                finished = true;
                break;
            }
            Err(ReadError::Blocked) => break,
            Err(e) => {
                failed = Some(format!("read {id}: {e}"));
                break;
            }
        }
    }
    let _ = chunks.finalize();
    failed.map_or(Ok(finished), Err)
}

/// A stream the server echoes.
struct Echo {
    id: StreamId,
    pending: Vec<u8>,
    read_all: bool,
    finished: bool,
}

/// The server: every bidirectional stream of every connection echoed.
#[derive(Default)]
pub(super) struct Server {
    echoes: Vec<(ConnectionHandle, Echo)>,
    /// Bytes echoed.
    pub(super) echoed: u64,
}

impl Server {
    /// What the server does now.
    pub(super) fn run(&mut self, st: &mut State) -> Result<(), String> {
        st.accept_all();
        let handles: Vec<ConnectionHandle> = st.conns.keys().copied().collect();
        for h in handles {
            let Some(conn) = st.conns.get_mut(&h) else {
                continue;
            };
            while let Some(id) = conn.c.streams().accept(Dir::Bi) {
                self.echoes.push((
                    h,
                    Echo {
                        id,
                        pending: Vec::new(),
                        read_all: false,
                        finished: false,
                    },
                ));
            }
            st.mark(h);
        }
        for (h, e) in &mut self.echoes {
            let Some(conn) = st.conns.get_mut(h) else {
                continue;
            };
            let c = &mut conn.c;
            if !e.read_all {
                e.read_all = read(c, e.id, &mut e.pending)?;
            }
            while !e.pending.is_empty() {
                match c.send_stream(e.id).write(&e.pending) {
                    Ok(n) => {
                        e.pending.drain(..n);
                        self.echoed += n as u64;
                    }
                    Err(WriteError::Blocked) => break,
                    // The connection is closing: nothing more to echo.
                    Err(_) => {
                        e.pending.clear();
                        e.finished = true;
                    }
                }
            }
            if e.read_all && e.pending.is_empty() && !e.finished {
                let _ = c.send_stream(e.id).finish();
                e.finished = true;
            }
        }
        self.echoes
            .retain(|(h, e)| !e.finished && st.conns.contains_key(h));
        Ok(())
    }
}
