//! `#[corelane::test]` and `#[corelane::main]`: a tokio service's tests and main, ported by
//! changing the attribute.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::*;
use corelane::net::{TcpListener, TcpStream};
use corelane_testnet::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[corelane::test]
async fn a_ported_tokio_test_runs_in_the_lab() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let (mut r, mut w) = s.split();
        tokio::io::copy(&mut r, &mut w).await
    });
    let mut c = TcpStream::connect(addr).await.expect("connect");
    c.write_all(b"ported").await.expect("write");
    let mut b = [0u8; 6];
    c.read_exact(&mut b).await.expect("read");
    assert_eq!(&b, b"ported");
}

#[corelane::test]
async fn a_test_that_returns_a_result_keeps_it() -> std::io::Result<()> {
    let u = corelane::net::UdpSocket::bind("127.0.0.1:0").await?;
    let v = corelane::net::UdpSocket::bind("127.0.0.1:0").await?;
    u.send_to(b"dgram", v.local_addr()?).await?;
    let mut b = [0u8; 16];
    let (n, from) = v.recv_from(&mut b).await?;
    assert_eq!((&b[..n], from), (&b"dgram"[..], u.local_addr()?));
    Ok(())
}

/// Set in the child process: the main below runs there.
const CHILD: &str = "CORELANE_ATTRIBUTES_CHILD";

/// A service's main as `#[tokio::main]` had it; its interface and address come from the
/// `CORELANE_*` variables. It greets one client and then stops with an error of its own.
#[corelane::main(addr = "10.99.0.9/24")]
async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(7).await?;
    let (mut s, _) = listener.accept().await?;
    s.write_all(b"hello from main").await?;
    s.shutdown().await?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await?;
    Err("served one, as asked".into())
}

#[test]
fn a_ported_main_takes_its_interface_and_address_from_the_environment() {
    if std::env::var_os(CHILD).is_some() {
        let e = serve().expect_err("the core's error ends main");
        assert!(e.to_string().contains("served one, as asked"), "{e}");
        return;
    }
    if !require_root("attributes: corelane::main") {
        return;
    }
    let net = net(1);
    let exe = std::env::current_exe().expect("exe");
    let mut cmd: Command = net.server_ns().command(exe.to_str().expect("path"));
    cmd.args([
        "--exact",
        "a_ported_main_takes_its_interface_and_address_from_the_environment",
        "--nocapture",
    ])
    .env(CHILD, "1")
    .env("CORELANE_IFACE", net.server_if())
    // Over the attribute's address, which is on no link here.
    .env("CORELANE_ADDR", format!("{SERVER_V4}/24"))
    .env("CORELANE_CORES", "1");
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("child");
    let to: SocketAddr = format!("{SERVER_V4}:7").parse().expect("addr");
    let got = net
        .client_ns()
        .run(move || -> std::io::Result<Vec<u8>> {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let mut s = loop {
                match std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
                    Ok(s) => break s,
                    Err(e) if std::time::Instant::now() > deadline => return Err(e),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut b = Vec::new();
            s.read_to_end(&mut b)?;
            s.write_all(b"bye")?;
            Ok(b)
        })
        .expect("client namespace");
    let out = child.wait_with_output().expect("child ends");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(got.ok().as_deref(), Some(&b"hello from main"[..]), "{text}");
    assert!(
        out.status.success(),
        "the child's main did not end as asked:\n{text}"
    );
}
