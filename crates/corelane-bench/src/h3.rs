//! An HTTP/3 client on the kernel's UDP (h3 over quinn), for the comparison's load
//! (`h3compare`) and for checking a server by hand or in the zero-copy guest (`h3get`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};

/// Any error of the client.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request sender of one connection.
pub type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// A quinn client endpoint on `bind` that trusts `cert` and speaks h3.
///
/// # Errors
/// A certificate rustls refuses; a socket the kernel refuses.
pub fn client_endpoint(
    cert: &rustls::pki_types::CertificateDer<'static>,
    bind: SocketAddr,
) -> Result<quinn::Endpoint, BoxError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone())?;
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut ep = quinn::Endpoint::client(bind)?;
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    Ok(ep)
}

/// A connection to `to` (the certificate naming "localhost") with its h3 driver running on a
/// task of its own (call from a `LocalSet`).
///
/// # Errors
/// The handshake failed or took over five seconds.
pub async fn open(
    ep: &quinn::Endpoint,
    to: SocketAddr,
) -> Result<(quinn::Connection, Sender), BoxError> {
    let conn = tokio::time::timeout(Duration::from_secs(5), ep.connect(to, "localhost")?)
        .await
        .map_err(|_| "handshake timed out")??;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
    tokio::task::spawn_local(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    Ok((conn, send))
}

/// One request, `body` sent when given (a POST) and the answer read whole: its body.
///
/// # Errors
/// A status other than 200, or the request failed.
pub async fn request(
    send: &mut Sender,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Vec<u8>, BoxError> {
    let req = match body {
        Some(_) => http::Request::post(format!("https://localhost{path}")).body(())?,
        None => http::Request::get(format!("https://localhost{path}")).body(())?,
    };
    let mut stream = send.send_request(req).await?;
    if let Some(b) = body {
        stream.send_data(Bytes::copy_from_slice(b)).await?;
    }
    stream.finish().await?;
    let resp = stream.recv_response().await?;
    if resp.status() != 200 {
        return Err(format!("status {}", resp.status()).into());
    }
    let mut out = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await? {
        while chunk.has_remaining() {
            let c = chunk.chunk();
            out.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    Ok(out)
}

/// One `GET path`, read whole: the body's length (nothing kept).
///
/// # Errors
/// As [`request`].
pub async fn get_len(send: &mut Sender, path: &str) -> Result<u64, BoxError> {
    let req = http::Request::get(format!("https://localhost{path}")).body(())?;
    let mut stream = send.send_request(req).await?;
    stream.finish().await?;
    let resp = stream.recv_response().await?;
    if resp.status() != 200 {
        return Err(format!("status {}", resp.status()).into());
    }
    let mut n = 0u64;
    while let Some(chunk) = stream.recv_data().await? {
        n += chunk.remaining() as u64;
    }
    Ok(n)
}
