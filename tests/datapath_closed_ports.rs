//! The host that owns an address answers for all of its ports: a kernel client connecting to a
//! port of a corelane address that nothing listens on is refused at once (a reset the XDP
//! program builds and sends back), over IPv4 and IPv6, while the port that is served still
//! echoes. Before, the SYN went to the kernel, which does not hold the address, and the client
//! waited for its connect timeout. (On veth the answer reaches a peer that runs an XDP program;
//! the test gives the client end one, as `xdp_syn_cookies` does.)

mod common;

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{SERVER_V4, SERVER_V6, net, serve_on};
use corelane::net::TcpListener;
use corelane_testnet::require_root;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[test]
fn a_connect_to_a_closed_port_of_an_owned_address_is_refused_at_once() -> Result {
    if !require_root("resets for closed ports") {
        return Ok(());
    }
    let net = net(1);
    // veth hands the program's answers (XDP_TX) to a peer only when the peer runs an XDP
    // program of its own (a NIC needs none): corelane's, owning nothing, passes everything.
    let object = concat!(env!("CARGO_MANIFEST_DIR"), "/xdp/corelane.bpf.o");
    net.client_ns().attach_xdp(net.client_if(), object)?;
    let served = serve_on(
        &net,
        |b| b.cores(1).addr("fd00:77::3/64"),
        |_| async {
            let l = TcpListener::bind(7).expect("listen");
            while let Ok((s, _)) = l.accept().await {
                tokio::task::spawn_local(common::echo_stream(s));
            }
        },
    )?;
    let connect = |ip: &str, port: u16| -> Result<std::io::Result<()>> {
        let to = SocketAddr::new(ip.parse()?, port);
        Ok(net.client_ns().run(move || {
            // Retried briefly while the neighbour entry resolves; a refusal ends it at once.
            let mut last = Err(std::io::Error::from(ErrorKind::TimedOut));
            for _ in 0..3 {
                last = TcpStream::connect_timeout(&to, Duration::from_secs(3)).map(drop);
                if !matches!(&last, Err(e) if e.kind() == ErrorKind::TimedOut) {
                    break;
                }
            }
            last
        })?)
    };
    for ip in [SERVER_V4, SERVER_V6] {
        // The listener binds once the core runs, a moment after the runtime is built; until
        // then port 7 is closed too and refused, as a kernel's is before `listen`.
        let mut served_port = connect(ip, 7)?;
        for _ in 0..50 {
            if served_port.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            served_port = connect(ip, 7)?;
        }
        assert!(
            served_port.is_ok(),
            "{ip}: the served port accepts: {served_port:?}"
        );
        for port in [9, 80, 50_000] {
            let r = connect(ip, port)?;
            assert!(
                matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
                "{ip} port {port}: {r:?}"
            );
        }
    }
    served.stop.stop();
    let report = served.thread.join()??;
    assert!(
        report.xdp.closed_port_resets >= 6,
        "the program answered them: {:?}",
        report.xdp
    );
    Ok(())
}
