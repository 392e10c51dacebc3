//! corelane's TCP on a path longer than a veth: the router holds every frame toward the server
//! for 5 ms (a delay line), so at 500 Mbit/s a window must reach about 300 KiB to fill the
//! path. corelane's buffers follow the window rather than stopping at a fixed size: its send
//! buffer grows to two congestion windows and its receive window toward twice what arrives per
//! round trip, both past 256 KiB (a buffer that size would cap the path near 420 Mbit/s), and
//! neither past the stack's maximum. The kernel's TCP is the peer both ways; every byte
//! arrives intact.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::sync::mpsc;
use std::time::Duration;

use common::{payload, sha256 as sha};
use corelane::StackConfig;
use corelane_testnet::{Loss, require_root};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KERNEL: &str = "10.85.0.1";
const CLIENT: &str = "10.85.0.2";
const CORELANE: &str = "10.85.0.3";
const N: usize = 16 << 20;
const OLD_FIXED: usize = 256 * 1024;

/// The largest send queue and receive window corelane's side showed during each transfer.
#[derive(Debug)]
struct Seen {
    send_queue: usize,
    rcv_window: usize,
    received: Option<[u8; 32]>,
}

#[test]
fn buffers_grow_with_a_long_path_s_window_both_ways() {
    if !require_root("tcp on a 5 ms path") {
        return;
    }
    let net = common::lossy_path(KERNEL, CLIENT);
    net.set_rate(Some(500), Some(500)).expect("rate");
    net.set_reorder(Loss::ALL, Loss::NONE, Duration::from_millis(5))
        .expect("delay line");
    // The kernel server corelane downloads from, in the client namespace.
    let kernel_server = net
        .client_ns()
        .spawn(|| {
            let l = TcpListener::bind((CLIENT, 5041)).expect("listen");
            let (mut s, _) = l.accept().expect("accept");
            s.write_all(&payload(N, 41)).expect("send");
            s.shutdown(Shutdown::Write).expect("shutdown");
            let _ = s.read(&mut [0u8; 16]);
        })
        .expect("kernel server");
    let (tx, rx) = mpsc::channel::<Result<Seen, String>>();
    let builder = common::one_core_on(&net, CORELANE);
    let max = StackConfig::default().tcp_tx_buffer;
    let served = common::serve_reporting(net.server_ns(), builder, tx, |tx| async move {
        let l = corelane::net::TcpListener::bind(5040).await.expect("bind");
        let upload = async {
            let (mut s, _) = l.accept().await?;
            let data = payload(N, 40);
            let mut seen = 0;
            for chunk in data.chunks(64 * 1024) {
                s.write_all(chunk).await?;
                seen = seen.max(s.info()?.send_queue);
            }
            s.shutdown().await?;
            let _ = s.read(&mut [0u8; 16]).await?;
            Ok::<_, std::io::Error>(seen)
        };
        let download = async {
            let mut s = corelane::net::TcpStream::connect(format!("{CLIENT}:5041")).await?;
            let (mut v, mut buf, mut seen) = (Vec::with_capacity(N), vec![0; 65536], 0);
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                v.extend_from_slice(&buf[..n]);
                seen = seen.max(s.info()?.rcv_window);
            }
            Ok::<_, std::io::Error>((sha(&v), seen))
        };
        let r = match tokio::join!(upload, download) {
            (Ok(send_queue), Ok((hash, rcv_window))) => Ok(Seen {
                send_queue,
                rcv_window,
                received: Some(hash),
            }),
            (Err(e), _) => Err(format!("upload: {e}")),
            (_, Err(e)) => Err(format!("download: {e}")),
        };
        let _ = tx.send(r);
    })
    .expect("corelane");
    let addr: SocketAddr = format!("{CORELANE}:5040").parse().expect("address");
    let got = net
        .client_ns()
        .run(move || common::download(addr))
        .expect("client");
    let seen = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a report")
        .expect("corelane");
    served.end();
    kernel_server.join().expect("kernel server");
    assert_eq!(got.len(), N);
    assert!(got == payload(N, 40), "corelane's bytes arrived changed");
    assert!(
        seen.received == Some(sha(&payload(N, 41))),
        "the kernel's bytes arrived changed"
    );
    assert!(
        seen.send_queue > OLD_FIXED && seen.send_queue <= max,
        "{seen:?}"
    );
    let rx_max = StackConfig::default().tcp_rx_buffer;
    assert!(
        seen.rcv_window > OLD_FIXED && seen.rcv_window <= rx_max,
        "{seen:?}"
    );
}
