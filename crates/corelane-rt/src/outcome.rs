//! A core future's error, and the future tasks await to learn that the run is ending.
//!
//! Under [`Runtime::try_run`](crate::Runtime::try_run) a core's future returns a `Result`, as
//! `main` may under `#[tokio::main]`, and its error ends the run. A task that holds a connection open (an idle
//! keep-alive, a stream waiting for a request) awaits [`shutdown_requested`] to close it with
//! a FIN when a graceful shutdown begins, rather than have it reset when the grace runs out.

use std::io;

/// Completes when the run begins to end: a graceful
/// [`shutdown`](crate::StopHandle::shutdown) (listeners are closed; the tasks have the grace to
/// finish), a [`stop`](crate::StopHandle::stop), or another core's failure. At once if that
/// has already happened. Await it beside a connection's reads, as a tokio service awaits its
/// shutdown signal, and close the connection when it fires:
///
/// ```no_run
/// # use corelane_rt as corelane;
/// use corelane::net::TcpStream;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// async fn serve(mut s: TcpStream) -> std::io::Result<()> {
///     let mut buf = vec![0; 4096];
///     // Made once, outside the loop: each wait registers with the runtime.
///     let shutdown = corelane::shutdown_requested();
///     tokio::pin!(shutdown);
///     loop {
///         tokio::select! {
///             n = s.read(&mut buf) => match n? {
///                 0 => return Ok(()),
///                 n => s.write_all(&buf[..n]).await?,
///             },
///             // An idle connection closes with a FIN, not a reset after the grace.
///             _ = &mut shutdown => return s.shutdown().await,
///         }
///     }
/// }
/// ```
///
/// # Errors
/// Outside a corelane core (nothing to wait for).
pub async fn shutdown_requested() -> io::Result<()> {
    let core = crate::lane::current()?;
    let life = &core.shared.life;
    loop {
        let asked = life.asked.notified();
        tokio::pin!(asked);
        // Registered before the check, so an announcement between the two is not missed.
        asked.as_mut().enable();
        if life.stop.load(std::sync::atomic::Ordering::SeqCst) || life.draining() {
            return Ok(());
        }
        asked.await;
    }
}
