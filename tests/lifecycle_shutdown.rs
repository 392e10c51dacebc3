//! How a run ends when the application says so: under `try_run`, a core future that returns
//! an error (`?` in it, as in a `#[tokio::main]` function) stops the run with that error; tasks that await
//! `shutdown_requested` close their idle connections with a FIN when a graceful shutdown
//! begins, instead of having them reset when the grace runs out.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use corelane::net::TcpListener;
use corelane_testnet::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[test]
fn a_core_future_that_returns_an_error_stops_the_run_with_it() -> Result {
    if !require_root("lifecycle: a core future's error") {
        return Ok(());
    }
    let net = net(1);
    let starts = Arc::new(AtomicUsize::new(0));
    let counted = starts.clone();
    let ifname = net.server_if().to_string();
    let server = net.server_ns().spawn(move || {
        let rt = corelane::Runtime::builder(&ifname)
            .addr("10.77.0.3/24")
            .cores(1)
            .build()
            .map_err(|e| e.to_string())?;
        rt.try_run(|_| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                let _held = TcpListener::bind(7).await?;
                let _again = TcpListener::bind(7).await?;
                Ok::<(), std::io::Error>(())
            }
        })
        .map_err(|e| e.to_string())
    })?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !server.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.is_finished(), "the run ended by itself");
    let e = server.join()?.err().ok_or("an error")?;
    assert!(
        e.contains("the future on core 0 failed") && e.contains("in use"),
        "{e}"
    );
    assert_eq!(starts.load(Ordering::SeqCst), 1, "an error is not retried");
    Ok(())
}

/// Echoes until the peer closes, or closes itself (FIN) once a shutdown begins.
async fn echo_until_shutdown(mut s: corelane::net::TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; 4096];
    let shutdown = corelane::shutdown_requested();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            n = s.read(&mut buf) => match n? {
                0 => return Ok(()),
                n => s.write_all(&buf[..n]).await?,
            },
            r = &mut shutdown => {
                r?;
                return s.shutdown().await;
            }
        }
    }
}

#[test]
fn a_graceful_shutdown_closes_idle_connections_with_a_fin() -> Result {
    if !require_root("lifecycle: idle connections at a shutdown") {
        return Ok(());
    }
    let net = net(1);
    let served = serve_on(
        &net,
        |b| b.cores(1),
        |_| async {
            let l = TcpListener::bind(7).await.expect("bind");
            while let Ok((s, _)) = l.accept().await {
                tokio::task::spawn_local(echo_until_shutdown(s));
            }
        },
    )?;
    let to: SocketAddr = "10.77.0.3:7".parse()?;
    // Three clients say hello, then sit idle (`connect` tries again while the port is not
    // bound yet: refused at once, as a kernel's is).
    let idle: Vec<TcpStream> = net.client_ns().run(move || {
        (0..3)
            .map(|_| {
                let mut s = common::connect(to)?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                let mut b = [0u8; 5];
                s.write_all(b"hello")?;
                s.read_exact(&mut b)?;
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()
    })??;
    served.stop.shutdown(Duration::from_secs(8));
    for mut s in idle {
        let mut b = [0u8; 16];
        // A FIN: end of stream, not a reset (which `read` returns as an error).
        assert_eq!(s.read(&mut b)?, 0, "the idle connection ends with a FIN");
    }
    let report = served.thread.join()??;
    assert!(report.stopped);
    let reset: u64 = report
        .cores
        .iter()
        .map(|c| c.stats.stack.reset_at_stop)
        .sum();
    assert_eq!(reset, 0, "nothing had to be reset");
    Ok(())
}

/// The http example under SIGTERM with keep-alive clients sitting idle: hyper's graceful
/// shutdown, started by `shutdown_requested`, closes each with a FIN, and nothing is reset.
#[test]
fn the_http_example_closes_idle_keep_alive_connections_on_sigterm() -> Result {
    if !require_root("lifecycle: the http example's idle connections") {
        return Ok(());
    }
    let net = net(1);
    let http = Echo::start_example(&net, "http", &["--addr", "10.77.0.3/24", "--cores", "1"]);
    let to: SocketAddr = format!("{SERVER_V4}:8080").parse()?;
    let idle: Vec<TcpStream> = net.client_ns().run(move || {
        (0..3)
            .map(|_| {
                let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")?;
                // The whole response (headers and a short body) in one read is enough here:
                // what matters is that the connection then sits idle, kept alive.
                let mut b = [0u8; 4096];
                let n = s.read(&mut b)?;
                if !b[..n].starts_with(b"HTTP/1.1 200") {
                    return Err(std::io::Error::other("no 200"));
                }
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()
    })??;
    http.signal(libc::SIGTERM);
    for mut s in idle {
        let mut b = [0u8; 64];
        assert_eq!(s.read(&mut b)?, 0, "the idle connection ends with a FIN");
    }
    let (status, out) = http.wait();
    assert_clean_exit(status, &out);
    assert!(out.contains("0 reset at stop"), "nothing was reset:\n{out}");
    Ok(())
}

/// A server that installed no signal handler, killed with SIGTERM, leaves no peer waiting:
/// the runtime's default handling shuts down in 1 s (the idle echo connection, which the
/// application never closes, gets a FIN then) and the process ends by the signal, as it would
/// have.
#[test]
fn a_server_without_a_handler_ends_its_connections_on_sigterm_then_dies_by_it() -> Result {
    if !require_root("lifecycle: SIGTERM with no handler") {
        return Ok(());
    }
    use std::os::unix::process::ExitStatusExt;
    let net = net(1);
    let echo = Echo::start_example(
        &net,
        "echo",
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "1",
            "--runtime-signals",
        ],
    );
    let to: SocketAddr = format!("{SERVER_V4}:7").parse()?;
    let mut s = net
        .client_ns()
        .run(move || -> std::io::Result<TcpStream> {
            let mut s = connect_patiently(to);
            s.write_all(b"ping")?;
            let mut b = [0u8; 4];
            s.read_exact(&mut b)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            Ok(s)
        })??;
    echo.signal(libc::SIGTERM);
    let mut b = [0u8; 64];
    // Nothing unread, everything acknowledged: a FIN at the grace's end, as the kernel's
    // socket gets at a process's exit (it was a reset).
    let r = s.read(&mut b);
    assert!(
        matches!(&r, Ok(0)),
        "the idle connection of a server killed by SIGTERM ends with a FIN: {r:?}"
    );
    let (status, out) = echo.wait();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}\n{out}");
    Ok(())
}
