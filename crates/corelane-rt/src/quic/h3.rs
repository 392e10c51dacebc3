//! HTTP/3 over corelane's QUIC: the `h3` crate's QUIC traits (`h3::quic`) implemented over
//! [`quic::Connection`](super::Connection) and its streams, as `h3-quinn` does for quinn.
//!
//! A server written for h3 over quinn ports by one line: where it wrapped quinn's connection
//! in `h3_quinn::Connection::new`, it wraps corelane's in [`Connection::new`]. Nothing here
//! needs `Send` from the application; the types are `Send` anyway, so code that spawns
//! them with `tokio::spawn` elsewhere compiles unchanged.
//!
//! ```no_run
//! # async fn serve(endpoint: corelane_rt::quic::Endpoint) {
//! use bytes::Bytes;
//! use corelane_rt::quic::h3::Connection;
//!
//! while let Some(incoming) = endpoint.accept().await {
//!     tokio::task::spawn_local(async move {
//!         let Ok(conn) = incoming.await else { return };
//!         let Ok(mut h3) = h3::server::Connection::<_, Bytes>::new(Connection::new(conn)).await
//!         else {
//!             return;
//!         };
//!         while let Ok(Some(resolver)) = h3.accept().await {
//!             tokio::task::spawn_local(async move {
//!                 let Ok((_req, mut stream)) = resolver.resolve_request().await else { return };
//!                 let resp = http::Response::new(());
//!                 if stream.send_response(resp).await.is_ok() {
//!                     let _ = stream.send_data(Bytes::from_static(b"hello\n")).await;
//!                     let _ = stream.finish().await;
//!                 }
//!             });
//!         }
//!     });
//! }
//! # }
//! ```

use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h3::quic::{ConnectionErrorIncoming, StreamErrorIncoming, WriteBuf};
use quinn_proto::{ConnectionError, Dir, VarInt};

use super::{ReadError, WriteError};

/// h3's stream ID for a QUIC one (both are the same 62-bit number).
fn h3_id(id: quinn_proto::StreamId) -> h3::quic::StreamId {
    // A QUIC stream ID is below 2^62, which is all h3 checks.
    h3::quic::StreamId::try_from(u64::from(id))
        .unwrap_or_else(|_| unreachable!("a QUIC stream ID is a 62-bit number"))
}

/// An error code h3 chose, as QUIC carries it (codes past 2^62 cannot be sent; h3's own are
/// far below).
fn code(c: u64) -> VarInt {
    VarInt::from_u64(c).unwrap_or(VarInt::MAX)
}

fn conn_error(e: ConnectionError) -> ConnectionErrorIncoming {
    match e {
        ConnectionError::ApplicationClosed(close) => ConnectionErrorIncoming::ApplicationClose {
            error_code: close.error_code.into_inner(),
        },
        ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        e => ConnectionErrorIncoming::Undefined(Arc::new(e)),
    }
}

fn stream_lost(e: ConnectionError) -> StreamErrorIncoming {
    StreamErrorIncoming::ConnectionErrorIncoming {
        connection_error: conn_error(e),
    }
}

fn write_error(e: WriteError) -> StreamErrorIncoming {
    match e {
        WriteError::Stopped(c) => StreamErrorIncoming::StreamTerminated {
            error_code: c.into_inner(),
        },
        WriteError::ConnectionLost(e) => stream_lost(e),
        e => StreamErrorIncoming::Unknown(Box::new(e)),
    }
}

fn read_error(e: ReadError) -> StreamErrorIncoming {
    match e {
        ReadError::Reset(c) => StreamErrorIncoming::StreamTerminated {
            error_code: c.into_inner(),
        },
        ReadError::ConnectionLost(e) => stream_lost(e),
        e => StreamErrorIncoming::Unknown(Box::new(e)),
    }
}

/// A QUIC connection as h3 takes it: `h3::server::Connection::new(Connection::new(conn))`,
/// or `h3::client::new(Connection::new(conn))`.
pub struct Connection {
    conn: super::Connection,
    opener: OpenStreams,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Connection").field(&self.conn).finish()
    }
}

impl Connection {
    /// Wraps an established connection for h3.
    pub fn new(conn: super::Connection) -> Connection {
        Connection {
            opener: OpenStreams { conn: conn.clone() },
            conn,
        }
    }

    /// The QUIC connection underneath (its address, datagrams, close).
    pub fn inner(&self) -> &super::Connection {
        &self.conn
    }
}

impl<B: Buf> h3::quic::Connection<B> for Connection {
    type RecvStream = RecvStream;
    type OpenStreams = OpenStreams;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvStream, ConnectionErrorIncoming>> {
        let id = ready!(self.conn.poll_stream(cx, Dir::Uni, false)).map_err(conn_error)?;
        Poll::Ready(Ok(RecvStream(self.conn.recv_stream(id))))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, ConnectionErrorIncoming>> {
        let id = ready!(self.conn.poll_stream(cx, Dir::Bi, false)).map_err(conn_error)?;
        Poll::Ready(Ok(self.opener.bidi(id)))
    }

    fn opener(&self) -> OpenStreams {
        self.opener.clone()
    }
}

impl<B: Buf> h3::quic::OpenStreams<B> for Connection {
    type BidiStream = BidiStream<B>;
    type SendStream = SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, StreamErrorIncoming>> {
        self.opener.poll_open_bidi(cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream<B>, StreamErrorIncoming>> {
        self.opener.poll_open_send(cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        <OpenStreams as h3::quic::OpenStreams<B>>::close(&mut self.opener, code, reason);
    }
}

/// What opens a connection's streams for h3 (a clone of the connection).
#[derive(Clone, Debug)]
pub struct OpenStreams {
    conn: super::Connection,
}

impl OpenStreams {
    fn bidi<B: Buf>(&self, id: quinn_proto::StreamId) -> BidiStream<B> {
        BidiStream {
            send: SendStream::new(self.conn.send_stream(id)),
            recv: RecvStream(self.conn.recv_stream(id)),
        }
    }
}

impl<B: Buf> h3::quic::OpenStreams<B> for OpenStreams {
    type BidiStream = BidiStream<B>;
    type SendStream = SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, StreamErrorIncoming>> {
        let id = ready!(self.conn.poll_stream(cx, Dir::Bi, true)).map_err(stream_lost)?;
        Poll::Ready(Ok(self.bidi(id)))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream<B>, StreamErrorIncoming>> {
        let id = ready!(self.conn.poll_stream(cx, Dir::Uni, true)).map_err(stream_lost)?;
        Poll::Ready(Ok(SendStream::new(self.conn.send_stream(id))))
    }

    fn close(&mut self, c: h3::error::Code, reason: &[u8]) {
        self.conn.close(code(c.value()), reason);
    }
}

/// A bidirectional stream for h3: both halves, which [`split`](h3::quic::BidiStream::split)
/// parts.
pub struct BidiStream<B: Buf> {
    send: SendStream<B>,
    recv: RecvStream,
}

impl<B: Buf> std::fmt::Debug for BidiStream<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BidiStream")
            .field("send", &self.send)
            .field("recv", &self.recv)
            .finish()
    }
}

impl<B: Buf> h3::quic::BidiStream<B> for BidiStream<B> {
    type SendStream = SendStream<B>;
    type RecvStream = RecvStream;

    fn split(self) -> (SendStream<B>, RecvStream) {
        (self.send, self.recv)
    }
}

impl<B: Buf> h3::quic::RecvStream for BidiStream<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code);
    }

    fn recv_id(&self) -> h3::quic::StreamId {
        self.recv.recv_id()
    }
}

impl<B: Buf> h3::quic::SendStream<B> for BidiStream<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code);
    }

    fn send_id(&self) -> h3::quic::StreamId {
        self.send.send_id()
    }
}

impl<B: Buf> h3::quic::SendStreamUnframed<B> for BidiStream<B> {
    fn poll_send<D: Buf>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut D,
    ) -> Poll<Result<usize, StreamErrorIncoming>> {
        self.send.poll_send(cx, buf)
    }
}

/// The receiving half of a stream for h3: each poll hands over the next chunk that arrived,
/// without a copy.
#[derive(Debug)]
pub struct RecvStream(super::RecvStream);

impl h3::quic::RecvStream for RecvStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.0.poll_read_chunk(cx, usize::MAX).map_err(read_error)
    }

    fn stop_sending(&mut self, error_code: u64) {
        // Stopped or read to its end already: nothing to tell the peer.
        let _ = self.0.stop(code(error_code));
    }

    fn recv_id(&self) -> h3::quic::StreamId {
        h3_id(self.0.id())
    }
}

/// The sending half of a stream for h3: holds the frame h3 hands it until the stream's flow
/// control has taken all of it.
pub struct SendStream<B: Buf> {
    stream: super::SendStream,
    writing: Option<WriteBuf<B>>,
}

impl<B: Buf> std::fmt::Debug for SendStream<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendStream")
            .field("stream", &self.stream)
            .field("writing", &self.writing.as_ref().map(Buf::remaining))
            .finish()
    }
}

impl<B: Buf> SendStream<B> {
    fn new(stream: super::SendStream) -> SendStream<B> {
        SendStream {
            stream,
            writing: None,
        }
    }
}

impl<B: Buf> h3::quic::SendStream<B> for SendStream<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        if let Some(data) = &mut self.writing {
            while data.has_remaining() {
                let n =
                    ready!(self.stream.poll_write_buf(cx, data.chunk())).map_err(write_error)?;
                data.advance(n);
            }
        }
        self.writing = None;
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        if self.writing.is_some() {
            // h3 waits for `poll_ready` before each frame; a second one here is h3's mistake,
            // and the connection ends with H3_INTERNAL_ERROR rather than lose a frame.
            return Err(StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error: ConnectionErrorIncoming::InternalError(
                    "a frame was handed to a stream still sending the last one".into(),
                ),
            });
        }
        self.writing = Some(data.into());
        Ok(())
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        // What h3 handed over goes first: finishing before it would cut the last frame.
        ready!(self.poll_ready(cx))?;
        Poll::Ready(
            self.stream
                .finish()
                .map_err(|e| StreamErrorIncoming::Unknown(Box::new(e))),
        )
    }

    fn reset(&mut self, reset_code: u64) {
        let _ = self.stream.reset(code(reset_code));
    }

    fn send_id(&self) -> h3::quic::StreamId {
        h3_id(self.stream.id())
    }
}

impl<B: Buf> h3::quic::SendStreamUnframed<B> for SendStream<B> {
    fn poll_send<D: Buf>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut D,
    ) -> Poll<Result<usize, StreamErrorIncoming>> {
        // A frame handed over by `send_data` goes before raw bytes.
        ready!(h3::quic::SendStream::<B>::poll_ready(self, cx))?;
        let n = ready!(self.stream.poll_write_buf(cx, buf.chunk())).map_err(write_error)?;
        buf.advance(n);
        Poll::Ready(Ok(n))
    }
}
