//! A connection and its streams, as the application holds them: handles on the endpoint's
//! state, each call a short lock of it, the driver woken when something may be sent.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use quinn_proto::{ConnectionError, ConnectionHandle, Dir, StreamId, VarInt};

use super::Shared;
use super::driver::Conn;
use super::stream::{RecvStream, SendStream};

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

    /// A stream opened (`open`) or accepted in `dir`, as a poll: `Pending` (and `cx` woken)
    /// while the peer allows no more, or has opened none.
    pub(crate) fn poll_stream(
        &self,
        cx: &mut Context<'_>,
        dir: Dir,
        open: bool,
    ) -> Poll<Result<StreamId, ConnectionError>> {
        let r = with(&self.shared, self.handle, |conn| {
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
            self.shared.poke(self.handle);
        }
        r
    }

    fn streams(
        &self,
        dir: Dir,
        open: bool,
    ) -> impl Future<Output = Result<StreamId, ConnectionError>> + '_ {
        std::future::poll_fn(move |cx| self.poll_stream(cx, dir, open))
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

    pub(crate) fn send_stream(&self, id: StreamId) -> SendStream {
        SendStream::new(self.shared.clone(), self.handle, id)
    }

    pub(crate) fn recv_stream(&self, id: StreamId) -> RecvStream {
        RecvStream::new(self.shared.clone(), self.handle, id)
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
