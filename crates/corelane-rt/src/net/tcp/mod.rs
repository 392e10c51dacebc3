//! TCP: a listener per core and port, streams, and their owned halves.

mod listener;
mod peek;
mod ready;
mod socket;
mod split;
mod stream;

pub use listener::TcpListener;
pub use socket::TcpSocket;
pub use split::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, WriteHalf};
pub use stream::TcpStream;

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};

use corelane_stack::FlowId;
use tokio::io::ReadBuf;

use crate::lane::Core;

/// One connection as its stream or halves hold it; released (FIN, then freed) when the last
/// holder drops it.
pub(crate) struct Conn {
    pub(crate) core: Arc<Core>,
    pub(crate) id: FlowId,
    /// What `set_linger` set ([`Linger`]); zero: the last holder's drop resets instead of
    /// closing.
    pub(crate) linger: Linger,
    /// Write readiness as tokio keeps it: set when room was seen, cleared only when a write
    /// found none, so `writable()` after a partial write is still ready (the next write says
    /// `WouldBlock`, and only then does `writable()` wait).
    pub(crate) write_ready: std::sync::atomic::AtomicBool,
    /// Read readiness, kept the same way: a new stream is assumed readable until a read (or
    /// peek) finds nothing.
    pub(crate) read_ready: std::sync::atomic::AtomicBool,
    /// What `set_quickack` set (read back only: every ACK is quick).
    pub(crate) quickack: std::sync::atomic::AtomicBool,
}

impl Conn {
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // Into the buffer's free part as it is: zeroing it first (`initialize_unfilled`) cost
        // a pass over all of it on every read, 8 KiB a request under hyper.
        let max = buf.remaining();
        let r = self.core.stack().tcp_read_with(
            self.id,
            max,
            |bytes| buf.put_slice(bytes),
            Some(cx.waker()),
        );
        self.note_read(&r);
        r.map_ok(|_| ())
    }

    /// Keeps read readiness after a read's outcome `r` (and wakes the driver when reading
    /// opened the window: it sends the update).
    pub(crate) fn note_read(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) if *n > 0 => self.core.wake_driver(),
            Poll::Pending => self
                .read_ready
                .store(false, std::sync::atomic::Ordering::Relaxed),
            _ => {}
        }
    }

    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = self.core.stack().tcp_write(self.id, buf, Some(cx.waker()));
        self.note_write(&r);
        r
    }

    /// Queues `bufs` in order until one does not fit whole, as `writev` would: the bytes
    /// queued; `Pending` (waker registered) only when none fit. hyper and others write a
    /// response's head and body this way when the stream says it is vectored, instead of
    /// copying both into one buffer first.
    fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut total = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            // Only a write that has queued nothing yet waits.
            let waker = (total == 0).then_some(cx.waker());
            match self.core.stack().tcp_write(self.id, b, waker) {
                Poll::Ready(Ok(n)) => {
                    total += n;
                    if n < b.len() {
                        break;
                    }
                }
                r @ (Poll::Ready(Err(_)) | Poll::Pending) if total == 0 => {
                    self.note_write(&r);
                    return r;
                }
                _ => break,
            }
        }
        let r = Poll::Ready(Ok(total));
        self.note_write(&r);
        r
    }

    /// Keeps write readiness after a write's outcome `r` (and wakes the driver for data).
    pub(crate) fn note_write(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(_)) => self.core.wake_driver(),
            Poll::Pending => self
                .write_ready
                .store(false, std::sync::atomic::Ordering::Relaxed),
            Poll::Ready(Err(_)) => {}
        }
    }

    fn shutdown(&self) -> io::Result<()> {
        self.core.stack().tcp_shutdown(self.id)?;
        self.core.wake_driver();
        Ok(())
    }
}

/// A linger setting (`SO_LINGER`) as one atomic: None, or a duration in nanoseconds.
#[derive(Debug)]
pub(crate) struct Linger(std::sync::atomic::AtomicU64);

impl Linger {
    const OFF: u64 = u64::MAX;

    pub(crate) fn new(d: Option<std::time::Duration>) -> Linger {
        let l = Linger(std::sync::atomic::AtomicU64::new(Self::OFF));
        l.set(d);
        l
    }

    pub(crate) fn set(&self, d: Option<std::time::Duration>) {
        let v = d.map_or(Self::OFF, |d| {
            u64::try_from(d.as_nanos())
                .unwrap_or(Self::OFF - 1)
                .min(Self::OFF - 1)
        });
        self.0.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> Option<std::time::Duration> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            Self::OFF => None,
            n => Some(std::time::Duration::from_nanos(n)),
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.linger.get() == Some(std::time::Duration::ZERO) {
            self.core.stack().abort(self.id);
        }
        self.core.stack().release(self.id);
        self.core.wake_driver();
    }
}

/// tokio's reading trait for a type with a `conn: Arc<Conn>`.
macro_rules! async_read {
    ($t:ty) => {
        impl tokio::io::AsyncRead for $t {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                self.conn().poll_read(cx, buf)
            }
        }
    };
}

/// tokio's writing trait for a type with a `conn: Arc<Conn>`. Flush has nothing to wait for:
/// written bytes are in the socket's send buffer and the driver sends them this turn.
macro_rules! async_write {
    ($t:ty) => {
        impl tokio::io::AsyncWrite for $t {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                self.conn().poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                self.conn().poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Ok(()))
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(self.conn().shutdown())
            }
        }
    };
}

pub(crate) use {async_read, async_write};
