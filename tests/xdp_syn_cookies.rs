//! SYN cookies answered by the XDP program, over IPv4 and over IPv6: a spoofed SYN flood fills
//! a corelane listener's SYN backlog, the stack's first cookies turn the program's answer on for
//! the port, and from then on the flood is answered on the CPU it arrives on without reaching
//! the stack. Real clients keep connecting during it: their SYNs are answered by the program
//! too, and their ACKs open connections in the stack from cookies it never made itself, so the
//! program's cookies (SipHash in BPF, over the addresses of either family) and the stack's check
//! agree. The veth peer runs an XDP program too, which veth needs to deliver the program's
//! answers (XDP_TX).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::echo_once;
use corelane::StackStats;
use corelane_testnet::{VethPair, require_root};

const BACKLOG: usize = 16;

#[test]
fn the_xdp_program_answers_a_flood_with_cookies_the_stack_accepts() -> Result<(), String> {
    if !require_root("xdp syn cookies") {
        return Ok(());
    }
    flood_answered_by_the_program("10.86.0", "fd00:86::", false)
}

#[test]
fn the_xdp_program_answers_an_ipv6_flood_with_cookies_the_stack_accepts() -> Result<(), String> {
    if !require_root("xdp syn cookies over IPv6") {
        return Ok(());
    }
    flood_answered_by_the_program("10.87.0", "fd00:87::", true)
}

/// The flood and the real clients aimed at corelane's IPv6 address when `v6`, else at its IPv4
/// one (`net4`.3 and `net6`3; the kernel's ends are .1 and .2).
fn flood_answered_by_the_program(net4: &str, net6: &str, v6: bool) -> Result<(), String> {
    let net = VethPair::builder()
        .server_addr(&format!("{net4}.1/24"))
        .server_addr(&format!("{net6}1/64"))
        .client_addr(&format!("{net4}.2/24"))
        .client_addr(&format!("{net6}2/64"))
        .build()
        .map_err(|e| e.to_string())?;
    // veth hands the program's answers (XDP_TX) to a peer only when the peer runs an XDP
    // program of its own: corelane's, owning nothing, passes everything.
    let object = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/corelane-xsk/xdp/corelane.bpf.o"
    );
    net.client_ns()
        .attach_xdp(net.client_if(), object)
        .map_err(|e| e.to_string())?;
    // The stack's counters at every accept.
    let seen: Arc<Mutex<Vec<StackStats>>> = Arc::default();
    let (ready_tx, ready_rx) = mpsc::channel();
    let last = seen.clone();
    let one = common::one_core(net.server_if(), &format!("{net4}.3"));
    let addr6 = format!("{net6}3/64");
    let builder = move || one().addr(addr6).backlog(BACKLOG).xdp_syn_cookies(true);
    let (stop, server) = common::serve_in(net.server_ns(), builder, move |rt| {
        let ready_tx = Mutex::new(ready_tx);
        let last = Mutex::new(last);
        rt.run(|_| {
            let ready = ready_tx.lock().map(|t| t.clone()).ok();
            let last = last.lock().map(|s| s.clone()).ok();
            async move {
                let l = corelane::net::TcpListener::bind(7)
                    .await
                    .map_err(|e| e.to_string());
                if let Some(t) = ready {
                    let _ = t.send(l.as_ref().map(|_| ()).map_err(Clone::clone));
                }
                let (Ok(l), Some(last)) = (l, last) else {
                    return;
                };
                while let Ok((s, _)) = l.accept().await {
                    if let (Some(st), Ok(mut v)) = (corelane::core_stats(), last.lock()) {
                        v.push(st.stack);
                    }
                    tokio::task::spawn_local(common::echo_stream(s));
                }
            }
        })
        .map_err(|e| e.to_string())
    })?;
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the server did not start")??;
    let target: SocketAddr = if v6 {
        format!("[{net6}3]:7")
    } else {
        format!("{net4}.3:7")
    }
    .parse()
    .map_err(|_| "addr")?;
    net.client_ns()
        .run(move || echo_once(target))
        .map_err(|e| e.to_string())??;
    // Bounded: at most 2 seconds and 3 million SYNs (the time ends it first here); real
    // connections from 300 ms on.
    let (flooded, tries) = common::flood_and_connect(
        &net,
        target,
        3_000_000,
        Duration::from_secs(2),
        Duration::from_millis(300),
    )?;
    std::thread::sleep(Duration::from_millis(50));
    stop.stop();
    let report = server.join().map_err(|e| e.to_string())???;
    let accepts = seen.lock().map_err(|_| "poisoned")?.clone();
    let stack = accepts.last().cloned().unwrap_or_default();
    eprintln!(
        "{target}: flood {} SYNs; XDP cookies {}; stack cookies sent {}, opened from cookies {}; {tries:?}",
        flooded.sent, report.xdp.syn_cookies, stack.tcp.cookies_sent, stack.tcp.cookies_ok
    );
    let failures: Vec<_> = tries.iter().filter(|t| t.is_err()).collect();
    assert!(failures.is_empty(), "real connections failed: {failures:?}");
    assert!(flooded.sent >= 10_000, "the flood sent only {flooded:?}");
    // The program answered most of the flood, the stack only what came before it took over.
    assert!(
        report.xdp.syn_cookies >= flooded.sent / 2,
        "the program answered {} of {} SYNs",
        report.xdp.syn_cookies,
        flooded.sent
    );
    assert!(
        stack.tcp.cookies_sent < report.xdp.syn_cookies / 10,
        "the stack answered {} itself",
        stack.tcp.cookies_sent
    );
    // The real clients' connections during the flood (every accept after the first) were
    // opened from cookies, and the stack sent none meanwhile: the program's cookies.
    assert_eq!(accepts.len(), 11, "{accepts:?}");
    let during = &accepts[1..];
    assert!(
        during
            .windows(2)
            .all(|w| w[1].tcp.cookies_ok == w[0].tcp.cookies_ok + 1),
        "not opened from cookies: {:?}",
        during.iter().map(|s| s.tcp.cookies_ok).collect::<Vec<_>>()
    );
    assert!(
        during
            .iter()
            .all(|s| s.tcp.cookies_sent == during[0].tcp.cookies_sent),
        "the stack answered SYNs meanwhile: {:?}",
        during
            .iter()
            .map(|s| s.tcp.cookies_sent)
            .collect::<Vec<_>>()
    );
    Ok(())
}
