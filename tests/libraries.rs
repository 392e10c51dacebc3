//! The libraries a service is built from, unmodified, on corelane's sockets: sockets are
//! `Send`, `tokio::spawn` on a core runs the task there, a socket handed to another core works
//! through its own, hyper-util's pooled client reuses its connections, and hyper's upgrades
//! carry a WebSocket (tokio-tungstenite) end to end. The peers are the kernel's.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use corelane_testnet::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const KERNEL: &str = "10.77.0.2";

/// A kernel echo server on the client end, one thread per connection.
fn kernel_echo(net: &corelane_testnet::VethPair, port: u16) -> Result {
    let l = net
        .client_ns()
        .run(move || std::net::TcpListener::bind((KERNEL, port)))??;
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            std::thread::spawn(move || {
                let mut r = s.try_clone().expect("clone");
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    Ok(())
}

/// A kernel HTTP/1.1 server on the client end that answers every `GET` with `ok`, keeping the
/// connection open, and counts the connections it accepted.
fn kernel_http(net: &corelane_testnet::VethPair, port: u16) -> Result<Arc<AtomicUsize>> {
    let l = net
        .client_ns()
        .run(move || std::net::TcpListener::bind((KERNEL, port)))??;
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = s.read(&mut buf) else { return };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(answer).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Ok(accepted)
}

/// Runs one corelane runtime with `cores` cores in the server namespace of `net` (owning
/// SERVER_V4), each core running `f`; returns what the cores sent on the channel.
fn on_cores<T, F, Fut>(net: &corelane_testnet::VethPair, cores: usize, f: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(corelane::CoreInfo, std::sync::mpsc::Sender<T>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let ifname = net.server_if().to_string();
    let got = net
        .server_ns()
        .run(move || -> std::result::Result<Vec<T>, String> {
            let rt = corelane::Runtime::builder(&ifname)
                .addr(format!("{SERVER_V4}/24"))
                .cores(cores)
                .build()
                .map_err(|e| e.to_string())?;
            let (tx, rx) = std::sync::mpsc::channel();
            let tx = Mutex::new(tx);
            rt.run(|core| {
                let tx = tx.lock().expect("lock").clone();
                f(core, tx)
            })
            .map_err(|e| e.to_string())?;
            Ok(rx.try_iter().collect())
        })??;
    Ok(got)
}

#[test]
fn tokio_spawn_on_a_core_runs_the_socket_s_task_on_that_core() -> Result {
    if !require_root("libraries: tokio::spawn") {
        return Ok(());
    }
    let net = net(1);
    kernel_echo(&net, 7400)?;
    let got = on_cores(&net, 1, |_core, tx| async move {
        let here = std::thread::current().id();
        let to: SocketAddr = (KERNEL.parse::<std::net::IpAddr>().expect("ip"), 7400).into();
        // A future holding a corelane stream, spawned as a library would spawn it.
        let task = tokio::spawn(async move {
            let mut s = corelane::net::TcpStream::connect(to).await?;
            s.write_all(b"spawned").await?;
            let mut b = [0u8; 7];
            s.read_exact(&mut b).await?;
            std::io::Result::Ok((b, std::thread::current().id()))
        });
        let r = tokio::time::timeout(Duration::from_secs(10), task).await;
        let _ = tx.send(match r {
            Ok(Ok(Ok((b, there)))) => {
                format!("echoed {} on the core: {}", &b == b"spawned", there == here)
            }
            other => format!("failed: {other:?}"),
        });
    })?;
    assert_eq!(got, ["echoed true on the core: true"]);
    Ok(())
}

#[test]
fn a_stream_handed_to_another_core_works_through_its_own() -> Result {
    if !require_root("libraries: a stream on another core") {
        return Ok(());
    }
    let net = net(2);
    kernel_echo(&net, 7401)?;
    let (give, take) = tokio::sync::oneshot::channel::<corelane::net::TcpStream>();
    let give = Arc::new(Mutex::new(Some(give)));
    let take = Arc::new(Mutex::new(Some(take)));
    // Core 0 runs until core 1 is done: a core whose future returned has ended, and closed the
    // connections it owns wherever they are held.
    let done = Arc::new(tokio::sync::Notify::new());
    let data = payload(256 * 1024, 9);
    let want = sha256(&data);
    let got = on_cores(&net, 2, move |core, tx| {
        let (give, take, data, done) = (give.clone(), take.clone(), data.clone(), done.clone());
        async move {
            if core.index == 0 {
                let to: SocketAddr = (KERNEL.parse::<std::net::IpAddr>().expect("ip"), 7401).into();
                match corelane::net::TcpStream::connect(to).await {
                    Ok(s) => {
                        if let Some(g) = give.lock().expect("lock").take() {
                            let _ = g.send(s);
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(format!("connect: {e}"));
                        return;
                    }
                }
                done.notified().await;
                return;
            }
            let Some(take) = take.lock().expect("lock").take() else {
                return;
            };
            let r = async {
                let s = take.await.map_err(std::io::Error::other)?;
                let (mut rd, mut wr) = s.into_split();
                let writer = tokio::spawn(async move {
                    wr.write_all(&data).await?;
                    wr.shutdown().await
                });
                let mut back = Vec::new();
                rd.read_to_end(&mut back).await?;
                writer.await.map_err(std::io::Error::other)??;
                std::io::Result::Ok(sha256(&back))
            };
            let _ = tx.send(
                match tokio::time::timeout(Duration::from_secs(20), r).await {
                    Ok(Ok(h)) if h == want => "echoed on core 1 through core 0".to_string(),
                    other => format!("failed: {other:?}"),
                },
            );
            done.notify_one();
        }
    })?;
    assert_eq!(got, ["echoed on core 1 through core 0"]);
    Ok(())
}

#[test]
fn hyper_util_s_pooled_client_reuses_its_corelane_connections() -> Result {
    if !require_root("libraries: hyper-util's pooled client") {
        return Ok(());
    }
    let net = net(1);
    let accepted = kernel_http(&net, 7402)?;
    let got = on_cores(&net, 1, |_core, tx| async move {
        use http_body_util::BodyExt;
        let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(corelane::net::Connector::new());
        let uri: hyper::Uri = format!("http://{KERNEL}:7402/").parse().expect("uri");
        let mut ok = 0;
        for _ in 0..20 {
            let r = async {
                let res = client.get(uri.clone()).await?;
                let body = res.into_body().collect().await?.to_bytes();
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(body)
            };
            match tokio::time::timeout(Duration::from_secs(10), r).await {
                Ok(Ok(b)) if &b[..] == b"ok" => ok += 1,
                other => {
                    let _ = tx.send(format!("request failed: {other:?}"));
                    return;
                }
            }
        }
        // Four at once: the pool opens more, each from a task tokio::spawn made.
        let many: Vec<_> = (0..4)
            .map(|_| {
                let (client, uri) = (client.clone(), uri.clone());
                tokio::spawn(async move { client.get(uri).await.map(|r| r.status()) })
            })
            .collect();
        for m in many {
            if matches!(m.await, Ok(Ok(s)) if s == 200) {
                ok += 1;
            }
        }
        let _ = tx.send(format!("{ok} answered"));
    })?;
    assert_eq!(got, ["24 answered"]);
    let n = accepted.load(Ordering::SeqCst);
    assert!(
        (1..=5).contains(&n),
        "20 requests in a row and 4 at once took {n} connections: the pool did not reuse them"
    );
    Ok(())
}

/// What the corelane server of the upgrade test does with one request: `GET /ws` upgrades to
/// a WebSocket that echoes; `CONNECT host:port` opens a corelane connection there and
/// tunnels. Both through hyper's `with_upgrades`, which needs `Send` streams.
async fn upgrade_or_tunnel(
    mut req: hyper::Request<hyper::body::Incoming>,
) -> std::result::Result<hyper::Response<http_body_util::Empty<bytes::Bytes>>, std::io::Error> {
    use hyper::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
    let status = |s: u16| {
        let mut r = hyper::Response::new(http_body_util::Empty::new());
        *r.status_mut() = hyper::StatusCode::from_u16(s).expect("status");
        r
    };
    if req.method() == hyper::Method::CONNECT {
        let to: SocketAddr = req
            .uri()
            .authority()
            .and_then(|a| a.as_str().parse().ok())
            .ok_or_else(|| std::io::Error::other("CONNECT to what?"))?;
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let (Ok(up), Ok(mut there)) =
                (upgrade.await, corelane::net::TcpStream::connect(to).await)
            else {
                return;
            };
            let mut up = hyper_util::rt::TokioIo::new(up);
            let _ = tokio::io::copy_bidirectional(&mut up, &mut there).await;
        });
        return Ok(status(200));
    }
    let Some(key) = req.headers().get(SEC_WEBSOCKET_KEY).cloned() else {
        // A plain request (the proxy test's upstream answers those): no content.
        return Ok(status(204));
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        use futures_util::{SinkExt, StreamExt};
        let Ok(up) = upgrade.await else { return };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(up),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        while let Some(Ok(m)) = ws.next().await {
            if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                break;
            }
        }
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut r = status(101);
    r.headers_mut()
        .insert(UPGRADE, "websocket".parse().expect("h"));
    r.headers_mut()
        .insert(CONNECTION, "upgrade".parse().expect("h"));
    r.headers_mut()
        .insert(SEC_WEBSOCKET_ACCEPT, accept.parse().expect("h"));
    Ok(r)
}

/// A kernel connection to a server that may not listen yet: refusals retried for 10 s.
async fn connect_retrying(to: SocketAddr) -> std::result::Result<tokio::net::TcpStream, String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(to))
            .await
        {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e))
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return Err(format!("connecting to {to}: {other:?}")),
        }
    }
}

/// Three WebSocket messages `{word} N` from tokio-tungstenite's client on the kernel's stack
/// (in the client namespace) to `to`, and what came back.
fn ws_echo(
    net: &corelane_testnet::VethPair,
    to: SocketAddr,
    word: &'static str,
) -> std::result::Result<Vec<String>, String> {
    net.client_ns()
        .run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                use futures_util::{SinkExt, StreamExt};
                // The server binds its port once it runs: until then, a refusal.
                let tcp = connect_retrying(to).await?;
                let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{to}/ws"), tcp)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut back = Vec::new();
                for i in 0..3 {
                    let m = tokio_tungstenite::tungstenite::Message::text(format!("{word} {i}"));
                    ws.send(m).await.map_err(|e| e.to_string())?;
                    match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                        Ok(Some(Ok(m))) => {
                            back.push(m.into_text().map_err(|e| e.to_string())?.to_string())
                        }
                        other => return Err(format!("no echo: {other:?}")),
                    }
                }
                Ok(back)
            })
        })
        .map_err(|e| e.to_string())?
}

/// Serves one connection with `upgrade_or_tunnel`, upgrades allowed.
async fn serve_upgrades<S>(s: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(
            hyper_util::rt::TokioIo::new(s),
            hyper::service::service_fn(upgrade_or_tunnel),
        )
        .with_upgrades()
        .await;
}

#[test]
fn hyper_upgrades_carry_a_websocket_echo_and_a_connect_tunnel() -> Result {
    if !require_root("libraries: hyper upgrades") {
        return Ok(());
    }
    let net = net(1);
    kernel_echo(&net, 7403)?;
    let served = serve_on(
        &net,
        |b| b.cores(1),
        |_core| async move {
            let Ok(l) = corelane::net::TcpListener::bind(8080).await else {
                return;
            };
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(serve_upgrades(s));
            }
        },
    )?;
    let server: SocketAddr = format!("{SERVER_V4}:8080").parse()?;
    // The WebSocket: tokio-tungstenite's client on the kernel's stack.
    let echoed = ws_echo(&net, server, "hello")?;
    assert_eq!(echoed, ["hello 0", "hello 1", "hello 2"]);
    // CONNECT: a kernel client tunnels through the corelane server to the kernel echo server.
    let tunneled = net.client_ns().run(move || -> std::io::Result<Vec<u8>> {
        let mut s = connect_patiently(server);
        write!(
            s,
            "CONNECT {KERNEL}:7403 HTTP/1.1\r\nhost: {KERNEL}:7403\r\n\r\n"
        )?;
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut b)?;
            head.push(b[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") {
            return Err(std::io::Error::other(
                String::from_utf8_lossy(&head).into_owned(),
            ));
        }
        let data = payload(64 * 1024, 4);
        s.write_all(&data)?;
        let mut back = vec![0u8; data.len()];
        s.read_exact(&mut back)?;
        Ok(if back == data {
            b"tunneled".to_vec()
        } else {
            back
        })
    })??;
    assert_eq!(tunneled, b"tunneled");
    served.stop.stop();
    served.thread.join()??;
    Ok(())
}

/// A kernel server on the client end running `upgrade_or_tunnel` (plain requests and
/// WebSockets), counting its connections.
fn kernel_upgrades(net: &corelane_testnet::VethPair, port: u16) -> Result<Arc<AtomicUsize>> {
    let l = net
        .client_ns()
        .run(move || std::net::TcpListener::bind((KERNEL, port)))??;
    l.set_nonblocking(true)?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let Ok(l) = tokio::net::TcpListener::from_std(l) else {
                return;
            };
            while let Ok((s, _)) = l.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_upgrades(s));
            }
        });
    });
    Ok(accepted)
}

#[test]
fn the_proxy_example_pools_its_upstream_connections_and_passes_websockets_through() -> Result {
    if !require_root("libraries: the proxy example") {
        return Ok(());
    }
    let net = net(1);
    let accepted = kernel_upgrades(&net, 7600)?;
    let _proxy = Echo::start_example(
        &net,
        "proxy",
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "1",
            "--upstream",
            "10.77.0.2:7600",
        ],
    );
    let proxy: SocketAddr = format!("{SERVER_V4}:8080").parse()?;
    // 20 requests on one client connection: each goes on through the core's pool.
    let answered = net.client_ns().run(move || -> std::io::Result<usize> {
        let mut s = std::net::TcpStream::connect_timeout(&proxy, Duration::from_secs(10))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut ok = 0;
        for _ in 0..20 {
            s.write_all(b"GET /plain HTTP/1.1\r\nhost: proxied\r\n\r\n")?;
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut b)?;
                head.push(b[0]);
            }
            if head.starts_with(b"HTTP/1.1 204") {
                ok += 1;
            }
        }
        Ok(ok)
    })??;
    assert_eq!(answered, 20);
    let upstream_conns = accepted.load(Ordering::SeqCst);
    assert_eq!(
        upstream_conns, 1,
        "20 proxied requests in a row took {upstream_conns} upstream connections"
    );
    // A WebSocket through the proxy to the upstream's echo.
    let echoed = ws_echo(&net, proxy, "through")?;
    assert_eq!(echoed, ["through 0", "through 1", "through 2"]);
    Ok(())
}
