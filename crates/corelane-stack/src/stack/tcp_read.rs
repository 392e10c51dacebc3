//! Reading what a TCP connection received: into a slice, or handed out as the receive
//! buffer's pieces to a buffer that need not be initialized (tokio's `ReadBuf`), taken or
//! peeked.

use std::io;
use std::task::{Poll, Waker};

use super::socket::ended;
use super::{FlowId, Stack};
use crate::copy::slice_put;

impl Stack {
    /// Reads what TCP flow `id` received into `buf`. `Ready(Ok(0))` with a non-empty `buf` is
    /// the end of the stream; `Pending` means nothing yet, and `waker` (if given) is woken when
    /// something arrives. A read that opens the window enough queues a window update.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone; `ConnectionReset` (or the error that ended the
    /// connection: `TimedOut`, `ConnectionRefused`) once it ended abnormally.
    pub fn tcp_read(
        &mut self,
        id: FlowId,
        buf: &mut [u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        let max = buf.len();
        self.tcp_take(id, max, &mut slice_put(buf), waker, false)
    }

    /// As [`Stack::tcp_read`], for a buffer whose free part need not be initialized (tokio's
    /// `ReadBuf`, which a slice would have to zero first, all of it, on every read): up to
    /// `max` bytes are handed to `put`, in order, in at most two pieces.
    ///
    /// ```
    /// # use corelane_stack::{Stack, FlowId};
    /// fn read_into(stack: &mut Stack, id: FlowId, out: &mut Vec<u8>) -> std::io::Result<usize> {
    ///     match stack.tcp_read_with(id, 4096, |bytes| out.extend_from_slice(bytes), None) {
    ///         std::task::Poll::Ready(r) => r,
    ///         std::task::Poll::Pending => Ok(0),
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    /// As [`Stack::tcp_read`].
    pub fn tcp_read_with(
        &mut self,
        id: FlowId,
        max: usize,
        mut put: impl FnMut(&[u8]),
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        self.tcp_take(id, max, &mut put, waker, false)
    }

    /// As [`Stack::tcp_read`], leaving the bytes to be read again.
    ///
    /// # Errors
    /// As [`Stack::tcp_read`].
    pub fn tcp_peek(
        &mut self,
        id: FlowId,
        buf: &mut [u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        let max = buf.len();
        self.tcp_take(id, max, &mut slice_put(buf), waker, true)
    }

    /// As [`Stack::tcp_read_with`], leaving the bytes to be read again.
    ///
    /// # Errors
    /// As [`Stack::tcp_read`].
    pub fn tcp_peek_with(
        &mut self,
        id: FlowId,
        max: usize,
        mut put: impl FnMut(&[u8]),
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        self.tcp_take(id, max, &mut put, waker, true)
    }

    /// Reads (or, with `peek`, copies without taking) up to `max` bytes of what TCP flow `id`
    /// received, handing them to `put`.
    fn tcp_take(
        &mut self,
        id: FlowId,
        max: usize,
        put: &mut dyn FnMut(&[u8]),
        waker: Option<&Waker>,
        peek: bool,
    ) -> Poll<io::Result<usize>> {
        let now = self.clock;
        self.poll_tcp(id, |c| {
            if c.readable() > 0 && max > 0 {
                if peek {
                    return (Poll::Ready(Ok(c.peek_with(max, put))), false);
                }
                let (n, update) = c.read_with(now, max, put);
                (Poll::Ready(Ok(n)), update)
            } else if c.fin_received() {
                // The peer's FIN came before whatever ended the connection since (a reset from
                // a peer that closed all the way): what it sent was all read, and that is the
                // end of it, as Linux reads it.
                (Poll::Ready(Ok(0)), false)
            } else if let Some(kind) = c.error() {
                (Poll::Ready(Err(ended(kind))), false)
            } else if c.at_eof() || max == 0 {
                (Poll::Ready(Ok(0)), false)
            } else {
                if let Some(w) = waker {
                    c.set_rx_waker(w);
                }
                (Poll::Pending, false)
            }
        })
    }
}
