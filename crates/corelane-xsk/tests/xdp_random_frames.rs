//! The XDP program run by the kernel (`BPF_PROG_TEST_RUN`) on tens of thousands of generated
//! frames, each checked against a model of what the program must do with it, written here from
//! the rules in `crates/corelane-xsk/xdp/corelane.bpf.c`'s comments:
//!
//! - a frame that is not ours (another address, another EtherType, VLAN-tagged, ARP for
//!   someone else) comes back XDP_PASS with every byte as it was, counted as passed;
//! - a frame too short for the headers it announces comes back XDP_PASS untouched, counted as
//!   malformed (the kernel drops it as it always would);
//! - a frame ours to steer finds no socket here (these tests register none): a TCP segment or
//!   UDP datagram to a served port is answered as a closed port would be (the runtime that
//!   served it is gone), the rest comes back XDP_PASS untouched; both counted as steered to no
//!   socket;
//! - an answer (a reset for a closed TCP port, port unreachable for a closed UDP port, a SYN
//!   cookie's SYN-ACK) is XDP_TX of a well-formed frame: lengths and checksums right, addresses
//!   and ports swapped, sent to the frame's sender from the interface's own MAC; and only a
//!   frame sent to the interface's MAC from a unicast sender is answered;
//! - nothing is ever XDP_ABORTED.
//!
//! Frames are built from the protocols' structure (IPv4 options, IPv6 extension headers, VLAN
//! tags, TCP options with bad lengths, every TCP flag, fragments, group and foreign MACs,
//! unspecified and multicast sources), then some are mutated and truncated; a fifth are random
//! bytes; and a handful are cut at every length. `CORELANE_XDP_FRAMES` and `CORELANE_XDP_SEED`
//! run a longer or another sequence.

#![allow(unsafe_code)]

mod bpf;

use aya::programs::Xdp;
use bpf::frames::{Rng, frame};
use bpf::model::{Expect, check_answer, expect};
use bpf::*;
use corelane_xsk::PROGRAM;

/// Counter slots (`XdpCounters` order).
const PASSED: usize = 1;
const MALFORMED: usize = 2;
const NO_SOCKET: usize = 3;
const COOKIES: usize = 4;
const RESETS: usize = 5;
const UNREACH: usize = 6;
const UNREACH_LIMITED: usize = 7;
const RESETS_LIMITED: usize = 8;

/// Runs `f`, checks the verdict, the bytes and the counter against the model.
fn check(ebpf: &aya::Ebpf, prog: &Xdp, f: &[u8], seen: &mut [u64; 7]) {
    let want = expect(f);
    let before = counters(ebpf);
    let (verdict, out) = run(prog, f);
    let after = counters(ebpf);
    let moved: Vec<usize> = (0..before.len())
        .filter(|&i| after[i] != before[i])
        .collect();
    let ctx = format!("{want:?}: verdict {verdict}, counters {moved:?}, frame {f:02x?}");
    assert_ne!(verdict, XDP_ABORTED, "{ctx}");
    let untouched = |slots: &[usize]| {
        assert_eq!(verdict, XDP_PASS, "{ctx}");
        assert_eq!(out, f, "passed frames keep every byte: {ctx}");
        assert_eq!(moved, slots, "{ctx}");
    };
    // A served port with no socket also counts the missing socket.
    let also = |slot: usize| -> Vec<usize> {
        let mut v = vec![slot];
        if matches!(want, Expect::SteerReset | Expect::SteerUnreach) {
            v.insert(0, NO_SOCKET);
        }
        v
    };
    let unreach = matches!(want, Expect::Unreach | Expect::SteerUnreach);
    let reset = matches!(want, Expect::Reset | Expect::SteerReset);
    match want {
        Expect::Pass => untouched(&[PASSED]),
        Expect::Malformed => untouched(&[MALFORMED]),
        Expect::Steer => untouched(&[NO_SOCKET]),
        Expect::SteerPass => untouched(&[PASSED, NO_SOCKET]),
        _ if unreach && verdict == XDP_DROP => {
            assert_eq!(moved, also(UNREACH_LIMITED), "{ctx}")
        }
        _ if reset && verdict == XDP_DROP => {
            assert_eq!(moved, also(RESETS_LIMITED), "{ctx}")
        }
        _ => {
            let slot = match want {
                Expect::Reset | Expect::SteerReset => RESETS,
                Expect::Unreach | Expect::SteerUnreach => UNREACH,
                _ => COOKIES,
            };
            assert_eq!(verdict, XDP_TX, "{ctx}");
            assert_eq!(moved, also(slot), "{ctx}");
            check_answer(want, f, &out);
        }
    }
    let k = match want {
        _ if (unreach || reset) && verdict == XDP_DROP => 6,
        Expect::Pass => 0,
        Expect::Malformed => 1,
        Expect::Steer | Expect::SteerPass => 2,
        Expect::Reset | Expect::SteerReset => 3,
        Expect::Unreach | Expect::SteerUnreach => 4,
        Expect::Cookie => 5,
    };
    seen[k] += 1;
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn every_generated_frame_gets_what_the_model_says() {
    if !root("xdp_random_frames") {
        return;
    }
    let ebpf = loaded();
    let prog: &Xdp = ebpf.program(PROGRAM).unwrap().try_into().unwrap();
    let frames = env("CORELANE_XDP_FRAMES", 30_000);
    let seed = env("CORELANE_XDP_SEED", 0x5eed_f00d);
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // passed, malformed, steered, reset, unreachable, cookie, answers rate-limited
    let mut seen = [0u64; 7];
    for i in 0..frames {
        let f = if i % 5 == 4 {
            let n = 14 + r.below(120);
            r.bytes(n)
        } else {
            frame(&mut r)
        };
        check(&ebpf, prog, &f, &mut seen);
    }
    eprintln!(
        "seed {seed:#x}: {frames} frames: passed {}, malformed {}, steered {}, reset {}, \
         unreachable {} (+{} rate-limited), cookies {}",
        seen[0], seen[1], seen[2], seen[3], seen[4], seen[6], seen[5]
    );
    // The generator reaches every outcome, or the test proves less than it says (the rate
    // limit has its own test below).
    assert!(seen[..6].iter().all(|&n| n > 0), "{seen:?}");
}

#[test]
fn every_truncation_of_answered_and_steered_frames_is_safe() {
    if !root("xdp_random_frames") {
        return;
    }
    let ebpf = loaded();
    let prog: &Xdp = ebpf.program(PROGRAM).unwrap().try_into().unwrap();
    let mut r = Rng(7);
    let mut seen = [0u64; 7];
    let mut whole = Vec::new();
    // Frames the model answers or steers, whole: each then cut at every length.
    while whole.len() < 60 {
        let f = frame(&mut r);
        if matches!(
            expect(&f),
            Expect::Reset
                | Expect::Unreach
                | Expect::Cookie
                | Expect::Steer
                | Expect::SteerPass
                | Expect::SteerReset
                | Expect::SteerUnreach
        ) && (whole.len() % 4 != 0 || f.len() > 60)
        {
            whole.push(f);
        }
    }
    for f in &whole {
        for n in 14..=f.len() {
            check(&ebpf, prog, &f[..n], &mut seen);
        }
    }
    assert!(seen[1] > 0 && seen[3] + seen[4] + seen[5] > 0, "{seen:?}");
}

#[test]
fn closed_port_answers_are_rate_limited() {
    if !root("xdp_random_frames") {
        return;
    }
    let ebpf = loaded();
    let prog: &Xdp = ebpf.program(PROGRAM).unwrap().try_into().unwrap();
    // A well-formed datagram to a closed port, again and again until the program refuses one:
    // at most 50 at once (per CPU) and one a millisecond after that, far slower than these
    // arrive. Each answer and each refusal is checked as above.
    let mut f = Vec::new();
    f.extend_from_slice(&IFACE_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 30, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&CLIENT);
    f.extend_from_slice(&SERVER);
    let c = !fold(sum(&f[14..34]));
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&[0x9c, 0x40, 0x1e, 0x61, 0, 10, 0, 0, 1, 2]);
    assert_eq!(expect(&f), Expect::Unreach);
    let mut seen = [0u64; 7];
    for _ in 0..100_000 {
        check(&ebpf, prog, &f, &mut seen);
        if seen[6] > 0 {
            break;
        }
    }
    assert!(seen[4] >= 50, "the burst is answered: {seen:?}");
    assert_eq!(seen[6], 1, "then one is refused: {seen:?}");
}

#[test]
fn closed_port_resets_are_rate_limited_and_never_sent_to_a_group_or_to_nobody() {
    if !root("xdp_random_frames") {
        return;
    }
    let ebpf = loaded();
    let prog: &Xdp = ebpf.program(PROGRAM).unwrap().try_into().unwrap();
    // An ACK to a closed TCP port (1), from the client: answered with a reset.
    let segment = |src: [u8; 4]| {
        let mut f = Vec::new();
        f.extend_from_slice(&IFACE_MAC);
        f.extend_from_slice(&CLIENT_MAC);
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&SERVER);
        let c = !fold(sum(&f[14..34]));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&[
            0x9c, 0x40, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0x50, 0x10, 0x10, 0,
        ]);
        f.extend_from_slice(&[0, 0, 0, 0]);
        f
    };
    let f = segment(CLIENT);
    assert_eq!(expect(&f), Expect::Reset);
    let mut seen = [0u64; 7];
    for _ in 0..100_000 {
        check(&ebpf, prog, &f, &mut seen);
        if seen[6] > 0 {
            break;
        }
    }
    assert!(seen[3] >= 50, "the burst is answered: {seen:?}");
    assert_eq!(seen[6], 1, "then one is refused: {seen:?}");
    // Unspecified, broadcast and multicast sources: passed unanswered (the kernel, which does
    // not hold the address, drops them), as port unreachables are.
    for src in [
        [0, 0, 0, 0],
        [255, 255, 255, 255],
        [224, 0, 0, 1],
        [239, 1, 2, 3],
    ] {
        let g = segment(src);
        assert_eq!(expect(&g), Expect::Pass, "{src:?}");
        check(&ebpf, prog, &g, &mut seen);
    }
}

/// `f` grown by `extra` bytes of payload with its IP and UDP lengths (and the IPv4 header
/// checksum) kept true, when it is an untagged IPv4 or IPv6 frame whose lengths were exact.
fn grown(f: &[u8], extra: usize) -> Option<Vec<u8>> {
    let mut g = f.to_vec();
    g.extend((0..extra).map(|i| (i % 253) as u8));
    let add = |g: &mut Vec<u8>, at: usize| {
        let v = usize::from(u16::from_be_bytes([g[at], g[at + 1]])) + extra;
        g[at..at + 2].copy_from_slice(&u16::try_from(v).ok()?.to_be_bytes());
        Some(())
    };
    let (l4, proto) = match u16::from_be_bytes([f[12], f[13]]) {
        0x0800 if f.len() >= 34 => {
            let ihl = usize::from(f[14] & 0x0f) * 4;
            if usize::from(u16::from_be_bytes([f[16], f[17]])) != f.len() - 14 {
                return None;
            }
            add(&mut g, 16)?;
            g[24..26].copy_from_slice(&[0, 0]);
            let c = !fold(sum(&g[14..14 + ihl]));
            g[24..26].copy_from_slice(&c.to_be_bytes());
            (14 + ihl, f[23])
        }
        0x86dd if f.len() >= 54 => {
            if usize::from(u16::from_be_bytes([f[18], f[19]])) != f.len() - 54 {
                return None;
            }
            add(&mut g, 18)?;
            (54, f[20])
        }
        _ => return None,
    };
    if proto == 17 && f.len() >= l4 + 8 {
        add(&mut g, l4 + 4)?;
    }
    Some(g)
}

#[test]
fn jumbo_frames_in_several_buffers_are_judged_and_answered_whole() {
    if !root("xdp_random_frames") {
        return;
    }
    // The program is a multi-buffer one: BPF_PROG_TEST_RUN hands it a frame longer than a page
    // in several buffers, as a veth or NIC at MTU 9000 does. Answers shrink the frame to its
    // headers (every buffer after the first dropped) and steered frames keep every byte.
    let ebpf = loaded();
    let prog: &Xdp = ebpf.program(PROGRAM).unwrap().try_into().unwrap();
    let mut r = Rng(9000);
    let mut seen = [0u64; 7];
    let mut tried = 0;
    while seen[2] + seen[3] + seen[4] + seen[5] < 200 && tried < 200_000 {
        tried += 1;
        let f = frame(&mut r);
        let kind = expect(&f);
        if !matches!(
            kind,
            Expect::Reset
                | Expect::Unreach
                | Expect::Steer
                | Expect::SteerReset
                | Expect::SteerUnreach
        ) {
            continue;
        }
        let Some(g) = grown(&f, 9014 - f.len().min(9014)) else {
            continue;
        };
        if expect(&g) != kind {
            continue;
        }
        check(&ebpf, prog, &g, &mut seen);
    }
    eprintln!("{tried} generated, jumbo outcomes {seen:?}");
    assert!(seen[2] > 0 && seen[3] > 0 && seen[4] > 0, "{seen:?}");
}

/// `f` with an 802.1Q tag carrying `tci` after its addresses.
fn tagged(f: &[u8], tci: u16) -> Vec<u8> {
    let mut g = f[..12].to_vec();
    g.extend_from_slice(&[0x81, 0x00]);
    g.extend_from_slice(&tci.to_be_bytes());
    g.extend_from_slice(&f[12..]);
    g
}

/// Runs `n` generated frames through `plain` (serving untagged frames) and, wrapped in the
/// tags `wrap` adds, through `tagged`: the same verdict and the same frame out with the tags
/// put back (only the closed-port rate limit, per program and by time, may tell them apart).
/// Each of `others(f)` must pass `tagged` untouched. Returns the counts of frames passed,
/// answered, rate-limited apart and left alone.
fn same_as_untagged(
    plain: &Xdp,
    tagged: &Xdp,
    seed: u64,
    wrap: impl Fn(&[u8]) -> Vec<u8>,
    others: impl Fn(&[u8]) -> Vec<Vec<u8>>,
) -> [u64; 4] {
    let mut r = Rng(seed);
    let mut same = [0u64; 4];
    for _ in 0..3000 {
        let f = frame(&mut r);
        if f.len() < 14 {
            continue;
        }
        let (pv, pout) = run(plain, &f);
        let (tv, tout) = run(tagged, &wrap(&f));
        if pv != tv {
            assert!(
                matches!((pv, tv), (XDP_TX, XDP_DROP) | (XDP_DROP, XDP_TX)),
                "verdicts {pv} / {tv} for {f:02x?}"
            );
            same[2] += 1;
            continue;
        }
        match pv {
            XDP_PASS | XDP_TX => {
                assert_eq!(tout, wrap(&pout), "verdict {pv} for {f:02x?}");
                same[usize::from(pv == XDP_TX)] += 1;
            }
            XDP_DROP => {}
            other => panic!("verdict {other} for {f:02x?}"),
        }
        for g in others(&f) {
            let (gv, gout) = run(tagged, &g);
            assert_eq!((gv, &gout), (XDP_PASS, &g), "not this VLAN's: {g:02x?}");
            same[3] += 1;
        }
    }
    eprintln!(
        "passed {}, answered {}, rate-limited apart {}, left alone {}",
        same[0], same[1], same[2], same[3]
    );
    assert!(same[0] > 0 && same[1] > 0, "{same:?}");
    same
}

#[test]
fn a_vlan_program_judges_its_tagged_frames_as_untagged_ones_and_leaves_the_rest() {
    if !root("xdp_random_frames") {
        return;
    }
    // The same generated frames through a program serving untagged frames and, tagged, through
    // one serving VLAN 100 (no socket here, so what would be steered passes). Untagged frames
    // and VLAN 200's pass the VLAN program untouched.
    let plain = loaded();
    let vlan = loaded_vlan(100);
    let p: &Xdp = plain.program(PROGRAM).unwrap().try_into().unwrap();
    let v: &Xdp = vlan.program(PROGRAM).unwrap().try_into().unwrap();
    let tci = 0x2000 | 100; // priority 1, VLAN 100
    same_as_untagged(
        p,
        v,
        802,
        |f| tagged(f, tci),
        |f| vec![f.to_vec(), tagged(f, 200)],
    );
}

/// `f` with an 802.1ad service tag carrying `outer` and, inside it, an 802.1Q tag carrying
/// `inner` after its addresses.
fn double_tagged(f: &[u8], outer: u16, inner: u16) -> Vec<u8> {
    let mut g = f[..12].to_vec();
    g.extend_from_slice(&[0x88, 0xa8]);
    g.extend_from_slice(&outer.to_be_bytes());
    g.extend_from_slice(&tagged(f, inner)[12..]);
    g
}

#[test]
fn a_qinq_program_judges_its_double_tagged_frames_as_untagged_ones_and_leaves_the_rest() {
    if !root("xdp_random_frames") {
        return;
    }
    // As the VLAN test, with VLAN 100 inside service VLAN 200: both tags put back in order.
    // Untagged frames, VLAN 100 without the service tag, service VLAN 300 around VLAN 100,
    // service VLAN 200 around VLAN 101, and the tags in the wrong order pass untouched.
    let plain = loaded();
    let qinq = loaded_tags(corelane_xsk::Vlan::qinq(200, 100));
    let p: &Xdp = plain.program(PROGRAM).unwrap().try_into().unwrap();
    let q: &Xdp = qinq.program(PROGRAM).unwrap().try_into().unwrap();
    let (outer, inner) = (0x4000 | 200, 0x2000 | 100); // with priorities
    same_as_untagged(
        p,
        q,
        88,
        |f| double_tagged(f, outer, inner),
        |f| {
            let mut swapped = f[..12].to_vec();
            swapped.extend_from_slice(&[0x81, 0x00, 0, 100, 0x88, 0xa8, 0, 200]);
            swapped.extend_from_slice(&f[12..]);
            vec![
                f.to_vec(),
                tagged(f, 100),
                double_tagged(f, 300, 100),
                double_tagged(f, 200, 101),
                swapped,
            ]
        },
    );
}
