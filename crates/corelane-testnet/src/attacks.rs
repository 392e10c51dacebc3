//! Attack scripts against a TCP echo server behind the server end of a [`VethPair`]: an
//! off-path attacker on the client's link who knows the four-tuple of a connection but not (for
//! the blind attacks) its sequence numbers sends forged resets, SYNs, data and ICMP errors, and
//! probes the IP IDs; each script then checks what the server answered and whether the
//! connection still works. The same scripts run against the kernel and against corelane, so
//! their results sit side by side (`corelane-bench`'s `attacks`), and a test asserts corelane's.
//!
//! The client's connections do not use timestamps (the attacker then needs only the sequence
//! numbers, the harder case for the server), and every forged segment but the controls is one
//! RFC 5961 or RFC 9293 says to drop.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream};
use std::time::Duration;

use crate::craft::{self, ACK, Ip4, PSH, RST, RawLink, SYN, Seen, Tcp};
use crate::{Error, Result, VethPair};

/// What one attack did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The attack's name.
    pub attack: &'static str,
    /// What a server that follows the RFCs does.
    pub expected: &'static str,
    /// What the server sent back right after it ("nothing", "1 ACK", "1 RST", ...).
    pub answer: String,
    /// The connection still echoes afterwards (None where no connection is involved).
    pub survived: Option<bool>,
    /// The forged data reached the application (None where no data was forged).
    pub injected: Option<bool>,
    /// Anything else the attack measured.
    pub detail: String,
    /// The ICMP scripts: the server's largest segment afterwards.
    pub largest_segment: Option<usize>,
    /// The IP ID probe: the replies to two addresses came from one counter.
    pub shared_ids: Option<bool>,
}

/// The attacker's view of one connection to the target.
struct Conn {
    stream: TcpStream,
    port: u16,
    /// The server's next sequence number, and the one it expects from the client.
    server_next: u32,
    client_next: u32,
}

struct Bench<'a> {
    net: &'a VethPair,
    target: SocketAddrV4,
    client: Ipv4Addr,
    link: RawLink,
    server_mac: [u8; 6],
    client_mac: [u8; 6],
}

const EVIL: &[u8] = b"EVIL!";
const PING: &[u8] = b"ping!";

fn io(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        what: what.to_string(),
        source,
    }
}

impl Bench<'_> {
    /// Connects, echoes once, and reads both sides' next sequence numbers off the link.
    fn connect(&self) -> Result<Conn> {
        self.link.listen(Duration::ZERO).map_err(io("drain"))?;
        let addr = SocketAddr::V4(self.target);
        let mut stream = self
            .net
            .client_ns()
            .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3)))?
            .map_err(io("connect"))?;
        stream.set_nodelay(true).map_err(io("nodelay"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .map_err(io("timeout"))?;
        let port = stream.local_addr().map_err(io("local_addr"))?.port();
        stream.write_all(b"hello").map_err(io("write"))?;
        let mut b = [0u8; 5];
        stream.read_exact(&mut b).map_err(io("read"))?;
        let last = self
            .server_segments(port, Duration::from_millis(50))?
            .into_iter()
            .last()
            .ok_or_else(|| Error::Io {
                what: "no segment from the server seen on the link".into(),
                source: std::io::ErrorKind::NotFound.into(),
            })?;
        Ok(Conn {
            stream,
            port,
            server_next: last.end(),
            client_next: last.ack,
        })
    }

    /// The server's segments to client port `port` arriving within `time`.
    fn server_segments(&self, port: u16, time: Duration) -> Result<Vec<Seen>> {
        Ok(self
            .link
            .listen(time)
            .map_err(io("listen"))?
            .iter()
            .filter_map(|f| craft::parse_tcp4(f))
            .filter(|s| s.src == *self.target.ip() && s.dport == port)
            .collect())
    }

    fn ip(&self) -> Ip4 {
        Ip4::new(self.client, *self.target.ip())
    }

    /// A segment on `c`'s four-tuple with `flags`, `seq`, `ack` and `payload`.
    fn forge(&self, c: &Conn, flags: u8, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
        let t = Tcp {
            sport: c.port,
            dport: self.target.port(),
            seq,
            ack,
            flags,
            window: 502,
            payload: payload.to_vec(),
        };
        craft::tcp4(self.server_mac, self.client_mac, &self.ip(), &t)
    }

    /// Sends `frame` and describes what the server sent to `port` in the next 200 ms.
    fn answer(&self, frame: &[u8], port: u16) -> Result<String> {
        self.link.send(frame).map_err(io("send"))?;
        Ok(describe(
            &self.server_segments(port, Duration::from_millis(200))?,
        ))
    }

    /// Whether `c` still echoes, and whether forged data came back with the echo.
    fn still_echoes(&self, c: &mut Conn) -> (bool, bool) {
        if c.stream.write_all(PING).is_err() {
            return (false, false);
        }
        let mut got = Vec::new();
        let mut b = [0u8; 64];
        while !got.ends_with(PING) {
            match c.stream.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
        let injected = got.windows(EVIL.len()).any(|w| w == EVIL);
        (got.ends_with(PING), injected)
    }

    /// One attack on a fresh connection: `frame` built from it, then the echo checked.
    fn on_connection(
        &self,
        attack: &'static str,
        expected: &'static str,
        frame: impl Fn(&Self, &Conn) -> Vec<u8>,
        data: bool,
    ) -> Result<Outcome> {
        let mut c = self.connect()?;
        let answer = self.answer(&frame(self, &c), c.port)?;
        let (survived, injected) = self.still_echoes(&mut c);
        Ok(Outcome {
            attack,
            expected,
            answer,
            survived: Some(survived),
            injected: data.then_some(injected),
            detail: String::new(),
            largest_segment: None,
            shared_ids: None,
        })
    }
}

/// "nothing", or the segments' flags counted ("2 ACK, 1 RST").
fn describe(seen: &[Seen]) -> String {
    if seen.is_empty() {
        return "nothing".into();
    }
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for s in seen {
        let k = match (s.flags & RST != 0, s.flags & SYN != 0, s.len > 0) {
            (true, _, _) => "RST",
            (_, true, _) => "SYN",
            (_, _, true) => "data",
            _ => "ACK",
        };
        match kinds.iter_mut().find(|(n, _)| n == k) {
            Some((_, c)) => *c += 1,
            None => kinds.push((k.to_string(), 1)),
        }
    }
    kinds
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs every attack against the echo server at `target`, from `client` (the client end's
/// address); `spare` is a second address the scripts add to the client end for the IP ID probe.
pub fn run_all(
    net: &VethPair,
    target: SocketAddrV4,
    client: Ipv4Addr,
    spare: Ipv4Addr,
) -> Result<Vec<Outcome>> {
    net.client_ns()
        .exec("sysctl", &["-qw", "net.ipv4.tcp_timestamps=0"])?;
    // Segments on the wire as sent, so the largest one seen is a segment, not a batch.
    crate::lossy::offloads_off(net.server_ns(), net.server_if(), false)?;
    let b = Bench {
        net,
        target,
        client,
        link: RawLink::open(net.client_ns(), net.client_if())?,
        server_mac: net.server_ns().mac(net.server_if())?,
        client_mac: net.client_ns().mac(net.client_if())?,
    };
    let far = 0x8000_0000u32;
    let mut out = vec![
        b.on_connection(
            "blind RST, sequence outside the window",
            "dropped",
            |b, c| b.forge(c, RST, c.client_next.wrapping_add(far), 0, &[]),
            false,
        )?,
        b.on_connection(
            "blind RST, in the window but not next",
            "challenge ACK (RFC 5961 3.2)",
            |b, c| b.forge(c, RST, c.client_next.wrapping_add(10_000), 0, &[]),
            false,
        )?,
        b.on_connection(
            "RST at exactly the next sequence (control)",
            "connection reset",
            |b, c| b.forge(c, RST, c.client_next, 0, &[]),
            false,
        )?,
        b.on_connection(
            "blind SYN in the window",
            "challenge ACK (RFC 5961 4.2)",
            |b, c| b.forge(c, SYN, c.client_next.wrapping_add(10_000), 0, &[]),
            false,
        )?,
        b.on_connection(
            "data outside the window",
            "dropped, ACK",
            |b, c| {
                let seq = c.client_next.wrapping_add(far);
                b.forge(c, ACK | PSH, seq, c.server_next, EVIL)
            },
            true,
        )?,
        b.on_connection(
            "data at the next sequence acknowledging unsent data",
            "dropped, ACK (RFC 9293 3.10.7.4)",
            |b, c| {
                let ack = c.server_next.wrapping_add(0x4000_0000);
                b.forge(c, ACK | PSH, c.client_next, ack, EVIL)
            },
            true,
        )?,
        b.on_connection(
            "data at the next sequence with a far too old ACK",
            "dropped, challenge ACK (RFC 5961 5.2)",
            |b, c| {
                let ack = c.server_next.wrapping_sub(0x4000_0000);
                b.forge(c, ACK | PSH, c.client_next, ack, EVIL)
            },
            true,
        )?,
        b.on_connection(
            "data outside the window from a forged source MAC",
            "dropped; replies still to the real MAC",
            |b, c| {
                let mut f = b.forge(
                    c,
                    ACK | PSH,
                    c.client_next.wrapping_add(far),
                    c.server_next,
                    EVIL,
                );
                f[6..12].copy_from_slice(&[2, 0x66, 0x66, 0x66, 0x66, 0x66]);
                f
            },
            true,
        )?,
    ];
    out.push(cookie_ack(&b)?);
    out.push(icmp_too_big(&b, false)?);
    out.push(ip_ids(&b, spare)?);
    // Last: a path MTU it lowers would stay for the connections after it.
    out.push(icmp_too_big(&b, true)?);
    Ok(out)
}

/// An ACK to the listening port from a four-tuple with no connection and no SYN flood: a SYN
/// cookie guess.
fn cookie_ack(b: &Bench<'_>) -> Result<Outcome> {
    b.link.listen(Duration::ZERO).map_err(io("drain"))?;
    let port = 61_000;
    let t = Tcp {
        sport: port,
        dport: b.target.port(),
        seq: 0x1234_5678,
        ack: 0x0bad_cafe,
        flags: ACK,
        window: 502,
        payload: Vec::new(),
    };
    let answer = b.answer(&craft::tcp4(b.server_mac, b.client_mac, &b.ip(), &t), port)?;
    Ok(Outcome {
        attack: "ACK to the listener with a guessed SYN cookie, no flood",
        expected: "RST (RFC 9293 3.10.7.2), no connection",
        answer,
        survived: None,
        injected: None,
        detail: String::new(),
        largest_segment: None,
        shared_ids: None,
    })
}

/// ICMP "fragmentation needed" (MTU 576) quoting one of the server's segments: with a sequence
/// number outside what is in flight (`in_flight` false), or the next one (a control: RFC 5927
/// lets a stack act on it). Then 4000 bytes are echoed and the server's largest segment seen.
fn icmp_too_big(b: &Bench<'_>, in_flight: bool) -> Result<Outcome> {
    let mut c = b.connect()?;
    let seq = if in_flight {
        c.server_next
    } else {
        c.server_next.wrapping_add(0x8000_0000)
    };
    let quoted = Tcp {
        sport: b.target.port(),
        dport: c.port,
        seq,
        ..Tcp::default()
    };
    let quote = craft::quote_tcp4(&Ip4::new(*b.target.ip(), b.client), &quoted, 1448);
    // From a router on the path: here, the client's address will do.
    let f = craft::icmp4(
        b.server_mac,
        b.client_mac,
        &b.ip(),
        3,
        4,
        [0, 0, 2, 64],
        &quote,
    );
    b.link.send(&f).map_err(io("send"))?;
    std::thread::sleep(Duration::from_millis(100));
    b.link.listen(Duration::ZERO).map_err(io("drain"))?;
    let data = vec![b'x'; 4000];
    let mut back = vec![0u8; data.len()];
    let echoed = c.stream.write_all(&data).is_ok() && c.stream.read_exact(&mut back).is_ok();
    let largest = b
        .server_segments(c.port, Duration::from_millis(100))?
        .iter()
        .map(|s| s.len)
        .max()
        .unwrap_or(0);
    Ok(Outcome {
        attack: if in_flight {
            "ICMP too big (MTU 576) quoting the next sequence (control)"
        } else {
            "ICMP too big (MTU 576) quoting a sequence not in flight"
        },
        expected: if in_flight {
            "may lower the path MTU (Linux takes SND.UNA..=SND.NXT; nothing is in flight)"
        } else {
            "ignored (RFC 5927 4.1)"
        },
        answer: "-".into(),
        survived: Some(echoed),
        injected: None,
        detail: format!("largest segment after it: {largest} bytes"),
        largest_segment: Some(largest),
        shared_ids: None,
    })
}

/// Fragmented echo requests (2000 bytes) from two of the client's addresses in turn; the IDs
/// of the replies. One counter shared by all destinations shows in them as steps of one from
/// address to address, and lets an observer count what the server sends to others.
fn ip_ids(b: &Bench<'_>, spare: Ipv4Addr) -> Result<Outcome> {
    let _ = b.net.client_ns().ip(&[
        "addr",
        "add",
        &format!("{spare}/32"),
        "dev",
        b.net.client_if(),
    ]);
    let _ = b.net.client_ns().ip(&[
        "route",
        "add",
        &format!("{}/32", b.target.ip()),
        "dev",
        b.net.client_if(),
        "src",
        &b.client.to_string(),
    ]);
    b.link.listen(Duration::ZERO).map_err(io("drain"))?;
    let mut ids: Vec<(Ipv4Addr, u16)> = Vec::new();
    for i in 0..8u16 {
        let from = if i % 2 == 0 { b.client } else { spare };
        let ip = Ip4 {
            id: 0x4000 + i,
            ..Ip4::new(from, *b.target.ip())
        };
        for f in craft::echo4_fragments(b.server_mac, b.client_mac, &ip, 0x77, i, 2000, 1500) {
            b.link.send(&f).map_err(io("send"))?;
        }
        // The first fragment of the reply carries its ID.
        let got = b
            .link
            .listen(Duration::from_millis(150))
            .map_err(io("listen"))?;
        if let Some((_, dst, id, _)) = got
            .iter()
            .filter_map(|f| craft::ipv4_id(f))
            .find(|(src, dst, _, proto)| src == b.target.ip() && *dst == from && *proto == 1)
        {
            ids.push((dst, id));
        }
    }
    let steps: Vec<u16> = ids
        .windows(2)
        .map(|w| w[1].1.wrapping_sub(w[0].1))
        .collect();
    let shared = ids.len() == 8 && steps.iter().all(|&s| s == 1);
    let text = |a: Ipv4Addr| {
        ids.iter()
            .filter(|(d, _)| *d == a)
            .map(|(_, id)| format!("{id:#06x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    Ok(Outcome {
        attack: "fragmented echo requests from two addresses in turn: the replies' IP IDs",
        expected: "no counter shared by all destinations (RFC 7739)",
        answer: format!("{} of 8 replies", ids.len()),
        survived: None,
        injected: None,
        detail: format!(
            "to {}: {}; to {spare}: {}; one shared counter: {}",
            b.client,
            text(b.client),
            text(spare),
            if shared { "yes" } else { "no" }
        ),
        largest_segment: None,
        shared_ids: Some(shared),
    })
}

/// An unsolicited neighbour advertisement with Override, claiming the client's IPv6 address for
/// another MAC, sent to the server with hop limit 64 (off-link, so to be ignored: RFC 4861
/// section 7.1.2) and, as a control, with 255 (on-link: a stack may move the neighbour, and the
/// server's replies then go to a MAC nobody has). Each on a fresh IPv6 connection to `target`.
pub fn neighbour_advert(
    net: &VethPair,
    target: SocketAddrV6,
    client: Ipv6Addr,
) -> Result<Vec<Outcome>> {
    let server_mac = net.server_ns().mac(net.server_if())?;
    let client_mac = net.client_ns().mac(net.client_if())?;
    let link = RawLink::open(net.client_ns(), net.client_if())?;
    let mut out = Vec::new();
    for hops in [64u8, 255] {
        let addr = SocketAddr::V6(target);
        let mut stream = net
            .client_ns()
            .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3)))?
            .map_err(io("connect"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .map_err(io("timeout"))?;
        let mut b = [0u8; 5];
        stream.write_all(b"hello").map_err(io("write"))?;
        stream.read_exact(&mut b).map_err(io("read"))?;
        let f = craft::na6(
            server_mac,
            client_mac,
            client,
            *target.ip(),
            hops,
            &craft::Advert {
                target: client,
                lladdr: [2, 0x66, 0x66, 0x66, 0x66, 0x66],
                flags: 0x2000_0000,
            },
        );
        link.send(&f).map_err(io("send"))?;
        std::thread::sleep(Duration::from_millis(100));
        let survived =
            stream.write_all(PING).is_ok() && stream.read_exact(&mut b).is_ok() && b == PING;
        out.push(Outcome {
            attack: if hops == 64 {
                "IPv6: unsolicited NA with Override moving the client to another MAC, hop limit 64"
            } else {
                "IPv6: the same NA with hop limit 255 (control)"
            },
            expected: if hops == 64 {
                "ignored (RFC 4861 7.1.2)"
            } else {
                "may move the neighbour (RFC 4861 7.2.5)"
            },
            answer: "-".into(),
            survived: Some(survived),
            injected: None,
            detail: String::new(),
            largest_segment: None,
            shared_ids: None,
        });
    }
    Ok(out)
}
