//! The per-core runtime serving kernel clients across a 2-queue veth: the echo example with
//! 1,000 concurrent connections spread over two cores, stopped with all of them open; the http
//! example (hyper) answering curl.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use corelane_testnet::require_root;

fn v4(port: u16) -> SocketAddr {
    format!("{SERVER_V4}:{port}").parse().unwrap()
}

#[test]
fn runtime_echo_1000_connections_over_two_cores_then_stop_with_them_open() {
    if !require_root("runtime_echo_1000_connections") {
        return;
    }
    let net = net(2);
    let echo = Echo::start(&net, &["--addr", "10.77.0.3/24", "--backlog", "1024"]);
    assert!(echo.output().contains("2 core(s)"), "{}", echo.output());
    let conns: Vec<TcpStream> = net
        .client_ns()
        .run(|| {
            (0..1000)
                .map(|_| {
                    let s = connect(v4(7)).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                    s.set_nodelay(true).unwrap();
                    s
                })
                .collect()
        })
        .unwrap();
    // All 1,000 are open at once; each sends its own payload and checks its own echo.
    let verified: usize = std::thread::scope(|scope| {
        conns
            .chunks(125)
            .enumerate()
            .map(|(t, chunk)| {
                scope.spawn(move || {
                    let mut ok = 0;
                    let data: Vec<Vec<u8>> = (0..chunk.len())
                        .map(|i| payload(4096 + i, (t * 1000 + i) as u64))
                        .collect();
                    for (mut s, d) in chunk.iter().zip(&data) {
                        s.write_all(d).unwrap();
                    }
                    for (mut s, d) in chunk.iter().zip(&data) {
                        let mut back = vec![0u8; d.len()];
                        if s.read_exact(&mut back).is_ok() && &back == d {
                            ok += 1;
                        }
                    }
                    ok
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum()
    });
    assert_eq!(verified, 1000, "connections whose echo came back intact");
    // Stop with every connection still open: resets go out, every frame is accounted for.
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    assert_no_xdp(&net);
    assert!(out.contains("1000 accepted"), "{out}");
    let per_core = accepted_per_core(&out);
    assert_eq!(per_core.len(), 2, "{out}");
    assert!(
        per_core.iter().all(|&n| n > 0),
        "both cores should take connections (kernel sockets pick queues at random): {per_core:?}"
    );
    let mut reset = 0;
    for mut s in conns {
        let mut b = [0u8; 1];
        if matches!(s.read(&mut b), Ok(0) | Err(_)) {
            reset += 1;
        }
    }
    assert_eq!(reset, 1000, "every client sees its connection end");
}

fn curl(net: &corelane_testnet::VethPair, args: &[&str]) -> String {
    let mut all = vec!["-sS", "--max-time", "10", "--retry", "3"];
    all.extend_from_slice(args);
    net.client_ns()
        .exec("curl", &all)
        .unwrap_or_else(|e| panic!("curl {args:?}: {e}"))
}

#[test]
fn runtime_http_example_answers_curl_on_both_cores_over_http1_and_http2() {
    if !require_root("runtime_http_curl") {
        return;
    }
    let net = net(2);
    let http = Echo::start_example(
        &net,
        "http",
        &["--addr", "10.77.0.3/24", "--header-timeout", "0.5"],
    );
    let url = |p: &str| format!("http://{SERVER_V4}:8080{p}");
    let mut cores_seen = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let body = curl(&net, &[&url("/")]);
        let core = body
            .strip_prefix("hello from corelane core ")
            .unwrap_or_else(|| panic!("unexpected body: {body:?}"));
        cores_seen.insert(core.trim().to_string());
    }
    assert_eq!(cores_seen.len(), 2, "answers came from {cores_seen:?}");
    let size = curl(
        &net,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            &url("/bytes/3000000"),
        ],
    );
    assert_eq!(size, "3000000");
    let data: String = (0..50_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let back = curl(&net, &["--data-binary", &data, &url("/echo")]);
    assert!(back == data, "POST /echo returned {} bytes", back.len());
    let code = curl(
        &net,
        &["-o", "/dev/null", "-w", "%{http_code}", &url("/nope")],
    );
    assert_eq!(code, "404");
    // HTTP/2 on the same port (h2c, prior knowledge): a GET and a 50,000-byte POST echo.
    let h2 = curl(
        &net,
        &[
            "--http2-prior-knowledge",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code}",
            &url("/"),
        ],
    );
    assert_eq!(h2, "2 200");
    let back = curl(
        &net,
        &[
            "--http2-prior-knowledge",
            "--data-binary",
            &data,
            &url("/echo"),
        ],
    );
    assert!(
        back == data,
        "HTTP/2 POST /echo returned {} bytes",
        back.len()
    );
    // A client that never finishes its headers is disconnected after the header timeout
    // (half a second here), while the server goes on answering others.
    let slow = net
        .client_ns()
        .run(|| -> std::io::Result<usize> {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect((SERVER_V4, 8080))?;
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")?;
            s.set_read_timeout(Some(std::time::Duration::from_secs(20)))?;
            let mut b = [0u8; 512];
            s.read(&mut b)
        })
        .expect("client thread");
    match slow {
        // Closed (perhaps after a 408 hyper sends), not left open until the read timeout.
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("a client with unfinished headers was not disconnected: {e}"),
    }
    assert_eq!(
        curl(&net, &["-o", "/dev/null", "-w", "%{http_code}", &url("/")]),
        "200"
    );
    let (status, out) = http.stop();
    assert_clean_exit(status, &out);
    assert_no_xdp(&net);
}

#[test]
fn runtime_udp_echo_example_on_two_cores_answers_every_datagram() {
    if !require_root("runtime_udp_echo") {
        return;
    }
    let net = net(2);
    let udp = Echo::start_example(&net, "udp_echo", &["--addr", "10.77.0.3/24"]);
    let answered = net
        .client_ns()
        .run(|| {
            (0..200u32)
                .filter(|i| {
                    // A fresh socket each time: the kernel picks a queue per socket.
                    let s = std::net::UdpSocket::bind("10.77.0.2:0").unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    let msg = payload(100 + *i as usize, u64::from(*i));
                    let mut back = [0u8; 512];
                    (0..5).any(|_| {
                        s.send_to(&msg, v4(7)).unwrap();
                        matches!(s.recv_from(&mut back), Ok((n, from)) if from == v4(7) && back[..n] == msg[..])
                    })
                })
                .count()
        })
        .unwrap();
    assert_eq!(answered, 200);
    let (status, out) = udp.stop();
    assert_clean_exit(status, &out);
}

#[test]
fn runtime_bulk_sink_counts_what_a_kernel_client_sends() {
    if !require_root("runtime_bulk_sink") {
        return;
    }
    let net = net(2);
    let bulk = Echo::start_example(&net, "bulk", &["--addr", "10.77.0.3/24", "--mode", "sink"]);
    let n = 32usize << 20;
    net.client_ns()
        .run(move || {
            let mut s = connect(v4(5001)).unwrap();
            s.write_all(&payload(n, 3)).unwrap();
        })
        .unwrap();
    let want = format!(": {n} bytes in ");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !bulk.output().contains(&want) {
        assert!(std::time::Instant::now() < deadline, "{}", bulk.output());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, out) = bulk.stop();
    assert_clean_exit(status, &out);
    assert!(out.contains("Gbit/s"), "{out}");
    // Model-T: a bulk push fills the receive batches, so the adaptive batch grows past its
    // smallest size on the core that carried the stream (it may settle back there when the
    // core keeps up with the stream; then it still changed size on the way).
    let after = |key: &str| -> Vec<usize> {
        out.match_indices(key)
            .filter_map(|(i, m)| out[i + m.len()..].split(' ').next()?.parse().ok())
            .collect()
    };
    let settled = after("settled at ");
    let changes: Vec<usize> = out
        .match_indices(" changes)")
        .filter_map(|(i, _)| out[..i].rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(
        settled.iter().any(|&b| b > 4) || changes.iter().any(|&c| c > 0),
        "{out}"
    );
}

#[test]
fn runtime_http_example_serves_https_with_http2_by_alpn() {
    if !require_root("runtime_https") {
        return;
    }
    let net = net(1);
    let tls = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/http/tls");
    let (cert, key) = (format!("{tls}/cert.pem"), format!("{tls}/key.pem"));
    let http = Echo::start_example(
        &net,
        "http",
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "1",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    let url = |p: &str| format!("https://{SERVER_V4}:8080{p}");
    let fmt = "%{http_version} %{http_code}";
    // ALPN picks HTTP/2; a client that offers only HTTP/1.1 gets it; the certificate checks.
    let h2 = curl(
        &net,
        &["--cacert", &cert, "-o", "/dev/null", "-w", fmt, &url("/")],
    );
    assert_eq!(h2, "2 200");
    let h1 = curl(
        &net,
        &[
            "--cacert",
            &cert,
            "--http1.1",
            "-o",
            "/dev/null",
            "-w",
            fmt,
            &url("/"),
        ],
    );
    assert_eq!(h1, "1.1 200");
    let body = curl(&net, &["--cacert", &cert, &url("/bytes/100000")]);
    assert_eq!(body.len(), 100_000);
    let (status, out) = http.stop();
    assert_clean_exit(status, &out);
    assert!(out.contains("HTTPS on port 8080"), "{out}");
}

/// One gRPC call to the grpc example (tonic on hyper's HTTP/2), made with curl: the request
/// is a length-prefixed protobuf `Say { text }`, the answer `Said { text, core }` with
/// `grpc-status: 0`; an unknown method is `grpc-status: 12` (unimplemented).
#[test]
fn runtime_grpc_example_answers_a_unary_call() {
    if !require_root("runtime_grpc") {
        return;
    }
    let net = net(1);
    let grpc = Echo::start_example(&net, "grpc", &["--addr", "10.77.0.3/24", "--cores", "1"]);
    let text = b"hello over grpc";
    // Say { text = 1 }: field 1, wire type 2 (0x0a), its length, the bytes; then the gRPC
    // frame: not compressed, a 4-byte big-endian length.
    let mut msg = vec![0x0a, text.len() as u8];
    msg.extend_from_slice(text);
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    let dir = std::env::temp_dir().join(format!("corelane-grpc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (req, resp, heads) = (dir.join("req"), dir.join("resp"), dir.join("heads"));
    std::fs::write(&req, &frame).unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let call = |method: &str, body: &std::path::Path| {
        curl(
            &net,
            &[
                "--http2-prior-knowledge",
                "-H",
                "content-type: application/grpc",
                "-H",
                "te: trailers",
                "--data-binary",
                &format!("@{}", body.display()),
                "-D",
                heads.to_str().unwrap(),
                "-o",
                resp.to_str().unwrap(),
                &format!("http://{SERVER_V4}:50051/corelane.echo.Echo/{method}"),
            ],
        );
        (
            std::fs::read(&resp).unwrap(),
            std::fs::read_to_string(&heads).unwrap(),
        )
    };
    let (body, headers) = call("Say", &req);
    assert!(headers.contains("grpc-status: 0"), "{headers}");
    // Said { text = 1, core = 2 }, framed.
    assert_eq!(body[0], 0, "not compressed");
    let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
    let said = &body[5..];
    assert_eq!(said.len(), len);
    let mut want = vec![0x0a, text.len() as u8];
    want.extend_from_slice(text);
    assert!(said.starts_with(&want), "{said:?}");
    // The core field is 0 here (one core), which protobuf leaves out.
    assert_eq!(said.len(), want.len(), "{said:?}");
    // An unknown method is answered without reading the request: sent with no message, so
    // the answer cannot overtake the client's upload (curl 7.88 reports a stream the server
    // closed while it still sent as an HTTP/2 framing error).
    let (_, headers) = call("Shout", &empty);
    assert!(headers.contains("grpc-status: 12"), "{headers}");
    let _ = std::fs::remove_dir_all(&dir);
    let (status, out) = grpc.stop();
    assert_clean_exit(status, &out);
}
