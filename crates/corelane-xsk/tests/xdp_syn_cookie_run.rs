//! The XDP program's SYN-ACKs, run by the kernel on crafted frames (`BPF_PROG_TEST_RUN`): for
//! SYNs with the option layouts real stacks send, with none, and NOP-padded, the answer is a
//! well-formed SYN-ACK (both checksums right, addresses and ports swapped, the ISN + 1
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
    let tcp_len = 20 + opts.len();
    let mut f = vec![0u8; 14 + 20 + tcp_len];
    f[..6].copy_from_slice(&IFACE_MAC);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
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
    let t = &mut f[34..];
    t[..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&port.to_be_bytes());
    t[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    t[12] = ((tcp_len / 4) as u8) << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t[20..].copy_from_slice(opts);
    f
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
    for (opts, has_ts, sack, ws) in cases {
        let (verdict, out) = run(prog, &syn(80, &opts, 0x02));
        assert_eq!(verdict, XDP_TX, "{opts:?}");
        assert_eq!(&out[..6], &[2, 0, 0, 0, 0, 2], "to the client's MAC");
        assert_eq!(&out[6..12], &IFACE_MAC, "from the interface's MAC");
        let ip = &out[14..34];
        assert_eq!(fold(sum(ip)), 0xffff, "IPv4 checksum, {opts:?}");
        assert_eq!((&ip[12..16], &ip[16..20]), (&SERVER[..], &CLIENT[..]));
        let tcp_len = usize::from(u16::from_be_bytes([ip[2], ip[3]])) - 20;
        let t = &out[34..34 + tcp_len];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&SERVER);
        pseudo.extend_from_slice(&CLIENT);
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        assert_eq!(
            fold(sum(&pseudo) + sum(t)),
            0xffff,
            "TCP checksum, {opts:?}"
        );
        assert_eq!(u16::from_be_bytes([t[0], t[1]]), 80);
        assert_eq!(u16::from_be_bytes([t[2], t[3]]), 40000);
        assert_eq!(t[13], 0x12, "SYN and ACK");
        let ack = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
        assert_eq!(ack, 0x1234_5679);
        let o = options(t);
        assert!(o.contains(&(2, vec![5, 180])), "our MSS: {o:?}");
        let tso = o.iter().find(|(k, _)| *k == 8);
        assert_eq!(tso.is_some(), has_ts, "{o:?}");
        if let Some((_, v)) = tso {
            assert_eq!(&v[4..8], &[0, 0, 0, 99], "TSecr echoes TSval");
            // TSval's low bits: the peer's window scale (0xf: none) and SACK-permitted.
            let low = v[3] & 0x1f;
            assert_eq!(low & 0xf, if ws { opts_ws(&opts) } else { 0xf });
            assert_eq!(low >> 4, u8::from(sack));
        }
        assert_eq!(o.iter().any(|(k, _)| *k == 4), sack && has_ts, "{o:?}");
        assert_eq!(
            o.iter().any(|(k, _)| *k == 3),
            ws && has_ts,
            "window scale only with timestamps: {o:?}"
        );
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
