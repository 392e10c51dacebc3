//! TCP's urgent mechanism end to end (RFC 9293 3.8.5, MUST-30/31): a kernel client on a veth
//! sends data and then one byte with `MSG_OOB` (Linux sets URG and points past that byte);
//! corelane's server, through the XDP program and the runtime, reads every byte inline and in
//! order, and `urgent_remaining` says how many of them are urgent. Before, the pointer was
//! dropped in parsing and the application could not tell.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

use common::{SERVER_V4, net, serve_on};
use corelane::net::TcpListener;
use corelane_testnet::require_root;
use tokio::io::AsyncReadExt;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[test]
fn urgent_data_from_a_kernel_client_is_read_inline_with_its_end_known() -> Result {
    if !require_root("TCP urgent data") {
        return Ok(());
    }
    let net = net(1);
    let (tx, rx) = mpsc::channel();
    let served = serve_on(
        &net,
        |b| b.cores(1),
        move |_| {
            let tx = tx.clone();
            async move {
                let l = TcpListener::bind(7).await.expect("listen");
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                // Wait (bounded) until all six bytes are in: the urgent one is last.
                let mut probe = [0u8; 16];
                for _ in 0..200 {
                    if s.peek(&mut probe).await.unwrap_or(0) >= 6 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let before = s.urgent_remaining().unwrap_or(usize::MAX);
                let mut all = Vec::new();
                let _ = s.read_to_end(&mut all).await;
                let _ = tx.send((before, all));
            }
        },
    )?;
    let to: SocketAddr = format!("{SERVER_V4}:7").parse()?;
    net.client_ns().run(move || -> std::io::Result<()> {
        // Retried briefly while the listener comes up.
        let mut s = None;
        for _ in 0..50 {
            if let Ok(c) = TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
                s = Some(c);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut s = s.ok_or_else(|| std::io::Error::other("no connection"))?;
        s.write_all(b"hello")?;
        // SAFETY: send(2) on the stream's own descriptor with a one-byte buffer that lives
        // for the call.
        let n = unsafe { libc::send(s.as_raw_fd(), b"!".as_ptr().cast(), 1, libc::MSG_OOB) };
        if n != 1 {
            return Err(std::io::Error::last_os_error());
        }
        std::thread::sleep(Duration::from_millis(200));
        Ok(())
    })??;
    let (urgent, all) = rx.recv_timeout(Duration::from_secs(20))?;
    assert_eq!(all, b"hello!", "every byte inline, in order");
    assert_eq!(urgent, 6, "the urgent point is after the out-of-band byte");
    served.stop.stop();
    served.thread.join()??;
    Ok(())
}
