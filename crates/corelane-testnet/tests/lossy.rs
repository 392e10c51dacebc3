//! The lossy path drops what it is told to, in the direction it is told, and the kernel's TCP
//! still delivers every byte across it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use corelane_testnet::{Loss, LossyPath, require_root};

#[test]
fn the_router_drops_the_chosen_share_one_way_and_tcp_still_delivers() {
    if !require_root("lossy path") {
        return;
    }
    let net = LossyPath::builder()
        .server_addr("10.79.0.1/24")
        .client_addr("10.79.0.2/24")
        .build()
        .expect("path");
    net.set_loss(Loss::NONE, Loss::percent(5.0)).expect("loss");
    let n = 8usize << 20;
    let server = net
        .server_ns()
        .spawn(move || {
            let l = TcpListener::bind("10.79.0.1:5000").expect("listen");
            let (mut s, _) = l.accept().expect("accept");
            let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            s.write_all(&data).expect("send");
        })
        .expect("server");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let got = net
        .client_ns()
        .run(move || {
            let mut s = TcpStream::connect("10.79.0.1:5000").expect("connect");
            let mut v = Vec::new();
            s.read_to_end(&mut v).expect("read");
            v
        })
        .expect("client");
    server.join().expect("server thread");
    assert_eq!(got.len(), n);
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    let c = net.counters().expect("counters");
    // About 5% of ~5800 data frames were dropped toward the client, none toward the server.
    assert!(
        (100..=800).contains(&c.dropped_to_client),
        "dropped to client: {c:?}"
    );
    assert_eq!(c.dropped_to_server, 0, "{c:?}");
    assert!(
        c.dropped_to_client_bytes > 1000 * c.dropped_to_client,
        "{c:?}"
    );
    // A rate limit and duplication apply too.
    net.set_rate(Some(100), Some(100)).expect("rate");
    net.set_duplicate(Loss::percent(50.0), Loss::NONE)
        .expect("dup");
    net.set_rate(None, None).expect("no rate");
}

/// Sends `count` numbered datagrams from the server's side (`server` ip) to the client's
/// (`client` ip, port 5001), 20 at a time with a pause between, while the client reads; the
/// numbers in the order they arrived (the client stops after 500 ms without one).
fn arrivals(net: &LossyPath, server: &'static str, client: &'static str, count: u32) -> Vec<u32> {
    let rx = net
        .client_ns()
        .run(move || std::net::UdpSocket::bind((client, 5001)))
        .expect("ns")
        .expect("bind");
    // A busy machine may leave the receiver unscheduled for a while: a buffer that holds
    // every datagram (each costs a kilobyte or so of buffer), and a wait long enough that the
    // reordering stage's last releases come before it ends the reading.
    corelane_testnet::sockopt::force_receive_buffer(&rx, 8 << 20).expect("SO_RCVBUFFORCE");
    rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .expect("timeout");
    // The receiver reads while the sender sends (2000 datagrams overflow a default buffer).
    let sender = net
        .server_ns()
        .spawn(move || {
            let tx = std::net::UdpSocket::bind((server, 0)).expect("bind");
            for i in 0..count {
                tx.send_to(&i.to_be_bytes(), (client, 5001)).expect("send");
                if i % 20 == 0 {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
        })
        .expect("sender");
    let mut got = Vec::new();
    let mut buf = [0u8; 16];
    while got.len() < count as usize
        && let Ok(n) = rx.recv(&mut buf)
    {
        assert_eq!(n, 4);
        got.push(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]));
    }
    sender.join().expect("sender thread");
    got
}

#[test]
fn the_reordering_stage_delays_the_chosen_share_and_loses_none() {
    if !require_root("lossy path") {
        return;
    }
    let net = LossyPath::builder()
        .server_addr("10.79.1.1/24")
        .client_addr("10.79.1.2/24")
        .build()
        .expect("path");
    net.set_reorder(
        Loss::NONE,
        Loss::percent(10.0),
        std::time::Duration::from_millis(2),
    )
    .expect("reorder");
    let count = 2000u32;
    let (mut seen, mut late, mut max) = (vec![false; count as usize], 0u64, None::<u32>);
    for i in arrivals(&net, "10.79.1.1", "10.79.1.2", count) {
        seen[i as usize] = true;
        if max.is_some_and(|m| i < m) {
            late += 1;
        }
        max = max.max(Some(i));
    }
    let c = net.counters().expect("counters");
    let missing = seen.iter().filter(|&&s| !s).count();
    assert_eq!(missing, 0, "every datagram arrives: {c:?}");
    assert_eq!(c.reordered_to_server, 0, "{c:?}");
    // About 10% of 2000 took the detour, and each arrived behind datagrams sent after it.
    assert!((100..=320).contains(&c.reordered_to_client), "{c:?}");
    assert_eq!(c.reorder_released, c.reordered_to_client, "{c:?}");
    assert_eq!(c.reorder_dropped, 0, "{c:?}");
    assert!(
        late * 10 >= c.reordered_to_client * 9 && late <= c.reordered_to_client,
        "{late} arrived late of {c:?}"
    );
}

#[test]
fn reordering_by_depth_holds_a_share_behind_later_frames_and_loses_none() {
    if !require_root("lossy path") {
        return;
    }
    let net = LossyPath::builder()
        .server_addr("10.79.2.1/24")
        .client_addr("10.79.2.2/24")
        .build()
        .expect("path");
    net.set_reorder_depth(Loss::percent(20.0), 8)
        .expect("reorder");
    let count = 2000u32;
    let (mut seen, mut max) = (vec![false; count as usize], None::<u32>);
    let (mut late, mut deep) = (0u32, 0u32);
    for i in arrivals(&net, "10.79.2.1", "10.79.2.2", count) {
        seen[i as usize] = true;
        if let Some(m) = max.filter(|&m| i < m) {
            late += 1;
            // Held behind 8 later frames: at least that many (more when the frames behind
            // it were held too) were sent after it and arrived first.
            if m - i >= 8 {
                deep += 1;
            }
        }
        max = max.max(Some(i));
    }
    let c = net.counters().expect("counters");
    let missing = seen.iter().filter(|&&s| !s).count();
    assert_eq!(missing, 0, "every datagram arrives: {c:?}");
    assert_eq!(c.reorder_dropped, 0, "{c:?}");
    // Every frame crosses the stage; about a fifth of them arrive late, nearly all of those
    // behind 8 or more (the last few go at the time limit, with fewer behind them).
    assert!(c.reordered_to_client >= u64::from(count), "{c:?}");
    assert!((250..=550).contains(&late), "{late} late of {count}: {c:?}");
    assert!(
        deep * 10 >= late * 9,
        "{deep} of {late} held behind 8 or more"
    );
}
