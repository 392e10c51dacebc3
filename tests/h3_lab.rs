//! HTTP/3 through corelane's `h3` glue on both ends, in the lab (one core over an in-memory
//! queue: no root): h3's server and h3's client, each over a corelane QUIC endpoint, meet
//! through the device's loopback. This covers the glue's client half (opening streams),
//! which the wire tests' peers do not.

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use corelane_rt::quic::h3::Connection;
use corelane_rt::quic::{ClientConfig, Endpoint, ServerConfig};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// TLS 1.3 configs with ALPN `h3` for "localhost", the client trusting the server.
fn configs() -> Result<(ServerConfig, ClientConfig)> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)?;
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let server = ServerConfig::with_crypto(Arc::new(
        quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls)?,
    ));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let client = ClientConfig::new(Arc::new(
        quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls)?,
    ));
    Ok((server, client))
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

async fn body<S: h3::quic::RecvStream>(
    stream: &mut h3::server::RequestStream<S, Bytes>,
) -> std::result::Result<Vec<u8>, BoxError> {
    let mut got = BytesMut::new();
    while let Some(mut chunk) = stream.recv_data().await? {
        got.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    Ok(got.to_vec())
}

/// The server: each request's body answered reversed, with the path in a header; the
/// number of requests served once the client has gone.
async fn serve(endpoint: Endpoint) -> std::result::Result<usize, BoxError> {
    let conn = endpoint.accept().await.ok_or("no connection")?.await?;
    let mut h3 = h3::server::Connection::<_, Bytes>::new(Connection::new(conn)).await?;
    let mut tasks = Vec::new();
    // However the connection ends (the client closes it), the requests taken are counted.
    while let Ok(Some(resolver)) = h3.accept().await {
        tasks.push(tokio::task::spawn_local(async move {
            let (req, mut stream) = resolver.resolve_request().await?;
            let mut got = body(&mut stream).await?;
            got.reverse();
            let resp = http::Response::builder()
                .header("x-path", req.uri().path())
                .body(())?;
            stream.send_response(resp).await?;
            stream.send_data(Bytes::from(got)).await?;
            stream.finish().await?;
            Ok::<_, BoxError>(())
        }));
    }
    let mut served = 0;
    for t in tasks {
        if matches!(t.await, Ok(Ok(()))) {
            served += 1;
        }
    }
    Ok(served)
}

#[test]
fn lab_h3_client_and_server_over_corelane_quic_carry_twenty_requests_at_once() -> Result {
    let (server_config, client_config) = configs()?;
    let out: Result<(Vec<bool>, usize)> = corelane::lab::run(async move {
        let server = Endpoint::server(server_config, "127.0.0.1:4433")?;
        let addr = server.local_addr()?;
        let served = tokio::task::spawn_local(async move { serve(server).await });
        let client = Endpoint::client("127.0.0.1:0")?;
        client.set_default_client_config(client_config);
        let conn = client.connect(addr, "localhost")?.await?;
        let (mut driver, send) = h3::client::new(Connection::new(conn))
            .await
            .map_err(|e| e.to_string())?;
        let drive = tokio::task::spawn_local(async move {
            std::future::poll_fn(|cx| driver.poll_close(cx)).await
        });
        // Twenty requests at once, bodies of 0 B to 380 KB (larger than a stream's first
        // window), each answered with its body reversed.
        let mut reqs = Vec::new();
        for i in 0..20u8 {
            let mut send = send.clone();
            reqs.push(tokio::task::spawn_local(async move {
                let data = pattern(i, usize::from(i) * 20_000);
                let req = http::Request::post(format!("https://localhost/r/{i}")).body(())?;
                let mut stream = send.send_request(req).await?;
                stream.send_data(Bytes::from(data.clone())).await?;
                stream.finish().await?;
                let resp = stream.recv_response().await?;
                let mut back = BytesMut::new();
                while let Some(mut chunk) = stream.recv_data().await? {
                    back.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
                }
                let mut want = data;
                want.reverse();
                let path_ok = resp.headers().get("x-path").map(|v| v.as_bytes())
                    == Some(format!("/r/{i}").as_bytes());
                Ok::<_, BoxError>(resp.status() == 200 && path_ok && back[..] == want[..])
            }));
        }
        let mut same = Vec::new();
        for r in reqs {
            same.push(matches!(r.await, Ok(Ok(true))));
        }
        // The client goes: the server's accept loop ends, having served every request.
        drop(send);
        // H3_NO_ERROR.
        client.close(0x100u32.into(), b"done");
        let served = served.await.map_err(|e| e.to_string())?.unwrap_or(0);
        drive.abort();
        client.wait_idle().await;
        Ok((same, served))
    })?;
    let (same, served) = out?;
    assert_eq!(same, vec![true; 20], "requests answered whole");
    assert_eq!(served, 20);
    Ok(())
}
