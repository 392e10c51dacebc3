//! Connections the broker refuses (a user not granted, one with too many open), told why and
//! closed on a thread of their own.
//!
//! A refused client's hello may already wait unread when the broker closes: a unix socket
//! closed with unread data resets its peer, whose read then fails with ECONNRESET instead of
//! returning the reason waiting for it (seen: "the broker did not answer `hello`: Connection
//! reset by peer" where "uid N is not granted" was said). So the reason is sent, the socket's
//! reading side shut (a hello sent later fails at once, and the client reads the reason), what
//! arrived before is read away, and only then the socket closed.
//!
//! A refused connection carries no descriptor: the grant socket takes none before its user is
//! known to be granted (`SO_PASSRIGHTS`, inherited from the listener: a sender's `sendmsg`
//! with one fails), so no close here can block on a hostile one (a lingering TCP socket to a
//! zero window, a file of a FUSE server that never answers). While this thread is behind,
//! further refusals are told why and closed at once on the accept loop, which is as safe.
//! On a kernel that cannot refuse descriptors (before 6.16) the broker says so at start: there
//! a refused user's descriptor can still hold this thread up, and then the accept loop.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use nix::sys::socket::{MsgFlags, Shutdown, recv, shutdown};

/// Refusals waiting for the thread; past these, closed at once.
const WAITING: usize = 64;

/// Where the accept loop hands refused connections.
pub(crate) struct Refuser {
    tx: SyncSender<(OwnedFd, String)>,
}

impl Refuser {
    /// Starts the thread (`corelane-refuse`).
    pub(crate) fn start() -> std::io::Result<Refuser> {
        let (tx, rx) = sync_channel(WAITING);
        std::thread::Builder::new()
            .name("corelane-refuse".into())
            .spawn(move || serve(rx))?;
        Ok(Refuser { tx })
    }

    /// Tells `conn` why it is refused and closes it, on the thread when it has room.
    pub(crate) fn refuse(&self, conn: OwnedFd, why: String) {
        match self.tx.try_send((conn, why)) {
            Ok(()) => {}
            Err(TrySendError::Full((conn, why)) | TrySendError::Disconnected((conn, why))) => {
                let _ = corelane_xsk::grant::send_message(conn.as_raw_fd(), &why, None);
            }
        }
    }
}

fn serve(rx: Receiver<(OwnedFd, String)>) {
    while let Ok((conn, why)) = rx.recv() {
        let fd = conn.as_raw_fd();
        let _ = corelane_xsk::grant::send_message(fd, &why, None);
        let _ = shutdown(fd, Shutdown::Read);
        let mut buf = [0u8; 512];
        // What arrived before the shutdown (a few messages at most: a client says hello and
        // waits).
        for _ in 0..16 {
            match recv(fd, &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        drop(conn);
    }
}
