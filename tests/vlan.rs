//! 802.1Q VLANs: a corelane server on VLAN 100 of a veth and corelane clients on the other end
//! (this kernel has no 802.1Q module, so no kernel VLAN device can be the peer). A client on
//! the same VLAN echoes TCP and UDP through it, every frame on the wire tagged; a client on
//! VLAN 200 and an untagged kernel client with an address in the same subnet do not reach it;
//! the kernel's own untagged traffic on the interface goes on. Under a grant broker that serves
//! the VLAN the same server runs without privileges to attach, and one built for untagged
//! frames is refused. With QinQ (VLAN 100 inside 802.1ad service VLAN 200) the same, and
//! neither a client in service VLAN 300 nor one on VLAN 100 without the service tag reaches it.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use corelane::Runtime;
use corelane::net::{TcpStream, UdpSocket};
use corelane_testnet::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SERVER: &str = "10.100.0.3";

/// What came back through an echo, or why nothing did.
type Echoed = Result<Vec<u8>, String>;

/// What a corelane client on VLAN `vid` (inside service VLAN `svid` when not 0) of the
/// client's end got: the TCP echo of `len` bytes (or the error) and the UDP echo of one
/// datagram (or the error).
fn client_on_vlan(
    net: &corelane_testnet::VethPair,
    (svid, vid): (u16, u16),
    len: usize,
) -> (Echoed, Echoed) {
    let out: Arc<Mutex<Vec<Echoed>>> = Arc::default();
    let o = out.clone();
    let ifname = net.client_if().to_string();
    let ran = net.client_ns().run(move || -> Result<(), String> {
        let mut stack = corelane::StackConfig::default();
        stack.tcp.syn_retries = 2;
        stack.tcp.rto_initial = Duration::from_millis(200);
        Runtime::builder(&ifname)
            .service_vlan(svid)
            .vlan(vid)
            .addr("10.100.0.2/24")
            .cores(1)
            .stack(stack)
            .build()
            .map_err(|e| e.to_string())?
            .run(move |_core| {
                let o = o.clone();
                async move {
                    let to: SocketAddr = format!("{SERVER}:7").parse().expect("addr");
                    let tcp = async {
                        let mut s = TcpStream::connect(to).await?;
                        let data = payload(len, 5);
                        let (mut r, mut w) = s.split();
                        let write = async {
                            w.write_all(&data).await?;
                            w.shutdown().await
                        };
                        let mut got = Vec::new();
                        let read = r.read_to_end(&mut got);
                        let (a, b) = tokio::join!(write, read);
                        a?;
                        b?;
                        Ok::<_, std::io::Error>(got)
                    };
                    let tcp = tokio::time::timeout(Duration::from_secs(20), tcp).await;
                    let tcp = match tcp {
                        Ok(r) => r.map_err(|e| e.to_string()),
                        Err(_) => Err("timed out".to_string()),
                    };
                    let udp = async {
                        let u = UdpSocket::bind("10.100.0.2:0").await?;
                        let mut buf = vec![0u8; 2048];
                        for _ in 0..5 {
                            u.send_to(&payload(1000, 6), to).await?;
                            let got = tokio::time::timeout(
                                Duration::from_millis(400),
                                u.recv_from(&mut buf),
                            )
                            .await;
                            if let Ok(Ok((n, _))) = got {
                                return Ok(buf[..n].to_vec());
                            }
                        }
                        Err(std::io::Error::other("no answer"))
                    };
                    let udp = udp.await.map_err(|e| e.to_string());
                    let mut o = o.lock().expect("lock");
                    o.push(tcp);
                    o.push(udp);
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    if let Err(e) = ran.expect("client thread") {
        panic!("the VLAN {vid} (service VLAN {svid}) client failed to run: {e}");
    }
    let mut o = out.lock().expect("lock");
    let udp = o.pop().expect("udp result");
    let tcp = o.pop().expect("tcp result");
    (tcp, udp)
}

#[test]
fn vlan_server_answers_its_vlan_only() {
    if !require_root("vlan") {
        return;
    }
    let net = net(1);
    let echo = Echo::start(
        &net,
        &[
            "--addr",
            &format!("{SERVER}/24"),
            "--cores",
            "1",
            "--vlan",
            "100",
        ],
    );
    // An untagged kernel client with an address in the VLAN's subnet: the server's address is
    // not on the untagged link (nobody answers its ARP).
    net.client_ns()
        .ip(&["addr", "add", "10.100.0.9/24", "dev", net.client_if()])
        .expect("address");
    let untagged = net
        .client_ns()
        .run(|| {
            std::net::TcpStream::connect_timeout(
                &format!("{SERVER}:7").parse().expect("addr"),
                Duration::from_secs(2),
            )
            .map(|_| ())
        })
        .expect("client thread");
    assert!(
        untagged.is_err(),
        "an untagged client reached the VLAN's server"
    );
    net.client_ns()
        .ip(&["addr", "del", "10.100.0.9/24", "dev", net.client_if()])
        .expect("address");
    // The kernel's own untagged address on the served interface still answers.
    assert_echoes_kernel_ping(&net);
    // A corelane client on the same VLAN: 2 MiB of TCP and a datagram, echoed.
    let (tcp, udp) = client_on_vlan(&net, (0, 100), 2 << 20);
    assert_eq!(tcp.expect("tcp on VLAN 100"), payload(2 << 20, 5));
    assert_eq!(udp.expect("udp on VLAN 100"), payload(1000, 6));
    // One on VLAN 200, the same addresses: nothing reaches the server.
    let (tcp, udp) = client_on_vlan(&net, (0, 200), 1000);
    assert!(
        tcp.is_err(),
        "a VLAN 200 client reached the VLAN 100 server"
    );
    assert!(udp.is_err(), "a VLAN 200 datagram was answered");
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert_eq!(xdp_counter(&out, "malformed"), 0, "{out}");
}

/// A grant broker on the server's interface granting the server's address and TCP and UDP
/// port 7, for the tags `tags` adds (`--vlan`, `--service-vlan`).
fn grant_broker(net: &corelane_testnet::VethPair, tags: &[&str]) -> Echo {
    let broker_bin = workspace_bin("corelane-broker").expect("corelane-broker built");
    let mut cmd = net.server_ns().command(broker_bin.to_str().expect("path"));
    cmd.args(["grant", net.server_if(), "--addr", SERVER])
        .args(["--tcp", "7", "--udp", "7"])
        .args(tags);
    Echo::start_cmd(cmd, "corelane-broker")
}

/// The echo server started with `args` under the broker: it must be refused; what it said.
fn refused_server(net: &corelane_testnet::VethPair, args: &[&str]) -> String {
    let out = net
        .server_ns()
        .command(echo_bin().to_str().expect("path"))
        .args(["--iface", net.server_if()])
        .args(args)
        .output()
        .expect("echo");
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "a server built for other tags started: {text}"
    );
    text
}

/// The server namespace's kernel answers a ping to its own (untagged) address.
fn assert_echoes_kernel_ping(net: &corelane_testnet::VethPair) {
    let out = net
        .client_ns()
        .exec("ping", &["-c", "1", "-W", "2", "10.77.0.1"])
        .expect("ping the kernel's address");
    assert!(out.contains("1 received"), "{out}");
}

#[test]
fn a_vlan_id_out_of_range_is_refused() {
    if !require_root("vlan id") {
        return;
    }
    let net = net(1);
    let (status, out) = run_echo(&net, &["--addr", "10.100.0.3/24", "--vlan", "4095"]);
    assert_fails_with(
        &net,
        status,
        &out,
        &["VLAN 4095 is not a VLAN id (1 to 4094)"],
    );
}

/// A grant broker serving VLAN 100: a server built for VLAN 100 serves through it; one built
/// for untagged frames is refused in one line naming both.
#[test]
fn a_grant_broker_serves_its_vlan_to_a_server_built_for_it() {
    if !require_root("vlan under a grant broker") {
        return;
    }
    let net = net(1);
    let broker = grant_broker(&net, &["--vlan", "100"]);
    let base = ["--addr", "10.100.0.3/24", "--cores", "1"];
    let text = refused_server(&net, &base);
    assert!(
        text.contains("built for untagged frames") && text.contains("serves VLAN 100"),
        "{text}"
    );
    let mut args = base.to_vec();
    args.extend(["--vlan", "100"]);
    let echo = Echo::start(&net, &args);
    assert!(
        echo.output().contains("by corelane-broker grant"),
        "{}",
        echo.output()
    );
    let (tcp, udp) = client_on_vlan(&net, (0, 100), 256 << 10);
    assert_eq!(tcp.expect("tcp on VLAN 100"), payload(256 << 10, 5));
    assert_eq!(udp.expect("udp on VLAN 100"), payload(1000, 6));
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    broker.signal(libc::SIGTERM);
    let (status, out) = broker.wait();
    assert!(status.success(), "{out}");
}

/// QinQ: a server on VLAN 100 inside service VLAN 200 echoes a client with both tags (full-size
/// segments: the second tag comes out of the MTU), and nothing without both; under a grant
/// broker serving the same tags, a server built for VLAN 100 alone is refused, one built for
/// both serves.
#[test]
fn a_qinq_server_answers_its_service_vlan_and_vlan_only() {
    if !require_root("qinq") {
        return;
    }
    let net = net(1);
    let base = ["--addr", "10.100.0.3/24", "--cores", "1"];
    let qinq = ["--vlan", "100", "--service-vlan", "200"];
    let mut args = base.to_vec();
    args.extend(qinq);
    let echo = Echo::start(&net, &args);
    let (tcp, udp) = client_on_vlan(&net, (200, 100), 2 << 20);
    assert_eq!(tcp.expect("tcp on VLAN 100 in 200"), payload(2 << 20, 5));
    assert_eq!(udp.expect("udp on VLAN 100 in 200"), payload(1000, 6));
    for other in [(300, 100), (0, 100)] {
        let (tcp, udp) = client_on_vlan(&net, other, 1000);
        assert!(tcp.is_err(), "a client on {other:?} reached the server");
        assert!(udp.is_err(), "a datagram on {other:?} was answered");
    }
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert_eq!(xdp_counter(&out, "malformed"), 0, "{out}");

    let broker = grant_broker(&net, &qinq);
    let mut vlan_only = base.to_vec();
    vlan_only.extend(["--vlan", "100"]);
    let text = refused_server(&net, &vlan_only);
    assert!(
        text.contains("built for VLAN 100 but")
            && text.contains("serves VLAN 100 in service VLAN 200"),
        "{text}"
    );
    let echo = Echo::start(&net, &args);
    assert!(
        echo.output().contains("by corelane-broker grant"),
        "{}",
        echo.output()
    );
    let (tcp, udp) = client_on_vlan(&net, (200, 100), 256 << 10);
    assert_eq!(tcp.expect("tcp under the broker"), payload(256 << 10, 5));
    assert_eq!(udp.expect("udp under the broker"), payload(1000, 6));
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    broker.signal(libc::SIGTERM);
    let (status, out) = broker.wait();
    assert!(status.success(), "{out}");
}
