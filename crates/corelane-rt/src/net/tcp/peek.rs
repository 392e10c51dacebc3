//! The rest of tokio's `TcpStream` surface: peeking from the stream and its read halves,
//! vectored `try_*` calls, and the socket options corelane answers the way tokio's callers
//! expect.

use std::future::poll_fn;
use std::io::{self, IoSlice, IoSliceMut};
use std::task::{Context, Poll};

use tokio::io::ReadBuf;

use super::{Conn, OwnedReadHalf, ReadHalf, TcpStream};

impl Conn {
    /// Copies what is there into `buf` without taking it; the count copied.
    fn poll_peek(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<usize>> {
        let max = buf.remaining();
        let r = self.core.stack().tcp_peek_with(
            self.id,
            max,
            |bytes| buf.put_slice(bytes),
            Some(cx.waker()),
        );
        if r.is_pending() {
            self.read_ready
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
}

impl TcpStream {
    /// Waits for bytes and copies them into `buf` without taking them (the next read returns
    /// them again); 0 at the end of the stream. As [`peek`](Self::peek), for a hand-written
    /// future.
    ///
    /// # Errors
    /// As a read: the connection was reset, timed out or is gone.
    pub fn poll_peek(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<usize>> {
        self.conn.poll_peek(cx, buf)
    }

    /// Reads what is there without waiting into `bufs`, in order, as `readv` would.
    ///
    /// # Errors
    /// `WouldBlock` when nothing is there yet; otherwise as a read.
    pub fn try_read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        in_order(bufs.iter_mut().map(|b| &mut **b), |b| self.try_read(b))
    }

    /// Queues what fits of `bufs`, in order, without waiting, as `writev` would.
    ///
    /// # Errors
    /// `WouldBlock` when the send buffer is full; otherwise as a write.
    pub fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        in_order(bufs.iter().map(|b| &**b), |b| self.try_write(b))
    }

    /// Dropping the stream resets the connection (RST, unsent data dropped), as
    /// `set_linger(Some(Duration::ZERO))`.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_zero_linger(&self) -> io::Result<()> {
        self.set_linger(Some(std::time::Duration::ZERO))
    }

    /// How many of the bytes still to read are urgent data (TCP's urgent mechanism, RFC 9293
    /// 3.8.5): up to the point the peer's urgent pointer marked, 0 when none is pending. The
    /// urgent data is read in order with the rest (inline, as a kernel socket with
    /// `SO_OOBINLINE` set): this says where it ends. Readiness tells that it came, as for any
    /// data.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f(s: &mut corelane::net::TcpStream) -> std::io::Result<()> {
    /// use tokio::io::AsyncReadExt;
    /// // A telnet-like reader: what the peer marked urgent (an interrupt) comes first.
    /// let urgent = s.urgent_remaining()?;
    /// let mut head = vec![0u8; urgent];
    /// s.read_exact(&mut head).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn urgent_remaining(&self) -> io::Result<usize> {
        self.conn.core.stack().tcp_urgent(self.conn.id)
    }

    /// What [`set_quickack`](Self::set_quickack) set (true unless set): corelane
    /// acknowledges what a turn of the core received at the end of that turn, never later,
    /// whatever this says (there is no delayed ACK to turn off).
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn quickack(&self) -> io::Result<bool> {
        Ok(self
            .conn
            .quickack
            .load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Kept and read back by [`quickack`](Self::quickack); the ACKs do not change: every one
    /// is already quick.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_quickack(&self, quickack: bool) -> io::Result<()> {
        self.conn
            .quickack
            .store(quickack, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Runs `op` on each non-empty buffer in order until one is not filled (or taken) whole: the
/// bytes moved, or the first call's error when none moved.
fn in_order<B: AsRef<[u8]>>(
    bufs: impl Iterator<Item = B>,
    mut op: impl FnMut(B) -> io::Result<usize>,
) -> io::Result<usize> {
    let mut total = 0;
    for b in bufs {
        let len = b.as_ref().len();
        if len == 0 {
            continue;
        }
        match op(b) {
            Ok(n) => {
                total += n;
                if n < len {
                    break;
                }
            }
            Err(_) if total > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

macro_rules! peek_half {
    ($t:ty) => {
        impl $t {
            /// Waits for bytes and copies them into `buf` without taking them (the next read
            /// returns them again); 0 at the end of the stream.
            ///
            /// # Errors
            /// As a read: the connection was reset, timed out or is gone.
            ///
            /// # Cancel safety
            /// Cancel safe.
            pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let mut buf = ReadBuf::new(buf);
                poll_fn(|cx| self.conn().poll_peek(cx, &mut buf)).await
            }

            /// As [`peek`](Self::peek), for a hand-written future.
            ///
            /// # Errors
            /// As a read.
            pub fn poll_peek(
                &mut self,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<usize>> {
                self.conn().poll_peek(cx, buf)
            }
        }
    };
}

peek_half!(OwnedReadHalf);
peek_half!(ReadHalf<'_>);
