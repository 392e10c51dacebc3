//! The steering decision held to one truth: the compiled XDP program, run by the kernel
//! (`BPF_PROG_TEST_RUN`), and the in-memory program's Rust model of it (`MemProgram`, which
//! every verdict of the runtime simulation rests on) are given the same maps and the same
//! frames, and must agree on every frame whether it goes to a socket. Frames: the generator
//! the program's own tests use (IPv4 with options and fragments, IPv6 with extension headers
//! and fragments, ARP and NDP, TCP with every flag and bad options, UDP, ICMP errors quoting
//! owned and foreign ports, VLAN and QinQ tags, group and foreign MACs, unspecified and
//! multicast sources, mutations, truncations, random bytes), sent to owned, shared and
//! foreign addresses, with SYN cookies on for one port.
//!
//! What is compared is steering: the program's "no socket" counter (it steers, and finds no
//! socket here) against the model's verdict. What the program answers itself (resets, port
//! unreachables, SYN-ACKs) is checked byte by byte in `xdp_random_frames.rs`; the model's
//! side of those is "not steered". `CORELANE_XDP_FRAMES` and `CORELANE_XDP_SEED` run more or
//! other frames.

#![allow(unsafe_code)] // `bpf::run`: the BPF_PROG_TEST_RUN system call.

mod bpf;

use std::net::IpAddr;

use aya::maps::PerCpuArray;
use aya::programs::Xdp;
use bpf::frames::{Rng, frame};
use bpf::*;
use corelane_xsk::{MemProgram, PROGRAM, Proto, Verdict};

/// The program's "no socket" counter (`XdpCounters::no_socket`'s slot).
const NO_SOCKET: u32 = 3;

fn no_socket(ebpf: &aya::Ebpf) -> u64 {
    let stats: PerCpuArray<_, u64> =
        PerCpuArray::try_from(ebpf.map("stats").expect("stats")).expect("map");
    stats.get(&NO_SOCKET, 0).expect("a counter").iter().sum()
}

/// The in-memory program with the maps `bpf::loaded` gives the compiled one.
fn model() -> MemProgram {
    let p = MemProgram::new();
    let mut s = p.steering("diff0");
    s.own_addr(IpAddr::from(SERVER)).expect("own");
    s.own_addr(IpAddr::from(SERVER6)).expect("own");
    s.own_shared_addr(IpAddr::from(SHARED)).expect("own shared");
    s.own_shared_addr(IpAddr::from(SHARED6))
        .expect("own shared");
    s.own_port(Proto::Tcp, COOKIE_PORT).expect("port");
    s.own_port(Proto::Tcp, TCP_PORT).expect("port");
    s.own_port(Proto::Udp, UDP_PORT).expect("port");
    p.set_mac(IFACE_MAC);
    p.set_cookie_port(COOKIE_PORT, true);
    // The maps live in `p`; the steering that wrote them may go.
    drop(s);
    p
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Both programs on `f`: (the compiled one steered it, the model steers it).
fn both(ebpf: &aya::Ebpf, prog: &Xdp, mem: &MemProgram, f: &[u8]) -> (bool, bool) {
    let before = no_socket(ebpf);
    let _ = run(prog, f);
    let compiled = no_socket(ebpf) != before;
    let modelled = match mem.receive(0, f) {
        Verdict::Passed => false,
        Verdict::Dropped | Verdict::Steered(_) => true,
    };
    (compiled, modelled)
}

#[test]
fn the_model_steers_every_frame_as_the_compiled_program_does() {
    if !root("the_model_steers_every_frame_as_the_compiled_program_does") {
        return;
    }
    let ebpf = loaded();
    let mem = model();
    let frames = env("CORELANE_XDP_FRAMES", 100_000);
    let seed = env("CORELANE_XDP_SEED", 0x5eed);
    let prog: &Xdp = ebpf
        .program(PROGRAM)
        .expect("the program")
        .try_into()
        .expect("an XDP program");
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (mut steered, mut differ) = (0u64, Vec::new());
    for k in 0..frames {
        let f = if k % 5 == 4 {
            let n = 14 + r.below(120);
            r.bytes(n)
        } else {
            frame(&mut r)
        };
        let (compiled, modelled) = both(&ebpf, prog, &mem, &f);
        steered += u64::from(compiled);
        if compiled != modelled && differ.len() < 10 {
            differ.push(format!(
                "compiled {}, model {}: {f:02x?}",
                if compiled { "steers" } else { "does not steer" },
                if modelled { "steers" } else { "does not" }
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "the model and the program differ (first {}):\n{}",
        differ.len(),
        differ.join("\n")
    );
    // Something of each kind was seen, or the comparison says little.
    assert!(
        steered > frames / 20 && steered < frames - frames / 20,
        "{steered} of {frames} steered"
    );
    eprintln!("{frames} frames, {steered} steered, the same in both");
}
