//! The grant protocol's requests: each written and read back whole, and what is not one
//! refused with its reason.

use super::*;

fn every_kind() -> Vec<Request> {
    let peer: SocketAddr = "[fd00::2]:40000".parse().expect("an address");
    vec![
        Request::Addr {
            addr: "10.0.0.1".parse().expect("an address"),
            shared: false,
        },
        Request::Addr {
            addr: "fd00::1".parse().expect("an address"),
            shared: true,
        },
        Request::Unaddr("10.0.0.1".parse().expect("an address")),
        Request::Port {
            proto: Proto::Tcp,
            port: 443,
            on: true,
        },
        Request::Port {
            proto: Proto::Udp,
            port: 53,
            on: false,
        },
        Request::Queue {
            queue: 3,
            generation: None,
        },
        Request::Queue {
            queue: 3,
            generation: Some(1),
        },
        Request::Channels(4),
        Request::Neigh("10.0.0.2".parse().expect("an address")),
        Request::Counters,
        Request::Stats(1 << 20),
        Request::Vlan,
        Request::RestartKey,
        Request::Capture(8 << 20),
        Request::UpgradeState,
        Request::Upgrade {
            current: 1,
            split: true,
        },
        Request::Keep {
            peer,
            port: 7,
            generation: 0,
        },
        Request::Forget { peer, port: 7 },
    ]
}

#[test]
fn every_request_reads_back_as_written() {
    for r in every_kind() {
        let text = r.to_text();
        assert_eq!(Request::parse(&text), Ok(r.clone()), "{text}");
        assert_eq!(r.takes_descriptor(), text.starts_with("queue "), "{text}");
    }
}

#[test]
fn what_is_not_a_request_is_refused_with_its_reason() {
    for (text, why) in [
        ("addr 10.0.0.300", "`10.0.0.300` is not an address"),
        ("port sctp 7", "`sctp` is not tcp or udp"),
        ("port tcp 70000", "`70000` is not a port"),
        ("queue x", "`x` is not a queue"),
        ("channels -1", "`-1` is not a count"),
        ("stats lots", "malformed size in `stats lots`"),
        ("upgrade 1 x", "`x` is not a split (0 or 1)"),
        ("keep 10.0.0.2 7 0", "`10.0.0.2` is not an address and port"),
        (
            "addr 10.0.0.1 whole",
            "unknown request `addr 10.0.0.1 whole`",
        ),
        ("hello", "unknown request `hello`"),
        ("", "unknown request ``"),
    ] {
        assert_eq!(Request::parse(text), Err(why.to_string()), "{text}");
    }
    // Arbitrary text (seeded): never a panic, and what parses is written back the same way
    // it reads.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let words = [
        "addr", "unaddr", "port", "unport", "tcp", "udp", "queue", "7", "0", "65536", "shared",
        "10.0.0.1", "[::1]:9", "keep", "forget", "upgrade", "stats", "capture", "x", "-",
    ];
    for _ in 0..5000 {
        let n = (x % 5) as usize;
        let text: Vec<&str> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                words[(x % words.len() as u64) as usize]
            })
            .collect();
        let text = text.join(" ");
        if let Ok(r) = Request::parse(&text) {
            assert_eq!(Request::parse(&r.to_text()), Ok(r), "{text}");
        }
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    }
}
