//! QUIC on a corelane core: an endpoint per core driving quinn-proto's sans-IO state machine
//! over one of the core's UDP sockets, with quinn-shaped types.
//!
//! A quinn user ports by the imports and the entry point, as with TCP: [`Endpoint::server`]
//! and [`Endpoint::client`] bind a [`UdpSocket`] of the calling core
//! (serve one port from every core by binding it on every core), [`Endpoint::accept`] and
//! [`Endpoint::connect`] give [`Connection`]s, whose [`SendStream`] and [`RecvStream`] are
//! tokio's `AsyncWrite` and `AsyncRead`. The configs are quinn-proto's ([`ServerConfig`],
//! [`ClientConfig`]), with rustls as the crypto.
//!
//! The endpoint's driver is a task on the core: it reads every datagram waiting, hands each
//! to the state machine, and sends what every connection may send now; its timers are the
//! core's clock (the host's, so a simulation can drive it). Nothing is shared with another
//! core: a connection lives on the core whose socket its first packet came in on, and the
//! connection IDs it gives out name that core, so a later datagram that lands on another
//! core's queue (the client's address or port changed: a NAT rebinding, a migration) is
//! handed back to it by the stack.
//!
//! ```no_run
//! # async fn serve(config: corelane_rt::quic::ServerConfig) -> std::io::Result<()> {
//! use corelane_rt::quic::Endpoint;
//! use tokio::io::AsyncWriteExt;
//!
//! let endpoint = Endpoint::server(config, "0.0.0.0:4433")?;
//! while let Some(incoming) = endpoint.accept().await {
//!     tokio::task::spawn_local(async move {
//!         let Ok(conn) = incoming.await else { return };
//!         while let Ok((mut send, mut recv)) = conn.accept_bi().await {
//!             let _ = tokio::io::copy(&mut recv, &mut send).await;
//!             let _ = send.shutdown().await;
//!         }
//!     });
//! }
//! # Ok(()) }
//! ```

mod cid;
mod conn;
mod driver;
pub(crate) mod fuzz;
#[cfg(feature = "h3")]
pub mod h3;
#[cfg(feature = "sim")]
pub mod sim;
mod stream;

use std::future::{Future, IntoFuture};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

pub use conn::{Connecting, Connection, SendDatagramError};
pub use quinn_proto::{
    ClientConfig, ClosedStream, ConnectError, ConnectionError, EndpointConfig, ServerConfig,
    StreamId, TransportConfig, VarInt,
};
pub use stream::{ReadError, RecvStream, SendStream, WriteError};

use crate::net::{ToSocketAddr, UdpSocket};
use driver::State;

/// A QUIC endpoint on the calling core: a server, a client, or both.
///
/// Cheap to clone: the clones are the same endpoint. Dropping the last one (and every
/// connection of it) ends its driver.
#[derive(Clone)]
pub struct Endpoint {
    shared: Arc<Shared>,
}

/// What the endpoint's handles and its driver share.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Wakes the driver: a connection has something to send, or a handle went.
    driver: Mutex<Option<Waker>>,
    /// A pass was asked for since the driver last looked.
    pass_asked: AtomicBool,
    local: SocketAddr,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connection `h` has something to do (the application wrote, read, opened, closed):
    /// the driver's next pass looks at it.
    pub(crate) fn poke(&self, h: quinn_proto::ConnectionHandle) {
        self.lock().mark(h);
        self.wake_driver();
    }

    /// Asks the driver for a pass: something may be sent now.
    pub(crate) fn wake_driver(&self) {
        self.pass_asked.store(true, Ordering::Release);
        if let Some(w) = self.driver.lock().unwrap_or_else(|p| p.into_inner()).take() {
            w.wake();
        }
    }
}

impl Endpoint {
    /// A server endpoint on `addr` of the calling core, which also connects out (with a
    /// client config, [`Endpoint::set_default_client_config`]).
    ///
    /// # Errors
    /// As [`UdpSocket::bind`](crate::net::UdpSocket::bind): an address the runtime does not
    /// own, a port in use, outside a corelane core.
    ///
    /// The endpoint sets the config's address-validation token key from the runtime's
    /// master key: every core of the run, and the next process of an upgrade, accepts the
    /// tokens the others gave.
    pub fn server(config: ServerConfig, addr: impl ToSocketAddr) -> io::Result<Endpoint> {
        Endpoint::open(Some(config), addr)
    }

    /// A client endpoint on `addr` of the calling core (port 0 picks one this core owns).
    ///
    /// # Errors
    /// As [`Endpoint::server`].
    pub fn client(addr: impl ToSocketAddr) -> io::Result<Endpoint> {
        Endpoint::open(None, addr)
    }

    fn open(server: Option<ServerConfig>, addr: impl ToSocketAddr) -> io::Result<Endpoint> {
        let socket = UdpSocket::bind_now(addr.to_socket_addr()?)?;
        let local = socket.local_addr()?;
        let core = crate::lane::current()?;
        let clock = core.shared.clock.clone();
        let keys = core.stack().quic_keys();
        let steer = socket.steer_quic()?;
        let ep = state_machine(keys, server, move || cid::CoreCids::new(steer), None);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(ep, clock)),
            driver: Mutex::new(None),
            pass_asked: AtomicBool::new(false),
            local,
        });
        tokio::task::spawn_local(driver::drive(Arc::downgrade(&shared), socket));
        Ok(Endpoint { shared })
    }

    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.shared.local)
    }

    /// The config [`Endpoint::connect`] uses.
    pub fn set_default_client_config(&self, config: ClientConfig) {
        self.shared.lock().client_config = Some(config);
    }

    /// Connects to `addr`, naming the server `server_name` (what its certificate must say),
    /// with the default client config.
    ///
    /// # Errors
    /// No default client config, or quinn-proto's refusal (an unsupported address, no
    /// connection IDs left).
    pub fn connect(&self, addr: SocketAddr, server_name: &str) -> Result<Connecting, ConnectError> {
        let config = self
            .shared
            .lock()
            .client_config
            .clone()
            .ok_or(ConnectError::NoDefaultClientConfig)?;
        self.connect_with(config, addr, server_name)
    }

    /// [`Endpoint::connect`] with `config`.
    ///
    /// # Errors
    /// As [`Endpoint::connect`].
    pub fn connect_with(
        &self,
        config: ClientConfig,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<Connecting, ConnectError> {
        let handle = self.shared.lock().connect(config, addr, server_name)?;
        self.shared.wake_driver();
        Ok(Connecting::new(self.shared.clone(), handle))
    }

    /// The next connection a client opens to this endpoint; None once the endpoint is
    /// closed.
    pub async fn accept(&self) -> Option<Incoming> {
        std::future::poll_fn(|cx| self.shared.lock().poll_incoming(cx))
            .await
            .map(|incoming| Incoming {
                shared: self.shared.clone(),
                incoming: Some(Box::new(incoming)),
            })
    }

    /// Closes every connection with `code` and `reason`, and accepts no more.
    pub fn close(&self, code: VarInt, reason: &[u8]) {
        self.shared.lock().close_all(code, reason);
        self.shared.wake_driver();
    }

    /// Waits until every connection of the endpoint has ended (closed, and its closing
    /// period over).
    pub async fn wait_idle(&self) {
        std::future::poll_fn(|cx| self.shared.lock().poll_idle(cx)).await
    }
}

/// The endpoint's state machine, under the stack's QUIC `keys` (stateless reset, token):
/// the reset key follows the host's restart key, so the next process resets this one's
/// connections in words their peers recognise; the token key is the run's, so every core and
/// the next process of an upgrade accept the others' tokens. Its connection IDs come from
/// `cids`, which name this core: a datagram another core receives (the peer's address or port
/// changed) is handed here.
fn state_machine<N: cid::Nonces>(
    (reset, token): ([u8; 32], [u8; 32]),
    server: Option<ServerConfig>,
    cids: impl Fn() -> cid::CoreCids<N> + Send + Sync + 'static,
    rng_seed: Option<[u8; 32]>,
) -> quinn_proto::Endpoint {
    let server = server.map(|mut s| {
        let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &[]);
        s.token_key(Arc::new(salt.extract(&token)));
        Arc::new(s)
    });
    let reset = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &reset);
    let mut config = EndpointConfig::new(Arc::new(reset));
    config.cid_generator(move || Box::new(cids()));
    quinn_proto::Endpoint::new(Arc::new(config), server, true, rng_seed)
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // The driver ends once no handle is left.
        self.shared.wake_driver();
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("local", &self.shared.local)
            .finish_non_exhaustive()
    }
}

/// A connection a client is opening, before the server has taken its part: accept it (await
/// it, or [`Incoming::accept`]) or [`Incoming::refuse`] it.
pub struct Incoming {
    shared: Arc<Shared>,
    incoming: Option<Box<quinn_proto::Incoming>>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("remote", &self.remote_address())
            .finish_non_exhaustive()
    }
}

impl Incoming {
    /// The client's address (not yet validated).
    pub fn remote_address(&self) -> SocketAddr {
        self.incoming
            .as_ref()
            .map_or(self.shared.local, |i| i.remote_address())
    }

    /// Takes the connection's handshake on.
    ///
    /// # Errors
    /// The state machine refused it (the endpoint closed, a bad first packet).
    pub fn accept(mut self) -> Result<Connecting, ConnectionError> {
        let Some(incoming) = self.incoming.take() else {
            return Err(ConnectionError::LocallyClosed);
        };
        let handle = self.shared.lock().accept(*incoming)?;
        self.shared.wake_driver();
        Ok(Connecting::new(self.shared.clone(), handle))
    }

    /// Whether the client's address is validated: it came back with a token this endpoint
    /// (or another core's, or the last process's) gave it.
    pub fn remote_address_validated(&self) -> bool {
        self.incoming
            .as_ref()
            .is_some_and(|i| i.remote_address_validated())
    }

    /// Answers with a Retry: the client comes back with a token that proves its address (a
    /// new `Incoming`, [`Incoming::remote_address_validated`]), and until then the server
    /// holds nothing for it. What a server under a flood of first packets does.
    ///
    /// # Errors
    /// The client came with a token already (it may not be retried twice): the `Incoming`
    /// comes back, to accept or refuse.
    pub fn retry(mut self) -> Result<(), Incoming> {
        let Some(i) = self.incoming.take() else {
            return Ok(());
        };
        let r = self.shared.lock().retry(*i);
        self.shared.wake_driver();
        r.map_err(|i| Incoming {
            shared: self.shared.clone(),
            incoming: Some(i),
        })
    }

    /// Refuses the connection (the client is told so).
    pub fn refuse(mut self) {
        if let Some(i) = self.incoming.take() {
            self.shared.lock().refuse(*i);
            self.shared.wake_driver();
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        // Neither accepted nor refused: refused.
        if let Some(i) = self.incoming.take() {
            self.shared.lock().refuse(*i);
            self.shared.wake_driver();
        }
    }
}

impl IntoFuture for Incoming {
    type Output = Result<Connection, ConnectionError>;
    type IntoFuture = IncomingFuture;

    fn into_future(self) -> IncomingFuture {
        IncomingFuture(Some(self.accept()))
    }
}

/// An [`Incoming`] accepted and awaited: the connection once its handshake is done.
#[derive(Debug)]
pub struct IncomingFuture(Option<Result<Connecting, ConnectionError>>);

impl Future for IncomingFuture {
    type Output = Result<Connection, ConnectionError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.0.as_mut() {
            Some(Ok(c)) => Pin::new(c).poll(cx),
            Some(Err(_)) => match self.0.take() {
                Some(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
            None => Poll::Pending,
        }
    }
}
