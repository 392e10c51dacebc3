//! TCP and UDP sockets on the current core, with tokio's `AsyncRead` and `AsyncWrite`, laid
//! out as tokio lays out its own: `tcp::{TcpListener, TcpStream, OwnedReadHalf,
//! OwnedWriteHalf}` and `UdpSocket`.
//!
//! Every socket lives on the core whose task created it: its state is in that core's
//! [`Stack`](corelane_stack::Stack), which the core's pipeline turns. The sockets are `Send` and
//! `Sync`, as tokio's are, so the libraries that need it take them (hyper-util's pooled client,
//! hyper's upgrades, `tonic::transport::Server`, anything spawned with `tokio::spawn`):
//!
//! - `tokio::spawn` on a core runs the task on that core: each core's executor is a
//!   current-thread runtime, which runs every task it is given on its own thread. A task that
//!   serves a socket of its core this way costs what a `spawn_local` one does.
//! - A socket that reaches another thread (another core's task, a pool shared by the cores)
//!   keeps working through its own core: each call locks that core's stack, and the task is
//!   woken across threads. That is correct and safe, and slower than staying put (the
//!   `cross_core` bench measures it); keep a core's connections on it where you can, as a pool
//!   per core does.
//! - Creating a socket (`connect`, `bind`) needs a core: outside one it fails with an error
//!   that says so.
//! - A socket works while its core runs: a core whose future returned has ended, and closed
//!   the connections it owns (a FIN, or a reset where data was unread), wherever they are
//!   held.
//!
//! A socket's task is woken only when that socket changes. Sockets call the core's stack,
//! which queues their output for the core's next pipeline turn; the driver is woken when there
//! is something to send.
//!
//! ```
//! # use corelane_rt as corelane;
//! fn needs_send_and_sync<T: Send + Sync>() {}
//! needs_send_and_sync::<corelane::net::TcpStream>();
//! needs_send_and_sync::<corelane::net::TcpListener>();
//! needs_send_and_sync::<corelane::net::UdpSocket>();
//! needs_send_and_sync::<corelane::net::OwnedReadHalf>();
//! needs_send_and_sync::<corelane::net::OwnedWriteHalf>();
//! fn needs_send<T: Send>() {}
//! needs_send::<corelane::net::TcpSocket>();
//! ```

mod addr;
mod glue;
pub mod tcp;
mod udp;
mod udp_poll;
mod udp_ready;

pub use addr::ToSocketAddr;
/// tokio's name for [`ToSocketAddr`], so that `A: ToSocketAddrs` bounds port as they are
/// (corelane takes addresses and ports, never host names to resolve).
pub use addr::ToSocketAddr as ToSocketAddrs;
#[cfg(feature = "hyper")]
pub use glue::Connector;
#[cfg(feature = "tonic")]
pub use glue::{ConnectInfo, Incoming};
pub use tcp::{OwnedReadHalf, OwnedWriteHalf, TcpListener, TcpSocket, TcpStream};
pub use udp::UdpSocket;

/// A `Cell` that may be shared between threads: a socket is `Sync`, as tokio's are.
#[derive(Debug, Default)]
pub(crate) struct SyncCell<T: Copy>(std::sync::Mutex<T>);

impl<T: Copy> SyncCell<T> {
    pub(crate) fn new(v: T) -> SyncCell<T> {
        SyncCell(std::sync::Mutex::new(v))
    }

    pub(crate) fn get(&self) -> T {
        *crate::lock::lock(&self.0)
    }

    pub(crate) fn set(&self, v: T) {
        *crate::lock::lock(&self.0) = v;
    }
}
