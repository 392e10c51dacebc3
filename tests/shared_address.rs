//! corelane serving on the kernel's own address (`--shared`, `Builder::share_kernel_addrs`):
//! the server end of a veth pair has one IPv4 address, 10.77.0.1, which the kernel holds;
//! corelane serves its ports there while the kernel keeps the rest: a kernel listener on another
//! port of the same address, the kernel's own outbound connections, ping, ARP and closed ports,
//! all at once and under load; the same over IPv6; corelane's own connections out of the
//! address beside the kernel's. A kernel socket on a port corelane wants is refused in one line
//! naming it; a killed server gives its ports back to the kernel; a replacement under load and
//! a server under a grant broker keep all of it.

mod common;
mod shared;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use corelane_testnet::{VethPair, require_root};
use shared::*;

/// Serves `example` with `args` on the kernel's address, a kernel listener on port 2222 of the
/// same address and a kernel listener on the client's end for the server's kernel to connect
/// to; loads all three at once, and checks ping and a closed port on the way. Returns the
/// example's output after a clean stop.
fn shared_with_the_kernel(
    net: &VethPair,
    example: &str,
    port: u16,
    args: &[&str],
    also: impl FnOnce(&VethPair),
) -> String {
    let ssh = KernelEcho::start(net.server_ns(), at(2222));
    let remote = KernelEcho::start(
        net.client_ns(),
        SocketAddr::new(CLIENT.parse().unwrap(), 3333),
    );
    let mut all = vec![
        "--addr",
        "10.77.0.1/24",
        "--shared",
        "--linger-on-death",
        "0",
    ];
    all.extend_from_slice(args);
    let server = Echo::start_example(net, example, &all);
    let t = Instant::now();
    // corelane's port, the kernel's listener on the same address and the kernel's own
    // connections out of it, all at once.
    let to_corelane = if example == "echo" {
        load(net.client_ns(), at(port), 3, 40)
    } else {
        Vec::new()
    };
    let to_kernel = load(net.client_ns(), at(2222), 2, 40);
    let from_kernel = load(
        net.server_ns(),
        SocketAddr::new(CLIENT.parse().unwrap(), 3333),
        2,
        40,
    );
    if example == "http" {
        for i in 0..60 {
            let body = net
                .client_ns()
                .run(move || http_get(at(port)))
                .unwrap()
                .unwrap_or_else(|e| panic!("GET {i} from corelane's http: {e}"));
            assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        }
    }
    also(net);
    let mut failed = failures(to_corelane);
    failed.extend(failures(to_kernel));
    failed.extend(failures(from_kernel));
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
    // Ping and ARP are the kernel's: it answers for the address as before.
    let ping = net
        .client_ns()
        .exec("ping", &["-c", "2", "-i", "0.2", "-W", "2", KERNEL])
        .expect("ping the shared address");
    assert!(ping.contains("2 received"), "{ping}");
    // A port neither serves is the kernel's to refuse.
    let closed = net
        .client_ns()
        .run(|| TcpStream::connect_timeout(&at(9), Duration::from_secs(3)).map(drop))
        .unwrap();
    assert_eq!(
        closed.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused),
        "the kernel refuses a closed port of the shared address"
    );
    assert_eq!(
        ssh.served(80),
        80,
        "the kernel's listener served every connection"
    );
    assert_eq!(
        remote.served(80),
        80,
        "the kernel's own connections all finished"
    );
    eprintln!("{example}: shared load done in {:?}", t.elapsed());
    let (status, out) = server.stop();
    assert_clean_exit_of(example, status, &out);
    assert!(out.contains("shared with the kernel: 10.77.0.1"), "{out}");
    out
}

#[test]
fn echo_serves_on_the_kernel_s_only_address_beside_its_listener_and_connections() {
    if !require_root("shared address echo") {
        return;
    }
    let net = net(2);
    let out = shared_with_the_kernel(&net, "echo", 7, &["--port", "7"], |net| {
        // UDP too: datagrams to corelane's port come back, from the shared address.
        net.client_ns()
            .run(|| udp_echo(at(7)))
            .unwrap()
            .expect("a UDP echo from the shared address");
    });
    assert!(xdp_counter(&out, "steered") > 0, "{out}");
    assert!(xdp_counter(&out, "passed") > 0, "{out}");
    assert_no_xdp(&net);
    // The port is the kernel's again.
    kernel_binds(&net, 7).expect("port 7 given back to the kernel at exit");
}

#[test]
fn http_serves_on_the_kernel_s_only_address_beside_its_listener_and_connections() {
    if !require_root("shared address http") {
        return;
    }
    let net = net(1);
    shared_with_the_kernel(&net, "http", 8080, &["--port", "8080"], |_| {});
}

#[test]
fn a_port_a_kernel_socket_holds_is_refused_naming_it() {
    if !require_root("shared address conflict") {
        return;
    }
    let net = net(1);
    let ssh = KernelEcho::start(net.server_ns(), at(7));
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.1/24", "--shared", "--port", "7"]);
    assert!(!status.success(), "{out}");
    let errors: Vec<&str> = out.lines().filter(|l| l.contains("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{out}");
    for needle in [
        "TCP port 7 of 10.77.0.1 is the kernel's",
        "listens on 10.77.0.1:7",
        "ss -tanp",
    ] {
        assert!(
            errors[0].contains(needle),
            "`{needle}` missing: {}",
            errors[0]
        );
    }
    assert_no_xdp(&net);
    drop(ssh);
    // Without --shared the kernel's address is refused, pointing at it.
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.1/24", "--port", "7"]);
    assert_fails_with(&net, status, &out, &["is the kernel's address", "--shared"]);
    // Also one the kernel holds on another interface (a VLAN device over this one would be
    // one): it answers for it on every interface.
    net.server_ns()
        .ip(&["addr", "add", "10.77.0.9/32", "dev", "lo"])
        .expect("an address on lo");
    let (status, out) = run_echo(&net, &["--addr", "10.77.0.9/24", "--port", "7"]);
    assert_fails_with(
        &net,
        status,
        &out,
        &["10.77.0.9 is the kernel's address on lo", "dev lo"],
    );
}

#[test]
fn a_killed_server_gives_the_kernel_its_ports_back() {
    if !require_root("shared address kill") {
        return;
    }
    let net = net(1);
    let args = [
        "--addr",
        "10.77.0.1/24",
        "--shared",
        "--port",
        "7",
        "--linger-on-death",
        "0",
    ];
    let server = Echo::start(&net, &args);
    // While it serves, the kernel cannot take the port: a bind fails.
    assert_eq!(kernel_binds(&net, 7), Err(std::io::ErrorKind::AddrInUse));
    net.client_ns()
        .run(|| exchange(at(7), 1000, 1))
        .unwrap()
        .expect("served");
    server.signal(libc::SIGKILL);
    let (status, _) = server.wait();
    assert!(!status.success());
    // Nothing to clean up: the port is the kernel's at once, and the next start serves.
    kernel_binds(&net, 7).expect("port 7 given back to the kernel by the process's death");
    let again = Echo::start(&net, &args);
    net.client_ns()
        .run(|| exchange(at(7), 5000, 2))
        .unwrap()
        .expect("served after the restart");
    let (status, out) = again.stop();
    assert!(status.success(), "{out}");
}

#[test]
fn corelane_and_the_kernel_connect_out_of_one_address_without_sharing_a_port() {
    if !require_root("shared address outbound") {
        return;
    }
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let net = net(1);
    let remote_at = SocketAddr::new(CLIENT.parse().unwrap(), 3333);
    let remote = KernelEcho::start(net.client_ns(), remote_at);
    // The kernel's own connections out of the address, while corelane opens its own.
    let from_kernel = load(net.server_ns(), remote_at, 2, 40);
    let ifname = net.server_if().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let runtime = net
        .server_ns()
        .spawn(move || {
            let rt = corelane::Runtime::builder(&ifname)
                .addr("10.77.0.1/24")
                .share_kernel_addrs(true)
                .cores(1)
                .build()
                .map_err(|e| e.to_string())?;
            let stop = rt.stop_handle();
            rt.run(move |_| {
                let (tx, stop) = (tx.clone(), stop.clone());
                async move {
                    let mut open = Vec::new();
                    let mut ports = Vec::new();
                    for i in 0..40u64 {
                        let data = payload(1000, i);
                        let mut s = corelane::net::TcpStream::connect(remote_at)
                            .await
                            .expect("corelane connects out of the shared address");
                        s.write_all(&data).await.expect("write");
                        let mut back = vec![0u8; data.len()];
                        s.read_exact(&mut back).await.expect("read");
                        assert_eq!(back, data);
                        ports.push(s.local_addr().expect("local address").port());
                        open.push(s);
                    }
                    let _ = tx.send(ports);
                    // Held open while the test tries the kernel on those ports.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    drop(open);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    stop.stop();
                }
            })
            .map_err(|e| e.to_string())
        })
        .expect("spawn the runtime");
    let ports = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("corelane's 40 connections");
    let mut unique = ports.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 40, "{ports:?}");
    // While corelane holds them, none of its ports is the kernel's to give.
    for &p in &ports {
        assert_eq!(
            kernel_binds(&net, p),
            Err(std::io::ErrorKind::AddrInUse),
            "port {p} of corelane's connection"
        );
    }
    let failed = failures(from_kernel);
    assert!(failed.is_empty(), "the kernel's connections: {failed:?}");
    let report = runtime.join().expect("runtime thread").expect("the run");
    assert!(report.stopped, "{report:?}");
    assert_eq!(remote.served(120), 120, "every connection of both finished");
}

#[test]
fn a_server_on_a_shared_address_is_replaced_under_load() {
    if !require_root("shared address upgrade") {
        return;
    }
    let net = net(2);
    let ssh = KernelEcho::start(net.server_ns(), at(2222));
    let sock = std::env::temp_dir().join(format!("corelane-shared-up-{}.sock", std::process::id()));
    let sock = sock.to_str().unwrap().to_string();
    let args = |from: &'static str| -> Vec<&str> {
        vec![
            "--addr",
            "10.77.0.1/24",
            "--shared",
            "--cores",
            "2",
            "--port",
            "7",
            "--linger-on-death",
            "0",
            "--upgrades",
            sock.as_str(),
            from,
            sock.as_str(),
        ]
    };
    let old = Echo::start(&net, &args("--take-over"));
    // Kept connections doing round trips across the switch, and the kernel's listener on the
    // same address all along.
    let stop = Arc::new(AtomicBool::new(false));
    let kept: Vec<_> = (0..2u64)
        .map(|t| {
            let stop = stop.clone();
            net.client_ns()
                .spawn(move || -> Result<u64, String> {
                    let mut s = connect(at(7)).map_err(|e| e.to_string())?;
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let mut buf = vec![0u8; 4096];
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let req = payload(1 + (n as usize * 131) % 4000, t * 100_000 + n);
                        s.write_all(&req).map_err(|e| format!("write {n}: {e}"))?;
                        s.read_exact(&mut buf[..req.len()])
                            .map_err(|e| format!("read {n}: {e}"))?;
                        if buf[..req.len()] != req[..] {
                            return Err(format!("answer {n} differs"));
                        }
                        n += 1;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Ok(n)
                })
                .unwrap()
        })
        .collect();
    let to_kernel = load(net.client_ns(), at(2222), 1, 30);
    std::thread::sleep(Duration::from_millis(500));
    let new = Echo::start(&net, &args("--upgrade-from"));
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    for k in kept {
        let n = k
            .join()
            .unwrap()
            .expect("a kept connection across the switch");
        assert!(n > 20, "{n} round trips");
    }
    assert!(failures(to_kernel).is_empty());
    let (status, out) = old.wait();
    assert!(status.success(), "{out}");
    assert!(out.contains("echo: upgraded"), "{out}");
    // The new process alone serves new connections on the shared address.
    net.client_ns()
        .run(|| exchange(at(7), 100_000, 5))
        .unwrap()
        .expect("served by the new process");
    assert_eq!(
        ssh.served(30),
        30,
        "the kernel's listener served throughout"
    );
    let (status, out) = new.stop();
    assert_clean_exit_of("echo", status, &out);
    kernel_binds(&net, 7).expect("port 7 given back to the kernel after both processes");
}

#[test]
fn echo_serves_on_the_kernel_s_ipv6_address_while_the_kernel_keeps_its_neighbour_discovery() {
    if !require_root("shared address ipv6") {
        return;
    }
    let net = net(1);
    let v6 = |port: u16| SocketAddr::new("fd00:77::1".parse().unwrap(), port);
    let ssh = KernelEcho::start(net.server_ns(), v6(2222));
    let server = Echo::start(
        &net,
        &[
            "--addr",
            "fd00:77::1/64",
            "--shared",
            "--port",
            "7",
            "--linger-on-death",
            "0",
        ],
    );
    let client = |to: SocketAddr, len: usize, seed: u64| {
        net.client_ns()
            .run(move || exchange(to, len, seed))
            .unwrap()
    };
    client(v6(7), 200_000, 1).expect("TCP to corelane over IPv6");
    client(v6(2222), 50_000, 2).expect("TCP to the kernel's listener over IPv6");
    // A UDP reply needs the client's hardware address: its neighbour advertisement went to the
    // kernel, and the program noted it for corelane.
    let got = net
        .client_ns()
        .run(move || -> std::io::Result<usize> {
            let u = std::net::UdpSocket::bind("[fd00:77::2]:0")?;
            u.set_read_timeout(Some(Duration::from_secs(1)))?;
            let mut b = [0u8; 64];
            for i in 0..5u8 {
                u.send_to(&[b'6', i], v6(7))?;
                if let Ok((n, from)) = u.recv_from(&mut b) {
                    assert_eq!(from, v6(7));
                    return Ok(n);
                }
            }
            Err(std::io::ErrorKind::TimedOut.into())
        })
        .unwrap()
        .expect("a UDP echo from the shared IPv6 address");
    assert_eq!(got, 2);
    let ping = net
        .client_ns()
        .exec("ping", &["-6", "-c", "1", "-W", "2", "fd00:77::1"])
        .expect("ping the shared address");
    assert!(ping.contains("1 received"), "{ping}");
    assert_eq!(ssh.served(1), 1);
    let (status, out) = server.stop();
    assert_clean_exit_of("echo", status, &out);
}

#[test]
fn a_granted_server_serves_its_granted_port_of_a_shared_address() {
    if !require_root("shared address under a grant") {
        return;
    }
    let net = net(1);
    let ssh = KernelEcho::start(net.server_ns(), at(2222));
    let broker_bin = workspace_bin("corelane-broker").expect("corelane-broker built");
    let mut cmd = net.server_ns().command(broker_bin.to_str().unwrap());
    cmd.args([
        "grant",
        net.server_if(),
        "--addr",
        KERNEL,
        "--tcp",
        "7",
        "--udp",
        "7",
    ]);
    let broker = Echo::start_cmd(cmd, "corelane-broker");
    let server = Echo::start(
        &net,
        &[
            "--addr",
            "10.77.0.1/24",
            "--shared",
            "--xdp",
            "granted",
            "--port",
            "7",
        ],
    );
    if let Err(e) = net.client_ns().run(|| exchange(at(7), 300_000, 3)).unwrap() {
        panic!(
            "the granted server does not answer on the shared address: {e}\nserver:\n{}\nbroker:\n{}",
            server.output(),
            broker.output()
        );
    }
    net.client_ns()
        .run(|| exchange(at(2222), 3000, 4))
        .unwrap()
        .expect("the kernel's listener answers beside it");
    // A UDP reply: its next hop from what the broker's program noted, asked of the broker.
    if let Err(e) = net.client_ns().run(|| udp_echo(at(7))).unwrap() {
        panic!(
            "no UDP echo from the shared address under the grant: {e}\nbroker:\n{}\nserver:\n{}",
            broker.output(),
            server.output()
        );
    }
    // The broker holds the port in the kernel for its server.
    assert_eq!(kernel_binds(&net, 7), Err(std::io::ErrorKind::AddrInUse));
    let (status, out) = server.stop();
    assert!(status.success(), "{out}");
    // The session over, the broker gives the port back.
    let deadline = Instant::now() + Duration::from_secs(5);
    while kernel_binds(&net, 7).is_err() {
        assert!(
            Instant::now() < deadline,
            "port 7 still held after the session"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ssh.served(1), 1);
    let (_, out) = broker.stop();
    assert!(!out.contains("refused"), "{out}");
}
