//! HTTP/3 on the wire, as root: the `http3` example (h3 over corelane's QUIC, through the XDP
//! program and an AF_XDP socket) on one end of a veth pair, and clients nobody here wrote on
//! the kernel's UDP at the other: aioquic (Python's HTTP/3 client, `scripts/h3client.py`
//! around it) and h3 over quinn.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use common::*;
use corelane_testnet::require_root;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const PORT: &str = "4433";

/// What one run of `scripts/h3client.py` printed.
#[derive(Debug)]
struct Fetched {
    answered: u64,
    asked: u64,
    statuses: String,
    lens: Vec<u64>,
    sha256s: Vec<String>,
    sent_sha256: Option<String>,
    errors: String,
    raw: String,
}

/// The text after `"key": ` in `json`, to the end of its value (a number, a string, a list).
fn values<'a>(json: &'a str, key: &str) -> Vec<&'a str> {
    json.match_indices(&format!("\"{key}\": "))
        .map(|(i, m)| {
            let rest = &json[i + m.len()..];
            let end = match rest.as_bytes().first() {
                Some(b'"') => rest[1..].find('"').map_or(rest.len(), |e| e + 2),
                Some(b'[') => rest.find(']').map_or(rest.len(), |e| e + 1),
                _ => rest.find([',', '}']).unwrap_or(rest.len()),
            };
            rest[..end].trim_matches('"')
        })
        .collect()
}

impl Fetched {
    fn parse(raw: String) -> Fetched {
        let one = |k: &str| values(&raw, k).first().map(|s| s.to_string());
        let num = |k: &str| one(k).and_then(|s| s.parse().ok()).unwrap_or(0);
        Fetched {
            answered: num("answered"),
            asked: num("asked"),
            statuses: one("statuses").unwrap_or_default(),
            lens: values(&raw, "len")
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect(),
            sha256s: values(&raw, "sha256")
                .iter()
                .map(|s| s.to_string())
                .collect(),
            sent_sha256: one("sent_sha256"),
            errors: one("errors").unwrap_or_default(),
            raw,
        }
    }

    /// Every request answered 200, none failed.
    fn assert_all_ok(&self) {
        assert!(
            self.asked > 0 && self.answered == self.asked,
            "answered {} of {}: {}",
            self.answered,
            self.asked,
            self.raw
        );
        assert_eq!(self.statuses, "[200]", "{}", self.raw);
        assert_eq!(self.errors, "[]", "{}", self.raw);
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The client script, and a check that aioquic is there (`scripts/install-deps.sh` installs
/// it; a machine without it fails here, with that said, instead of skipping).
fn h3client() -> PathBuf {
    let ok = Command::new("python3")
        .args(["-c", "import aioquic"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 cannot import aioquic: run scripts/install-deps.sh (it installs aioquic)"
    );
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/h3client.py")
}

/// Runs the client in `ns` against `url` with `args`, trusting `ca`.
fn fetch(ns: &corelane_testnet::Netns, ca: &str, url: &str, args: &[&str]) -> Fetched {
    let script = h3client();
    let out = ns
        .command("python3")
        .arg(script)
        .args(["--ca", ca, "--timeout", "120"])
        .args(args)
        .arg(url)
        .output()
        .expect("run python3");
    let raw = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        raw.contains("\"answered\""),
        "h3client printed no summary ({}): {raw}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Fetched::parse(raw)
}

/// A temporary path for the server's certificate.
fn cert_path(test: &str) -> String {
    std::env::temp_dir()
        .join(format!("corelane-{test}-{}.pem", std::process::id()))
        .to_string_lossy()
        .to_string()
}

#[test]
fn aioquic_gets_get_post_a_10_mib_body_and_many_requests_from_the_http3_example() {
    if !require_root("http3_wire: aioquic against the http3 example") {
        return;
    }
    let net = net(1);
    let ca = cert_path("h3-basic");
    let server = Echo::start_example(
        &net,
        "http3",
        &["--addr", &format!("{SERVER_V4}/24"), "--cert-out", &ca],
    );
    let base = format!("https://{SERVER_V4}:{PORT}");
    let ns = net.client_ns();

    // GET /: the text names the core that served it.
    let got = fetch(ns, &ca, &format!("{base}/"), &[]);
    got.assert_all_ok();
    assert_eq!(got.lens, [b"hello from corelane core 0\n".len() as u64]);
    assert_eq!(got.sha256s, [hex(&sha256(b"hello from corelane core 0\n"))]);

    // A 10 MiB body, checked whole.
    let n = 10 << 20;
    let got = fetch(ns, &ca, &format!("{base}/bytes/{n}"), &[]);
    got.assert_all_ok();
    assert_eq!(got.lens, [n as u64]);
    assert_eq!(got.sha256s, [hex(&sha256(&vec![b'x'; n]))]);

    // A POST of 1 MB, echoed whole.
    let got = fetch(ns, &ca, &format!("{base}/echo"), &["--post", "1000000"]);
    got.assert_all_ok();
    assert_eq!(got.lens, [1_000_000]);
    let sent = got.sent_sha256.clone().expect("sent_sha256");
    assert_eq!(got.sha256s, [sent]);

    // 100 requests in turn on one connection.
    let got = fetch(
        ns,
        &ca,
        &format!("{base}/bytes/1000"),
        &["--requests", "100"],
    );
    got.assert_all_ok();
    assert_eq!(got.answered, 100);
    assert!(got.lens.iter().all(|&l| l == 1000), "{}", got.raw);

    // 16 connections at once, 8 requests each.
    let got = fetch(
        ns,
        &ca,
        &format!("{base}/bytes/5000"),
        &["--connections", "16", "--requests", "8"],
    );
    got.assert_all_ok();
    assert_eq!(got.answered, 128);
    let want = hex(&sha256(&[b'x'; 5000]));
    assert!(got.sha256s.iter().all(|s| *s == want), "{}", got.raw);

    // A route it does not serve is a 404, not a lost connection.
    let got = fetch(ns, &ca, &format!("{base}/nowhere"), &[]);
    assert_eq!(got.answered, 1, "{}", got.raw);
    assert_eq!(got.statuses, "[404]", "{}", got.raw);

    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let _ = std::fs::remove_file(&ca);
}

/// Through the lossy router at `percent` loss both ways: a body of `n` bytes each way and
/// twenty small requests, every one whole; the router's counters show it dropped datagrams
/// both ways. (2 MiB is about 1,500 datagrams: the chance that 1% loss drops none of them
/// is about e^-15; 1 MiB at 5%, about e^-37.)
fn through_loss(percent: f64, n: usize) {
    const CLIENT: &str = "10.90.0.2";
    const CORELANE: &str = "10.90.0.3";
    let net = lossy_path("10.90.0.1", CLIENT);
    let ca = cert_path(&format!("h3-loss-{percent}"));
    let server = Echo::start_in(
        net.server_ns(),
        net.server_if(),
        "http3",
        &["--addr", &format!("{CORELANE}/24"), "--cert-out", &ca],
    );
    net.set_loss(
        corelane_testnet::Loss::percent(percent),
        corelane_testnet::Loss::percent(percent),
    )
    .expect("set loss");
    let base = format!("https://{CORELANE}:{PORT}");
    let got = fetch(net.client_ns(), &ca, &format!("{base}/bytes/{n}"), &[]);
    got.assert_all_ok();
    assert_eq!(got.sha256s, [hex(&sha256(&vec![b'x'; n]))]);
    let got = fetch(
        net.client_ns(),
        &ca,
        &format!("{base}/echo"),
        &["--post", &n.to_string()],
    );
    got.assert_all_ok();
    assert_eq!(got.lens, [n as u64]);
    assert_eq!(
        got.sha256s,
        got.sent_sha256.iter().cloned().collect::<Vec<_>>()
    );
    let got = fetch(
        net.client_ns(),
        &ca,
        &format!("{base}/echo"),
        &["--post", "3000", "--requests", "20"],
    );
    got.assert_all_ok();
    let sent = got.sent_sha256.clone().expect("sent_sha256");
    assert!(got.sha256s.iter().all(|s| *s == sent), "{}", got.raw);
    let c = net.counters().expect("counters");
    assert!(
        c.dropped_to_client > 0 && c.dropped_to_server > 0,
        "the router dropped nothing at {percent}%: {c:?}"
    );
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let _ = std::fs::remove_file(&ca);
}

#[test]
fn aioquic_gets_whole_bodies_through_one_percent_loss() {
    if !require_root("http3_wire: aioquic through 1% loss") {
        return;
    }
    through_loss(1.0, 2 << 20);
}

#[test]
fn aioquic_gets_whole_bodies_through_five_percent_loss() {
    if !require_root("http3_wire: aioquic through 5% loss") {
        return;
    }
    through_loss(5.0, 1 << 20);
}

/// h3's own client over quinn on the kernel's UDP: GET and POST against the http3 example.
#[test]
fn h3_over_quinn_on_the_kernel_talks_to_the_http3_example() -> Result {
    if !require_root("http3_wire: h3 over quinn against the http3 example") {
        return Ok(());
    }
    let net = net(1);
    let ca = cert_path("h3-quinn");
    let server = Echo::start_example(
        &net,
        "http3",
        &["--addr", &format!("{SERVER_V4}/24"), "--cert-out", &ca],
    );
    let pem = std::fs::read(&ca)?;
    let to: SocketAddr = format!("{SERVER_V4}:{PORT}").parse()?;
    let got = net.client_ns().run(
        move || -> std::result::Result<Vec<(u16, Vec<u8>)>, String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(h3_requests(pem, to)).map_err(|e| e.to_string())
        },
    )??;
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].0, 200);
    assert_eq!(got[0].1, b"hello from corelane core 0\n");
    assert_eq!(got[1].0, 200);
    assert_eq!(got[1].1, vec![b'x'; 300_000]);
    assert_eq!(got[2].0, 200);
    assert_eq!(got[2].1, payload(200_000, 9));
    let (status, out) = server.stop();
    assert_clean_exit(status, &out);
    let _ = std::fs::remove_file(&ca);
    Ok(())
}

/// GET /, GET /bytes/300000 and a POST /echo of 200,000 bytes on one h3 connection over
/// quinn, trusting the certificate `pem`.
async fn h3_requests(
    pem: Vec<u8>,
    to: SocketAddr,
) -> std::result::Result<Vec<(u16, Vec<u8>)>, Box<dyn std::error::Error + Send + Sync>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(c?)?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut endpoint = quinn::Endpoint::client("0.0.0.0:0".parse()?)?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    // The server may still be binding its port: a first attempt can time out.
    let conn = loop {
        match tokio::time::timeout(
            std::time::Duration::from_secs(5),
            endpoint.connect(to, "localhost")?,
        )
        .await
        {
            Ok(c) => break c?,
            Err(_) => continue,
        }
    };
    let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn)).await?;
    let drive = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    let mut out = Vec::new();
    for (method, path, body) in [
        ("GET", "/", None),
        ("GET", "/bytes/300000", None),
        ("POST", "/echo", Some(payload(200_000, 9))),
    ] {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("https://localhost{path}"))
            .body(())?;
        let mut stream = send.send_request(req).await?;
        if let Some(b) = body {
            stream.send_data(Bytes::from(b)).await?;
        }
        stream.finish().await?;
        let resp = stream.recv_response().await?;
        let mut got = Vec::new();
        while let Some(mut chunk) = stream.recv_data().await? {
            while chunk.has_remaining() {
                let c = chunk.chunk();
                got.extend_from_slice(c);
                let n = c.len();
                chunk.advance(n);
            }
        }
        out.push((resp.status().as_u16(), got));
    }
    drop(send);
    endpoint.close(0u32.into(), b"done");
    drive.abort();
    Ok(out)
}
