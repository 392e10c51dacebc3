//! The XDP program loaded for `BPF_PROG_TEST_RUN`, with the maps set as a server owning
//! `SERVER` / `SERVER6` would set them, and the helpers the program's tests share.

#![allow(dead_code, unreachable_pub)]

pub mod frames;
pub mod model;

use std::os::fd::{AsFd, AsRawFd};

use aya::Ebpf;
use aya::maps::{Array, HashMap, PerCpuArray};
use aya::programs::Xdp;
use corelane_xsk::{CookieParams, PROGRAM, STAT_SLOTS, XDP_OBJECT};

pub const SERVER: [u8; 4] = [10, 88, 0, 3];
pub const CLIENT: [u8; 4] = [10, 88, 0, 2];
/// An address the program owns shared with the kernel (its value has `ADDR_SHARED`).
pub const SHARED: [u8; 4] = [10, 88, 0, 9];
pub const SERVER6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3];
pub const CLIENT6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
pub const SHARED6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
/// The interface's hardware address, in the program's `iface` entry and cookie parameters.
pub const IFACE_MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];
pub const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

/// TCP ports: 80 served with SYN cookies on, 81 served; UDP port 53 served.
pub const COOKIE_PORT: u16 = 80;
pub const TCP_PORT: u16 = 81;
pub const UDP_PORT: u16 = 53;

/// True as root; a skip elsewhere, never under CI.
pub fn root(name: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{name} needs root (BPF_PROG_TEST_RUN); CI must run it"
    );
    eprintln!("\n*** SKIPPED {name}: needs root ***\n");
    false
}

pub fn fold(mut s: u32) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The ones'-complement sum of `b` as 16-bit big-endian words (an odd byte padded).
pub fn sum(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

/// Runs the program once on `frame`; returns its verdict and the frame it left.
pub fn run(prog: &Xdp, frame: &[u8]) -> (u32, Vec<u8>) {
    let fd = prog.fd().expect("loaded").as_fd().as_raw_fd();
    let mut out = vec![0u8; frame.len() + 512];
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
        "BPF_PROG_TEST_RUN on {frame:02x?}: {}",
        std::io::Error::last_os_error()
    );
    let retval = u32::from_ne_bytes([attr[4], attr[5], attr[6], attr[7]]);
    let n = u32::from_ne_bytes([attr[12], attr[13], attr[14], attr[15]]) as usize;
    out.truncate(n);
    (retval, out)
}

/// The program's counters (`stats`), summed over the CPUs, in `XdpCounters` order.
pub fn counters(ebpf: &Ebpf) -> [u64; STAT_SLOTS] {
    let stats: PerCpuArray<_, u64> =
        PerCpuArray::try_from(ebpf.map("stats").expect("stats")).expect("map");
    let mut out = [0u64; STAT_SLOTS];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = stats.get(&(i as u32), 0).expect("a counter").iter().sum();
    }
    out
}

/// The program loaded, owning SERVER and SERVER6 (and SHARED and SHARED6 shared with the
/// kernel) with the ports above, its interface's address
/// and cookie parameters set, and no AF_XDP socket (what it would steer comes back XDP_PASS,
/// counted as "no socket").
pub fn loaded() -> Ebpf {
    loaded_vlan(0)
}

/// [`loaded`], serving 802.1Q VLAN `vid` (0: untagged frames).
pub fn loaded_vlan(vid: u16) -> Ebpf {
    loaded_tags(corelane_xsk::Vlan::tagged(vid))
}

/// [`loaded`], serving `vlan`'s frames.
pub fn loaded_tags(vlan: corelane_xsk::Vlan) -> Ebpf {
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
        owned
            .insert(u32::from_ne_bytes(SHARED), 3, 0)
            .expect("own the shared address");
    }
    {
        let mut owned: HashMap<_, [u8; 16], u8> =
            HashMap::try_from(ebpf.map_mut("owned_v6").expect("owned_v6")).expect("map");
        owned.insert(SERVER6, 1, 0).expect("own the address");
        owned.insert(SHARED6, 3, 0).expect("own the shared address");
    }
    {
        let mut ports: Array<_, u8> =
            Array::try_from(ebpf.map_mut("tcp_ports").expect("tcp_ports")).expect("map");
        ports
            .set(u32::from(COOKIE_PORT), 1 | 2, 0)
            .expect("served, cookies");
        ports.set(u32::from(TCP_PORT), 1, 0).expect("served");
    }
    {
        let mut ports: Array<_, u8> =
            Array::try_from(ebpf.map_mut("udp_ports").expect("udp_ports")).expect("map");
        ports.set(u32::from(UDP_PORT), 1, 0).expect("served");
    }
    {
        let mut iface: Array<_, [u8; 12]> =
            Array::try_from(ebpf.map_mut("iface").expect("iface")).expect("map");
        iface
            .set(0, corelane_xsk::iface_entry(IFACE_MAC, vlan), 0)
            .expect("the interface's address");
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
            mss6: 1440,
        };
        cfg.set(0, p, 0).expect("cookie parameters");
    }
    ebpf
}
