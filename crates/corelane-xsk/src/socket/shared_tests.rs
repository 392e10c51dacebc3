//! Tests of `shared.rs`.

use super::*;
use crate::{Proto, XskQueue};
use corelane_frame::FrameIo;
use corelane_testnet::VethPair;
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 91, 0, 1);
const PORT: u16 = 9000;

/// Starts sending `payloads` from the client to the server's port; the thread returns what
/// the client's socket then receives: `want` datagrams, or what came within `wait`.
fn exchange(
    net: &VethPair,
    payloads: &[&str],
    want: usize,
    wait: Duration,
) -> corelane_testnet::NsThread<Vec<(SocketAddr, Vec<u8>)>> {
    let payloads: Vec<String> = payloads.iter().map(|s| s.to_string()).collect();
    net.client_ns()
        .spawn(move || {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            for p in &payloads {
                s.send_to(p.as_bytes(), (SERVER, PORT)).unwrap();
            }
            if want > 0 {
                s.set_read_timeout(Some(wait)).unwrap();
            }
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            while got.len() < want
                && let Ok((n, from)) = s.recv_from(&mut buf)
            {
                got.push((from, buf[..n].to_vec()));
            }
            got
        })
        .unwrap()
}

/// The UDP payload of an untagged IPv4 frame.
fn payload(frame: &[u8]) -> &[u8] {
    &frame[42.min(frame.len())..]
}

#[test]
fn a_second_socket_on_the_queue_shares_the_umem_and_its_rings() {
    if !corelane_testnet::require_root("a_second_socket_on_the_queue_shares_the_umem") {
        return;
    }
    let lab = crate::lab_tests::lab(91);
    let (net, mut steering) = (&lab.net, lab.steering);
    let ifname = net.server_if();
    steering.own_port(Proto::Udp, PORT).unwrap();
    let config = crate::lab_tests::small();
    let mut a = XskQueue::open(ifname, 0, &config).unwrap();
    steering.register(0, a.fd()).unwrap();

    // The first socket receives what the program steers to the queue.
    let client = exchange(net, &["a0", "a1", "a2"], 0, Duration::ZERO);
    let mut got = VecDeque::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 3 && Instant::now() < deadline {
        a.wait(100).unwrap();
        a.recv(&mut got, 64);
    }
    let seen: Vec<Vec<u8>> = got.iter().map(|f| payload(a.bytes(f)).to_vec()).collect();
    assert_eq!(seen, [b"a0".to_vec(), b"a1".to_vec(), b"a2".to_vec()]);
    a.release(&mut got.drain(..).collect());
    client.join().unwrap();

    // A second socket joins the queue from the first one's descriptor and the UMEM's memory
    // file (mapped anew, as another process maps it), and the program is pointed at it.
    let (file, len) = (a.umem.file(), a.umem.len());
    let file = file.try_clone_to_owned().unwrap();
    let first = a.socket.borrow().try_clone_to_owned().unwrap();
    let mut b = Joined::open(ifname, 0, first.as_fd(), file, len, 64).unwrap();
    drop(first);
    steering.register(0, b.socket.raw()).unwrap();

    // It receives into frames the first socket posted to the shared fill ring, and reads
    // them through its own mapping.
    let client = exchange(net, &["b0", "b1"], 1, Duration::from_secs(5));
    let mut descs = [super::super::ring::Desc::default(); 8];
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while n < 2 && Instant::now() < deadline {
        b.socket.poll_readable(100).unwrap();
        n += b.rings.rx.pop(&mut descs[n..]);
    }
    assert_eq!(n, 2, "the second socket receives what is steered to it");
    for (d, want) in descs[..2].iter().zip([b"b0", b"b1"]) {
        assert!(d.addr < len as u64);
        // SAFETY: the kernel handed this frame to the second socket's RX ring.
        let f = unsafe { b.umem.bytes(d.addr, d.len as usize) };
        assert_eq!(payload(f), want);
    }
    assert_eq!(
        a.recv(&mut got, 64),
        0,
        "nothing for the first socket any more"
    );

    // The fill and completion rings it maps are the first socket's: the same indices.
    let (mut fq, mut cq) = b.fill_and_completion().unwrap();
    assert_eq!(fq.free_exact(), a.fq.free_exact());
    assert!(fq.free_exact() < 64, "the first socket's frames are in it");

    // It sends back through its own TX ring, and the completion comes back on the shared
    // completion ring.
    let mut d = descs[1];
    // SAFETY: the frame came off the second socket's RX ring, and nothing else refers to
    // it until it is sent.
    crate::lab_tests::turn_around(unsafe { b.umem.bytes_mut(d.addr, d.len as usize) });
    d.options = 0;
    assert_eq!(b.rings.tx.push(&[d]), 1);
    b.socket.kick_tx().unwrap();
    let mut done = [0u64; 4];
    let mut c = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while c == 0 && Instant::now() < deadline {
        c = cq.pop(&mut done);
        if c == 0 {
            b.socket.kick_tx().unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!(c, 1, "one completion, on the shared ring");
    assert_eq!(done[0] / 2048, d.addr / 2048, "for the frame sent");
    let replies = client.join().unwrap();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].1, b"b1");
    assert_eq!(replies[0].0, SocketAddr::from((SERVER, PORT)));
}
