//! A QUIC server's demux as a fuzz target (`corelane_rt::fuzzing::QuicServer`): datagrams from
//! anyone, steered by their connection ID as a core's stack steers them (one naming the other
//! core goes there), the rest as a server endpoint of a core takes them off its UDP socket,
//! handed to the state machine (with the connection IDs a run gives out), every connection
//! they start accepted, a pass after each. Whatever arrives must come back as datagrams to
//! send or nothing, never a panic, and a connection it starts must end. An input is records: the client's port (one byte, added to 40000), milliseconds since
//! the last record (one byte), the datagram's length (two bytes, big-endian), the datagram.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use corelane_rt::fuzzing::QuicServer;

/// A certificate for "localhost", made once per process: the server's config, and a client
/// config that trusts it (for the seeds).
fn configs() -> Option<&'static (quinn_proto::ServerConfig, quinn_proto::ClientConfig)> {
    static CONFIGS: OnceLock<Option<(quinn_proto::ServerConfig, quinn_proto::ClientConfig)>> =
        OnceLock::new();
    CONFIGS
        .get_or_init(|| {
            let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).ok()?;
            let cert = ck.cert.der().clone();
            let key =
                rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
            let server =
                quinn_proto::ServerConfig::with_single_cert(vec![cert.clone()], key).ok()?;
            let mut roots = rustls::RootCertStore::empty();
            roots.add(cert).ok()?;
            let client = quinn_proto::ClientConfig::with_root_certificates(Arc::new(roots)).ok()?;
            Some((server, client))
        })
        .as_ref()
}

pub(crate) fn run(input: &[u8]) {
    let Some((server, _)) = configs() else {
        return;
    };
    let mut s = QuicServer::new(server.clone());
    let mut rest = input;
    while let [port, ms, hi, lo, tail @ ..] = rest {
        let len = (usize::from(*hi) << 8 | usize::from(*lo)).min(tail.len());
        let (d, after) = tail.split_at(len);
        s.datagram(40000 + u16::from(*port), u16::from(*ms) * 4, d);
        rest = after;
    }
    // Long after: every connection's timers run out, and the idle ones end.
    for _ in 0..8 {
        s.datagram(0, 255 * 40, &[]);
    }
    let _ = s.connections();
}

fn record(port: u8, ms: u8, d: &[u8]) -> Vec<u8> {
    let mut v = vec![port, ms, (d.len() >> 8) as u8, d.len() as u8];
    v.extend_from_slice(d);
    v
}

/// A client's first datagram to the server, as quinn-proto's client makes it (`n`: which
/// client, each with its own connection IDs).
fn first_datagram(n: u8) -> Option<Vec<u8>> {
    let (_, client) = configs()?;
    let mut ep = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        Some([n; 32]),
    );
    let now = Instant::now();
    let to = "10.0.0.1:4433".parse().ok()?;
    let (_, mut conn) = ep.connect(now, client.clone(), to, "localhost").ok()?;
    let mut buf = Vec::new();
    let t = conn.poll_transmit(now, 1, &mut buf)?;
    buf.truncate(t.size);
    Some(buf)
}

/// A first datagram alone, two clients' at once, one sent twice, and one followed by a
/// short-header packet for a connection ID nobody gave.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let (Some(a), Some(b)) = (first_datagram(1), first_datagram(2)) else {
        return Vec::new();
    };
    let mut short = vec![0x40];
    short.extend_from_slice(&[0xab; 40]);
    vec![
        record(1, 0, &a),
        [record(1, 0, &a), record(2, 1, &b)].concat(),
        [record(1, 0, &a), record(1, 250, &a)].concat(),
        [record(1, 0, &a), record(1, 5, &short)].concat(),
    ]
}

/// Bits flipped, bytes set, a record cut short or doubled, the other input's tail spliced.
pub(crate) fn mutate(r: &mut impl FnMut(usize) -> usize, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + r(4) {
        match r(6) {
            0 | 1 if !v.is_empty() => {
                let i = r(v.len());
                v[i] ^= 1 << r(8);
            }
            2 if !v.is_empty() => {
                let i = r(v.len());
                v[i] = [0, 0xff, 0x40, 0xc0, 1][r(5)];
            }
            3 if !v.is_empty() => v.truncate(r(v.len())),
            4 if !v.is_empty() => {
                let from = r(v.len());
                let tail = v[from..].to_vec();
                v.extend_from_slice(&tail);
            }
            _ if !other.is_empty() => {
                let from = r(other.len());
                v.truncate(r(v.len() + 1));
                v.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    v.truncate(16 << 10);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_s_first_datagram_starts_a_connection_and_idle_time_ends_it() -> Result<(), String> {
        let (server, _) = configs().ok_or("no certificate")?;
        let first = first_datagram(1).ok_or("no first datagram")?;
        let mut s = QuicServer::new(server.clone());
        s.datagram(40001, 0, &first);
        assert_eq!(s.connections(), 1, "the first datagram was accepted");
        // A second client, and the first one's datagram again (a retransmission).
        s.datagram(40002, 1, &first_datagram(2).ok_or("no second client")?);
        s.datagram(40001, 1, &first);
        assert_eq!(s.connections(), 2, "one connection per client");
        // Nobody answers: the handshakes time out and the connections go.
        for _ in 0..8 {
            s.datagram(0, 10_000, &[]);
        }
        assert_eq!(s.connections(), 0, "no connection is held forever");
        Ok(())
    }

    #[test]
    fn a_short_header_naming_the_other_core_is_steered_away_before_the_state_machine() {
        use corelane_stack::quic_cid::CidSteer;
        let Some((server, _)) = configs() else {
            panic!("no certificate");
        };
        let mut s = QuicServer::new(server.clone());
        // The fuzz server is core 0 of two under key (1, 2).
        let other = CidSteer::new((1, 2), 1, 2).cid([1, 2, 3, 4, 5, 6, 7]);
        let here = CidSteer::new((1, 2), 0, 2).cid([1, 2, 3, 4, 5, 6, 7]);
        let short = |cid: [u8; 8]| [&[0x40][..], &cid, &[0u8; 60]].concat();
        s.datagram(40001, 0, &short(other));
        assert_eq!(s.handed(), 1, "named core 1: handed there");
        s.datagram(40001, 0, &short(here));
        assert_eq!(
            s.handed(),
            1,
            "named this core: kept (and dropped as unknown)"
        );
        assert_eq!(s.connections(), 0);
    }
}
