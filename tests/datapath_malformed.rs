//! Frames from the wire that are truncated, corrupted or plain garbage are counted and dropped;
//! the server keeps serving and loses nothing.

mod common;

use common::*;
use corelane_testnet::require_root;

/// A raw AF_PACKET socket bound to one interface, for sending hand-made frames.
struct RawSocket {
    fd: i32,
    ifindex: i32,
}

impl RawSocket {
    fn open(ifname: &str) -> RawSocket {
        let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto) };
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        let name = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: name is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
        assert!(ifindex > 0, "no {ifname}");
        RawSocket { fd, ifindex }
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid starting value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = self.ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: frame and addr are valid for the lengths given for the duration of the call.
        let n = unsafe {
            libc::sendto(
                self.fd,
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert!(n >= 0, "sendto: {}", std::io::Error::last_os_error());
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: fd is ours and open.
        unsafe { libc::close(self.fd) };
    }
}

fn mac_of(link: &str) -> [u8; 6] {
    let s = link
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("MAC in ip link output");
    let mut m = [0u8; 6];
    for (b, p) in m.iter_mut().zip(s.split(':')) {
        *b = u8::from_str_radix(p, 16).unwrap();
    }
    m
}

fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from(c[0]) << 8
        };
        sum += u32::from(w);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Ethernet + IPv4 (valid header checksum) + a TCP header to port 7 with a wrong checksum.
fn tcp_frame_bad_checksum(dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = 20 + 20 + payload.len();
    let mut ip = vec![
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        1,
        0x40,
        0,
        64,
        6,
        0,
        0,
    ];
    ip.extend_from_slice(&[10, 77, 0, 2, 10, 77, 0, 3]);
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    // src port 40000, dst 7, seq 1, ack 0, data offset 5, flags ACK, window, checksum 0xdead.
    f.extend_from_slice(&[
        0x9c, 0x40, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0x20, 0, 0xde, 0xad, 0, 0,
    ]);
    f.extend_from_slice(payload);
    f
}

#[test]
fn datapath_malformed_frames_and_a_garbage_flood_are_counted_and_survived() {
    if !require_root("datapath_malformed_frames") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24"]);
    let server_mac = mac_of(&net.server_link().unwrap());
    let client_if = net.client_if().to_string();
    let client_link = net
        .client_ns()
        .ip(&["link", "show", "dev", &client_if])
        .unwrap();
    let client_mac = mac_of(&client_link);

    net.client_ns()
        .run(move || {
            let raw = RawSocket::open(&client_if);
            // A bad TCP checksum to the owned address and port: steered, then dropped by classify.
            for _ in 0..10 {
                raw.send(&tcp_frame_bad_checksum(server_mac, client_mac, b"corrupt"));
            }
            // IPv4 header truncated after the Ethernet header: malformed at XDP.
            let mut short = Vec::from(&server_mac[..]);
            short.extend_from_slice(&client_mac);
            short.extend_from_slice(&[0x08, 0x00, 0x45, 0x00]);
            for _ in 0..10 {
                raw.send(&short);
            }
            // TCP header cut short on an owned address: malformed at XDP.
            let cut = tcp_frame_bad_checksum(server_mac, client_mac, b"");
            for _ in 0..10 {
                raw.send(&cut[..14 + 20 + 8]);
            }
            // A flood of garbage IPv4 frames at the owned address.
            let mut x: u64 = 0x1234_5678_9abc_def1;
            let good = tcp_frame_bad_checksum(server_mac, client_mac, &[0u8; 64]);
            for i in 0..50_000 {
                let mut f = good.clone();
                for b in f.iter_mut().skip(14 + 20) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *b = x as u8;
                }
                // Keep the address and port so the frames are steered; vary the length.
                f[14 + 22] = 0;
                f[14 + 23] = 7;
                f.truncate(14 + 20 + 20 + (i % 64));
                raw.send(&f);
            }
        })
        .unwrap();

    // Still serving, byte for byte.
    assert_echoes(&net, format!("{SERVER_V4}:7").parse().unwrap(), 2 << 20, 11);

    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert!(device_counter(&out, "bad checksum") >= 10, "{out}");
    assert!(xdp_counter(&out, "malformed") >= 20, "{out}");
}
