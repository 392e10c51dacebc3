//! A quiet stack (the old process of an upgrade, `Stack::set_quiet`): it takes no new
//! connection and refuses none, while what its listener holds completes and is accepted.

use smoltcp::time::Duration;

use crate::{Pair, StackConfig, TcpState};

fn cfg() -> StackConfig {
    StackConfig {
        seed: Some(0x0a11),
        ..StackConfig::default()
    }
}

#[test]
fn a_quiet_stack_takes_no_new_connection_and_refuses_none() -> Result<(), Box<dyn std::error::Error>>
{
    let mut p = Pair::with(corelane_frame::MemLink::default(), cfg(), cfg());
    p.a.stack.listen_tcp(7, None)?;
    let (queued, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    p.drive(Duration::from_secs(1), |p| {
        p.a.stack.accept_queue_len(7) == 1
    })?;

    p.a.stack.set_quiet(true);
    assert!(
        !p.a.stack.listeners_idle(),
        "a connection waits to be accepted"
    );
    let (late, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    p.drive_for(Duration::from_millis(1500), |_| {})?;
    assert_eq!(
        p.b.stack.tcp_state(late),
        Some(TcpState::SynSent),
        "not refused"
    );
    assert!(p.a.stack.stats().syn_dropped >= 1);
    // What the listener held completes: accepted, and the listener may close.
    assert!(p.a.stack.accept(7).is_some());
    assert!(p.a.stack.listeners_idle());
    p.a.stack.unlisten(7);
    p.drive_for(Duration::from_millis(2500), |_| {})?;
    assert_eq!(p.b.stack.tcp_state(queued), Some(TcpState::Established));
    assert_eq!(
        p.b.stack.tcp_state(late),
        Some(TcpState::SynSent),
        "a SYN to a closed port is not answered either"
    );
    // Loud again: the next retry is refused.
    p.a.stack.set_quiet(false);
    p.drive(Duration::from_secs(10), |p| {
        p.b.stack.tcp_state(late) != Some(TcpState::SynSent)
    })?;
    assert_ne!(p.b.stack.tcp_state(late), Some(TcpState::Established));
    Ok(())
}
