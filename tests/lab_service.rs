//! A tokio service ported, with its own integration tests: a key-value store with
//! publish/subscribe and its client, written as a tokio user writes them (state made once
//! behind `Arc<Mutex<..>>`, a `serve(listener, db)` function, a client over the concrete
//! stream type). What the port changed: the imports, `tokio::spawn` to
//! `tokio::task::spawn_local`, the entry point (`Runtime::run_with`, handing every core the
//! one store), and each `#[tokio::test] async fn` to a `#[test] fn` whose body runs in
//! `corelane::lab::run`.
//!
//! The `lab_` tests need no root, interface or XDP program (`scripts/test-unprivileged.sh` runs
//! them as user nobody); the last one serves the same code on a two-queue veth pair to kernel
//! clients, as root.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use corelane::net::{TcpListener, TcpStream};
use corelane_testnet::require_root;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::broadcast;
use tokio_util::codec::{Framed, LinesCodec};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The store: values and one channel per subscribed topic (made once, as a service's `main`
/// makes it, and shared by every connection of every core).
#[derive(Default)]
struct Db {
    values: HashMap<String, String>,
    topics: HashMap<String, broadcast::Sender<String>>,
}

/// The server: `SET k v` -> `OK`, `GET k` -> the value or `(nil)`, `PUBLISH t m` -> how many
/// subscribers got it, `SUBSCRIBE t` -> `subscribed`, then every message published to `t`.
async fn serve(listener: TcpListener, db: Arc<Mutex<Db>>) {
    while let Ok((s, _)) = listener.accept().await {
        let db = db.clone();
        tokio::task::spawn_local(async move {
            let mut conn = Framed::new(s, LinesCodec::new());
            while let Some(Ok(line)) = conn.next().await {
                let mut words = line.splitn(3, ' ');
                let reply = match (words.next(), words.next(), words.next()) {
                    (Some("SET"), Some(k), Some(v)) => {
                        db.lock().unwrap().values.insert(k.into(), v.into());
                        "OK".to_string()
                    }
                    (Some("GET"), Some(k), None) => {
                        let v = db.lock().unwrap().values.get(k).cloned();
                        v.unwrap_or("(nil)".into())
                    }
                    (Some("PUBLISH"), Some(t), Some(m)) => {
                        let tx = db.lock().unwrap().topics.get(t).cloned();
                        tx.map_or(0, |tx| tx.send(m.into()).unwrap_or(0))
                            .to_string()
                    }
                    (Some("SUBSCRIBE"), Some(t), None) => {
                        let mut rx = {
                            let mut db = db.lock().unwrap();
                            let tx = db.topics.entry(t.into());
                            tx.or_insert_with(|| broadcast::channel(16).0).subscribe()
                        };
                        if conn.send("subscribed").await.is_err() {
                            return;
                        }
                        while let Ok(m) = rx.recv().await {
                            if conn.send(m).await.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                    _ => format!("ERR unknown command '{line}'"),
                };
                if conn.send(reply).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The service's client, over the concrete stream type (corelane's, once ported).
struct Client(Framed<TcpStream, LinesCodec>);

impl Client {
    async fn connect(addr: SocketAddr) -> Result<Client> {
        Ok(Client(Framed::new(
            TcpStream::connect(addr).await?,
            LinesCodec::new(),
        )))
    }

    async fn call(&mut self, line: &str) -> Result<String> {
        self.0.send(line).await?;
        let reply = self.0.next().await.ok_or("the server closed")??;
        Ok(reply)
    }
}

/// Starts the server on a port the lab picks; its address.
async fn start_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::task::spawn_local(serve(listener, Arc::default()));
    Ok(addr)
}

#[test]
fn lab_key_value_get_and_set() -> Result {
    corelane::lab::run(async {
        let addr = start_server().await?;
        let mut client = Client::connect(addr).await?;
        assert_eq!(client.call("GET hello").await?, "(nil)");
        assert_eq!(client.call("SET hello world").await?, "OK");
        assert_eq!(client.call("GET hello").await?, "world");
        // Another connection sees the same store.
        let mut other = Client::connect(addr).await?;
        assert_eq!(other.call("GET hello").await?, "world");
        assert!(other.call("FLY away").await?.starts_with("ERR"));
        Ok(())
    })?
}

#[test]
fn lab_published_messages_reach_every_subscriber() -> Result {
    corelane::lab::run(async {
        let addr = start_server().await?;
        let mut subs = Vec::new();
        for _ in 0..3 {
            let mut s = Client::connect(addr).await?;
            assert_eq!(s.call("SUBSCRIBE news").await?, "subscribed");
            subs.push(s);
        }
        let mut publisher = Client::connect(addr).await?;
        assert_eq!(publisher.call("PUBLISH news first").await?, "3");
        assert_eq!(publisher.call("PUBLISH sport nobody").await?, "0");
        for s in &mut subs {
            let got = tokio::time::timeout(Duration::from_secs(10), s.0.next()).await?;
            assert_eq!(got.ok_or("closed")??, "first");
        }
        Ok(())
    })?
}

#[test]
fn lab_many_clients_at_once_each_see_their_own_writes() -> Result {
    corelane::lab::run(async {
        let addr = start_server().await?;
        let clients: Vec<_> = (0..32)
            .map(|i| {
                tokio::task::spawn_local(async move {
                    let mut c = Client::connect(addr).await?;
                    for j in 0..20 {
                        let (k, v) = (format!("k{i}"), format!("v{i}-{j}"));
                        assert_eq!(c.call(&format!("SET {k} {v}")).await?, "OK");
                        assert_eq!(c.call(&format!("GET {k}")).await?, v);
                    }
                    Ok::<_, Box<dyn std::error::Error>>(())
                })
            })
            .collect();
        for c in clients {
            c.await??;
        }
        Ok(())
    })?
}

/// The same service on a two-queue veth pair, its one store handed to both cores: kernel
/// clients set keys and read them on new connections, and subscribers on both cores hear what
/// a publisher on either says.
#[test]
fn served_on_two_queues_its_one_store_answers_every_connection() -> Result {
    if !require_root("lab service on two queues") {
        return Ok(());
    }
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
        let db: Arc<Mutex<Db>> = Arc::default();
        rt.run_with(db, |_core, db| async move {
            let listener = TcpListener::bind("0.0.0.0:6379").await.expect("listen");
            serve(listener, db).await;
        })
        .map_err(|e| e.to_string())
    })?;
    let stop = rx.recv_timeout(Duration::from_secs(20))?;
    let to: SocketAddr = format!("{SERVER_V4}:6379").parse()?;
    let result = net
        .client_ns()
        .run(move || -> std::result::Result<(), String> {
            (|| -> Result {
                let open = || -> Result<(BufReader<std::net::TcpStream>, std::net::TcpStream)> {
                    let s = connect_patiently(to);
                    s.set_read_timeout(Some(Duration::from_secs(10)))?;
                    Ok((BufReader::new(s.try_clone()?), s))
                };
                let call = |c: &mut (BufReader<std::net::TcpStream>, std::net::TcpStream),
                            line: &str| {
                    c.1.write_all(format!("{line}\n").as_bytes())?;
                    let mut reply = String::new();
                    c.0.read_line(&mut reply)?;
                    Ok::<_, Box<dyn std::error::Error>>(reply.trim_end().to_string())
                };
                for i in 0..20 {
                    assert_eq!(call(&mut open()?, &format!("SET k{i} v{i}"))?, "OK");
                    assert_eq!(call(&mut open()?, &format!("GET k{i}"))?, format!("v{i}"));
                }
                let mut subs = (0..8).map(|_| open()).collect::<Result<Vec<_>>>()?;
                for s in &mut subs {
                    assert_eq!(call(s, "SUBSCRIBE news")?, "subscribed");
                }
                assert_eq!(call(&mut open()?, "PUBLISH news hello")?, "8");
                for s in &mut subs {
                    let mut line = String::new();
                    s.0.read_line(&mut line)?;
                    assert_eq!(line.trim_end(), "hello");
                }
                Ok(())
            })()
            .map_err(|e| e.to_string())
        })?;
    stop.shutdown(Duration::from_secs(1));
    let report = served.join().map_err(|e| format!("{e:?}"))??;
    result?;
    // Connections landed on both queues: each core accepted some.
    for c in &report.cores {
        assert!(c.stats.stack.established > 0, "{:?}", c.stats.stack);
    }
    Ok(())
}
