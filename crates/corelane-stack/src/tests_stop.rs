//! A stack's stop (`Stack::shutdown`, the end of a graceful shutdown's grace): a connection
//! with nothing unread and everything acknowledged ends with a FIN, as a process's exit ends a
//! kernel socket; one holding data it cannot deliver is reset.

use std::task::Poll;

use smoltcp::time::Duration;

use crate::{Pair, StackConfig, TcpState};

fn cfg() -> StackConfig {
    StackConfig {
        seed: Some(0x5709),
        ..StackConfig::default()
    }
}

#[test]
fn an_idle_connection_gets_a_fin_at_stop_and_one_with_unread_data_a_reset()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = Pair::with(corelane_frame::MemLink::default(), cfg(), cfg());
    p.a.stack.listen_tcp(7, None)?;
    let (idle, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    let (busy, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    p.drive(Duration::from_secs(1), |p| {
        p.a.stack.accept_queue_len(7) == 2
    })?;
    let first = p.a.stack.accept(7).ok_or("accepted")?;
    let second = p.a.stack.accept(7).ok_or("accepted")?;
    // The second client sends what the server never reads.
    let _ = p.b.stack.tcp_write(busy, b"unread", None);
    p.drive_for(Duration::from_millis(300), |_| {})?;
    assert!(p.a.stack.tcp_state(first) == Some(TcpState::Established));
    assert!(p.a.stack.tcp_state(second) == Some(TcpState::Established));

    let now = p.now();
    p.a.shutdown(now)?;
    let stats = p.a.stack.stats();
    assert_eq!(
        (stats.fin_at_stop, stats.reset_at_stop),
        (1, 1),
        "{stats:?}"
    );
    // Only the client runs on: what the stopped server sent reaches it.
    for _ in 0..10 {
        p.b.poll(now)?;
    }
    let mut buf = [0u8; 16];
    assert!(
        matches!(p.b.stack.tcp_read(idle, &mut buf, None), Poll::Ready(Ok(0))),
        "the idle connection reads its end: {:?}",
        p.b.stack.tcp_state(idle)
    );
    assert_eq!(p.b.stack.tcp_state(idle), Some(TcpState::CloseWait));
    assert!(
        matches!(p.b.stack.tcp_read(busy, &mut buf, None), Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the connection with unread data is reset: {:?}",
        p.b.stack.tcp_state(busy)
    );
    Ok(())
}
