//! The XDP program's SYN-ACKs, run by the kernel on crafted frames (`BPF_PROG_TEST_RUN`): for
//! SYNs over IPv4 and IPv6 with the option layouts real stacks send, with none, and NOP-padded,
//! the answer is a well-formed SYN-ACK (both checksums right, addresses and ports swapped, the ISN + 1
//! acknowledged) carrying the options the stack's own cookie SYN-ACK would: the MSS; with
//! timestamps, the echo, SACK-permitted when offered, the window scale when offered. A SYN to a
//! port without cookies, and a segment that is not a bare SYN, are not answered. That the
//! cookie itself opens a connection in the stack is `tests/xdp_syn_cookies.rs` at the top.

#![allow(unsafe_code)]

mod bpf;

use aya::programs::Xdp;
use bpf::*;
use corelane_xsk::PROGRAM;

/// A SYN from CLIENT:40000 to SERVER:`port` with TCP options `opts` (a multiple of 4 bytes).
fn syn(port: u16, opts: &[u8], flags: u8) -> Vec<u8> {
    syn_in(false, port, opts, flags)
}

/// The IP header's length for IPv6 (`v6`) or IPv4.
fn ip_len(v6: bool) -> usize {
    if v6 { 40 } else { 20 }
}

/// A SYN from CLIENT6:40000 to SERVER6:`port` when `v6`, else as [`syn`].
fn syn_in(v6: bool, port: u16, opts: &[u8], flags: u8) -> Vec<u8> {
    let tcp_len = 20 + opts.len();
    let l4 = 14 + ip_len(v6);
    let mut f = vec![0u8; l4 + tcp_len];
    f[..6].copy_from_slice(&IFACE_MAC);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    let t = &mut f[l4..];
    t[..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&port.to_be_bytes());
    t[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    t[12] = ((tcp_len / 4) as u8) << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t[20..].copy_from_slice(opts);
    let c = !fold(sum(&pseudo(v6, false, tcp_len)) + sum(t));
    t[16..18].copy_from_slice(&c.to_be_bytes());
    if v6 {
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        let ip = &mut f[14..54];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
        ip[6] = 6;
        ip[7] = 64;
        ip[8..24].copy_from_slice(&CLIENT6);
        ip[24..40].copy_from_slice(&SERVER6);
    } else {
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&CLIENT);
        ip[16..20].copy_from_slice(&SERVER);
        let c = !fold(sum(ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
    }
    f
}

/// The TCP pseudo-header of a segment of `tcp_len` bytes between the client and the server
/// (`answer`: from the server).
fn pseudo(v6: bool, answer: bool, tcp_len: usize) -> Vec<u8> {
    let (c, s): (&[u8], &[u8]) = if v6 {
        (&CLIENT6, &SERVER6)
    } else {
        (&CLIENT, &SERVER)
    };
    let mut p = Vec::new();
    if answer {
        p.extend_from_slice(s);
        p.extend_from_slice(c);
    } else {
        p.extend_from_slice(c);
        p.extend_from_slice(s);
    }
    if v6 {
        p.extend_from_slice(&(tcp_len as u32).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 6]);
    } else {
        p.extend_from_slice(&[0, 6]);
        p.extend_from_slice(&(tcp_len as u16).to_be_bytes());
    }
    p
}

/// The TCP options of a SYN-ACK, as (kind, value bytes).
fn options(t: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let hl = usize::from(t[12] >> 4) * 4;
    let o = &t[20..hl];
    let mut v = Vec::new();
    let mut i = 0;
    while i < o.len() {
        match o[i] {
            0 => break,
            1 => i += 1,
            k => {
                let l = usize::from(o[i + 1]);
                v.push((k, o[i + 2..i + l].to_vec()));
                i += l;
            }
        }
    }
    v
}

#[test]
fn syns_are_answered_with_well_formed_syn_acks_carrying_the_stacks_options() {
    if !root("xdp_syn_cookie_run") {
        return;
    }
    let ebpf = loaded();
    let prog: &Xdp = ebpf.program(PROGRAM).unwrap().try_into().unwrap();
    let ts = [8, 10, 0, 0, 0, 99, 0, 0, 0, 0];
    // Linux: MSS, SACK-permitted, timestamps, NOP, window scale.
    let mut linux = vec![2, 4, 5, 180, 4, 2];
    linux.extend_from_slice(&ts);
    linux.extend_from_slice(&[1, 3, 3, 7]);
    // NOP-padded, window scale first, timestamps, no SACK.
    let mut padded = vec![1, 3, 3, 2, 1, 1, 2, 4, 2, 0];
    padded.extend_from_slice(&ts);
    padded.extend_from_slice(&[1, 1]);
    // (the SYN's options; then whether the answer has timestamps, SACK, window scale)
    let cases: Vec<(Vec<u8>, bool, bool, bool)> = vec![
        (linux, true, true, true),
        (padded, true, false, true),
        (vec![2, 4, 5, 180], false, false, false),
        (vec![], false, false, false),
    ];
    for v6 in [false, true] {
        for (opts, has_ts, sack, ws) in &cases {
            let (has_ts, sack, ws) = (*has_ts, *sack, *ws);
            let (verdict, out) = run(prog, &syn_in(v6, 80, opts, 0x02));
            assert_eq!(verdict, XDP_TX, "{opts:?}, IPv6 {v6}");
            assert_eq!(&out[..6], &[2, 0, 0, 0, 0, 2], "to the client's MAC");
            assert_eq!(&out[6..12], &IFACE_MAC, "from the interface's MAC");
            let l4 = 14 + ip_len(v6);
            let tcp_len = if v6 {
                let ip = &out[14..54];
                assert_eq!(&out[12..14], &[0x86, 0xdd]);
                assert_eq!((ip[0] >> 4, ip[6], ip[7]), (6, 6, 64), "version, TCP, hops");
                assert_eq!((&ip[8..24], &ip[24..40]), (&SERVER6[..], &CLIENT6[..]));
                usize::from(u16::from_be_bytes([ip[4], ip[5]]))
            } else {
                let ip = &out[14..34];
                assert_eq!(fold(sum(ip)), 0xffff, "IPv4 checksum, {opts:?}");
                assert_eq!((&ip[12..16], &ip[16..20]), (&SERVER[..], &CLIENT[..]));
                usize::from(u16::from_be_bytes([ip[2], ip[3]])) - 20
            };
            assert_eq!(out.len(), l4 + tcp_len, "nothing after the segment");
            let t = &out[l4..];
            assert_eq!(
                fold(sum(&pseudo(v6, true, tcp_len)) + sum(t)),
                0xffff,
                "TCP checksum, {opts:?}, IPv6 {v6}"
            );
            assert_eq!(u16::from_be_bytes([t[0], t[1]]), 80);
            assert_eq!(u16::from_be_bytes([t[2], t[3]]), 40000);
            assert_eq!(t[13], 0x12, "SYN and ACK");
            let ack = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
            assert_eq!(ack, 0x1234_5679);
            let o = options(t);
            // This side's MSS: the parameters' 1460 over IPv4, 1440 over IPv6.
            let mss: [u8; 2] = if v6 { [5, 160] } else { [5, 180] };
            assert!(o.contains(&(2, mss.to_vec())), "our MSS: {o:?}");
            let tso = o.iter().find(|(k, _)| *k == 8);
            assert_eq!(tso.is_some(), has_ts, "{o:?}");
            if let Some((_, v)) = tso {
                assert_eq!(&v[4..8], &[0, 0, 0, 99], "TSecr echoes TSval");
                // TSval's low bits: the peer's window scale (0xf: none) and SACK-permitted.
                let low = v[3] & 0x1f;
                assert_eq!(low & 0xf, if ws { opts_ws(opts) } else { 0xf });
                assert_eq!(low >> 4, u8::from(sack));
            }
            assert_eq!(o.iter().any(|(k, _)| *k == 4), sack && has_ts, "{o:?}");
            assert_eq!(
                o.iter().any(|(k, _)| *k == 3),
                ws && has_ts,
                "window scale only with timestamps: {o:?}"
            );
        }
    }
    // The same SYN over IPv4 and IPv6 gets different cookies (the addresses are hashed), and a
    // SYN without an MSS option is taken as 536 over IPv4, 1220 over IPv6 (RFC 9293 3.7.1, RFC
    // 8200 section 5): the cookie's MSS index (bits 24-26) says which.
    let isn = |out: &[u8], v6: bool| {
        let t = &out[14 + ip_len(v6)..];
        u32::from_be_bytes([t[4], t[5], t[6], t[7]])
    };
    let four = isn(&run(prog, &syn_in(false, 80, &[], 0x02)).1, false);
    let six = isn(&run(prog, &syn_in(true, 80, &[], 0x02)).1, true);
    assert_ne!(
        four & 0xff_ffff,
        six & 0xff_ffff,
        "the hash covers the addresses"
    );
    assert_eq!((four >> 24) & 7, 0, "536: the table's first MSS");
    assert_eq!((six >> 24) & 7, 2, "1220: the table's third MSS");
    // An IPv6 SYN from a multicast or unspecified source is not answered here.
    for src in [[0xff; 16], [0; 16]] {
        let mut f = syn_in(true, 80, &[], 0x02);
        f[22..38].copy_from_slice(&src);
        assert_ne!(run(prog, &f).0, XDP_TX, "from {src:x?}");
    }
    // Only frames sent to the interface's own address are answered (as the kernel's TCP takes
    // only PACKET_HOST frames): not one sent to a group address, nor one for another host seen
    // by a promiscuous interface, whose MAC the answer would otherwise come from.
    for dest in [[0xff; 6], [0x01, 0, 0x5e, 0, 0, 1], [2, 0, 0, 0, 0, 3]] {
        let mut other = syn(80, &[2, 4, 5, 180], 0x02);
        other[..6].copy_from_slice(&dest);
        let (verdict, out) = run(prog, &other);
        assert_ne!(verdict, XDP_TX, "a SYN sent to {dest:x?}");
        assert_eq!(out, other, "passed on untouched");
    }
    let mut from_group = syn(80, &[2, 4, 5, 180], 0x02);
    from_group[6..12].copy_from_slice(&[0x01, 0, 0x5e, 0, 0, 1]);
    assert_ne!(run(prog, &from_group).0, XDP_TX, "from a multicast MAC");
    // No cookies for port 81, nor for anything but a bare SYN: no SYN-ACK from here (with no
    // socket to steer to here, the program answers as for a closed port: a reset, or for a
    // segment that is itself a reset, nothing).
    let no_syn_ack = |f: Vec<u8>, what: &str| {
        let (verdict, out) = run(prog, &f);
        assert!(
            verdict != XDP_TX || out[34 + 13] & 0x04 != 0,
            "{what}: answered {:#04x}",
            out[34 + 13]
        );
    };
    no_syn_ack(
        syn(81, &[2, 4, 5, 180], 0x02),
        "a SYN to a port without cookies",
    );
    no_syn_ack(syn(80, &[], 0x12), "a SYN-ACK");
    no_syn_ack(syn(80, &[], 0x06), "SYN with RST");
}

/// The window scale a SYN's options offer.
fn opts_ws(opts: &[u8]) -> u8 {
    opts.windows(3)
        .find(|w| w[0] == 3 && w[1] == 3)
        .map_or(0xf, |w| w[2])
}
