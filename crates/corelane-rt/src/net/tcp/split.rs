//! The owned halves of a [`TcpStream`](super::TcpStream).

use std::sync::Arc;

use super::{Conn, TcpStream, async_read, async_write};

/// The reading half of a [`TcpStream`], from [`TcpStream::into_split`].
pub struct OwnedReadHalf {
    conn: Arc<Conn>,
}

/// The writing half of a [`TcpStream`], from [`TcpStream::into_split`]; dropping it sends FIN.
pub struct OwnedWriteHalf {
    /// None once given back by [`OwnedReadHalf::reunite`] (its drop then sends nothing).
    conn: Option<Arc<Conn>>,
}

impl std::fmt::Debug for OwnedReadHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedReadHalf").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for OwnedWriteHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedWriteHalf").finish_non_exhaustive()
    }
}

impl OwnedReadHalf {
    pub(super) fn pair(conn: Arc<Conn>) -> (OwnedReadHalf, OwnedWriteHalf) {
        (
            OwnedReadHalf { conn: conn.clone() },
            OwnedWriteHalf { conn: Some(conn) },
        )
    }

    pub(super) fn conn(&self) -> &Conn {
        &self.conn
    }

    /// Puts the halves back together.
    ///
    /// # Errors
    /// Gives both halves back when they are not of the same stream.
    pub fn reunite(
        self,
        mut w: OwnedWriteHalf,
    ) -> Result<TcpStream, (OwnedReadHalf, OwnedWriteHalf)> {
        match &w.conn {
            Some(c) if Arc::ptr_eq(&self.conn, c) => {
                // Taken out, so the write half's drop sends no FIN and holds no reference.
                w.conn = None;
                Ok(TcpStream::from_conn(self.conn))
            }
            _ => Err((self, w)),
        }
    }
}

impl OwnedWriteHalf {
    fn conn(&self) -> &Conn {
        self.conn
            .as_deref()
            .expect("a write half is only emptied by reunite, which consumes it")
    }
}

async_read!(OwnedReadHalf);
async_write!(OwnedWriteHalf);

/// The reading half of a borrowed [`TcpStream`], from [`TcpStream::split`].
pub struct ReadHalf<'a> {
    conn: &'a Conn,
}

/// The writing half of a borrowed [`TcpStream`], from [`TcpStream::split`]; shutting it down
/// sends FIN.
pub struct WriteHalf<'a> {
    conn: &'a Conn,
}

impl std::fmt::Debug for ReadHalf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadHalf").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for WriteHalf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteHalf").finish_non_exhaustive()
    }
}

impl<'a> ReadHalf<'a> {
    pub(super) fn pair(conn: &'a Conn) -> (ReadHalf<'a>, WriteHalf<'a>) {
        (ReadHalf { conn }, WriteHalf { conn })
    }

    pub(super) fn conn(&self) -> &Conn {
        self.conn
    }
}

impl WriteHalf<'_> {
    fn conn(&self) -> &Conn {
        self.conn
    }
}

async_read!(ReadHalf<'_>);
async_write!(WriteHalf<'_>);

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            let _ = c.shutdown();
        }
    }
}
