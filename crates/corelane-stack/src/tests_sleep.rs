//! The deadline a core sleeps until (`Stack::sleep_deadline`): a timer that a connection no
//! longer needs is not slept until.

use std::task::Poll;

use smoltcp::time::Duration;

use crate::{FlowId, Pair, StackConfig, TcpState};

/// Two seeded stacks on an in-memory link.
fn pair() -> Pair {
    let cfg = StackConfig {
        seed: Some(0x5ee9),
        ..StackConfig::default()
    };
    Pair::with(corelane_frame::MemLink::default(), cfg, cfg)
}

/// Two seeded stacks with a connection open between them: the pair, the server's end (on
/// `a`) and the client's (on `b`).
pub(crate) fn connected() -> Result<(Pair, FlowId, FlowId), Box<dyn std::error::Error>> {
    let mut p = pair();
    p.a.stack.listen_tcp(7, None)?;
    let (c, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    let mut server = None;
    let open = p.drive(Duration::from_secs(1), |p| {
        server = server.or_else(|| p.a.stack.accept(7));
        server.is_some() && p.b.stack.tcp_state(c) == Some(TcpState::Established)
    })?;
    let s = server.filter(|_| open).ok_or("no connection")?;
    Ok((p, s, c))
}

/// Has the server's end `s` write `data` for `d` of simulated time while the client reads
/// nothing, so that the client's window shuts with bytes unsent. Returns the bytes written.
pub(crate) fn write_unread(
    p: &mut Pair,
    s: FlowId,
    data: &[u8],
    d: Duration,
) -> std::io::Result<usize> {
    let mut written = 0;
    p.drive_for(d, |p| {
        if let Poll::Ready(Ok(n)) = p.a.stack.tcp_write(s, &data[written..], None) {
            written += n;
        }
    })?;
    Ok(written)
}

#[test]
fn an_answer_that_carries_the_ack_leaves_no_delayed_ack_to_wake_for()
-> Result<(), Box<dyn std::error::Error>> {
    let (mut p, s, c) = connected()?;
    // Whatever the handshake left to do is done.
    p.drive_for(Duration::from_millis(300), |_| {})?;

    // A request: one small segment, for which the server owes an ACK within the ACK delay.
    assert!(matches!(
        p.b.stack.tcp_write(c, b"request!", None),
        Poll::Ready(Ok(8))
    ));
    let mut buf = [0u8; 64];
    let mut got = 0;
    p.drive(Duration::from_millis(10), |p| {
        if let Poll::Ready(Ok(n)) = p.a.stack.tcp_read(s, &mut buf, None) {
            got += n;
        }
        got == 8
    })?;
    assert_eq!(got, 8, "the request arrived");
    let owed = p.a.stack.next_deadline().ok_or("no ACK deadline")?;
    assert!(
        owed > p.now(),
        "the ACK is delayed: {owed:?} at {:?}",
        p.now()
    );

    // The answer carries the ACK: the delayed ACK's timer no longer matters.
    assert!(matches!(
        p.a.stack.tcp_write(s, &buf[..8], None),
        Poll::Ready(Ok(8))
    ));
    let now = p.now();
    p.a.poll(now)?;
    assert_eq!(
        p.a.stack.next_deadline(),
        Some(owed),
        "the delayed ACK's timer is still in the heap"
    );
    let sleep = p.a.stack.sleep_deadline();
    eprintln!("owed {owed:?}, sleep until {sleep:?}, now {now:?}");
    assert!(
        sleep.is_none_or(|t| t > owed),
        "a core would sleep until {sleep:?}, the ACK timer that no longer matters ({owed:?})"
    );
    // What it sleeps until is what the connection needs: the heap's top from now on.
    assert_eq!(p.a.stack.next_deadline(), sleep);
    assert_eq!(
        p.a.stack.sleep_deadline(),
        sleep,
        "a second look changes nothing"
    );
    Ok(())
}

#[test]
fn a_connection_waiting_for_its_next_hop_keeps_the_resolution_s_retry()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = pair();
    // On the link, held by nobody: the SYN waits for an ARP answer that never comes.
    let (c, _) = p.a.stack.connect_tcp("10.9.0.99:80".parse()?)?;
    let now = p.now();
    p.a.poll(now)?;
    assert_eq!(p.a.stack.tcp_state(c), Some(TcpState::SynSent));
    let retry =
        p.a.stack
            .next_deadline()
            .ok_or("no retry of the resolution")?;
    assert_eq!(
        p.a.stack.sleep_deadline(),
        Some(retry),
        "a core must wake to ask again (and to fail the connect in the end)"
    );
    // And it does fail, with the core sleeping until what `sleep_deadline` says.
    let end = now + Duration::from_secs(30);
    let mut at = now;
    while p.a.stack.tcp_state(c) == Some(TcpState::SynSent) && at < end {
        at =
            p.a.stack
                .sleep_deadline()
                .ok_or("nothing to wake for")?
                .max(at);
        p.a.poll(at)?;
    }
    assert_ne!(
        p.a.stack.tcp_state(c),
        Some(TcpState::SynSent),
        "still waiting at {at:?}"
    );
    Ok(())
}
