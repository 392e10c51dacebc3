//! corelane's own cost per request at the runtime level, without the kernel: the application
//! as tokio tasks on corelane's sockets (wakers, the driver's turns, the executor), in
//! `corelane::lab` (one core over the in-memory queue; the client's and the server's frames
//! loop back inside the device, checksums computed and verified). Each connection's client
//! task sends a request (1 B or 64 B) and reads the response its server task echoes, all
//! connections at once (1, 16, 256). Next to it, in the same run and on the same thread, the
//! same tasks on tokio's own sockets over the kernel's loopback (127.0.0.1): the kernel's TCP
//! stack under the same runtime. Prints ns per request per side (the run's time over the
//! requests answered, halved: client and server each do one side's work, on one core) and
//! writes docs/results/lab-reqresp.md.
//!
//! ```sh
//! cargo run --release -p corelane-bench --bin lab-reqresp            # the table
//! cargo run --release -p corelane-bench --bin lab-reqresp -- --quick # fewer requests
//! cargo run --release -p corelane-bench --bin lab-reqresp -- --profile 1 1 # corelane's row, for perf
//! ```

use std::future::Future;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// `n` connections of one stack (corelane's or the kernel's), their requests exchanged
/// `rounds` times each with `size` bytes; returns ns per request per side.
async fn exchange<S, C, CF>(connect: C, n: usize, size: usize, requests: usize) -> Result<f64>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
    C: Fn() -> CF,
    CF: Future<Output = std::io::Result<(S, S)>>,
{
    let rounds = requests.div_ceil(n);
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        pairs.push(connect().await?);
    }
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(2 * n);
    for (mut client, mut server) in pairs {
        tasks.push(tokio::task::spawn_local(async move {
            let mut b = vec![0u8; size];
            for _ in 0..rounds {
                server.read_exact(&mut b).await?;
                server.write_all(&b).await?;
            }
            Ok::<_, std::io::Error>(())
        }));
        tasks.push(tokio::task::spawn_local(async move {
            let req = vec![7u8; size];
            let mut b = vec![0u8; size];
            for _ in 0..rounds {
                client.write_all(&req).await?;
                client.read_exact(&mut b).await?;
            }
            Ok::<_, std::io::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let done = (rounds * n) as f64;
    Ok(t.elapsed().as_nanos() as f64 / done / 2.0)
}

fn corelane_row(n: usize, size: usize, requests: usize) -> Result<f64> {
    corelane::lab::Lab::new().seed(7).run(async move {
        let listener = corelane::net::TcpListener::bind("127.0.0.1:0").await?;
        let at = listener.local_addr()?;
        let listener = std::rc::Rc::new(listener);
        let connect = || {
            let listener = listener.clone();
            async move {
                let client = corelane::net::TcpStream::connect(at).await?;
                let (server, _) = listener.accept().await?;
                client.set_nodelay(true)?;
                server.set_nodelay(true)?;
                Ok((client, server))
            }
        };
        exchange(connect, n, size, requests).await
    })?
}

fn kernel_row(n: usize, size: usize, requests: usize) -> Result<f64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let at = listener.local_addr()?;
        let listener = std::rc::Rc::new(listener);
        let connect = || {
            let listener = listener.clone();
            async move {
                let client = tokio::net::TcpStream::connect(at).await?;
                let (server, _) = listener.accept().await?;
                client.set_nodelay(true)?;
                server.set_nodelay(true)?;
                Ok((client, server))
            }
        };
        exchange(connect, n, size, requests).await
    })
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let requests = if quick { 20_000 } else { 300_000 };
    // One core, as corelane's lanes run: the kernel's softirq work for loopback runs on the
    // same CPU, in the sending system call.
    if let Some(id) = core_affinity::get_core_ids().and_then(|ids| ids.into_iter().next()) {
        core_affinity::set_for_current(id);
    }
    // `--profile N SIZE`: corelane's row alone, ten times the requests (for perf).
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--profile") {
        let get = |k: usize| args.get(at + k).and_then(|v| v.parse().ok());
        let (n, size) = (get(1).unwrap_or(16), get(2).unwrap_or(1));
        let ns = corelane_row(n, size, requests * 10)?;
        println!("corelane {n} connections {size} B: {ns:.0} ns per request per side");
        return Ok(());
    }
    let mut rows = Vec::new();
    println!("connections  size  corelane ns  kernel ns  ratio");
    for n in [1usize, 16, 256] {
        for size in [1usize, 64] {
            let c = corelane_row(n, size, requests)?;
            let k = kernel_row(n, size, requests)?;
            println!("{n:>11}  {size:>4}  {c:>11.0}  {k:>9.0}  {:>5.2}x", c / k);
            rows.push(vec![
                n.to_string(),
                format!("{size} B"),
                format!("{c:.0}"),
                format!("{k:.0}"),
                format!("{:.2}x", c / k),
            ]);
        }
    }
    let table = corelane_bench::markdown_table(
        &[
            "connections",
            "request and response",
            "corelane ns per request per side",
            "tokio on the kernel's loopback, ns",
            "corelane / kernel",
        ],
        &rows,
    );
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results/lab-reqresp.md");
    let (commit, cpu) = corelane_bench::commit_and_cpu();
    let text = format!(
        "# Request/response at the runtime level, in memory\n\n\
         Measured at commit `{commit}` on one core of {cpu}, {requests} requests per row.\n\n\
         The application as tokio tasks on corelane's sockets in `corelane::lab` (one core over \
         the in-memory queue: every stage of the pipeline, the driver's turns, wakers; the \
         frames loop back inside the device, checksums computed and verified), a client task \
         and a server task per connection, every connection at once. Beside it, in the same \
         run on the same pinned thread, the same tasks on tokio's sockets over the kernel's \
         loopback. The figure is the run's time over the requests answered, halved (client \
         and server each do one side's work).\n\n\
         `cargo run --release -p corelane-bench --bin lab-reqresp`\n\n{table}"
    );
    if !quick {
        std::fs::write(&out, text)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}
