//! What a hostile peer can make one core hold: out-of-order data parked at the far edge of
//! many connections' windows stays under the memory cap (the segments past it are dropped and
//! counted), everything is given back when those connections go, and a connection opened
//! afterwards transfers in full; past `max_tcp` connections a SYN is dropped and `connect`
//! fails, both counted.

use std::collections::VecDeque;
use std::task::Poll;

use smoltcp::time::Duration;

use crate::{FlowId, Pair, StackConfig, StackError};

type Res = Result<(), Box<dyn std::error::Error>>;

const CAP: usize = 256 * 1024;
/// How far past the next expected byte the parked segment goes (inside the 64 KiB window a
/// new connection promises).
const PARK: u32 = 60_000;

fn cfg() -> StackConfig {
    StackConfig {
        seed: Some(0xa77ac),
        ..StackConfig::default()
    }
}

/// The 16-bit ones' complement sum of `data` (big-endian words), added to `acc`.
fn sum16(acc: u32, data: &[u8]) -> u32 {
    let mut acc = acc;
    for c in data.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    acc
}

/// An IPv4 TCP data frame with `payload` bytes and its sequence number moved by `by`, with a
/// correct checksum again; None for anything else.
fn moved(f: &[u8], payload: usize, by: u32) -> Option<Vec<u8>> {
    if f.len() < 54 || u16::from_be_bytes([f[12], f[13]]) != 0x0800 || f[23] != 6 {
        return None;
    }
    let ihl = usize::from(f[14] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let t = 14 + ihl;
    let doff = usize::from(*f.get(t + 12)? >> 4) * 4;
    if total.checked_sub(ihl + doff)? != payload {
        return None;
    }
    let mut g = f.to_vec();
    let seq = u32::from_be_bytes(g[t + 4..t + 8].try_into().ok()?).wrapping_add(by);
    g[t + 4..t + 8].copy_from_slice(&seq.to_be_bytes());
    g[t + 16..t + 18].copy_from_slice(&[0, 0]);
    let tcp_len = total - ihl;
    let mut acc = sum16(0, &g[26..34]);
    acc += 6 + tcp_len as u32;
    acc = sum16(acc, &g[t..t + tcp_len]);
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    g[t + 16..t + 18].copy_from_slice(&(!(acc as u16)).to_be_bytes());
    Some(g)
}

/// `n` connections from b to a's port 7, accepted (and never read) by a.
fn open(p: &mut Pair, n: usize) -> Result<(Vec<FlowId>, Vec<FlowId>), Box<dyn std::error::Error>> {
    p.a.stack.listen_tcp(7, Some(2 * n))?;
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?.0);
    }
    let mut servers = Vec::new();
    p.drive(Duration::from_secs(5), |p| {
        while let Some(h) = p.a.stack.accept(7) {
            servers.push(h);
        }
        servers.len() == n
    })?;
    if servers.len() != n {
        return Err(format!("accepted {} of {n}", servers.len()).into());
    }
    Ok((clients, servers))
}

/// A pair, the clients' connections and the server's.
type Opened = (Pair, Vec<FlowId>, Vec<FlowId>);

/// A server capped at `CAP` with `n` connections from b, accepted and never read.
fn capped(n: usize) -> Result<Opened, Box<dyn std::error::Error>> {
    let server = StackConfig {
        tcp_mem_limit: Some(CAP),
        ..cfg()
    };
    let mut p = Pair::with(corelane_frame::MemLink::default(), server, cfg());
    let (clients, servers) = open(&mut p, n)?;
    Ok((p, clients, servers))
}

/// Each client sends 100 bytes; the wire (this test) keeps them (capturing from now on) and
/// delivers instead a copy moved `by` bytes ahead: a hole the server waits for, with data
/// parked past it. Returns how many were parked.
fn park(p: &mut Pair, clients: &[FlowId], by: u32) -> usize {
    p.b.dev_mut().io_mut().set_capture(true);
    for &c in clients {
        assert!(matches!(
            p.b.stack.tcp_write(c, &[7u8; 100], None),
            Poll::Ready(Ok(100))
        ));
    }
    let _ = p.drive_for(Duration::from_millis(1), |_| {});
    let mut sent = VecDeque::new();
    p.b.dev_mut().io_mut().take_sent(&mut sent);
    let parked: Vec<Vec<u8>> = sent.iter().filter_map(|f| moved(f, 100, by)).collect();
    for f in &parked {
        assert!(p.b.dev_mut().io_mut().inject(f));
    }
    parked.len()
}

/// Sends `data` on b's connection `c` to the next connection a accepts on port 7, reading as
/// it comes, for at most `time`; returns whether all arrived, and what did.
fn transfer(
    p: &mut Pair,
    c: FlowId,
    data: &[u8],
    time: Duration,
) -> Result<(bool, Vec<u8>), Box<dyn std::error::Error>> {
    let (mut s, mut sent, mut got) = (None, 0, Vec::new());
    let mut buf = vec![0u8; 65536];
    let done = p.drive(time, |p| {
        s = s.or_else(|| p.a.stack.accept(7));
        if sent < data.len()
            && let Poll::Ready(Ok(k)) = p.b.stack.tcp_write(c, &data[sent..], None)
        {
            sent += k;
        }
        if let Some(s) = s {
            while let Poll::Ready(Ok(k @ 1..)) = p.a.stack.tcp_read(s, &mut buf, None) {
                got.extend_from_slice(&buf[..k]);
            }
        }
        got.len() == data.len()
    })?;
    Ok((done, got))
}

#[test]
fn data_parked_out_of_order_on_many_connections_stays_under_the_cap() -> Res {
    let n = 32;
    let (mut p, clients, servers) = capped(n)?;
    // Parked 60,000 bytes ahead.
    assert_eq!(
        park(&mut p, &clients, PARK),
        n,
        "one data segment per connection"
    );
    let mut most = 0;
    p.drive_for(Duration::from_millis(2), |p| {
        most = most.max(p.a.stack.stats().tcp_mem);
    })?;
    let st = p.a.stack.stats();
    assert!(
        most <= CAP as u64,
        "{n} connections' parked data took {most} bytes, over the {CAP}-byte cap"
    );
    let fit = CAP / PARK as usize;
    assert!(
        st.tcp_mem_dropped >= (n - fit) as u64,
        "{} segments dropped for memory, expected at least {}: {st:?}",
        st.tcp_mem_dropped,
        n - fit
    );
    // The connections go: everything is given back.
    for &s in &servers {
        p.a.stack.abort(s);
        p.a.stack.release(s);
    }
    p.b.dev_mut().io_mut().set_capture(false);
    p.drive_for(Duration::from_millis(5), |_| {})?;
    assert_eq!(p.a.stack.stats().tcp_mem, 0, "memory given back");
    // A connection opened afterwards transfers in full.
    let (c, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    let (done, got) = transfer(&mut p, c, &data, Duration::from_secs(10))?;
    assert!(done, "received {} of {}", got.len(), data.len());
    assert!(got == data, "the bytes arrived changed");
    Ok(())
}

/// Parked data does not starve the others: with the cap full of data held out of order by
/// connections whose holes never fill, a new connection's in-order data is refused once, the
/// connections that have held out-of-order data longest lose it (Linux's
/// `tcp_prune_ofo_queue`; RFC 2018 lets a receiver renege on what it SACKed), and the new
/// connection then transfers in full while the parked ones stay open.
#[test]
fn parked_data_is_pruned_when_in_order_data_needs_the_memory() -> Res {
    let n = 32;
    let (mut p, clients, servers) = capped(n)?;
    // 8,000 bytes ahead: each parked ring takes 8 KiB, and 32 of them fill the cap to the
    // byte, so the next connection cannot have even its first 4 KiB.
    assert_eq!(park(&mut p, &clients, 8_000), n);
    p.drive_for(Duration::from_millis(2), |_| {})?;
    // The clients' own segments stay captured (dropped): the holes never fill.
    let before = p.a.stack.stats();
    assert!(
        before.tcp_mem as usize > CAP - 4096,
        "the cap is full: {before:?}"
    );
    let (c, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    p.b.dev_mut().io_mut().set_capture(false);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 11) as u8).collect();
    let (done, got) = transfer(&mut p, c, &data, Duration::from_secs(30))?;
    let st = p.a.stack.stats();
    assert!(
        done,
        "received {} of {} beside the parked data: {st:?}",
        got.len(),
        data.len()
    );
    assert!(got == data, "the bytes arrived changed");
    assert!(st.tcp_ooo_pruned > 0, "{st:?}");
    assert!(st.tcp_mem as usize <= CAP, "{st:?}");
    // The parked connections are still there.
    for &h in &servers {
        assert!(
            p.a.stack.tcp_state(h).is_some(),
            "a parked connection was closed"
        );
    }
    Ok(())
}

#[test]
fn past_the_connection_cap_syns_are_dropped_and_connect_fails() -> Res {
    let server = StackConfig {
        max_tcp: 8,
        ..cfg()
    };
    let mut p = Pair::with(corelane_frame::MemLink::default(), server, cfg());
    let (_clients, servers) = open(&mut p, 8)?;
    // Four more: their SYNs (and the retries) are dropped.
    let mut extra = Vec::new();
    for _ in 0..4 {
        extra.push(p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?.0);
    }
    p.drive_for(Duration::from_secs(2), |p| {
        while p.a.stack.accept(7).is_some() {}
    })?;
    let st = p.a.stack.stats();
    assert!(
        st.tcp_conn_limited >= 4,
        "{} SYNs refused: {st:?}",
        st.tcp_conn_limited
    );
    assert_eq!(p.a.stack.flow_count(), 8, "the eight connections only");
    for &c in &extra {
        assert_ne!(
            p.b.stack.tcp_state(c),
            Some(crate::TcpState::Established),
            "a connection past the cap was opened"
        );
    }
    // The server opening one more itself: refused with a clear error.
    match p.a.stack.connect_tcp("10.9.0.2:9".parse()?) {
        Err(StackError::TooManyConnections { max: 8, .. }) => {}
        other => return Err(format!("connect past the cap: {other:?}").into()),
    }
    // One goes (reset and released): a retried SYN finds room.
    p.a.stack.abort(servers[0]);
    p.a.stack.release(servers[0]);
    let mut opened = 0;
    p.drive(Duration::from_secs(10), |p| {
        while p.a.stack.accept(7).is_some() {
            opened += 1;
        }
        opened == 1
    })?;
    assert_eq!(
        opened, 1,
        "a SYN retried after room was made opened a connection"
    );
    Ok(())
}
