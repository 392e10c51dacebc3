//! A receiver whose reader stopped: once it has advertised a shut window it takes nothing past
//! it (RFC 9293 section 3.10.7.4: with RCV.WND zero no segment is acceptable, bar its ACK), so
//! a sender's window probes get no byte acknowledged and back off, as against Linux, one per
//! timeout (no loss probe goes into a shut window); and when the reader reads again, the rest
//! arrives.

use std::task::Poll;

use smoltcp::time::Duration;

use crate::tests_sleep::{connected, write_unread};

#[test]
fn a_shut_window_takes_no_probe_byte_and_the_probes_back_off()
-> Result<(), Box<dyn std::error::Error>> {
    let (mut p, s, c) = connected()?;
    // The client never reads: its window shuts with the server's bytes unsent.
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut written = write_unread(&mut p, s, &data, Duration::from_secs(2))?;
    let info = p.a.stack.tcp_info(s).ok_or("no server connection")?;
    assert_eq!(info.snd_window, 0, "{info:?}");
    let queued =
        p.b.stack
            .tcp_info(c)
            .ok_or("no client connection")?
            .recv_queue;

    // Twenty seconds of probing.
    let sent = |p: &mut crate::Pair| p.a.stack.tcp_info(s).map_or(0, |i| i.stats.segs_out);
    let before = sent(&mut p);
    p.drive_for(Duration::from_secs(20), |_| {})?;
    let probes = sent(&mut p) - before;
    let now_queued =
        p.b.stack
            .tcp_info(c)
            .ok_or("no client connection")?
            .recv_queue;
    eprintln!("{probes} probes in 20 s; client holds {queued} then {now_queued} bytes");
    assert!(probes > 0, "the shut window was never probed");
    // Backing off: one probe per timeout of the persist timer, at doubling intervals (4 in 20
    // s here). A probe every 200 ms, as when each probe's byte was taken, would be a hundred
    // (48 were sent before that fix); a loss probe after each timeout, sending the byte again
    // into the same shut window, made 3 per timeout (13).
    assert!(probes <= 6, "{probes} probes in 20 s");
    assert_eq!(now_queued, queued, "bytes taken past a shut window");

    // The reader reads again: every byte arrives, in order.
    let mut got = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; 64 * 1024];
    let done = p.drive(Duration::from_secs(30), |p| {
        if let Poll::Ready(Ok(n)) = p.a.stack.tcp_write(s, &data[written..], None) {
            written += n;
        }
        while let Poll::Ready(Ok(n)) = p.b.stack.tcp_read(c, &mut buf, None) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got.len() == data.len()
    })?;
    assert!(done, "{} of {} bytes", got.len(), data.len());
    assert!(got == data, "the bytes differ");
    Ok(())
}
