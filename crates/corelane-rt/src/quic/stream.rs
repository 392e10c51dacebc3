//! A stream's two halves, as the application holds them: tokio's `AsyncWrite` and
//! `AsyncRead`, and the calls of quinn's streams (`write`, `read_chunk`, `finish`, `reset`,
//! `stop`) with its errors.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use quinn_proto::{ClosedStream, ConnectionError, ConnectionHandle, StreamId, VarInt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Shared;
use super::driver::Conn;

/// Why a stream could not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteError {
    /// The peer asked this side to stop sending (STOP_SENDING), with its code.
    Stopped(VarInt),
    /// The connection was lost.
    ConnectionLost(ConnectionError),
    /// The stream was finished or reset already.
    ClosedStream,
}

/// Why a stream could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadError {
    /// The peer reset the stream (RESET_STREAM), with its code.
    Reset(VarInt),
    /// The connection was lost.
    ConnectionLost(ConnectionError),
    /// This side stopped the stream already.
    ClosedStream,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Stopped(c) => write!(f, "the peer stopped the stream (code {c})"),
            WriteError::ConnectionLost(e) => write!(f, "connection lost: {e}"),
            WriteError::ClosedStream => f.write_str("the stream was finished or reset already"),
        }
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Reset(c) => write!(f, "the peer reset the stream (code {c})"),
            ReadError::ConnectionLost(e) => write!(f, "connection lost: {e}"),
            ReadError::ClosedStream => f.write_str("the stream was stopped already"),
        }
    }
}

impl std::error::Error for WriteError {}
impl std::error::Error for ReadError {}

impl From<WriteError> for io::Error {
    fn from(e: WriteError) -> io::Error {
        let kind = match e {
            WriteError::Stopped(_) => io::ErrorKind::BrokenPipe,
            WriteError::ConnectionLost(_) => io::ErrorKind::ConnectionAborted,
            WriteError::ClosedStream => io::ErrorKind::NotConnected,
        };
        io::Error::new(kind, e)
    }
}

impl From<ReadError> for io::Error {
    fn from(e: ReadError) -> io::Error {
        let kind = match e {
            ReadError::Reset(_) => io::ErrorKind::ConnectionReset,
            ReadError::ConnectionLost(_) => io::ErrorKind::ConnectionAborted,
            ReadError::ClosedStream => io::ErrorKind::NotConnected,
        };
        io::Error::new(kind, e)
    }
}

/// Runs `f` on connection `h` if it is still there and not lost; `Err` with why not.
fn live<T>(
    shared: &Shared,
    h: ConnectionHandle,
    f: impl FnOnce(&mut Conn) -> T,
) -> Result<T, ConnectionError> {
    let mut st = shared.lock();
    match st.conns.get_mut(&h) {
        Some(conn) => match &conn.lost {
            Some(e) => Err(e.clone()),
            None => Ok(f(conn)),
        },
        None => Err(ConnectionError::LocallyClosed),
    }
}

/// The sending half of a stream: tokio's `AsyncWrite` (`shutdown` finishes it), or quinn's
/// [`write`](SendStream::write) and [`finish`](SendStream::finish).
pub struct SendStream {
    shared: Arc<Shared>,
    handle: ConnectionHandle,
    id: StreamId,
}

impl std::fmt::Debug for SendStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendStream")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl SendStream {
    pub(crate) fn new(shared: Arc<Shared>, handle: ConnectionHandle, id: StreamId) -> SendStream {
        SendStream { shared, handle, id }
    }

    /// The stream's ID.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Writes what of `buf` the stream's and the connection's flow control take now (at least
    /// one byte, waiting until some is taken), and says how much.
    ///
    /// # Errors
    /// The peer stopped the stream, it was finished or reset, or the connection was lost.
    pub async fn write(&mut self, buf: &[u8]) -> Result<usize, WriteError> {
        std::future::poll_fn(|cx| self.poll_write_buf(cx, buf)).await
    }

    /// Writes all of `buf`.
    ///
    /// # Errors
    /// As [`SendStream::write`]; what was written before the error stays written.
    pub async fn write_all(&mut self, mut buf: &[u8]) -> Result<(), WriteError> {
        while !buf.is_empty() {
            let n = self.write(buf).await?;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// [`SendStream::write`] as a poll: `Pending` (and `cx` woken) while nothing is taken.
    ///
    /// # Errors
    /// As [`SendStream::write`].
    pub fn poll_write_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<Result<usize, WriteError>> {
        let id = self.id;
        let r = live(&self.shared, self.handle, |conn| {
            match conn.c.send_stream(id).write(buf) {
                Ok(n) => Poll::Ready(Ok(n)),
                Err(quinn_proto::WriteError::Blocked) => {
                    conn.wait(cx);
                    Poll::Pending
                }
                Err(quinn_proto::WriteError::Stopped(code)) => {
                    Poll::Ready(Err(WriteError::Stopped(code)))
                }
                Err(quinn_proto::WriteError::ClosedStream) => {
                    Poll::Ready(Err(WriteError::ClosedStream))
                }
            }
        });
        match r {
            Ok(Poll::Ready(Ok(n))) => {
                self.shared.poke(self.handle);
                Poll::Ready(Ok(n))
            }
            Ok(p) => p,
            Err(e) => Poll::Ready(Err(WriteError::ConnectionLost(e))),
        }
    }

    /// Finishes the stream: the peer reads to its end once everything written has arrived.
    ///
    /// # Errors
    /// The stream was finished or reset already, or the connection was lost.
    pub fn finish(&mut self) -> Result<(), ClosedStream> {
        let id = self.id;
        let r = live(&self.shared, self.handle, |conn| {
            conn.c.send_stream(id).finish()
        });
        self.shared.poke(self.handle);
        match r {
            Ok(Ok(())) => Ok(()),
            // Stopped by the peer: the stream is over for this side too.
            Ok(Err(_)) | Err(_) => Err(ClosedStream::default()),
        }
    }

    /// Abandons the stream: the peer is told (RESET_STREAM, with `code`) that what was not
    /// delivered never will be.
    ///
    /// # Errors
    /// The stream was finished or reset already, or the connection was lost.
    pub fn reset(&mut self, code: VarInt) -> Result<(), ClosedStream> {
        let id = self.id;
        let r = live(&self.shared, self.handle, |conn| {
            conn.c.send_stream(id).reset(code)
        });
        self.shared.poke(self.handle);
        r.unwrap_or_else(|_| Err(ClosedStream::default()))
    }
}

impl AsyncWrite for SendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_buf(cx, buf)
            .map_err(io::Error::from)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(
            self.get_mut()
                .finish()
                .map_err(|e| io::Error::new(io::ErrorKind::NotConnected, e)),
        )
    }
}

impl Drop for SendStream {
    /// Finishes the stream if it was not (as quinn's does): the peer reads what was written
    /// and then its end, instead of waiting for the connection's.
    fn drop(&mut self) {
        let id = self.id;
        let _ = live(&self.shared, self.handle, |conn| {
            let mut s = conn.c.send_stream(id);
            if let Err(quinn_proto::FinishError::Stopped(code)) = s.finish() {
                let _ = s.reset(code);
            }
        });
        self.shared.poke(self.handle);
    }
}

/// The receiving half of a stream: tokio's `AsyncRead`, at its end once the peer finished
/// it and everything arrived; or quinn's [`read_chunk`](RecvStream::read_chunk) and
/// [`stop`](RecvStream::stop).
pub struct RecvStream {
    shared: Arc<Shared>,
    handle: ConnectionHandle,
    id: StreamId,
}

impl std::fmt::Debug for RecvStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvStream")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl RecvStream {
    pub(crate) fn new(shared: Arc<Shared>, handle: ConnectionHandle, id: StreamId) -> RecvStream {
        RecvStream { shared, handle, id }
    }

    /// The stream's ID.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The next bytes of the stream, in order, up to `max` of them, without a copy (None: the
    /// peer finished the stream and everything was read).
    ///
    /// # Errors
    /// The peer reset the stream, this side stopped it, or the connection was lost.
    pub async fn read_chunk(&mut self, max: usize) -> Result<Option<Bytes>, ReadError> {
        std::future::poll_fn(|cx| self.poll_read_chunk(cx, max)).await
    }

    /// [`RecvStream::read_chunk`] as a poll: `Pending` (and `cx` woken) while nothing new
    /// has arrived.
    ///
    /// # Errors
    /// As [`RecvStream::read_chunk`].
    pub fn poll_read_chunk(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<Result<Option<Bytes>, ReadError>> {
        let id = self.id;
        let mut st = self.shared.lock();
        let Some(conn) = st.conns.get_mut(&self.handle) else {
            return Poll::Ready(Err(ReadError::ConnectionLost(
                ConnectionError::LocallyClosed,
            )));
        };
        let mut rs = conn.c.recv_stream(id);
        let mut chunks = match rs.read(true) {
            Ok(c) => c,
            // Read to its end already (or stopped: reading after `stop` is the caller's
            // mistake, and the end is what there is to read).
            Err(quinn_proto::ReadableError::ClosedStream) => return Poll::Ready(Ok(None)),
            Err(quinn_proto::ReadableError::IllegalOrderedRead) => {
                return Poll::Ready(Err(ReadError::ClosedStream));
            }
        };
        let got = chunks.next(max);
        // Whether the peer must hear of the credit freed is the driver's pass to find out.
        let _ = chunks.finalize();
        let r = match got {
            Ok(Some(chunk)) => Poll::Ready(Ok(Some(chunk.bytes))),
            Ok(None) => Poll::Ready(Ok(None)),
            Err(quinn_proto::ReadError::Blocked) => {
                if let Some(e) = &conn.lost {
                    return Poll::Ready(Err(ReadError::ConnectionLost(e.clone())));
                }
                conn.wait(cx);
                return Poll::Pending;
            }
            Err(quinn_proto::ReadError::Reset(code)) => Poll::Ready(Err(ReadError::Reset(code))),
        };
        drop(st);
        // What was read frees flow-control credit the peer may need to hear of.
        self.shared.poke(self.handle);
        r
    }

    /// Asks the peer to stop sending (STOP_SENDING, with `code`): what it has not sent will
    /// not be read.
    ///
    /// # Errors
    /// The stream was stopped or read to its end already, or the connection was lost.
    pub fn stop(&mut self, code: VarInt) -> Result<(), ClosedStream> {
        let id = self.id;
        let r = live(&self.shared, self.handle, |conn| {
            conn.c.recv_stream(id).stop(code)
        });
        self.shared.poke(self.handle);
        r.unwrap_or_else(|_| Err(ClosedStream::default()))
    }
}

impl AsyncRead for RecvStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let max = buf.remaining();
        match self.get_mut().poll_read_chunk(cx, max) {
            Poll::Ready(Ok(Some(chunk))) => {
                buf.put_slice(&chunk);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(None)) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for RecvStream {
    /// Asks the peer to stop sending what nobody will read (as quinn's does), unless the
    /// stream was read to its end.
    fn drop(&mut self) {
        let id = self.id;
        let _ = live(&self.shared, self.handle, |conn| {
            let _ = conn.c.recv_stream(id).stop(VarInt::from_u32(0));
        });
        self.shared.poke(self.handle);
    }
}
