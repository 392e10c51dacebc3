//! What an idle connection holds: once everything received was read and everything sent was
//! acknowledged, no buffer; a large buffer is kept while a transfer may go on, and given back
//! when it stayed empty. On the same scripted connection as `conformance.rs`.

use super::conformance::{PEER_ISN, Script, seg};
use super::ring::SMALL;
use super::user::{SEND_MIN, SMALL_KEEP, TRIM_AFTER};

#[test]
fn an_exchange_leaves_no_buffer_behind() -> Result<(), &'static str> {
    let (mut s, una) = Script::established(false);
    let mut req = seg(PEER_ISN + 1, una);
    req.len = 64;
    s.input(req);
    assert_eq!(s.c.rcv.capacity(), SMALL, "the request is held");
    let mut buf = [0u8; 64];
    let now = s.now;
    assert_eq!(s.c.read(now, &mut buf).0, 64);
    // An emptied small buffer is kept a little: the next request of a request/response
    // connection comes soon, and reuses it.
    assert_eq!(s.c.rcv.capacity(), SMALL, "read: kept for the next request");
    let at = s.c.trim_at.get().ok_or("no timer for the emptied buffer")?;
    assert_eq!(at - s.now, SMALL_KEEP);
    assert_eq!(s.c.write(&[1u8; 64]), 64);
    assert_eq!(s.c.snd.capacity(), SMALL);
    let out = s.out();
    assert_eq!(out.iter().map(|o| o.len).sum::<usize>(), 64);
    s.input(seg(PEER_ISN + 65, una + 64));
    assert_eq!(s.c.snd.capacity(), SMALL, "acknowledged: kept a little too");
    // A second request in time reuses both buffers.
    let mut req = seg(PEER_ISN + 65, una + 64);
    req.len = 10;
    s.input(req);
    assert_eq!(s.c.read(s.now, &mut buf).0, 10);
    s.advance(SMALL_KEEP);
    s.out();
    assert_eq!(
        (s.c.snd.capacity(), s.c.rcv.capacity()),
        (0, 0),
        "still empty when the timer fired: both given back"
    );
    // The scoreboard's deque from that flight goes with the longer timer: a connection that
    // sends again soon keeps it, an idle one holds no heap at all.
    assert!(s.c.board.holds_heap());
    let at =
        s.c.trim_at
            .get()
            .ok_or("no trim timer for the flight's bookkeeping")?;
    assert_eq!(at - s.now, TRIM_AFTER);
    s.advance(TRIM_AFTER);
    s.out();
    assert!(
        !s.c.board.holds_heap(),
        "the scoreboard's deque is given back"
    );
    assert_eq!((s.c.snd.capacity(), s.c.rcv.capacity()), (0, 0));
    assert!(s.c.trim_at.is_none(), "nothing left to trim later");
    assert!(
        !s.c.stats.holds_rare(),
        "no loss, probe or reset: the rarer counters were never made"
    );
    Ok(())
}

#[test]
fn a_short_timer_never_gives_a_large_buffer_back_early() -> Result<(), &'static str> {
    let (mut s, una) = Script::established(false);
    // A large send buffer empties: the long timer.
    let n = 2 * SMALL + 1000;
    assert_eq!(s.c.write(&vec![2u8; n]), n);
    let cap = s.c.snd.capacity();
    s.out();
    s.input(seg(PEER_ISN + 1, una + n as u32));
    let long = s.c.trim_at.get().ok_or("no long timer")?;
    assert_eq!(long - s.now, TRIM_AFTER);
    // A request read a little later empties a small receive buffer: the short timer comes
    // first, gives back only that one, and the large one keeps its full time.
    s.advance(SMALL_KEEP);
    let mut req = seg(PEER_ISN + 1, una + n as u32);
    req.len = 5;
    s.input(req);
    let mut buf = [0u8; 8];
    assert_eq!(s.c.read(s.now, &mut buf).0, 5);
    let short = s.c.trim_at.get().ok_or("no short timer")?;
    assert_eq!(short - s.now, SMALL_KEEP);
    s.advance(SMALL_KEEP);
    s.out();
    assert_eq!(s.c.rcv.capacity(), 0, "the small buffer is given back");
    assert_eq!(s.c.snd.capacity(), cap, "the large one is kept");
    let again =
        s.c.trim_at
            .get()
            .ok_or("no long timer after the short one")?;
    assert!(again >= long, "{again:?} before {long:?}");
    s.advance(again - s.now);
    s.out();
    assert_eq!(s.c.snd.capacity(), 0, "given back when its own timer fired");
    Ok(())
}

#[test]
fn an_idle_connection_s_state_fits_in_a_kilobyte() -> Result<(), &'static str> {
    // What each connection costs at the least (`StackConfig::max_tcp` of them per core): the
    // scoreboard on the heap only while a flight is on it, the rarer counters made at their
    // first event, each timer's deadline in 8 bytes.
    let size = crate::Stack::conn_size();
    assert!(size <= 1024, "{size} bytes per connection");
    // The scoreboard a flight made is read as before, and its end is still a flight's end:
    // the next write makes a new one.
    let (mut s, una) = Script::established(false);
    assert!(!s.c.board.holds_heap() && s.c.board.is_empty());
    assert_eq!(s.c.write(&[1u8; 100]), 100);
    s.out();
    assert_eq!(s.c.board.in_flight(), 100);
    s.input(seg(PEER_ISN + 1, una + 100));
    assert!(s.c.board.is_empty());
    s.advance(SMALL_KEEP);
    s.out();
    s.advance(TRIM_AFTER);
    s.out();
    assert!(!s.c.board.holds_heap());
    assert_eq!(s.c.write(&[2u8; 50]), 50);
    assert_eq!(s.out().iter().map(|o| o.len).sum::<usize>(), 50);
    assert_eq!(s.c.board.in_flight(), 50);
    // A retransmission timeout on it makes the rarer counters and is counted there.
    let rto = s.c.rto_at.get().ok_or("no retransmission timer")?;
    s.advance(rto - s.now);
    assert_eq!(s.out().iter().map(|o| o.len).sum::<usize>(), 50, "resent");
    assert!(s.c.stats.holds_rare());
    let st = s.c.stats.get();
    assert_eq!((st.rto_expiries, st.retrans_segs), (1, 1));
    assert_eq!((st.bytes_out, st.retrans_bytes), (150, 50), "{st:?}");
    Ok(())
}

#[test]
fn a_large_buffer_is_kept_while_it_may_refill_and_given_back_when_it_stays_empty()
-> Result<(), &'static str> {
    let (mut s, una) = Script::established(false);
    let n = 2 * SMALL + 1000;
    assert_eq!(s.c.write(&vec![2u8; n]), n);
    let cap = s.c.snd.capacity();
    assert!(cap > SMALL);
    let sent: usize = s.out().iter().map(|o| o.len).sum();
    assert_eq!(sent, n, "the initial window takes it all");
    s.input(seg(PEER_ISN + 1, una + n as u32));
    assert_eq!(s.c.snd.capacity(), cap, "kept: the writer may go on");
    let at =
        s.c.trim_at
            .get()
            .ok_or("no trim timer after the ring emptied")?;
    assert_eq!(at - s.now, TRIM_AFTER);
    // Written again before the timer: the buffer is in use when it fires and stays.
    assert_eq!(s.c.write(&[3u8; 10]), 10);
    s.advance(TRIM_AFTER);
    s.out();
    assert_eq!(s.c.snd.capacity(), cap);
    assert!(s.c.trim_at.is_none());
    // Acknowledged and quiet: given back when the new timer fires.
    s.input(seg(PEER_ISN + 1, una + n as u32 + 10));
    assert_eq!(s.c.snd.capacity(), cap);
    s.advance(TRIM_AFTER);
    s.out();
    assert_eq!(s.c.snd.capacity(), 0);
    Ok(())
}

#[test]
fn the_send_buffer_follows_the_window_between_a_floor_and_the_stack_s_maximum() {
    let (mut s, una) = Script::established(false);
    let max = s.c.sizes.tx_max;
    let big = vec![5u8; 2 * max];
    // A new connection's window (10 segments) is far below the floor: 64 KiB.
    assert_eq!(s.c.write(&big), SEND_MIN);
    assert_eq!(s.c.write(&big), 0, "full");
    // The window grows (a long path in slow start): two windows.
    s.c.cc.cwnd = 100_000;
    s.out();
    s.input(seg(PEER_ISN + 1, una + 10_000));
    assert!(s.c.cc.cwnd >= 100_000);
    let room = s.c.send_room();
    assert_eq!(room, 2 * s.c.cc.cwnd - s.c.snd.len());
    assert_eq!(s.c.write(&big), room);
    // Never past the stack's maximum, however wide the window.
    s.c.cc.cwnd = max;
    s.c.write(&big);
    assert_eq!(s.c.snd.len(), max);
}
