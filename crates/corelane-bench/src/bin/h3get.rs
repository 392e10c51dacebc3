//! Checks an HTTP/3 server that serves the `http3` example's routes, from the kernel's UDP (h3
//! over quinn): a body of `--bytes N` (`GET /bytes/N`, every byte checked), a POST of
//! `--post N` echoed (`POST /echo`, compared), and `--requests K` more of `GET /bytes/1000` on
//! each of `--connections C` connections at once. Prints one line; exits 0 only when every
//! answer was whole.
//!
//! ```text
//! h3get 10.99.0.2:4433 --ca /tmp/http3.pem --bytes 1048576 --post 100000 --connections 4 --requests 25
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use corelane_bench::h3::{client_endpoint, open, request};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

#[derive(Parser, Debug)]
#[command(about = "Checks an HTTP/3 server that serves the http3 example's routes")]
struct Args {
    /// The server.
    to: SocketAddr,
    /// The certificate to trust (PEM; the http3 example's `--cert-out`).
    #[arg(long)]
    ca: std::path::PathBuf,
    /// `GET /bytes/N`.
    #[arg(long, default_value_t = 1 << 20)]
    bytes: usize,
    /// `POST /echo` of N bytes.
    #[arg(long, default_value_t = 100_000)]
    post: usize,
    /// Connections at once for the small requests.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Small requests on each of them.
    #[arg(long, default_value_t = 25)]
    requests: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(line) => {
            println!("h3get: ok: {line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("h3get: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<String, String> {
    let cert = CertificateDer::from_pem_file(&args.ca)
        .map_err(|e| format!("--ca {}: {e}", args.ca.display()))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    let to = args.to;
    let (n, post, conns, reqs) = (args.bytes, args.post, args.connections, args.requests);
    local.block_on(&rt, async move {
        let t0 = Instant::now();
        let any: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }
            .parse()
            .map_err(|e| format!("{e}"))?;
        let ep = client_endpoint(&cert, any).map_err(|e| e.to_string())?;
        let (conn, mut send) = open(&ep, to).await.map_err(|e| format!("handshake: {e}"))?;
        let body = request(&mut send, &format!("/bytes/{n}"), None)
            .await
            .map_err(|e| format!("GET /bytes/{n}: {e}"))?;
        if body.len() != n || body.iter().any(|&b| b != b'x') {
            return Err(format!(
                "GET /bytes/{n}: {} bytes, not {n} of 'x'",
                body.len()
            ));
        }
        let sent: Vec<u8> = (0..post).map(|i| (i * 7 + i / 251) as u8).collect();
        let back = request(&mut send, "/echo", Some(&sent))
            .await
            .map_err(|e| format!("POST /echo: {e}"))?;
        if back != sent {
            return Err(format!(
                "POST /echo: {} bytes back, not the {post} sent",
                back.len()
            ));
        }
        conn.close(0x100u32.into(), b"");
        let mut tasks = Vec::new();
        for _ in 0..conns {
            let ep = ep.clone();
            tasks.push(tokio::task::spawn_local(async move {
                let (conn, mut send) = open(&ep, to).await?;
                for _ in 0..reqs {
                    let b = request(&mut send, "/bytes/1000", None).await?;
                    if b.len() != 1000 {
                        return Err(format!("GET /bytes/1000: {} bytes", b.len()).into());
                    }
                }
                conn.close(0x100u32.into(), b"");
                Ok::<_, corelane_bench::h3::BoxError>(())
            }));
        }
        for t in tasks {
            t.await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("a connection of small requests: {e}"))?;
        }
        ep.wait_idle().await;
        Ok(format!(
            "{n} bytes got, {post} echoed, {} requests on {conns} connections, in {:.2} s",
            conns * reqs,
            t0.elapsed().as_secs_f64()
        ))
    })
}
