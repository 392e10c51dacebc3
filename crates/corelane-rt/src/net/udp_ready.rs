//! Readiness of a UDP socket as tokio offers it: `readable`, `writable`, `ready`, the `try_*`
//! calls that never wait, and the TTL.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use bytes::BufMut;
use tokio::io::{Interest, Ready};

use super::UdpSocket;

impl UdpSocket {
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self
            .core
            .stack()
            .udp_peek_from(self.id, &mut [], Some(cx.waker()))
        {
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::NotConnected && self.gone() => {
                Poll::Ready(Err(e))
            }
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    /// True when the socket's flow is gone (not merely draining).
    fn gone(&self) -> bool {
        self.core.stack().udp_ttl(self.id).is_err()
    }

    fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.core
            .stack()
            .udp_poll_writable(self.id, Some(cx.waker()))
    }

    /// Waits until a datagram waits (or a receive would return an error at once).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::UdpSocket;
    /// let sock = UdpSocket::bind(7).await?;
    /// let mut buf = [0u8; 2048];
    /// loop {
    ///     sock.readable().await?;
    ///     match sock.try_recv_from(&mut buf) {
    ///         Ok((n, from)) => {
    ///             let _ = sock.try_send_to(&buf[..n], from);
    ///         }
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// `NotConnected` when the socket is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn readable(&self) -> io::Result<()> {
        poll_fn(|cx| self.poll_readable(cx)).await
    }

    /// Waits until the send queue has room for a datagram.
    ///
    /// # Errors
    /// `NotConnected` when the socket is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn writable(&self) -> io::Result<()> {
        poll_fn(|cx| self.poll_writable(cx)).await
    }

    /// Waits until the socket is ready for any of `interest`, and says for which.
    ///
    /// # Errors
    /// `NotConnected` when the socket is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        poll_fn(|cx| {
            let mut ready = Ready::EMPTY;
            if interest.is_readable() {
                match self.poll_readable(cx) {
                    Poll::Ready(Ok(())) => ready |= Ready::READABLE,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            }
            if interest.is_writable() {
                match self.poll_writable(cx) {
                    Poll::Ready(Ok(())) => ready |= Ready::WRITABLE,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
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

    /// Takes a datagram that waits, without waiting: the bytes copied into `buf` (a longer
    /// datagram is cut to it) and its sender.
    ///
    /// # Errors
    /// `WouldBlock` when none waits; otherwise as [`recv_from`](Self::recv_from).
    pub fn try_recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        match self.core.stack().udp_recv_from(self.id, buf, None) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Takes a datagram from the connected peer that waits, without waiting (datagrams from
    /// others are dropped).
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); `WouldBlock` when none waits.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let peer = self.peer_addr()?;
        self.refused(peer)?;
        loop {
            let (n, from) = self.try_recv_from(buf)?;
            if from == peer {
                return Ok(n);
            }
        }
    }

    /// Queues one datagram to `target` without waiting.
    ///
    /// # Errors
    /// `WouldBlock` when the send queue is full; otherwise as [`send_to`](Self::send_to).
    pub fn try_send_to(&self, buf: &[u8], target: SocketAddr) -> io::Result<usize> {
        match self.core.stack().udp_send_to(self.id, buf, target, None) {
            Poll::Ready(r) => {
                self.core.wake_driver();
                r
            }
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Queues one datagram to the connected peer without waiting.
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); `WouldBlock` when the send queue is
    /// full.
    pub fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        let peer = self.peer_addr()?;
        self.refused(peer)?;
        self.try_send_to(buf, peer)
    }

    /// Sets the TTL (IPv4) or hop limit (IPv6) of the datagrams this socket sends.
    ///
    /// # Errors
    /// `InvalidInput` for 0 or more than 255; `NotConnected` when the socket is gone.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.core.stack().udp_set_ttl(self.id, ttl)
    }

    /// The TTL (IPv4) or hop limit (IPv6) of the datagrams this socket sends (64 unless set).
    ///
    /// # Errors
    /// `NotConnected` when the socket is gone.
    pub fn ttl(&self) -> io::Result<u32> {
        self.core.stack().udp_ttl(self.id)
    }

    /// Copies the next datagram from the connected peer into `buf` without taking it (one
    /// from another sender is dropped, as [`recv`](Self::recv) would).
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); otherwise as
    /// [`peek_from`](Self::peek_from).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let peer = self.peer_addr()?;
        loop {
            let (n, from) = self.peek_from(buf).await?;
            if from == peer {
                return Ok(n);
            }
            // Not the peer's: taken and dropped, as the kernel's filter would have.
            self.recv_from(&mut []).await?;
        }
    }

    /// None: corelane keeps no pending error on a socket (`SO_ERROR`); an error comes back
    /// from the call that meets it.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(None)
    }

    /// Takes a datagram that waits into `buf`'s spare room without waiting, advancing it
    /// (what does not fit is cut, as with a slice); its length and sender.
    ///
    /// # Errors
    /// `WouldBlock` when none waits; otherwise as [`try_recv_from`](Self::try_recv_from).
    pub fn try_recv_buf_from<B: BufMut>(&self, buf: &mut B) -> io::Result<(usize, SocketAddr)> {
        let mut chunk = vec![0u8; buf.remaining_mut().min(MAX_DATAGRAM)];
        let (n, from) = self.try_recv_from(&mut chunk)?;
        buf.put_slice(&chunk[..n]);
        Ok((n, from))
    }

    /// As [`try_recv_buf_from`](Self::try_recv_buf_from), from the connected peer.
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); `WouldBlock` when none waits.
    pub fn try_recv_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        let mut chunk = vec![0u8; buf.remaining_mut().min(MAX_DATAGRAM)];
        let n = self.try_recv(&mut chunk)?;
        buf.put_slice(&chunk[..n]);
        Ok(n)
    }

    /// Waits for a datagram and takes it into `buf`'s spare room, advancing it; its length and
    /// sender.
    ///
    /// # Errors
    /// As [`recv_from`](Self::recv_from).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv_buf_from<B: BufMut>(&self, buf: &mut B) -> io::Result<(usize, SocketAddr)> {
        let mut chunk = vec![0u8; buf.remaining_mut().min(MAX_DATAGRAM)];
        let (n, from) = self.recv_from(&mut chunk).await?;
        buf.put_slice(&chunk[..n]);
        Ok((n, from))
    }

    /// As [`recv_buf_from`](Self::recv_buf_from), from the connected peer.
    ///
    /// # Errors
    /// As [`recv`](Self::recv).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        let mut chunk = vec![0u8; buf.remaining_mut().min(MAX_DATAGRAM)];
        let n = self.recv(&mut chunk).await?;
        buf.put_slice(&chunk[..n]);
        Ok(n)
    }
}

/// The largest UDP payload (over IPv4; a receive into a larger buffer takes no more).
const MAX_DATAGRAM: usize = 65_507;
