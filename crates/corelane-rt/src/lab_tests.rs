//! The lab: a service and its own client on corelane's sockets, without root or a device.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::lab::{self, Lab};
use crate::net::{TcpListener, TcpStream, UdpSocket};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// An echo listener on `addr` (port 0: one the lab picks); its address.
async fn echo_server(addr: &str) -> SocketAddr {
    let listener = TcpListener::bind(addr).await.unwrap();
    let at = listener.local_addr().unwrap();
    tokio::task::spawn_local(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::task::spawn_local(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    at
}

/// Sends `data` on a new connection to `to` and reads the echo to its end.
async fn echo(to: SocketAddr, data: Vec<u8>) -> Vec<u8> {
    let s = TcpStream::connect(to).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let writer = tokio::task::spawn_local(async move {
        w.write_all(&data).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    back
}

#[test]
fn a_service_and_its_client_meet_on_the_loopback_addresses_of_both_families() {
    let out = lab::run(async {
        let mut ends = Vec::new();
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let at = echo_server(addr).await;
            assert_ne!(at.port(), 0, "{addr}: a port was picked");
            assert_eq!(at.ip(), addr.parse::<SocketAddr>().unwrap().ip());
            let data = pattern(1 << 20, at.port() as u8);
            let back = echo(at, data.clone()).await;
            ends.push(back == data);
        }
        ends
    })
    .unwrap();
    assert_eq!(out, [true, true], "each family's 1 MiB echoed whole");
}

#[test]
fn many_connections_at_once_each_echo_whole() {
    lab::run(async {
        let at = echo_server("127.0.0.1:7").await;
        let tasks: Vec<_> = (0..64u8)
            .map(|i| {
                let data = pattern(64 * 1024 + usize::from(i), i);
                tokio::task::spawn_local(async move { echo(at, data.clone()).await == data })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            assert!(t.await.unwrap(), "connection {i}");
        }
    })
    .unwrap();
}

#[test]
fn datagrams_to_the_lab_s_own_address_arrive_and_timers_run() {
    lab::run(async {
        let a = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = b.local_addr().unwrap();
        a.send_to(b"to the lab", to).await.unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = b.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"to the lab");
        assert_eq!(from, a.local_addr().unwrap());
        let t = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(t.elapsed() >= Duration::from_millis(20));
    })
    .unwrap();
}

#[test]
fn a_lab_with_its_own_addresses_serves_them_and_no_others() {
    let lab = Lab::new().addr("10.1.0.1/24").unwrap().seed(5);
    lab.run(async {
        let at = echo_server("10.1.0.1:80").await;
        assert_eq!(echo(at, b"hello".to_vec()).await, b"hello");
        assert!(
            TcpListener::bind("127.0.0.1:81").await.is_err(),
            "127.0.0.1 is not the lab's once it was given addresses"
        );
    })
    .unwrap();
    assert!(Lab::new().addr("224.0.0.1/4").is_err(), "multicast refused");
}

#[test]
fn a_closed_port_is_refused_and_an_address_no_one_answers_fails_instead_of_hanging() {
    let (closed, silent, unrouted) = lab::run(async {
        let within = |f| tokio::time::timeout(Duration::from_secs(60), f);
        (
            within(TcpStream::connect("127.0.0.1:9")).await,
            within(TcpStream::connect("127.0.0.2:9")).await,
            within(TcpStream::connect("10.250.0.1:9")).await,
        )
    })
    .unwrap();
    let kind = |r: Result<std::io::Result<TcpStream>, _>| {
        r.expect("an answer before the timeout")
            .err()
            .map(|e| e.kind())
    };
    // A closed port of the lab's own address: reset at once, as the kernel's are.
    assert_eq!(kind(closed), Some(std::io::ErrorKind::ConnectionRefused));
    // An address on the lab's link that no one holds: the neighbour never answers.
    assert!(kind(silent).is_some());
    // No route at all.
    assert!(kind(unrouted).is_some());
}

#[test]
fn tasks_still_running_when_the_future_ends_are_dropped_and_the_lab_runs_again() {
    for _ in 0..2 {
        let held = Rc::new(());
        let h = held.clone();
        lab::run(async move {
            let at = echo_server("127.0.0.1:0").await;
            tokio::task::spawn_local(async move {
                let _h = h;
                let _s = TcpStream::connect(at).await;
                std::future::pending::<()>().await;
            });
            tokio::task::yield_now().await;
        })
        .unwrap();
        assert_eq!(Rc::strong_count(&held), 1, "the task was dropped");
    }
}

#[test]
#[should_panic(expected = "the test's own assertion")]
fn a_panic_in_the_future_fails_the_test() {
    let _ = lab::run(async { panic!("the test's own assertion") });
}

#[test]
fn after_a_panic_in_a_lab_the_thread_is_no_core_s() {
    let r = std::panic::catch_unwind(|| lab::run(async { panic!("inside") }));
    assert!(r.is_err());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let e = rt.block_on(TcpListener::bind("127.0.0.1:0")).err();
    assert!(
        e.is_some(),
        "a socket off the lab, after its panic, is refused"
    );
    // And a lab runs again on the thread.
    assert_eq!(lab::run(async { 7 }).unwrap(), 7);
}

#[test]
fn off_the_lab_the_sockets_still_say_where_they_belong() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let e = rt.block_on(TcpListener::bind("127.0.0.1:0")).err().unwrap();
    assert!(e.to_string().contains("corelane::lab::run"), "{e}");
}

#[test]
fn a_socket_bound_to_one_of_two_owned_addresses_answers_from_it() {
    let lab = Lab::new()
        .addr("10.1.0.1/24")
        .and_then(|l| l.addr("10.1.0.2/24"))
        .unwrap();
    lab.run(async {
        let server = UdpSocket::bind("10.1.0.2:7").await.unwrap();
        let client = UdpSocket::bind("10.1.0.1:0").await.unwrap();
        let to = server.local_addr().unwrap();
        client.send_to(b"who are you", to).await.unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = server.recv_from(&mut buf).await.unwrap();
        assert_eq!(from.ip().to_string(), "10.1.0.1");
        server.send_to(&buf[..n], from).await.unwrap();
        let (_, replier) = client.recv_from(&mut buf).await.unwrap();
        // As a kernel socket: the address it was bound to, not the first one owned.
        assert_eq!(replier, to);
    })
    .unwrap();
}

#[test]
fn a_read_into_an_uninitialized_buffer_initializes_only_what_it_fills_and_try_read_buf_grows_a_vec()
{
    use std::mem::MaybeUninit;
    use std::pin::Pin;
    use tokio::io::{AsyncRead, ReadBuf};

    let (filled, initialized, peeked) = lab::run(async {
        let at = echo_server("127.0.0.1:0").await;
        let mut s = TcpStream::connect(at).await.unwrap();
        s.write_all(b"hello, world").await.unwrap();
        let mut space = [MaybeUninit::<u8>::uninit(); 8192];
        // The echo is there to peek once a peek sees it all.
        let mut peeked = 0;
        while peeked < 12 {
            let mut buf = ReadBuf::uninit(&mut space);
            peeked = s.peek(buf.initialize_unfilled()).await.unwrap();
        }
        let mut space = [MaybeUninit::<u8>::uninit(); 8192];
        let mut buf = ReadBuf::uninit(&mut space);
        std::future::poll_fn(|cx| Pin::new(&mut s).poll_read(cx, &mut buf))
            .await
            .unwrap();
        let filled = buf.filled().to_vec();
        let initialized = buf.initialized().len();
        // `try_read_buf` into a vector's spare room, in pieces as they come.
        s.write_all(b"and again").await.unwrap();
        let mut got = Vec::with_capacity(4);
        while got.len() < 9 {
            s.readable().await.unwrap();
            match s.try_read_buf(&mut got) {
                Ok(n) => assert!(n > 0, "the end of the stream"),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, b"and again");
        (filled, initialized, peeked)
    })
    .unwrap();
    assert_eq!(peeked, 12);
    assert_eq!(filled, b"hello, world");
    // A read that zeroed the buffer's free part first (8 KiB for 12 bytes: hyper's reads paid
    // that on every request) initializes all of it.
    assert_eq!(initialized, 12, "the read initialized more than it filled");
}

#[test]
fn a_datagram_received_into_an_uninitialized_buffer_initializes_only_its_bytes() {
    use std::mem::MaybeUninit;
    use tokio::io::ReadBuf;

    let (got, initialized, peeked) = lab::run(async {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = server.local_addr().unwrap();
        client.send_to(b"one datagram", to).await.unwrap();
        let mut space = [MaybeUninit::<u8>::uninit(); 8192];
        let mut buf = ReadBuf::uninit(&mut space);
        let from = std::future::poll_fn(|cx| server.poll_peek_from(cx, &mut buf))
            .await
            .unwrap();
        assert_eq!(from, client.local_addr().unwrap());
        let peeked = buf.filled().to_vec();
        let mut space = [MaybeUninit::<u8>::uninit(); 8192];
        let mut buf = ReadBuf::uninit(&mut space);
        std::future::poll_fn(|cx| server.poll_recv_from(cx, &mut buf))
            .await
            .unwrap();
        (buf.filled().to_vec(), buf.initialized().len(), peeked)
    })
    .unwrap();
    assert_eq!(peeked, b"one datagram");
    assert_eq!(got, b"one datagram");
    assert_eq!(
        initialized, 12,
        "the receive initialized more than it filled"
    );
}

#[test]
fn a_vectored_write_queues_every_buffer_in_order() {
    use std::io::IoSlice;
    use tokio::io::AsyncWrite;

    let (vectored, back) = lab::run(async {
        let at = echo_server("127.0.0.1:0").await;
        let mut s = TcpStream::connect(at).await.unwrap();
        let vectored = s.is_write_vectored();
        let body = pattern(3000, 7);
        let bufs = [
            IoSlice::new(b"head\r\n"),
            IoSlice::new(b""),
            IoSlice::new(&body),
        ];
        // Room for all of it: one call queues every buffer.
        let n = s.write_vectored(&bufs).await.unwrap();
        assert_eq!(n, 6 + body.len());
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        let mut want = b"head\r\n".to_vec();
        want.extend_from_slice(&body);
        (vectored, back == want)
    })
    .unwrap();
    assert!(
        vectored,
        "the stream says it is not vectored: hyper would copy"
    );
    assert!(back, "the echo differs");
}
