//! Readiness of a TCP stream as tokio offers it: `ready` with an `Interest`, the `poll_*_ready`
//! pair for hand-written futures, and `try_read_buf` into a `BufMut`.

use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll};

use bytes::BufMut;
use tokio::io::{Interest, Ready};

use super::TcpStream;

impl TcpStream {
    /// Polls until a read would not wait (data, the end of the stream, or an error); `cx`'s
    /// waker is registered otherwise. As tokio's, readiness lasts until a read finds nothing:
    /// a new stream is ready at first, and stays ready after a read that took everything
    /// until the next read says `WouldBlock`.
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.peek_one(cx) {
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Err(e)),
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending if self.read_ready() => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn read_ready(&self) -> bool {
        self.conn
            .read_ready
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What a one-byte peek says now (`cx`'s waker registered when nothing is there; the
    /// kept readiness is not changed by it).
    fn peek_one(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut probe = [0u8; 1];
        let r = self
            .conn
            .core
            .stack()
            .tcp_peek(self.conn.id, &mut probe, Some(cx.waker()));
        if r.is_ready() {
            self.conn
                .read_ready
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// Polls until a write would not wait (room in the send buffer, or an error); `cx`'s waker
    /// is registered otherwise. As tokio's, readiness once seen lasts until a write finds no
    /// room (`WouldBlock`): after a write that queued part of its bytes this is still ready,
    /// and the next `try_write` tells.
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.conn.write_ready.load(Relaxed) {
            return Poll::Ready(Ok(()));
        }
        let r = self
            .conn
            .core
            .stack()
            .tcp_poll_writable(self.conn.id, Some(cx.waker()));
        if let Poll::Ready(Ok(())) = r {
            self.conn.write_ready.store(true, Relaxed);
        }
        r
    }

    /// Waits until the stream is ready for any of `interest`, and says for which.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::TcpStream;
    /// use tokio::io::Interest;
    /// let s = TcpStream::connect("10.0.0.2:7").await?;
    /// let ready = s.ready(Interest::READABLE | Interest::WRITABLE).await?;
    /// if ready.is_readable() {
    ///     let mut buf = [0u8; 1024];
    ///     let _ = s.try_read(&mut buf);
    /// }
    /// if ready.is_writable() {
    ///     let _ = s.try_write(b"ping");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        poll_fn(|cx| {
            let mut ready = Ready::EMPTY;
            if interest.is_readable() {
                match self.peek_one(cx) {
                    Poll::Ready(Ok(0)) => ready |= Ready::READABLE | Ready::READ_CLOSED,
                    Poll::Ready(Ok(_)) => ready |= Ready::READABLE,
                    Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::NotConnected => {
                        return Poll::Ready(Err(e));
                    }
                    // An error a read would return: ready (the read reports it).
                    Poll::Ready(Err(_)) => ready |= Ready::READABLE | Ready::READ_CLOSED,
                    Poll::Pending if self.read_ready() => ready |= Ready::READABLE,
                    Poll::Pending => {}
                }
            }
            if interest.is_writable() {
                match self.poll_write_ready(cx) {
                    Poll::Ready(Ok(())) => ready |= Ready::WRITABLE,
                    Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::NotConnected => {
                        return Poll::Ready(Err(e));
                    }
                    // An error a write would return: ready (the write reports it).
                    Poll::Ready(Err(_)) => ready |= Ready::WRITABLE | Ready::WRITE_CLOSED,
                    Poll::Pending => {}
                }
            }
            if ready.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(Ok(ready))
            }
        })
        .await
    }

    /// Reads what is there without waiting into `buf`'s spare room, advancing it.
    ///
    /// # Errors
    /// `WouldBlock` when nothing is there yet; otherwise as a read.
    pub fn try_read_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        // Straight from the receive buffer into `buf`'s room, initialized or not.
        let conn = &self.conn;
        let max = buf.remaining_mut();
        let r = conn
            .core
            .stack()
            .tcp_read_with(conn.id, max, |bytes| buf.put_slice(bytes), None);
        conn.note_read(&r);
        match r {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}
