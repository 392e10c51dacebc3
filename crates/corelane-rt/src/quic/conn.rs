//! A connection and its streams, as the application holds them: handles on the endpoint's
//! state, each call a short lock of it, the driver woken when something may be sent.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use quinn_proto::{ConnectionError, ConnectionHandle, Dir, StreamId, VarInt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Shared;
use super::driver::Conn;

/// The connection `h` of `shared`, or why there is none any more.
fn with<T>(
    shared: &Shared,
    h: ConnectionHandle,
    f: impl FnOnce(&mut Conn) -> Poll<Result<T, ConnectionError>>,
) -> Poll<Result<T, ConnectionError>> {
    let mut st = shared.lock();
    match st.conns.get_mut(&h) {
        Some(conn) => f(conn),
        None => Poll::Ready(Err(ConnectionError::LocallyClosed)),
    }
}

/// A connection being set up: resolves once its handshake is done.
pub struct Connecting {
    shared: Arc<Shared>,
    handle: ConnectionHandle,
}

impl Connecting {
    pub(crate) fn new(shared: Arc<Shared>, handle: ConnectionHandle) -> Connecting {
        Connecting { shared, handle }
    }

    /// The peer's address.
    pub fn remote_address(&self) -> SocketAddr {
        remote(&self.shared, self.handle)
    }
}

fn remote(shared: &Shared, h: ConnectionHandle) -> SocketAddr {
    let st = shared.lock();
    st.conns
        .get(&h)
        .map_or(shared.local, |c| c.c.remote_address())
}

impl std::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connecting")
            .field("remote", &self.remote_address())
            .finish_non_exhaustive()
    }
}

impl Future for Connecting {
    type Output = Result<Connection, ConnectionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let h = self.handle;
        with(&self.shared, h, |conn| {
            if let Some(e) = &conn.lost {
                return Poll::Ready(Err(e.clone()));
            }
            if conn.connected {
                return Poll::Ready(Ok(()));
            }
            conn.wait(cx);
            Poll::Pending
        })
        .map_ok(|()| Connection {
            shared: self.shared.clone(),
            handle: h,
        })
    }
}

/// An established QUIC connection. Cheap to clone: the clones are the same connection.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    handle: ConnectionHandle,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("remote", &self.remote_address())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// The peer's address (where it last sent from).
    pub fn remote_address(&self) -> SocketAddr {
        remote(&self.shared, self.handle)
    }

    fn streams(
        &self,
        dir: Dir,
        open: bool,
    ) -> impl Future<Output = Result<StreamId, ConnectionError>> {
        let (shared, h) = (self.shared.clone(), self.handle);
        std::future::poll_fn(move |cx| {
            let r = with(&shared, h, |conn| {
                if let Some(e) = &conn.lost {
                    return Poll::Ready(Err(e.clone()));
                }
                let mut s = conn.c.streams();
                let id = if open { s.open(dir) } else { s.accept(dir) };
                match id {
                    Some(id) => Poll::Ready(Ok(id)),
                    None => {
                        conn.wait(cx);
                        Poll::Pending
                    }
                }
            });
            if open && r.is_ready() {
                shared.poke(h);
            }
            r
        })
    }

    /// Opens a bidirectional stream (waiting while the peer allows no more).
    ///
    /// # Errors
    /// The connection was lost.
    pub async fn open_bi(&self) -> Result<(SendStream, RecvStream), ConnectionError> {
        let id = self.streams(Dir::Bi, true).await?;
        Ok((self.send_stream(id), self.recv_stream(id)))
    }

    /// The next bidirectional stream the peer opens.
    ///
    /// # Errors
    /// The connection was lost (closed by either side: the peer's close is
    /// `ConnectionError::ApplicationClosed`).
    pub async fn accept_bi(&self) -> Result<(SendStream, RecvStream), ConnectionError> {
        let id = self.streams(Dir::Bi, false).await?;
        Ok((self.send_stream(id), self.recv_stream(id)))
    }

    /// Opens a unidirectional stream.
    ///
    /// # Errors
    /// The connection was lost.
    pub async fn open_uni(&self) -> Result<SendStream, ConnectionError> {
        let id = self.streams(Dir::Uni, true).await?;
        Ok(self.send_stream(id))
    }

    /// The next unidirectional stream the peer opens.
    ///
    /// # Errors
    /// The connection was lost.
    pub async fn accept_uni(&self) -> Result<RecvStream, ConnectionError> {
        let id = self.streams(Dir::Uni, false).await?;
        Ok(self.recv_stream(id))
    }

    fn send_stream(&self, id: StreamId) -> SendStream {
        SendStream {
            shared: self.shared.clone(),
            handle: self.handle,
            id,
        }
    }

    fn recv_stream(&self, id: StreamId) -> RecvStream {
        RecvStream {
            shared: self.shared.clone(),
            handle: self.handle,
            id,
        }
    }

    /// Sends `data` as one unreliable datagram (RFC 9221); the oldest waiting are dropped to
    /// make room when the send buffer is full.
    ///
    /// # Errors
    /// The peer takes no datagrams, `data` is larger than [`Connection::max_datagram_size`],
    /// or the connection was lost.
    pub fn send_datagram(&self, data: Bytes) -> Result<(), SendDatagramError> {
        let r = {
            let mut st = self.shared.lock();
            match st.conns.get_mut(&self.handle) {
                Some(conn) => match &conn.lost {
                    Some(e) => Err(SendDatagramError::ConnectionLost(e.clone())),
                    None => conn.c.datagrams().send(data, true).map_err(|e| match e {
                        quinn_proto::SendDatagramError::UnsupportedByPeer => {
                            SendDatagramError::UnsupportedByPeer
                        }
                        quinn_proto::SendDatagramError::Disabled => SendDatagramError::Disabled,
                        quinn_proto::SendDatagramError::TooLarge
                        | quinn_proto::SendDatagramError::Blocked(_) => SendDatagramError::TooLarge,
                    }),
                },
                None => Err(SendDatagramError::ConnectionLost(
                    ConnectionError::LocallyClosed,
                )),
            }
        };
        self.shared.poke(self.handle);
        r
    }

    /// The largest datagram the peer takes now (None: it takes none).
    pub fn max_datagram_size(&self) -> Option<usize> {
        let mut st = self.shared.lock();
        st.conns
            .get_mut(&self.handle)
            .and_then(|conn| conn.c.datagrams().max_size())
    }

    /// The next datagram the peer sent.
    ///
    /// # Errors
    /// The connection was lost.
    pub async fn read_datagram(&self) -> Result<Bytes, ConnectionError> {
        let (shared, h) = (self.shared.clone(), self.handle);
        std::future::poll_fn(move |cx| {
            with(&shared, h, |conn| {
                if let Some(d) = conn.c.datagrams().recv() {
                    return Poll::Ready(Ok(d));
                }
                if let Some(e) = &conn.lost {
                    return Poll::Ready(Err(e.clone()));
                }
                conn.wait(cx);
                Poll::Pending
            })
        })
        .await
    }

    /// Closes the connection with `code` and `reason`: streams not yet delivered are lost
    /// (finish them and wait for the peer first to deliver everything).
    pub fn close(&self, code: VarInt, reason: &[u8]) {
        {
            let mut st = self.shared.lock();
            let now = st.now();
            if let Some(conn) = st.conns.get_mut(&self.handle) {
                conn.c.close(now, code, Bytes::copy_from_slice(reason));
            }
        }
        self.shared.poke(self.handle);
    }

    /// Waits until the connection is lost, and says why.
    pub async fn closed(&self) -> ConnectionError {
        let (shared, h) = (self.shared.clone(), self.handle);
        let r = std::future::poll_fn(move |cx| {
            with::<()>(&shared, h, |conn| match &conn.lost {
                Some(e) => Poll::Ready(Err(e.clone())),
                None => {
                    conn.wait(cx);
                    Poll::Pending
                }
            })
        })
        .await;
        r.err().unwrap_or(ConnectionError::LocallyClosed)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.wake_driver();
    }
}

/// Why a datagram was not sent ([`Connection::send_datagram`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendDatagramError {
    /// The peer takes no datagrams.
    UnsupportedByPeer,
    /// This endpoint's transport config turned datagrams off.
    Disabled,
    /// Larger than the peer takes ([`Connection::max_datagram_size`]).
    TooLarge,
    /// The connection was lost.
    ConnectionLost(ConnectionError),
}

impl std::fmt::Display for SendDatagramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendDatagramError::UnsupportedByPeer => f.write_str("the peer takes no datagrams"),
            SendDatagramError::Disabled => f.write_str("datagrams are turned off"),
            SendDatagramError::TooLarge => f.write_str("datagram larger than the peer takes"),
            SendDatagramError::ConnectionLost(e) => write!(f, "connection lost: {e}"),
        }
    }
}

impl std::error::Error for SendDatagramError {}

fn lost(e: ConnectionError) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, e)
}

/// The sending half of a stream: tokio's `AsyncWrite`; `shutdown` finishes it.
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
    /// Finishes the stream: the peer reads to its end once everything written has arrived.
    ///
    /// # Errors
    /// The stream was finished or reset already, or the connection was lost.
    pub fn finish(&mut self) -> io::Result<()> {
        let r = {
            let mut st = self.shared.lock();
            match st.conns.get_mut(&self.handle) {
                Some(conn) => conn
                    .c
                    .send_stream(self.id)
                    .finish()
                    .map_err(|e| io::Error::new(io::ErrorKind::NotConnected, e)),
                None => Err(lost(ConnectionError::LocallyClosed)),
            }
        };
        self.shared.poke(self.handle);
        r
    }
}

impl AsyncWrite for SendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let id = self.id;
        let r = with(&self.shared, self.handle, |conn| {
            if let Some(e) = &conn.lost {
                return Poll::Ready(Err(e.clone()));
            }
            match conn.c.send_stream(id).write(buf) {
                Ok(n) => Poll::Ready(Ok(Ok(n))),
                Err(quinn_proto::WriteError::Blocked) => {
                    conn.wait(cx);
                    Poll::Pending
                }
                Err(e) => Poll::Ready(Ok(Err(io::Error::new(io::ErrorKind::BrokenPipe, e)))),
            }
        });
        match r {
            Poll::Ready(Ok(Ok(n))) => {
                self.shared.poke(self.handle);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Ok(Err(e))) => Poll::Ready(Err(e)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(lost(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().finish())
    }
}

impl Drop for SendStream {
    /// Finishes the stream if it was not (as quinn's does): the peer reads what was written
    /// and then its end, instead of waiting for the connection's.
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            if let Some(conn) = st.conns.get_mut(&self.handle)
                && conn.lost.is_none()
            {
                let mut s = conn.c.send_stream(self.id);
                if let Err(quinn_proto::FinishError::Stopped(code)) = s.finish() {
                    let _ = s.reset(code);
                }
            }
        }
        self.shared.poke(self.handle);
    }
}

/// The receiving half of a stream: tokio's `AsyncRead`, at its end once the peer finished
/// it and everything arrived.
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

impl AsyncRead for RecvStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let id = self.id;
        let r = with(&self.shared, self.handle, |conn| {
            let mut rs = conn.c.recv_stream(id);
            let mut chunks = match rs.read(true) {
                Ok(c) => c,
                // Read to its end already.
                Err(quinn_proto::ReadableError::ClosedStream) => return Poll::Ready(Ok(Ok(()))),
                Err(e) => {
                    return Poll::Ready(Ok(Err(io::Error::new(io::ErrorKind::InvalidInput, e))));
                }
            };
            let got = chunks.next(buf.remaining());
            let _ = chunks.finalize();
            match got {
                Ok(Some(chunk)) => {
                    buf.put_slice(&chunk.bytes);
                    Poll::Ready(Ok(Ok(())))
                }
                Ok(None) => Poll::Ready(Ok(Ok(()))),
                Err(quinn_proto::ReadError::Blocked) => {
                    if let Some(e) = &conn.lost {
                        return Poll::Ready(Err(e.clone()));
                    }
                    conn.wait(cx);
                    Poll::Pending
                }
                Err(quinn_proto::ReadError::Reset(code)) => Poll::Ready(Ok(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("stream reset by the peer (code {code})"),
                )))),
            }
        });
        match r {
            Poll::Ready(Ok(r)) => {
                // What was read frees flow-control credit the peer may need to hear of.
                self.shared.poke(self.handle);
                Poll::Ready(r)
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(lost(e))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for RecvStream {
    /// Asks the peer to stop sending what nobody will read (as quinn's does), unless the
    /// stream was read to its end.
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            if let Some(conn) = st.conns.get_mut(&self.handle)
                && conn.lost.is_none()
            {
                let _ = conn.c.recv_stream(self.id).stop(VarInt::from_u32(0));
            }
        }
        self.shared.poke(self.handle);
    }
}
