//! QUIC on a corelane core, end to end through the runtime's UDP sockets, its stack and its
//! driver, in the lab (one core over an in-memory queue: no root): a server endpoint and a
//! client endpoint on the same core meet through the device's loopback, with TLS 1.3 over a
//! certificate made for the test.

use std::sync::Arc;

use corelane_rt::quic::{ClientConfig, ConnectionError, Endpoint, ServerConfig, VarInt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A server config and the client config that trusts it, for the name "localhost".
fn configs() -> Result<(ServerConfig, ClientConfig)> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let server = ServerConfig::with_single_cert(vec![cert.clone()], key)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    let client = ClientConfig::with_root_certificates(Arc::new(roots))?;
    Ok((server, client))
}

/// `n` bytes of a pattern that differs at every offset of a stream.
fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

#[test]
fn lab_a_quic_client_and_server_echo_streams_and_see_the_close() -> Result {
    let (server_config, client_config) = configs()?;
    let out: Result<(Vec<bool>, String)> = corelane::lab::run(async move {
        let server = Endpoint::server(server_config, "127.0.0.1:4433")?;
        let addr = server.local_addr()?;
        // The server: every bidirectional stream echoed; at the end, why the connection
        // ended as the server saw it.
        let served = tokio::task::spawn_local(async move {
            let Some(incoming) = server.accept().await else {
                return "no connection".to_string();
            };
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => return format!("handshake: {e}"),
            };
            // Datagrams: each one sent back doubled.
            let dgrams = conn.clone();
            tokio::task::spawn_local(async move {
                while let Ok(d) = dgrams.read_datagram().await {
                    let _ = dgrams.send_datagram([&d[..], &d[..]].concat().into());
                }
            });
            let mut echoes = Vec::new();
            let why = loop {
                match conn.accept_bi().await {
                    Ok((mut send, mut recv)) => echoes.push(tokio::task::spawn_local(async move {
                        let _ = tokio::io::copy(&mut recv, &mut send).await;
                        let _ = send.shutdown().await;
                    })),
                    Err(e) => break e,
                }
            };
            for e in echoes {
                let _ = e.await;
            }
            match why {
                ConnectionError::ApplicationClosed(c) => format!("closed {}", c.error_code),
                other => format!("lost: {other}"),
            }
        });
        let client = Endpoint::client("127.0.0.1:0")?;
        client.set_default_client_config(client_config);
        let conn = client.connect(addr, "localhost")?.await?;
        // Three streams at once, of different lengths (one larger than the stream's and the
        // connection's first windows), each echoed whole.
        let mut streams = Vec::new();
        for (seed, len) in [(1u8, 100usize), (2, 300_000), (3, 2_000_000)] {
            let (mut send, mut recv) = conn.open_bi().await?;
            streams.push(tokio::task::spawn_local(async move {
                let data = pattern(seed, len);
                let sent = data.clone();
                let writer = tokio::task::spawn_local(async move {
                    send.write_all(&sent).await?;
                    send.shutdown().await
                });
                let mut back = Vec::new();
                let read = recv.read_to_end(&mut back).await;
                let wrote = writer.await;
                read.is_ok() && matches!(wrote, Ok(Ok(()))) && back == data
            }));
        }
        let mut same = Vec::new();
        for s in streams {
            same.push(s.await.unwrap_or(false));
        }
        // A datagram and its answer (unreliable: the lab's link loses nothing).
        let max = conn.max_datagram_size().unwrap_or(0);
        conn.send_datagram(bytes::Bytes::from_static(b"ping"))?;
        let back = conn.read_datagram().await?;
        same.push(max > 1000 && &back[..] == b"pingping");
        conn.close(VarInt::from_u32(7), b"done");
        let seen = served.await.unwrap_or_else(|e| format!("server task: {e}"));
        client.wait_idle().await;
        Ok((same, seen))
    })?;
    let (same, seen) = out?;
    assert_eq!(
        same,
        vec![true, true, true, true],
        "every stream came back whole, and the datagram doubled"
    );
    assert_eq!(
        seen, "closed 7",
        "the server saw the client's close with its code"
    );
    Ok(())
}

#[test]
fn lab_sixteen_quic_connections_at_once_each_with_a_hundred_requests() -> Result {
    let (server_config, client_config) = configs()?;
    let out: Result<Vec<usize>> = corelane::lab::run(async move {
        let server = Endpoint::server(server_config, "127.0.0.1:4434")?;
        let addr = server.local_addr()?;
        // The server: on every connection, every stream answered with its request reversed.
        tokio::task::spawn_local(async move {
            while let Some(incoming) = server.accept().await {
                tokio::task::spawn_local(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        tokio::task::spawn_local(async move {
                            let mut req = Vec::new();
                            if recv.read_to_end(&mut req).await.is_ok() {
                                req.reverse();
                                let _ = send.write_all(&req).await;
                            }
                            let _ = send.shutdown().await;
                        });
                    }
                });
            }
        });
        let client = Endpoint::client("127.0.0.1:0")?;
        client.set_default_client_config(client_config);
        let mut conns = Vec::new();
        for c in 0..16u32 {
            let conn = client.connect(addr, "localhost")?;
            conns.push(tokio::task::spawn_local(async move {
                let Ok(conn) = conn.await else { return 0 };
                let mut good = 0;
                // A hundred requests, ten at a time.
                for batch in 0..10u32 {
                    let mut reqs = Vec::new();
                    for r in 0..10u32 {
                        let conn = conn.clone();
                        reqs.push(tokio::task::spawn_local(async move {
                            let msg = format!("conn {c} request {}", batch * 10 + r).into_bytes();
                            let Ok((mut send, mut recv)) = conn.open_bi().await else {
                                return false;
                            };
                            if send.write_all(&msg).await.is_err() || send.shutdown().await.is_err()
                            {
                                return false;
                            }
                            let mut back = Vec::new();
                            let ok = recv.read_to_end(&mut back).await.is_ok();
                            back.reverse();
                            ok && back == msg
                        }));
                    }
                    for r in reqs {
                        good += usize::from(r.await.unwrap_or(false));
                    }
                }
                conn.close(VarInt::from_u32(0), b"");
                good
            }));
        }
        let mut answered = Vec::new();
        for c in conns {
            answered.push(c.await.unwrap_or(0));
        }
        client.wait_idle().await;
        Ok(answered)
    })?;
    assert_eq!(
        out?,
        vec![100; 16],
        "every request of every connection answered"
    );
    Ok(())
}

#[test]
fn lab_a_quic_server_sends_at_most_three_times_what_an_unvalidated_address_sent() -> Result {
    let (server_config, client_config) = configs()?;
    let out: Result<(usize, usize)> = corelane::lab::run(async move {
        let server = Endpoint::server(server_config, "127.0.0.1:4435")?;
        let addr = server.local_addr()?;
        tokio::task::spawn_local(async move {
            // Accepted, as a server does: its handshake answers, and waits for an answer that
            // never comes.
            while let Some(incoming) = server.accept().await {
                tokio::task::spawn_local(async move {
                    let _ = incoming.await;
                });
            }
        });
        // A client's first datagram, made by a state machine of its own, sent once from a
        // plain UDP socket that answers nothing (a spoofed source would look the same).
        let mut proto = quinn_proto::Endpoint::new(
            Arc::new(quinn_proto::EndpointConfig::default()),
            None,
            false,
            None,
        );
        let now = std::time::Instant::now();
        let (_, mut conn) = proto.connect(now, client_config, addr, "localhost")?;
        let mut first = Vec::new();
        let t = conn
            .poll_transmit(now, 1, &mut first)
            .ok_or("the client made no first datagram")?;
        first.truncate(t.size);
        let sock = corelane::net::UdpSocket::bind("127.0.0.1:0").await?;
        sock.send_to(&first, addr).await?;
        // Everything the server sends back over three seconds (its retransmissions too).
        let mut got = 0;
        let mut buf = vec![0u8; 65536];
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        while let Ok(Ok((n, _))) = tokio::time::timeout_at(until, sock.recv_from(&mut buf)).await {
            got += n;
        }
        Ok((first.len(), got))
    })?;
    let (sent, got) = out?;
    assert!(
        sent >= 1200,
        "a client's first datagram is padded to 1200 bytes: {sent}"
    );
    assert!(got > 0, "the server answered the first datagram");
    assert!(
        got <= 3 * sent,
        "{got} bytes sent to an address that sent {sent} and never proved it is there"
    );
    Ok(())
}

#[test]
fn lab_a_server_that_retries_accepts_the_client_once_it_proves_its_address() -> Result {
    let (server_config, client_config) = configs()?;
    let out: Result<(Vec<bool>, bool)> = corelane::lab::run(async move {
        let server = Endpoint::server(server_config, "127.0.0.1:4436")?;
        let addr = server.local_addr()?;
        // Every first attempt retried: what the server saw of each, validated or not.
        let seen = tokio::task::spawn_local(async move {
            let mut seen = Vec::new();
            while let Some(incoming) = server.accept().await {
                let validated = incoming.remote_address_validated();
                seen.push(validated);
                if !validated {
                    if let Err(i) = incoming.retry() {
                        i.refuse();
                    }
                    continue;
                }
                let Ok(conn) = incoming.await else { break };
                if let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let _ = tokio::io::copy(&mut recv, &mut send).await;
                    let _ = send.shutdown().await;
                }
                let _ = conn.closed().await;
                break;
            }
            seen
        });
        let client = Endpoint::client("127.0.0.1:0")?;
        client.set_default_client_config(client_config);
        let conn = client.connect(addr, "localhost")?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(b"after a retry").await?;
        send.shutdown().await?;
        let mut back = Vec::new();
        recv.read_to_end(&mut back).await?;
        conn.close(VarInt::from_u32(0), b"");
        let seen = seen.await.unwrap_or_default();
        client.wait_idle().await;
        Ok((seen, back == b"after a retry"))
    })?;
    let (seen, echoed) = out?;
    assert_eq!(
        seen,
        vec![false, true],
        "the first attempt came unvalidated and was retried, the second with its token"
    );
    assert!(echoed, "the retried connection carried its stream");
    Ok(())
}

#[test]
fn lab_a_dropped_send_stream_is_finished_and_a_dropped_receive_stream_stops_its_sender() -> Result {
    let (server_config, client_config) = configs()?;
    let out: Result<(Vec<u8>, bool)> = corelane::lab::run(async move {
        let server = Endpoint::server(server_config, "127.0.0.1:4437")?;
        let addr = server.local_addr()?;
        let served = tokio::task::spawn_local(async move {
            let conn = server.accept().await?.await.ok()?;
            // The first stream: read to its end, which comes though the client never
            // finished it, only dropped it.
            let (_, mut recv) = conn.accept_bi().await.ok()?;
            let mut got = Vec::new();
            recv.read_to_end(&mut got).await.ok()?;
            // The second: the client drops its receiving half; writing on here comes to an
            // error once the client's STOP_SENDING arrives.
            let (mut send, _) = conn.accept_bi().await.ok()?;
            let chunk = vec![0u8; 64 << 10];
            let mut stopped = false;
            for _ in 0..1000 {
                if let Err(e) = send.write_all(&chunk).await {
                    // Stopped by the peer (not the connection's end, which comes later).
                    stopped = e == corelane_rt::quic::WriteError::Stopped(VarInt::from_u32(0));
                    break;
                }
            }
            let _ = conn.closed().await;
            Some((got, stopped))
        });
        let client = Endpoint::client("127.0.0.1:0")?;
        client.set_default_client_config(client_config);
        let conn = client.connect(addr, "localhost")?.await?;
        {
            let (mut send, _recv) = conn.open_bi().await?;
            send.write_all(b"dropped, not finished").await?;
        }
        {
            let (mut send, recv) = conn.open_bi().await?;
            send.write_all(b"x").await?;
            drop(recv);
            // Kept open (and this core free to run the server) while the server finds out.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        conn.close(VarInt::from_u32(0), b"");
        let got = served.await.ok().flatten();
        client.wait_idle().await;
        got.ok_or_else(|| "the server saw no stream".into())
    })?;
    let (got, stopped) = out?;
    assert_eq!(
        got, b"dropped, not finished",
        "a dropped send stream ends where it was"
    );
    assert!(
        stopped,
        "a dropped receive stream stopped its peer's writes"
    );
    Ok(())
}
