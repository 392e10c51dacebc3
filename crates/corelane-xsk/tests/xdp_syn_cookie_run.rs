//! The XDP program's SYN-ACKs, run by the kernel on crafted frames (`BPF_PROG_TEST_RUN`): for
//! SYNs with the option layouts real stacks send, with none, and NOP-padded, the answer is a
//! well-formed SYN-ACK (both checksums right, addresses and ports swapped, the ISN + 1
//! acknowledged) carrying the options the stack's own cookie SYN-ACK would: the MSS; with
//! timestamps, the echo, SACK-permitted when offered, the window scale when offered. A SYN to a
//! port without cookies, and a segment that is not a bare SYN, are not answered. That the
//! cookie itself opens a connection in the stack is `tests/xdp_syn_cookies.rs` at the top.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd};

use aya::Ebpf;
use aya::maps::{Array, HashMap};
use aya::programs::Xdp;
use corelane_xsk::{CookieParams, PROGRAM, XDP_OBJECT};

const SERVER: [u8; 4] = [10, 88, 0, 3];
const CLIENT: [u8; 4] = [10, 88, 0, 2];
const XDP_TX: u32 = 3;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "xdp_syn_cookie_run needs root (BPF_PROG_TEST_RUN); CI must run it"
    );
    eprintln!("\n*** SKIPPED xdp_syn_cookie_run: needs root ***\n");
    false
}

fn fold(mut s: u32) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn sum(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

/// The interface's hardware address in the program's cookie parameters (not the SYNs'
/// destination, 02:00:00:00:00:03).
const IFACE_MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

/// A SYN from CLIENT:40000 to SERVER:`port` with TCP options `opts` (a multiple of 4 bytes).
fn syn(port: u16, opts: &[u8], flags: u8) -> Vec<u8> {
    let tcp_len = 20 + opts.len();
    let mut f = vec![0u8; 14 + 20 + tcp_len];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 3]);
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

/// Runs the program once on `frame`; returns its verdict and the frame it left.
fn run(prog: &Xdp, frame: &[u8]) -> (u32, Vec<u8>) {
    let fd = prog.fd().expect("loaded").as_fd().as_raw_fd();
    let mut out = vec![0u8; 512];
    // union bpf_attr's `test` member (BPF_PROG_TEST_RUN), as the kernel lays it out.
    let mut attr = [0u8; 80];
    attr[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    attr[12..16].copy_from_slice(&(out.len() as u32).to_ne_bytes());
    attr[16..24].copy_from_slice(&(frame.as_ptr() as u64).to_ne_bytes());
    attr[24..32].copy_from_slice(&(out.as_mut_ptr() as u64).to_ne_bytes());
    attr[32..36].copy_from_slice(&1u32.to_ne_bytes());
    // SAFETY: `attr` is a valid bpf_attr for BPF_PROG_TEST_RUN of its size; the kernel reads
    // `frame` (live for the call) and writes at most `out.len()` bytes into `out`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            10,
            attr.as_mut_ptr(),
            attr.len() as libc::c_uint,
        )
    };
    assert_eq!(
        rc,
        0,
        "BPF_PROG_TEST_RUN: {}",
        std::io::Error::last_os_error()
    );
    let retval = u32::from_ne_bytes([attr[4], attr[5], attr[6], attr[7]]);
    let n = u32::from_ne_bytes([attr[12], attr[13], attr[14], attr[15]]) as usize;
    out.truncate(n);
    (retval, out)
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

fn loaded() -> Ebpf {
    let mut ebpf = Ebpf::load(XDP_OBJECT).expect("the object loads");
    let prog: &mut Xdp = ebpf
        .program_mut(PROGRAM)
        .expect("the program")
        .try_into()
        .expect("an XDP program");
    prog.load().expect("the verifier takes it");
    {
        let mut owned: HashMap<_, u32, u8> =
            HashMap::try_from(ebpf.map_mut("owned_v4").expect("owned_v4")).expect("map");
        owned
            .insert(u32::from_ne_bytes(SERVER), 1, 0)
            .expect("own the address");
    }
    {
        let mut ports: Array<_, u8> =
            Array::try_from(ebpf.map_mut("tcp_ports").expect("tcp_ports")).expect("map");
        ports.set(80, 1 | 2, 0).expect("port 80: owned, cookies");
        ports.set(81, 1, 0).expect("port 81: owned");
    }
    {
        let mut cfg: Array<_, CookieParams> =
            Array::try_from(ebpf.map_mut("cookie_cfg").expect("cookie_cfg")).expect("map");
        let p = CookieParams {
            k0: 1,
            k1: 2,
            epoch_ns: 0,
            mss: 1460,
            window: 65535,
            wscale: 7,
            timestamps: 1,
            sack: 1,
            ttl: 64,
            ts_k0: 3,
            ts_k1: 4,
            mac: IFACE_MAC,
            pad: [0; 2],
        };
        cfg.set(0, p, 0).expect("cookie parameters");
    }
    ebpf
}

#[test]
fn syns_are_answered_with_well_formed_syn_acks_carrying_the_stacks_options() {
    if !root() {
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
    // The SYN's destination MAC is not the answer's source: a SYN to a group address still
    // gets the interface's; a SYN from a group address gets nothing.
    let mut to_group = syn(80, &[2, 4, 5, 180], 0x02);
    to_group[..6].copy_from_slice(&[0xff; 6]);
    let (verdict, out) = run(prog, &to_group);
    assert_eq!(verdict, XDP_TX);
    assert_eq!(&out[6..12], &IFACE_MAC);
    let mut from_group = syn(80, &[2, 4, 5, 180], 0x02);
    from_group[6..12].copy_from_slice(&[0x01, 0, 0x5e, 0, 0, 1]);
    assert_ne!(run(prog, &from_group).0, XDP_TX, "from a multicast MAC");
    // No cookies for port 81, nor for anything but a bare SYN: not answered here.
    assert_ne!(run(prog, &syn(81, &[2, 4, 5, 180], 0x02)).0, XDP_TX);
    assert_ne!(run(prog, &syn(80, &[], 0x12)).0, XDP_TX, "a SYN-ACK");
    assert_ne!(run(prog, &syn(80, &[], 0x06)).0, XDP_TX, "SYN with RST");
}

/// The window scale a SYN's options offer.
fn opts_ws(opts: &[u8]) -> u8 {
    opts.windows(3)
        .find(|w| w[0] == 3 && w[1] == 3)
        .map_or(0xf, |w| w[2])
}
