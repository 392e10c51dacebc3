//! A tokio service ported by changing its imports: a tokio-util `Framed<LinesCodec>` line
//! server whose connections close gracefully (FIN) when a shutdown begins, a UDP echo, an
//! axum router served by hyper, a client bounded by `tokio::time::timeout`, and a stream split
//! and reunited, on corelane sockets, against kernel peers on a veth pair.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream as StdStream;
use std::time::Duration;

use common::*;
use corelane::net::{TcpListener, TcpStream, UdpSocket};
use corelane_testnet::require_root;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::{Framed, LinesCodec};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A line server as a tokio user writes it: each line comes back prefixed; once a graceful
/// shutdown begins (where a tokio program would watch its own signal), each connection is
/// closed with a FIN.
async fn lines(l: TcpListener) {
    while let Ok((s, _)) = l.accept().await {
        tokio::task::spawn_local(async move {
            let mut framed = Framed::new(s, LinesCodec::new());
            let shutdown = corelane::shutdown_requested();
            tokio::pin!(shutdown);
            loop {
                tokio::select! {
                    line = framed.next() => match line {
                        Some(Ok(line)) => {
                            if framed.send(format!("echo: {line}")).await.is_err() {
                                break;
                            }
                        }
                        _ => break,
                    },
                    _ = &mut shutdown => {
                        let _ = framed.get_mut().shutdown().await;
                        break;
                    }
                }
            }
        });
    }
}

/// A UDP echo as a tokio user writes it.
async fn udp_echo(s: UdpSocket) {
    let mut buf = [0u8; 1500];
    while let Ok((n, from)) = s.recv_from(&mut buf).await {
        if s.send_to(&buf[..n], from).await.is_err() {
            break;
        }
    }
}

/// An axum router, served by hyper on each accepted stream.
async fn http(l: TcpListener) {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/hello/{name}",
        get(
            |axum::extract::Path(name): axum::extract::Path<String>| async move {
                format!("hello, {name}")
            },
        ),
    );
    while let Ok((s, _)) = l.accept().await {
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::task::spawn_local(async move {
            let io = hyper_util::rt::TokioIo::new(s);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
}

#[test]
fn a_tokio_service_runs_unmodified_on_corelane_sockets() -> Result {
    if !require_root("tokio port") {
        return Ok(());
    }
    let net = net(1);
    // A kernel echo server for the corelane client.
    let kernel = net
        .client_ns()
        .run(|| std::net::TcpListener::bind("10.77.0.2:9200"))??;
    std::thread::spawn(move || {
        for s in kernel.incoming() {
            let Ok(mut s) = s else { break };
            std::thread::spawn(move || {
                let mut r = s.try_clone().expect("clone");
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    let (out_tx, out_rx) = std::sync::mpsc::channel::<String>();
    let out = std::sync::Mutex::new(out_tx);
    let served = serve_on(
        &net,
        |b| b.cores(1),
        move |_| {
            let say = out.lock().expect("lock").clone();
            async move {
                tokio::task::spawn_local(lines(TcpListener::bind(7300).await.expect("7300")));
                tokio::task::spawn_local(http(TcpListener::bind(7301).await.expect("7301")));
                tokio::task::spawn_local(udp_echo(UdpSocket::bind(7302).await.expect("7302")));
                // A task that panics is contained by the executor, as tokio's are: the
                // servers above keep answering.
                let bad = tokio::task::spawn_local(async { panic!("a task's own panic") });
                let _ = say.send(format!(
                    "task panic contained: {}",
                    bad.await.err().is_some_and(|e| e.is_panic())
                ));
                // A client bounded by timeout: a dead address on the link never answers.
                let cut = tokio::time::timeout(
                    Duration::from_millis(300),
                    TcpStream::connect("10.77.0.99:80"),
                )
                .await
                .is_err();
                let _ = say.send(format!("timeout cut the connect: {cut}"));
                // Split, use both halves at once, reunite, use it whole.
                let r = async {
                    let s = TcpStream::connect("10.77.0.2:9200").await?;
                    let (mut rd, mut wr) = s.into_split();
                    let w = tokio::task::spawn_local(async move {
                        wr.write_all(b"split ").await.map(|()| wr)
                    });
                    let mut b = [0u8; 6];
                    rd.read_exact(&mut b).await?;
                    let wr = w.await.map_err(std::io::Error::other)??;
                    let mut s = rd
                        .reunite(wr)
                        .map_err(|_| std::io::Error::other("halves"))?;
                    s.write_all(b"whole").await?;
                    let mut c = [0u8; 5];
                    s.read_exact(&mut c).await?;
                    std::io::Result::Ok(format!(
                        "{}{}",
                        String::from_utf8_lossy(&b),
                        String::from_utf8_lossy(&c)
                    ))
                }
                .await;
                let _ = say.send(format!("split/reunite: {r:?}"));
                // The rest of tokio's stream calls: ttl, writable/try_write, readable/peek,
                // borrowed split, try_read with nothing there, linger zero.
                let r = async {
                    let mut s = TcpStream::connect("10.77.0.2:9200").await?;
                    s.set_ttl(9)?;
                    let ttl = s.ttl()?;
                    s.writable().await?;
                    let wrote = s.try_write(b"peek")?;
                    s.readable().await?;
                    let mut p = [0u8; 1];
                    let peeked = s.peek(&mut p).await?;
                    let mut all = [0u8; 4];
                    {
                        let (mut rd, _wr) = s.split();
                        rd.read_exact(&mut all).await?;
                    }
                    let empty = s.try_read(&mut [0u8; 8]).err().map(|e| e.kind());
                    s.set_linger(Some(Duration::ZERO))?;
                    std::io::Result::Ok(format!(
                        "ttl {ttl} wrote {wrote} peeked {peeked} {:?} read {:?} then {empty:?}",
                        p[0] as char,
                        String::from_utf8_lossy(&all)
                    ))
                }
                .await;
                let _ = say.send(format!("extras: {r:?}"));
                std::future::pending::<()>().await;
            }
        },
    )?;
    let (stop, server) = (served.stop, served.thread);
    // The line server.
    let got = net.client_ns().run(|| -> std::io::Result<Vec<String>> {
        let s = connect("10.77.0.3:7300".parse().map_err(std::io::Error::other)?)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut w = s.try_clone()?;
        w.write_all(b"one\ntwo\n")?;
        let r = BufReader::new(s);
        r.lines().take(2).collect()
    })??;
    assert_eq!(got, vec!["echo: one", "echo: two"]);
    // The UDP echo.
    let back = net.client_ns().run(|| -> std::io::Result<Vec<u8>> {
        let u = std::net::UdpSocket::bind("10.77.0.2:0")?;
        u.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [0u8; 64];
        for _ in 0..5 {
            u.send_to(b"datagram", "10.77.0.3:7302")?;
            if let Ok((n, _)) = u.recv_from(&mut buf) {
                return Ok(buf[..n].to_vec());
            }
        }
        Err(std::io::ErrorKind::TimedOut.into())
    })??;
    assert_eq!(back, b"datagram");
    // The axum router.
    let page = net.client_ns().run(|| -> std::io::Result<String> {
        let mut s = StdStream::connect("10.77.0.3:7301")?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /hello/corelane HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut page = String::new();
        s.read_to_string(&mut page)?;
        Ok(page)
    })??;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.ends_with("hello, corelane"), "{page}");
    let said = [
        out_rx.recv_timeout(Duration::from_secs(20))?,
        out_rx.recv_timeout(Duration::from_secs(20))?,
        out_rx.recv_timeout(Duration::from_secs(20))?,
        out_rx.recv_timeout(Duration::from_secs(20))?,
    ];
    assert!(
        said.contains(
            &"extras: Ok(\"ttl 9 wrote 4 peeked 1 'p' read \\\"peek\\\" then Some(WouldBlock)\")"
                .to_string()
        ),
        "{said:?}"
    );
    assert!(
        said.contains(&"task panic contained: true".to_string()),
        "{said:?}"
    );
    assert!(
        said.contains(&"timeout cut the connect: true".to_string()),
        "{said:?}"
    );
    assert!(
        said.contains(&"split/reunite: Ok(\"split whole\")".to_string()),
        "{said:?}"
    );
    // A graceful shutdown with a line-server connection sitting idle: it ends with a FIN
    // (end of file), not a reset.
    let idle = net.client_ns().run(|| -> std::io::Result<StdStream> {
        let mut s = connect("10.77.0.3:7300".parse().map_err(std::io::Error::other)?)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"before\n")?;
        let mut line = String::new();
        BufReader::new(s.try_clone()?).read_line(&mut line)?;
        Ok(s)
    })??;
    stop.shutdown(Duration::from_secs(3));
    let mut rest = Vec::new();
    let end = (&idle).read_to_end(&mut rest).map(|_| ());
    assert!(
        end.is_ok(),
        "the idle connection ended with {end:?}, not a FIN"
    );
    server.join()??;
    Ok(())
}

/// A store made once and handed to every core (`Runtime::run_with`) is one store: on a
/// two-queue veth, connections land on both cores (RSS), and what one connection sets, every
/// other reads, whichever core serves it. (A store made inside the per-core future would be
/// one per core: a port's most common silent fault.)
#[test]
fn state_made_once_and_handed_to_every_core_is_one_across_queues() -> Result {
    if !require_root("tokio port: state shared across cores") {
        return Ok(());
    }
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let net = net(2);
    let ifname = net.server_if().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let served = net.server_ns().spawn(move || {
        let rt = corelane::Runtime::builder(&ifname)
            .addr("10.77.0.3/24")
            .cores(2)
            .build()
            .map_err(|e| e.to_string())?;
        let _ = tx.send(rt.stop_handle());
        let db: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        rt.run_with(db, |core, db| async move {
            let l = TcpListener::bind(6379).await.expect("listen");
            while let Ok((s, _)) = l.accept().await {
                let db = db.clone();
                tokio::task::spawn_local(async move {
                    let mut lines = Framed::new(s, LinesCodec::new());
                    while let Some(Ok(line)) = lines.next().await {
                        let reply = match line.split_once(' ') {
                            Some(("SET", kv)) => {
                                let (k, v) = kv.split_once(' ').unwrap_or((kv, ""));
                                db.lock().unwrap().insert(k.into(), v.into());
                                format!("OK {}", core.index)
                            }
                            Some(("GET", k)) => {
                                let v = db.lock().unwrap().get(k).cloned();
                                format!("{} {}", v.unwrap_or_else(|| "nil".into()), core.index)
                            }
                            _ => "ERR".into(),
                        };
                        if lines.send(reply).await.is_err() {
                            break;
                        }
                    }
                });
            }
        })
        .map_err(|e| e.to_string())
    })?;
    let stop = rx.recv_timeout(Duration::from_secs(20))?;
    let to: std::net::SocketAddr = format!("{SERVER_V4}:6379").parse()?;
    let answers = net
        .client_ns()
        .run(move || -> std::io::Result<Vec<(String, String)>> {
            let ask = |line: String| -> std::io::Result<String> {
                let mut s = connect_patiently(to);
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.write_all(format!("{line}\n").as_bytes())?;
                let mut reply = String::new();
                BufReader::new(s).read_line(&mut reply)?;
                Ok(reply.trim_end().to_string())
            };
            // Each key set on one connection and read on a new one: 20 pairs, 40 connections.
            (0..20)
                .map(|i| Ok((ask(format!("SET k{i} v{i}"))?, ask(format!("GET k{i}"))?)))
                .collect()
        })??;
    stop.stop();
    served.join()??;
    let mut cores = std::collections::HashSet::new();
    for (i, (set, get)) in answers.iter().enumerate() {
        assert!(set.starts_with("OK "), "SET k{i}: {set}");
        assert!(
            get.starts_with(&format!("v{i} ")),
            "GET k{i} after SET: {get} ({answers:?})"
        );
        for a in [set, get] {
            cores.insert(a.rsplit(' ').next().unwrap_or("").to_string());
        }
    }
    assert_eq!(
        cores.len(),
        2,
        "connections landed on both cores, so the store was shared across them: {answers:?}"
    );
    Ok(())
}
