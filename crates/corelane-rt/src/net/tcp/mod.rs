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
    /// `set_linger(Some(0))`: the last holder's drop resets instead of closing.
    pub(crate) reset_on_drop: std::sync::atomic::AtomicBool,
}

impl Conn {
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let r = self
            .core
            .stack()
            .tcp_read(self.id, buf.initialize_unfilled(), Some(cx.waker()));
        if let Poll::Ready(Ok(n)) = r {
            buf.advance(n);
            if n > 0 {
                // Reading opened the window: the driver sends the update.
                self.core.wake_driver();
            }
        }
        r.map_ok(|_| ())
    }

    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = self.core.stack().tcp_write(self.id, buf, Some(cx.waker()));
        if let Poll::Ready(Ok(_)) = r {
            self.core.wake_driver();
        }
        r
    }

    fn shutdown(&self) -> io::Result<()> {
        self.core.stack().tcp_shutdown(self.id)?;
        self.core.wake_driver();
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self
            .reset_on_drop
            .load(std::sync::atomic::Ordering::Relaxed)
        {
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
