//! A veth pair whose MTU is larger than a 2048-byte frame holds: the runtime picks page-sized
//! frames by itself (no `XskConfig` from the application), and full-size TCP segments and UDP
//! datagrams of that MTU cross both ways. At MTU 9000 (a datacenter's jumbo frames) a frame
//! spans three UMEM frames: the XDP program runs in native mode as a multi-buffer program and
//! the AF_XDP socket chains descriptors (`XDP_USE_SG`) both ways.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use common::*;
use corelane_testnet::{VethPair, require_root};

#[test]
fn an_mtu_above_a_half_page_frame_gets_page_frames_and_full_size_segments_cross() {
    if !require_root("datapath jumbo MTU") {
        return;
    }
    let net = VethPair::builder()
        .mtu(3000)
        .server_addr("10.77.0.1/24")
        .client_addr("10.77.0.2/24")
        .build()
        .expect("veth pair");
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24", "--cores", "1"]);
    let to: SocketAddr = format!("{SERVER_V4}:7").parse().expect("addr");
    // TCP: the kernel's MSS is 2960 both ways; 8 MiB echoed byte for byte.
    assert_echoes(&net, to, 8 << 20, 1);
    assert_eq!(
        udp_echo(&net, to, 2972),
        payload(2972, 9),
        "the datagram came back whole"
    );
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
}

#[test]
fn mtu_9000_frames_span_umem_frames_both_ways() {
    if !require_root("datapath MTU 9000") {
        return;
    }
    for mode in ["native", "generic"] {
        let net = VethPair::builder()
            .mtu(9000)
            .server_addr("10.77.0.1/24")
            .client_addr("10.77.0.2/24")
            .build()
            .expect("veth pair");
        let echo = Echo::start(
            &net,
            &["--addr", "10.77.0.3/24", "--cores", "1", "--xdp-mode", mode],
        );
        assert!(
            echo.output().contains(&format!("attached in {mode} mode")),
            "{}",
            echo.output()
        );
        let to: SocketAddr = format!("{SERVER_V4}:7").parse().expect("addr");
        // TCP: 16 MiB echoed byte for byte, the kernel client's largest segment received from
        // corelane a full 9000-byte packet's (8948 bytes with timestamps), its own likewise.
        let data = payload(16 << 20, 3);
        let want = sha256(&data);
        let (got, n, rcv_mss, snd_mss) = net
            .client_ns()
            .run(move || echo_with_mss(to, &data))
            .expect("client thread")
            .expect("tcp echo");
        assert_eq!((n, got), (16 << 20, want), "{mode}: echoed bytes differ");
        assert_eq!(
            snd_mss, 8948,
            "{mode}: the client sends full 9000-byte packets"
        );
        assert_eq!(
            rcv_mss, 8948,
            "{mode}: corelane sent full 9000-byte packets"
        );
        // UDP: a full 9000-byte IP packet each way (no fragmentation at this MTU).
        assert_eq!(
            udp_echo(&net, to, 8972),
            payload(8972, 9),
            "{mode}: the datagram"
        );
        let (status, out) = echo.stop();
        assert_clean_exit(status, &out);
        assert_eq!(xdp_counter(&out, "malformed"), 0, "{mode}: {out}");
    }
}

/// Echoes `data` through `to` and returns the hash and length of what came back, with the
/// client socket's largest received segment and its send MSS (`TCP_INFO`).
fn echo_with_mss(to: SocketAddr, data: &[u8]) -> std::io::Result<([u8; 32], usize, u32, u32)> {
    let mut s = connect(to)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut r = s.try_clone()?;
    let len = data.len();
    let reader = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
        let mut got = Vec::with_capacity(len);
        let mut buf = vec![0u8; 256 << 10];
        while got.len() < len {
            let k = r.read(&mut buf)?;
            if k == 0 {
                break;
            }
            got.extend_from_slice(&buf[..k]);
        }
        Ok(got)
    });
    s.write_all(data)?;
    let got = reader
        .join()
        .map_err(|_| std::io::Error::other("reader panicked"))??;
    let info = corelane_testnet::sockopt::tcp_info(&s)?;
    let (rcv_mss, snd_mss) = (info.tcpi_rcv_mss, info.tcpi_snd_mss);
    Ok((sha256(&got), got.len(), rcv_mss, snd_mss))
}

/// Sends one UDP datagram of `len` bytes to `to` from the client (up to five tries) and returns
/// the answer.
fn udp_echo(net: &VethPair, to: SocketAddr, len: usize) -> Vec<u8> {
    net.client_ns()
        .run(move || -> std::io::Result<Vec<u8>> {
            let s = UdpSocket::bind("10.77.0.2:0")?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            let d = payload(len, 9);
            let mut buf = vec![0u8; 16384];
            for _ in 0..5 {
                s.send_to(&d, to)?;
                if let Ok((n, _)) = s.recv_from(&mut buf) {
                    return Ok(buf[..n].to_vec());
                }
            }
            Err(std::io::Error::other("no answer"))
        })
        .expect("client thread")
        .expect("udp echo")
}
