//! One connection sending and receiving at once through an imperfect router: a kernel client
//! writes 16 MiB to a corelane echo server while reading the echo back, through loss both
//! ways, reordering both ways, and a mix of reordering, duplication and loss. Each echo must
//! come back byte for byte (a stall shows as the client's 30 s read timeout), and no frame may
//! leave corelane longer than the interface's MTU, whatever SACK blocks it carries.
//! The simulation (`tests/sim.rs`, the `sim` bench) runs the same shapes over thousands of
//! seeds; this is the real path: the XDP program, AF_XDP, veth and a Linux bridge. The
//! kernel's echo server on the same path runs each case too; both times are printed, not
//! asserted.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{payload, sha256, tcp_echo};
use corelane_testnet::{Loss, require_root};

fn pct(p: f64) -> Loss {
    Loss::percent(p)
}

const KERNEL: &str = "10.88.0.1";
const CLIENT: &str = "10.88.0.2";
const CORELANE: &str = "10.88.0.3";
const N: usize = 16 << 20;

#[test]
fn an_echo_through_loss_reordering_and_duplication_comes_back_whole() {
    if !require_root("an echo both ways through an impaired router") {
        return;
    }
    let net = common::lossy_path(KERNEL, CLIENT);
    let (stop, served) =
        common::serve_in(net.server_ns(), common::one_core_on(&net, CORELANE), |rt| {
            rt.run(|_| async {
                let l = corelane::net::TcpListener::bind(5040).await.expect("bind");
                while let Ok((s, _)) = l.accept().await {
                    tokio::task::spawn_local(echo(s));
                }
            })
        })
        .expect("corelane");
    let addr: SocketAddr = format!("{CORELANE}:5040").parse().expect("address");
    // The kernel's echo on the same path, for the times printed side by side (not asserted).
    let kernel: SocketAddr = format!("{KERNEL}:5041").parse().expect("address");
    let listener = net
        .server_ns()
        .run(move || std::net::TcpListener::bind(kernel))
        .expect("namespace")
        .expect("kernel listener");
    let kernel_echo = std::thread::spawn(move || {
        for _ in 0..3 {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let mut r = s.try_clone().expect("clone");
            std::thread::spawn(move || std::io::copy(&mut r, &mut s));
        }
    });
    type Setup = fn(&corelane_testnet::LossyPath) -> corelane_testnet::Result<()>;
    let cases: [(&str, Setup); 3] = [
        ("1% lost both ways", |n| n.set_loss(pct(1.0), pct(1.0))),
        ("5% reordered both ways", |n| {
            n.set_loss(Loss::NONE, Loss::NONE)?;
            n.set_reorder(pct(5.0), pct(5.0), Duration::from_micros(200))
        }),
        ("10% reordered, 10% duplicated, 1% lost", |n| {
            n.set_loss(pct(1.0), pct(1.0))?;
            n.set_duplicate(pct(10.0), pct(10.0))?;
            n.set_reorder(pct(10.0), pct(10.0), Duration::from_micros(200))
        }),
    ];
    for (k, (name, setup)) in cases.iter().enumerate() {
        setup(&net).expect("impairment");
        let data = payload(N, 40 + k as u64);
        let t = Instant::now();
        let linux = net
            .client_ns()
            .run({
                let data = data.clone();
                move || tcp_echo(kernel, &data)
            })
            .expect("client")
            .map(|_| t.elapsed());
        let t = Instant::now();
        let (hash, len) = net
            .client_ns()
            .run({
                let data = data.clone();
                move || tcp_echo(addr, &data)
            })
            .expect("client")
            .unwrap_or_else(|e| panic!("{name}: the echo failed: {e}"));
        let c = net.counters().expect("counters");
        eprintln!(
            "{name}: corelane {:?}, Linux {linux:?} (same path, same run); {c:?}",
            t.elapsed()
        );
        assert_eq!(len, N, "{name}");
        assert!(hash == sha256(&data), "{name}: the echo came back changed");
    }
    stop.stop();
    let _ = kernel_echo.join();
    let report = served
        .join()
        .expect("corelane thread")
        .expect("runtime")
        .expect("run");
    let d = report.device();
    let mut tcp = corelane::TcpStats::default();
    for c in &report.cores {
        tcp += c.stats.stack.tcp;
    }
    eprintln!("{d:?}\n{tcp:?}");
    assert_eq!(d.tx_oversize, 0, "frames over the MTU were built");
    assert!(tcp.retrans_segs > 0, "the impairments cost retransmissions");
}

async fn echo(mut s: corelane::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = s.read(&mut buf).await {
        if s.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}
