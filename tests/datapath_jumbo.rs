//! A veth pair whose MTU is larger than a 2048-byte frame holds: the runtime picks page-sized
//! frames by itself (no `XskConfig` from the application), and full-size TCP segments and UDP
//! datagrams of that MTU cross both ways.

mod common;

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
    // UDP: one datagram of 2972 bytes (a full 3000-byte IP packet) and back.
    let got = net
        .client_ns()
        .run(move || -> std::io::Result<Vec<u8>> {
            let s = UdpSocket::bind("10.77.0.2:0")?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            let d = payload(2972, 9);
            let mut buf = vec![0u8; 4096];
            for _ in 0..5 {
                s.send_to(&d, to)?;
                if let Ok((n, _)) = s.recv_from(&mut buf) {
                    return Ok(buf[..n].to_vec());
                }
            }
            Err(std::io::Error::other("no answer"))
        })
        .expect("client thread")
        .expect("udp echo");
    assert_eq!(got, payload(2972, 9), "the datagram came back whole");
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
}
