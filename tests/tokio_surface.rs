//! The tokio calls a port reaches for, on a real runtime against the kernel's sockets: a
//! `TcpSocket` bound to a chosen port and sized before it connects, another that listens;
//! `poll_accept`, a listener's TTL passed to what it accepts; `ready`, `poll_read_ready`,
//! `poll_peek`, a read half's `peek`, vectored `try_*` calls on a stream; `readable`,
//! `writable`, `ready`, the `try_*` calls, `peek`, `recv_buf_from` and the TTL of a UDP socket; a connect to an on-link address nobody holds failing with
//! `HostUnreachable`. Each is written as it would be under tokio, only the imports differ.

mod common;

use std::future::poll_fn;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::one_core;
use corelane::net::{TcpSocket, UdpSocket};
use corelane_testnet::require_root;
use tokio::io::{AsyncReadExt, Interest, ReadBuf};

const SERVER: &str = "10.77.0.3";
const PEER: &str = "10.77.0.2";

fn addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|e| format!("{s}: {e}"))
}

/// What the core's future checks, as a tokio program would write it.
async fn port_of_a_tokio_program() -> std::io::Result<()> {
    let bad = |what: &str| std::io::Error::other(what.to_string());
    // Connect from a chosen local port with a sized receive buffer.
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::from(([10, 77, 0, 3], 41000)))?;
    sock.set_recv_buffer_size(1 << 20)?;
    sock.set_nodelay(true)?;
    // Read back doubled, as Linux reads SO_RCVBUF back.
    assert_eq!(sock.recv_buffer_size()?, 2 << 20);
    let s = sock
        .connect(SocketAddr::from(([10, 77, 0, 2], 9100)))
        .await?;
    if s.local_addr()?.port() != 41000 {
        return Err(bad("not from the bound port"));
    }
    let ready = s.ready(Interest::WRITABLE).await?;
    if !ready.is_writable() {
        return Err(bad("a new stream is not writable"));
    }
    if s.try_write_vectored(&[IoSlice::new(b"hel"), IoSlice::new(b"lo")])? != 5 {
        return Err(bad("short write"));
    }
    // The echo peeked whole by the stream (it waits until all five bytes are there), again by
    // its read half, then read into two buffers at once.
    let mut peeked = [0u8; 8];
    let n = loop {
        poll_fn(|cx| s.poll_read_ready(cx)).await?;
        let mut rb = ReadBuf::new(&mut peeked);
        let n = poll_fn(|cx| s.poll_peek(cx, &mut rb)).await?;
        if n >= 5 {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    if &peeked[..n] != b"hello" {
        return Err(bad("the echo came back changed"));
    }
    let mut s = s;
    let (mut half, _) = s.split();
    let mut again = [0u8; 8];
    if half.peek(&mut again).await? != 5 || &again[..5] != b"hello" {
        return Err(bad("peeked by the read half"));
    }
    let (mut hel, mut lo) = ([0u8; 3], [0u8; 2]);
    let n = s.try_read_vectored(&mut [IoSliceMut::new(&mut hel), IoSliceMut::new(&mut lo)])?;
    if n != 5 || &hel != b"hel" || &lo != b"lo" {
        return Err(bad("the vectored read"));
    }
    if s.try_read(&mut again).map_err(|e| e.kind()) != Err(std::io::ErrorKind::WouldBlock) {
        return Err(bad("peeked bytes read twice"));
    }

    // A listener from a socket, accepted by hand, its TTL inherited.
    let ls = TcpSocket::new_v4()?;
    ls.set_reuseaddr(true)?;
    ls.bind(SocketAddr::from(([0, 0, 0, 0], 9300)))?;
    let listener = ls.listen(16)?;
    listener.set_ttl(33)?;
    if listener.ttl()? != 33 {
        return Err(bad("listener TTL"));
    }
    let (mut a, peer) = poll_fn(|cx| listener.poll_accept(cx)).await?;
    if peer.ip().to_string() != PEER || a.ttl()? != 33 {
        return Err(bad("accepted connection: peer or TTL"));
    }
    let mut ping = Vec::new();
    a.read_to_end(&mut ping).await?;
    if ping != b"ping" {
        return Err(bad("the kernel client's bytes"));
    }
    let ready = a.ready(Interest::READABLE).await?;
    if !ready.is_read_closed() {
        return Err(bad("the end of the stream is not read-closed"));
    }

    // UDP without waiting in the calls themselves.
    let u = UdpSocket::bind("10.77.0.3:9400").await?;
    u.set_ttl(9)?;
    if u.ttl()? != 9 {
        return Err(bad("UDP TTL"));
    }
    u.writable().await?;
    u.try_send_to(
        b"dgram",
        "10.77.0.2:9200".parse().map_err(std::io::Error::other)?,
    )?;
    let mut buf = [0u8; 64];
    let (n, from) = loop {
        u.readable().await?;
        match u.try_recv_from(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => break other?,
        }
    };
    if &buf[..n] != b"dgram" || from.to_string() != "10.77.0.2:9200" {
        return Err(bad("the UDP echo"));
    }
    u.connect("10.77.0.2:9200").await?;
    u.try_send(b"again")?;
    let n = loop {
        let r = u.ready(Interest::READABLE | Interest::WRITABLE).await?;
        if !r.is_readable() {
            tokio::task::yield_now().await;
            continue;
        }
        match u.try_recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => break other?,
        }
    };
    if &buf[..n] != b"again" {
        return Err(bad("the connected UDP echo"));
    }
    // Peeked, then taken into a growing buffer.
    u.try_send(b"third")?;
    if u.peek(&mut buf).await? != 5 || &buf[..5] != b"third" {
        return Err(bad("the UDP peek"));
    }
    let mut grown: Vec<u8> = Vec::with_capacity(64);
    let (n, from) = u.recv_buf_from(&mut grown).await?;
    if n != 5 || grown != b"third" || from.to_string() != "10.77.0.2:9200" {
        return Err(bad("recv_buf_from"));
    }

    // An on-link address nobody holds: refused once ARP goes unanswered, as the kernel does.
    match corelane::net::TcpStream::connect("10.77.0.99:80").await {
        Err(e) if e.kind() == std::io::ErrorKind::HostUnreachable => {}
        other => return Err(bad(&format!("connect to nobody: {other:?}"))),
    }
    Ok(())
}

#[test]
fn a_tokio_program_s_socket_calls_work_against_kernel_peers() -> Result<(), String> {
    if !require_root("tokio surface") {
        return Ok(());
    }
    let net = common::net(1);
    // Kernel peers: a TCP echo that reports who connected, a UDP echo, and a client that
    // connects to the corelane listener and sends "ping". (The TTLs on the wire are checked
    // frame by frame in the protocol crate's tests_reply_path.rs.)
    let (tcp, udp) = net
        .client_ns()
        .run(|| -> std::io::Result<_> {
            let t = std::net::TcpListener::bind((PEER, 9100))?;
            let u = std::net::UdpSocket::bind((PEER, 9200))?;
            Ok((t, u))
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let (seen_tx, seen_rx) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((mut s, peer)) = tcp.accept() {
            let _ = seen_tx.send(peer);
            let mut b = [0u8; 5];
            if s.read_exact(&mut b).is_ok() {
                let _ = s.write_all(&b);
            }
            let _ = s.read(&mut b);
        }
    });
    std::thread::spawn(move || {
        let mut b = [0u8; 64];
        for _ in 0..3 {
            if let Ok((n, from)) = udp.recv_from(&mut b) {
                let _ = udp.send_to(&b[..n], from);
            }
        }
    });
    let server = addr(&format!("{SERVER}:9300"))?;
    let client = net
        .client_ns()
        .spawn(move || -> Result<(), String> {
            let end = Instant::now() + Duration::from_secs(20);
            loop {
                match std::net::TcpStream::connect_timeout(&server, Duration::from_millis(200)) {
                    Ok(mut s) => {
                        s.write_all(b"ping").map_err(|e| e.to_string())?;
                        s.shutdown(std::net::Shutdown::Write)
                            .map_err(|e| e.to_string())?;
                        return Ok(());
                    }
                    Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => return Err(format!("connecting to the listener: {e}")),
                }
            }
        })
        .map_err(|e| e.to_string())?;
    let build = one_core(net.server_if(), SERVER);
    let report = net
        .server_ns()
        .run(move || {
            build()
                .build()
                .map_err(|e| e.to_string())?
                .try_run(|_| port_of_a_tokio_program())
                .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    report?;
    client.join().map_err(|_| "client thread")??;
    let peer = seen_rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| "the kernel echo saw no connection")?;
    assert_eq!(
        peer.port(),
        41000,
        "the connection came from the bound port"
    );
    Ok(())
}
