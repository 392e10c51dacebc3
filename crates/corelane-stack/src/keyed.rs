//! SipHash (Aumasson and Bernstein, 2012) under a secret key: SipHash-2-4 over whole words for
//! the stack's secrets, and a streaming SipHash-1-3 `Hasher` for the hash tables indexed by
//! what a peer chooses (flows, neighbours, fragments). With a key the peer cannot know, it
//! cannot craft addresses that collide in a table and make each lookup walk a long chain.

use std::hash::{BuildHasher, Hasher};

const INIT: [u64; 4] = [
    0x736f_6d65_7073_6575,
    0x646f_7261_6e64_6f6d,
    0x6c79_6765_6e65_7261,
    0x7465_6462_7974_6573,
];

#[inline]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

#[inline]
fn start(k: (u64, u64)) -> [u64; 4] {
    [k.0 ^ INIT[0], k.1 ^ INIT[1], k.0 ^ INIT[2], k.1 ^ INIT[3]]
}

#[inline]
fn compress(v: &mut [u64; 4], m: u64, rounds: usize) {
    v[3] ^= m;
    for _ in 0..rounds {
        round(v);
    }
    v[0] ^= m;
}

#[inline]
fn finish(v: &mut [u64; 4], rounds: usize) -> u64 {
    v[2] ^= 0xff;
    for _ in 0..rounds {
        round(v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// SipHash-2-4 of a message of whole 64-bit words (little-endian) under `k`.
pub(crate) fn siphash(k: (u64, u64), words: &[u64]) -> u64 {
    let mut v = start(k);
    for &w in words {
        compress(&mut v, w, 2);
    }
    // The final block: the message length in bytes in the top byte.
    compress(&mut v, ((words.len() * 8) as u64) << 56, 2);
    finish(&mut v, 4)
}

/// Builds [`KeyedHasher`]s under one key: the `BuildHasher` of the stack's tables.
#[derive(Clone, Copy)]
pub struct KeyedState {
    k: (u64, u64),
}

impl std::fmt::Debug for KeyedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyedState(..)")
    }
}

impl KeyedState {
    /// Hashers under key `k`.
    pub(crate) fn new(k: (u64, u64)) -> KeyedState {
        KeyedState { k }
    }

    /// Hashers under a fresh key from the OS (or, should it have none to give, from the
    /// standard library's per-process random keys).
    pub fn random() -> KeyedState {
        let mut b = [0u8; 16];
        if getrandom::fill(&mut b).is_err() {
            let h = |x: u64| std::hash::RandomState::new().hash_one(x);
            b[..8].copy_from_slice(&h(1).to_le_bytes());
            b[8..].copy_from_slice(&h(2).to_le_bytes());
        }
        let (lo, hi) = b.split_at(8);
        let w = |s: &[u8]| s.iter().rev().fold(0u64, |a, &x| a << 8 | u64::from(x));
        KeyedState { k: (w(lo), w(hi)) }
    }
}

impl Default for KeyedState {
    fn default() -> Self {
        KeyedState::random()
    }
}

impl BuildHasher for KeyedState {
    type Hasher = KeyedHasher;

    #[inline]
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher {
            v: start(self.k),
            tail: 0,
            ntail: 0,
            len: 0,
        }
    }
}

/// Streaming SipHash-1-3 under a [`KeyedState`]'s key.
#[derive(Debug, Clone)]
pub struct KeyedHasher {
    v: [u64; 4],
    tail: u64,
    ntail: usize,
    len: usize,
}

impl KeyedHasher {
    /// Appends the `n` (1 to 8) low bytes of `x`, least significant first, to the message.
    #[inline]
    fn push(&mut self, x: u64, n: usize) {
        self.len += n;
        let fill = self.ntail;
        self.tail |= x << (8 * fill);
        if fill + n < 8 {
            self.ntail = fill + n;
            return;
        }
        compress(&mut self.v, self.tail, 1);
        // The bytes of `x` that did not fit start the next word.
        let used = 8 - fill;
        self.tail = if used == 8 { 0 } else { x >> (8 * used) };
        self.ntail = fill + n - 8;
    }
}

impl Hasher for KeyedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.push(u64::from_le_bytes(b), 8);
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let w = rest.iter().rev().fold(0u64, |a, &x| a << 8 | u64::from(x));
            self.push(w, rest.len());
        }
    }

    #[inline]
    fn write_u8(&mut self, x: u8) {
        self.push(u64::from(x), 1);
    }

    #[inline]
    fn write_u16(&mut self, x: u16) {
        self.push(u64::from(x), 2);
    }

    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.push(u64::from(x), 4);
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.push(x, 8);
    }

    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.push(x as u64, std::mem::size_of::<usize>());
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut v = self.v;
        compress(&mut v, self.tail | ((self.len as u64) << 56), 1);
        finish(&mut v, 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (u64, u64) {
        (
            u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]),
            u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]),
        )
    }

    #[test]
    fn siphash24_matches_the_reference_vectors() {
        // The reference implementation's table: key 00..0f; the empty message hashes to
        // 726fdb47dd0e0e31, the 8-byte message 00..07 to 93f5f5799a932462.
        let m = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(siphash(key(), &[m]), 0x93f5_f579_9a93_2462);
        assert_eq!(siphash(key(), &[]), 0x726f_db47_dd0e_0e31);
    }

    #[test]
    fn siphash13_streams_whatever_the_pieces() {
        let s = KeyedState::new(key());
        let msg: Vec<u8> = (0..37u8).collect();
        let whole = {
            let mut h = s.build_hasher();
            h.write(&msg);
            h.finish()
        };
        for cut in [0, 1, 7, 8, 9, 20, 37] {
            let mut h = s.build_hasher();
            h.write(&msg[..cut]);
            h.write(&msg[cut..]);
            assert_eq!(h.finish(), whole, "cut at {cut}");
        }
        // Integers are their little-endian bytes, wherever the stream stands.
        for lead in 0..9usize {
            let mut bytes = h_bytes(&s, &msg[..lead]);
            bytes.write(&0x0102_0304u32.to_le_bytes());
            bytes.write(&0xa1a2_a3a4_a5a6_a7a8u64.to_le_bytes());
            bytes.write(&[9]);
            let mut ints = h_bytes(&s, &msg[..lead]);
            ints.write_u32(0x0102_0304);
            ints.write_u64(0xa1a2_a3a4_a5a6_a7a8);
            ints.write_u8(9);
            assert_eq!(ints.finish(), bytes.finish(), "after {lead} bytes");
        }
        // Another key, another hash; another message, another hash.
        let mut h = KeyedState::new((1, 2)).build_hasher();
        h.write(&msg);
        assert_ne!(h.finish(), whole);
        let mut h = s.build_hasher();
        h.write(&msg[1..]);
        assert_ne!(h.finish(), whole);
    }

    fn h_bytes(s: &KeyedState, lead: &[u8]) -> KeyedHasher {
        let mut h = s.build_hasher();
        h.write(lead);
        h
    }

    #[test]
    fn random_states_differ() {
        let (a, b) = (KeyedState::random(), KeyedState::random());
        assert_ne!(a.hash_one(7u64), b.hash_one(7u64));
    }
}
