//! What a user sees without asking: a run's warnings and errors reach stderr when the
//! application installed no tracing subscriber, a fallback to generic XDP says why in one line
//! (a veth whose queues this run lowered below its peer's), and a stop with outbound
//! connections open warns of nothing.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::*;
use corelane_testnet::{VethPair, require_root};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Set in the child process this test starts: the interface its runtime takes.
const CHILD_IF: &str = "CORELANE_SEEN_CHILD_IF";

/// Runs `test` of this binary again in the server namespace of `net`, as a child with no
/// tracing subscriber; returns its status and stderr.
fn child(net: &VethPair, test: &str) -> Result<(std::process::ExitStatus, String)> {
    let exe = std::env::current_exe()?;
    let mut cmd: Command = net.server_ns().command(exe.to_str().ok_or("exe path")?);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_IF, net.server_if())
        .env_remove("RUST_LOG")
        .env_remove("CORELANE_LOG");
    let out = cmd.output()?;
    Ok((
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// In the child: one core on a two-queue veth (so the run lowers it to one receive queue,
/// below its peer's two transmit queues), whose future fails.
fn child_body(ifname: &str) {
    let rt = corelane::Runtime::builder(ifname)
        .addr(format!("{SERVER_V4}/24"))
        .cores(1)
        .build()
        .expect("runtime");
    let r = rt.try_run(|_| async {
        Err::<(), _>(std::io::Error::other("the application gave up on purpose"))
    });
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn with_no_subscriber_the_errors_reach_stderr_and_a_generic_fallback_names_the_peer_s_queues()
-> Result {
    if let Ok(ifname) = std::env::var(CHILD_IF) {
        child_body(&ifname);
        return Ok(());
    }
    if !require_root("seen: stderr without a subscriber") {
        return Ok(());
    }
    let net = net(2);
    let (status, err) = child(
        &net,
        "with_no_subscriber_the_errors_reach_stderr_and_a_generic_fallback_names_the_peer_s_queues",
    )?;
    assert!(status.success(), "the child failed ({status}):\n{err}");
    assert!(
        err.contains("corelane ERROR") && err.contains("the application gave up on purpose"),
        "the core's error did not reach stderr:\n{err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("refused native XDP"))
        .ok_or_else(|| format!("no line on the fallback to generic XDP:\n{err}"))?;
    assert!(
        line.contains("corelane WARN")
            && line.contains("lowered")
            && line.contains("from 2 to 1")
            && line.contains("transmit queues"),
        "the fallback's line does not name the cause: {line}"
    );
    Ok(())
}

#[test]
fn a_stop_with_outbound_connections_open_warns_of_nothing() -> Result {
    if !require_root("seen: no false warning at stop") {
        return Ok(());
    }
    let net = net(2);
    let l = net
        .client_ns()
        .run(|| std::net::TcpListener::bind("10.77.0.2:7200"))??;
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let _ = s.write_all(b"hello");
            held.push(s);
        }
    });
    let served = serve_on(
        &net,
        |b| b.cores(1),
        |_core| async move {
            let to: SocketAddr = "10.77.0.2:7200".parse().expect("addr");
            let mut open = Vec::new();
            for _ in 0..8 {
                match corelane::net::TcpStream::connect(to).await {
                    Ok(s) => open.push(s),
                    Err(e) => eprintln!("connect: {e}"),
                }
            }
            // Held until the runtime stops them.
            let _ = corelane::shutdown_requested().await;
            drop(open);
        },
    )?;
    std::thread::sleep(Duration::from_millis(500));
    served.stop.stop();
    let report = served.thread.join()??;
    assert!(
        report.warnings.is_empty(),
        "a stop with outbound connections open warned: {:?}",
        report.warnings
    );
    Ok(())
}
