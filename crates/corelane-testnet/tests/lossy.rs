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
