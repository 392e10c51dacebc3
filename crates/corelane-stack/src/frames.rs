//! Well-formed, checksummed frames for tests and benchmarks: Ethernet + IPv4 + TCP or UDP from
//! 10.0.0.2:40000 to 10.0.0.1:7.

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpProtocol, Ipv4Address,
    Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber, UdpPacket, UdpRepr,
};

const SRC: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);
const DST: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);

/// Ethernet + IPv4 headers around an L4 payload that `emit` writes (it gets the IPv4 payload).
fn ipv4(proto: IpProtocol, l4_len: usize, emit: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let ip = Ipv4Repr {
        src_addr: SRC,
        dst_addr: DST,
        next_header: proto,
        payload_len: l4_len,
        hop_limit: 64,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
        dst_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
        ethertype: EthernetProtocol::Ipv4,
    };
    let mut buf = vec![0u8; eth.buffer_len() + ip.buffer_len() + l4_len];
    let mut f = EthernetFrame::new_unchecked(&mut buf);
    eth.emit(&mut f);
    let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
    ip.emit(&mut p, &ChecksumCapabilities::default());
    emit(p.payload_mut());
    buf
}

/// A TCP segment (a SYN when `syn`) carrying `payload`.
pub fn tcp_v4(syn: bool, payload: &[u8]) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port: 40000,
        dst_port: 7,
        control: if syn {
            TcpControl::Syn
        } else {
            TcpControl::None
        },
        seq_number: TcpSeqNumber(1),
        ack_number: None,
        window_len: 1024,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None, None, None],
        timestamp: None,
        payload,
    };
    ipv4(IpProtocol::Tcp, tcp.buffer_len(), |b| {
        let mut t = TcpPacket::new_unchecked(b);
        tcp.emit(
            &mut t,
            &SRC.into(),
            &DST.into(),
            &ChecksumCapabilities::default(),
        );
    })
}

/// A UDP datagram carrying `payload`.
pub fn udp_v4(payload: &[u8]) -> Vec<u8> {
    let udp = UdpRepr {
        src_port: 40000,
        dst_port: 7,
    };
    ipv4(IpProtocol::Udp, udp.header_len() + payload.len(), |b| {
        let mut u = UdpPacket::new_unchecked(b);
        udp.emit(
            &mut u,
            &SRC.into(),
            &DST.into(),
            payload.len(),
            |p| p.copy_from_slice(payload),
            &ChecksumCapabilities::default(),
        );
    })
}
