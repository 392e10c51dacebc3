//! What the QUIC tests against quinn on the kernel share: a certificate, and stream contents.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A certificate for "localhost": quinn's server config with it, and the roots a client
/// trusts it by.
pub fn certificate() -> Result<(quinn::ServerConfig, rustls::RootCertStore), Box<dyn Error>> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let server = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    Ok((server, roots))
}

/// `n` bytes of a pattern that differs at every offset of a stream (and between seeds).
pub fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// A quinn client endpoint on `bind` (the kernel's UDP) trusting `roots`, connected to the
/// corelane server at `to` (the name "localhost"), tried again while the server's cores come up
/// (until then nothing answers): twenty seconds at most.
pub async fn connect(
    bind: SocketAddr,
    to: SocketAddr,
    roots: rustls::RootCertStore,
) -> Result<(quinn::Endpoint, quinn::Connection), String> {
    let mut endpoint = quinn::Endpoint::client(bind).map_err(|e| e.to_string())?;
    let config =
        quinn::ClientConfig::with_root_certificates(Arc::new(roots)).map_err(|e| e.to_string())?;
    endpoint.set_default_client_config(config);
    for _ in 0..40 {
        let attempt = endpoint
            .connect(to, "localhost")
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(Duration::from_millis(500), attempt).await {
            Ok(Ok(c)) => return Ok((endpoint, c)),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Err("no handshake with the corelane server".into())
}
