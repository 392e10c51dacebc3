//! The simulation's hosts: a stack over its in-memory link (whose other end is the wire's),
//! the endpoint state over a host's sockets, and how the two meet each step.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use corelane_stack::smoltcp::time::Instant as StackInstant;
use corelane_stack::smoltcp::wire::{IpCidr, Ipv4Address};
use corelane_stack::{FlowId, Peers, Pipeline, Stack, StackConfig, XdpDevice};
use corelane_xsk::{MemLink, MemPort, SplitMix64};

use super::super::driver::State;
use super::super::{ClientConfig, ServerConfig};
use super::{MTU, PORT};

/// One host's stack over its link; the other end of the link is the wire's.
pub(super) struct Host {
    pub(super) stack: Stack,
    pub(super) pipe: Pipeline<MemPort>,
    pub(super) wire: MemPort,
}

impl Host {
    pub(super) fn new(mac: [u8; 6], last: u8, cfg: StackConfig) -> Host {
        let link = MemLink {
            frames: 1024,
            frame_size: 2048,
            ring_size: 512,
        };
        let (mut io, wire) = link.pair();
        io.set_capture(true);
        let mut dev = XdpDevice::new(io, MTU, 64);
        let addr = Ipv4Address::new(10, 9, 0, last);
        let stack = Stack::new(&mut dev, mac, &[IpCidr::new(addr.into(), 24)], cfg);
        Host {
            stack,
            pipe: Pipeline::new(dev, None),
            wire,
        }
    }

    pub(super) fn turn(&mut self, now: StackInstant, peers: &mut dyn Peers) -> bool {
        self.pipe.turn(&mut self.stack, now, peers).busy()
    }
}

/// An endpoint's state over a host's sockets: it reads every one, and sends from the last.
pub(super) struct Ep {
    pub(super) st: State,
    pub(super) socks: Vec<FlowId>,
    pub(super) timer: Option<Instant>,
}

pub(super) fn server_addr() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1)), PORT)
}

/// A certificate for "localhost" made for the simulation (nothing else trusts it), and its
/// key: the server's config and the client's that trusts it.
pub(super) fn configs() -> Result<(ServerConfig, ClientConfig), String> {
    let cert =
        quinn_proto::rustls::pki_types::CertificateDer::from(&include_bytes!("sim-cert.der")[..]);
    let key = quinn_proto::rustls::pki_types::PrivateKeyDer::Pkcs8(
        include_bytes!("sim-key.der").to_vec().into(),
    );
    let server = ServerConfig::with_single_cert(vec![cert.clone().into_owned()], key)
        .map_err(|e| e.to_string())?;
    let mut roots = quinn_proto::rustls::RootCertStore::empty();
    roots.add(cert.into_owned()).map_err(|e| e.to_string())?;
    let client =
        ClientConfig::with_root_certificates(Arc::new(roots)).map_err(|e| e.to_string())?;
    Ok((server, client))
}

/// Every datagram waiting on the endpoint's sockets, to its state.
pub(super) fn read(host: &mut Host, ep: &mut Ep, now: Instant, buf: &mut [u8]) -> bool {
    let mut moved = false;
    for &sock in &ep.socks {
        while let Poll::Ready(Ok((n, from, ecn))) = host.stack.udp_recv_from_ecn(sock, buf, None) {
            ep.st.datagram(now, from, ecn, &buf[..n]);
            moved = true;
        }
    }
    moved
}

/// The endpoint's pass, and what it sends queued on its newest socket.
pub(super) fn pass(host: &mut Host, ep: &mut Ep, now: Instant) -> bool {
    ep.timer = ep.st.pass(now);
    let Some(&sock) = ep.socks.last() else {
        return false;
    };
    let mut moved = false;
    ep.st.take_out(|to, bytes, ecn| {
        // A full send queue drops the datagram, as UDP may.
        let _ = host.stack.udp_send_to_ecn(sock, bytes, to, ecn, None);
        moved = true;
    });
    moved
}

pub(super) fn seed_bytes(x: u64) -> [u8; 32] {
    let mut r = SplitMix64(x);
    let mut out = [0u8; 32];
    for c in out.chunks_exact_mut(8) {
        c.copy_from_slice(&r.draw().to_le_bytes());
    }
    out
}
