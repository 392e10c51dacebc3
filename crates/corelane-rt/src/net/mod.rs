//! TCP and UDP sockets on the current core, with tokio's `AsyncRead` and `AsyncWrite`, laid
//! out as tokio lays out its own: `tcp::{TcpListener, TcpStream, OwnedReadHalf,
//! OwnedWriteHalf}` and `UdpSocket`.
//!
//! Every socket lives on the core whose task created it and must stay there: the types are
//! `!Send`, so the compiler keeps them on their core (spawn their tasks with
//! `tokio::task::spawn_local`). A socket's task is woken only when that socket changes. Sockets
//! call the core's [`Stack`](corelane_stack::Stack), which queues their output for the core's
//! next pipeline turn; the driver is woken when there is something to send.
//!
//! The compiler refuses to move a socket to another thread:
//!
//! ```compile_fail
//! # use corelane_rt as corelane;
//! fn needs_send<T: Send>() {}
//! needs_send::<corelane::net::TcpStream>();
//! ```
//!
//! ```compile_fail
//! # use corelane_rt as corelane;
//! fn needs_send<T: Send>() {}
//! needs_send::<corelane::net::UdpSocket>();
//! ```
//!
//! ```compile_fail
//! # use corelane_rt as corelane;
//! fn needs_send<T: Send>() {}
//! needs_send::<corelane::net::TcpListener>();
//! ```

mod addr;
pub mod tcp;
mod udp;
mod udp_ready;

pub use addr::ToSocketAddr;
/// tokio's name for [`ToSocketAddr`], so that `A: ToSocketAddrs` bounds port as they are
/// (corelane takes addresses and ports, never host names to resolve).
pub use addr::ToSocketAddr as ToSocketAddrs;
pub use tcp::{OwnedReadHalf, OwnedWriteHalf, TcpListener, TcpSocket, TcpStream};
pub use udp::UdpSocket;

/// Makes a type `!Send` and `!Sync`: a socket belongs to the core whose task created it. A
/// named type, so that a compiler error about a socket moved to another thread (a
/// `tokio::spawn` of a future holding one) names the cause: spawn it with
/// `tokio::task::spawn_local`, on the socket's core.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SocketStaysOnItsCoreUseSpawnLocal(std::marker::PhantomData<*const ()>);

pub(crate) type NotSend = SocketStaysOnItsCoreUseSpawnLocal;
