//! A seeded fuzzer of the receive path: random segments (any flags, sequence and ACK numbers
//! near and far, windows, timestamps, SACK blocks, payloads) into connections in every state,
//! with the application reading, writing and closing in between and the clock jumping.
//! Nothing may panic, and whatever goes out stays within a segment.

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::TcpControl;

use super::conformance::{PAYLOAD, PEER_ISN, Script, cfg, ends, seg, sizes};
use super::conn::Conn;
use super::secret::Secret;

/// A seeded generator (xorshift) for the fuzzer.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[test]
fn random_segments_never_panic_in_any_state() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for round in 0..300 {
        let (mut s, una) = if round % 3 == 0 {
            let now = Instant::from_secs(5);
            let c = Conn::connect(cfg(), &Secret::new(round), ends().0, ends().1, sizes(), now);
            let mut s = Script { c, now };
            s.out();
            let iss = s.c.iss.0;
            (s, iss.wrapping_add(1))
        } else {
            Script::established(round % 2 == 0)
        };
        if round % 5 == 0 {
            s.c.write(&[4u8; 20_000]);
        }
        if round % 7 == 0 {
            s.c.close();
        }
        for _ in 0..400 {
            let near = |rng: &mut Rng, base: u32| -> u32 {
                match rng.below(4) {
                    0 => rng.next() as u32,
                    _ => base
                        .wrapping_add(rng.below(40_000) as u32)
                        .wrapping_sub(20_000),
                }
            };
            let mut g = seg(near(&mut rng, PEER_ISN + 1), near(&mut rng, una));
            g.ctl = match rng.below(10) {
                0 => TcpControl::Syn,
                1 => TcpControl::Fin,
                2 => TcpControl::Rst,
                3 => TcpControl::Psh,
                _ => TcpControl::None,
            };
            if rng.below(8) == 0 {
                g.ack = None;
            }
            g.window = rng.next() as u16;
            g.len = rng.below(PAYLOAD.len() as u64 + 1) as usize;
            if rng.below(2) == 0 {
                g.ts = Some((rng.next() as u32, rng.next() as u32));
            }
            for b in 0..rng.below(4) as usize {
                let l = near(&mut rng, una);
                g.sack[b] = Some((l, l.wrapping_add(rng.below(20_000) as u32)));
            }
            g.syn_opts = rng.below(4) == 0;
            // ECN marks and flags at random: negotiated or not, none may upset the engine.
            let bits = rng.below(8);
            let ecn = super::ecn::EcnIn::of((bits & 1) as u8 * 3, (bits as u8 >> 1) << 6);
            if round % 3 == 0 {
                s.c.ecn_on_syn(ecn);
            }
            let r = Script::repr(&g);
            s.c.input_ecn(s.now, &r, ecn);
            match rng.below(6) {
                0 => s.advance(Duration::from_millis(rng.below(3000))),
                1 => {
                    let mut buf = [0u8; 3000];
                    let now = s.now;
                    s.c.read(now, &mut buf);
                }
                2 => {
                    s.c.write(&[5u8; 3000]);
                }
                _ => {}
            }
            let out = s.out();
            // Whatever it sends is well formed: payload within the send window's bounds.
            assert!(out.iter().all(|o| o.len <= 1000), "{out:?}");
        }
    }
}
