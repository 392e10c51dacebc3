//! One connection carrying more than 2 GiB each way at once, through two stacks over the
//! in-memory link: past half the sequence space, every comparison with a number from the
//! connection's start turns around (RFC 9293 section 3.4), so this is where a stack that
//! compares wrongly corrupts data. Each side shuts down writing once it has sent everything,
//! so one of them reaches TIME-WAIT while its reader may still be behind. Every byte is
//! checked by its position in the stream. (Before this test: every byte past 2 GiB came from
//! the wrong place in the send ring, and the last unread bytes were dropped at TIME-WAIT.)

use std::task::Poll;

use corelane_stack::{FlowId, Pair, StackConfig};
use smoltcp::time::Duration;

const TOTAL: u64 = (2 << 30) + (1 << 20);

/// The byte at stream position `pos` (a prime period, so a shifted stream shows).
fn byte_at(pos: u64) -> u8 {
    (pos % 251) as u8
}

struct Side {
    sent: u64,
    got: u64,
    closed: bool,
    eof: bool,
}

/// Writes what it can, reads what there is; true once everything went out and the peer's
/// end came in. Err on a byte out of place.
fn pump(
    stack: &mut corelane_stack::Stack,
    id: FlowId,
    side: &mut Side,
    pattern: &[u8],
    buf: &mut [u8],
) -> Result<bool, String> {
    while side.sent < TOTAL {
        let off = (side.sent % 251) as usize;
        let n = ((TOTAL - side.sent) as usize).min(pattern.len() - 251);
        match stack.tcp_write(id, &pattern[off..off + n], None) {
            Poll::Ready(Ok(k)) if k > 0 => side.sent += k as u64,
            _ => break,
        }
    }
    if side.sent == TOTAL && !side.closed {
        stack.tcp_shutdown(id).map_err(|e| e.to_string())?;
        side.closed = true;
    }
    while !side.eof {
        match stack.tcp_read(id, buf, None) {
            Poll::Ready(Ok(0)) => side.eof = true,
            Poll::Ready(Ok(n)) => {
                for (i, &b) in buf[..n].iter().enumerate() {
                    let pos = side.got + i as u64;
                    if pos >= TOTAL || b != byte_at(pos) {
                        return Err(format!("byte {pos} is {b}, want {}", byte_at(pos)));
                    }
                }
                side.got += n as u64;
            }
            Poll::Ready(Err(e)) => return Err(e.to_string()),
            Poll::Pending => break,
        }
    }
    Ok(side.eof && side.closed)
}

#[test]
fn more_than_2_gib_each_way_on_one_connection_arrive_intact() -> Result<(), String> {
    let cfg = StackConfig {
        seed: Some(0x10_06),
        ..StackConfig::default()
    };
    let mut p = Pair::new(cfg);
    p.a.stack.listen_tcp(7, None).map_err(|e| e.to_string())?;
    let addr = Pair::A_ADDR.parse().map_err(|_| "address")?;
    let (c, _) = p.b.stack.connect_tcp(addr).map_err(|e| e.to_string())?;
    let pattern: Vec<u8> = (0..(1u64 << 20) + 251).map(byte_at).collect();
    let mut buf = vec![0u8; 1 << 20];
    let mut server = None;
    let new_side = || Side {
        sent: 0,
        got: 0,
        closed: false,
        eof: false,
    };
    let (mut sa, mut sb) = (new_side(), new_side());
    let mut failure = None;
    let done = p
        .drive(Duration::from_secs(3600), |p| {
            server = server.or_else(|| p.a.stack.accept(7));
            let mut step = || -> Result<bool, String> {
                let a = match server {
                    Some(s) => pump(&mut p.a.stack, s, &mut sa, &pattern, &mut buf)?,
                    None => false,
                };
                let b = pump(&mut p.b.stack, c, &mut sb, &pattern, &mut buf)?;
                Ok(a && b)
            };
            match step() {
                Ok(d) => d,
                Err(e) => {
                    failure = Some(e);
                    true
                }
            }
        })
        .map_err(|e| e.to_string())?;
    if let Some(e) = failure {
        return Err(e);
    }
    assert!(
        done,
        "sent {}/{}, received {}/{}",
        sa.sent, sb.sent, sa.got, sb.got
    );
    assert_eq!((sa.got, sb.got), (TOTAL, TOTAL));
    Ok(())
}
