//! What the QUIC tests against quinn on the kernel share: a certificate, and stream contents.

use std::error::Error;

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
