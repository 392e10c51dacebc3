//! Frames built from the protocols' structure for the program's tests: IPv4 options, IPv6
//! extension headers, VLAN tags, TCP options with bad lengths, every TCP flag, fragments,
//! group and foreign MACs, unspecified and multicast sources, then some mutated and cut short;
//! a fifth are random bytes.

use super::*;

/// xorshift64*: a fixed sequence per seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// TCP options: well-formed ones, NOPs, an end, and bad lengths, padded to a multiple of 4.
fn tcp_options(r: &mut Rng) -> Vec<u8> {
    let mut o = Vec::new();
    for _ in 0..r.below(5) {
        match r.below(8) {
            0 => o.extend_from_slice(&[2, 4, 5, 180]),
            1 => o.extend_from_slice(&[3, 3, r.below(20) as u8]),
            2 => o.extend_from_slice(&[4, 2]),
            3 => o.extend_from_slice(&[8, 10, 0, 0, 0, 7, 0, 0, 0, 0]),
            4 => o.push(1),
            5 => o.push(0),
            6 => o.extend_from_slice(&[r.pick(&[2, 3, 4, 8, 5]), r.pick(&[0, 1, 255, 40])]),
            _ => {
                let n = r.below(6);
                o.extend(r.bytes(n));
            }
        }
    }
    o.truncate(40);
    while o.len() % 4 != 0 {
        o.push(1);
    }
    o
}

/// The start of an IPv4 or IPv6 packet sent from here, as an ICMP error quotes it: its header
/// and the ports (from an owned port or another), sometimes cut short.
fn quote(r: &mut Rng, v4: bool) -> Vec<u8> {
    let any = r.next() as u8;
    let proto = r.pick(&[6, 6, 17, 17, 1, any]);
    let mut q = if v4 {
        let mut h = vec![0u8; 20];
        h[0] = if r.chance(90) { 0x45 } else { 0x46 };
        h[9] = proto;
        h[12..16].copy_from_slice(&SERVER);
        h[16..20].copy_from_slice(&CLIENT);
        h
    } else {
        let mut h = vec![0u8; 40];
        h[0] = 0x60;
        h[6] = proto;
        h[8..24].copy_from_slice(&SHARED6);
        h[24..40].copy_from_slice(&CLIENT6);
        h
    };
    let any = r.next() as u16;
    let sport = r.pick(&[COOKIE_PORT, TCP_PORT, UDP_PORT, 9, any]);
    q.extend_from_slice(&sport.to_be_bytes());
    q.extend(r.bytes(6));
    let n = q.len();
    q.truncate(n - r.pick(&[0, 0, 0, 3, 8]));
    q
}

fn l4_segment(r: &mut Rng, proto: u8) -> Vec<u8> {
    let any = r.next() as u16;
    let port = r.pick(&[COOKIE_PORT, COOKIE_PORT, TCP_PORT, UDP_PORT, 9, 7777, any]);
    match proto {
        6 => {
            let opts = tcp_options(r);
            let mut t = vec![0u8; 20];
            t[..2].copy_from_slice(&(r.next() as u16).to_be_bytes());
            t[2..4].copy_from_slice(&port.to_be_bytes());
            t[4..12].copy_from_slice(&r.bytes(8));
            let doff = if r.chance(85) {
                (20 + opts.len()) / 4
            } else {
                r.below(16)
            };
            t[12] = (doff as u8) << 4;
            let any = r.next() as u8;
            t[13] = if r.chance(50) {
                r.pick(&[
                    0x02, 0x02, 0x02, 0x10, 0x12, 0x04, 0x14, 0x11, 0x18, 0x03, any,
                ])
            } else {
                any
            };
            t[14..16].copy_from_slice(&(r.next() as u16).to_be_bytes());
            t.extend(opts);
            let n = r.pick(&[0, 0, 1, 10, 200]);
            t.extend(r.bytes(n));
            t
        }
        17 => {
            let payload = r.below(64);
            let mut u = vec![0u8; 8];
            u[..2].copy_from_slice(&(r.next() as u16).to_be_bytes());
            u[2..4].copy_from_slice(&port.to_be_bytes());
            let len = if r.chance(85) {
                8 + payload
            } else {
                r.below(200)
            };
            u[4..6].copy_from_slice(&(len as u16).to_be_bytes());
            u.extend(r.bytes(payload));
            u
        }
        1 if r.chance(40) => {
            // An error quoting a segment or datagram sent from here.
            let mut i = vec![r.pick(&[3, 11, 0, 8]), 0, 0, 0, 0, 0, 0, 0];
            i.extend(quote(r, true));
            i
        }
        _ => {
            let n = r.below(64);
            r.bytes(n)
        }
    }
}

pub fn frame(r: &mut Rng) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&r.pick(&[
        IFACE_MAC,
        IFACE_MAC,
        IFACE_MAC,
        [2, 0, 0, 0, 0, 3],
        [0xff; 6],
        [0x01, 0, 0x5e, 0, 0, 1],
        [0x33, 0x33, 0xff, 0, 0, 3],
    ]));
    f.extend_from_slice(&r.pick(&[CLIENT_MAC, CLIENT_MAC, CLIENT_MAC, [0x01, 0, 0x5e, 0, 0, 9]]));
    for _ in 0..[0, 0, 0, 0, 1, 2][r.below(6)] {
        f.extend_from_slice(&r.pick(&[0x8100u16, 0x88a8]).to_be_bytes());
        f.extend_from_slice(&(r.next() as u16 & 0x0fff).to_be_bytes());
    }
    match r.below(10) {
        0 => {
            f.extend_from_slice(&[0x08, 0x06]);
            let mut a = vec![0, 1, 8, 0, 6, 4, 0, r.pick(&[1, 2])];
            if r.chance(10) {
                a[r.below(6)] ^= 1 << r.below(8);
            }
            a.extend_from_slice(&CLIENT_MAC);
            a.extend_from_slice(&CLIENT);
            a.extend_from_slice(&[0; 6]);
            a.extend_from_slice(&r.pick(&[SERVER, SERVER, SHARED, [10, 88, 0, 7]]));
            f.extend(a);
        }
        1..=5 => {
            f.extend_from_slice(&[0x08, 0x00]);
            let any = r.next() as u8;
            let proto = r.pick(&[6, 6, 6, 17, 17, 1, 47, any]);
            let ihl = if r.chance(80) { 5 } else { r.below(16) };
            let opts = (ihl.max(5) - 5) * 4;
            let body = l4_segment(r, proto);
            let mut ip = vec![0u8; 20];
            ip[0] = if r.chance(95) {
                0x40
            } else {
                (r.next() as u8) & 0xf0
            } | ihl as u8;
            let tot = if r.chance(85) {
                20 + opts + body.len()
            } else {
                r.below(1600)
            };
            ip[2..4].copy_from_slice(&(tot as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&(r.next() as u16).to_be_bytes());
            let any = r.next() as u16;
            let frag = r.pick(&[0, 0, 0, 0x4000, 0x2000, 0x0010, any]);
            ip[6..8].copy_from_slice(&frag.to_be_bytes());
            ip[8] = r.pick(&[64, 1, 0, 255]);
            ip[9] = proto;
            ip[12..16].copy_from_slice(&r.pick(&[
                CLIENT,
                CLIENT,
                CLIENT,
                [0; 4],
                [255; 4],
                [224, 0, 0, 1],
            ]));
            ip[16..20].copy_from_slice(&r.pick(&[SERVER, SERVER, SHARED, SHARED, [10, 88, 0, 7]]));
            let c = !fold(sum(&ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            ip.extend(r.bytes(opts));
            f.extend(ip);
            f.extend(body);
        }
        6..=8 => {
            f.extend_from_slice(&[0x86, 0xdd]);
            let any = r.next() as u8;
            let next = r.pick(&[6, 6, 17, 17, 58, 58, 0, 43, 44, 60, 59, any]);
            let body = if next == 58 {
                let any = r.next() as u8;
                let mut i = vec![r.pick(&[135, 136, 128, 129, 1, 2, any]), 0, 0, 0];
                i.extend(r.bytes(4));
                i.extend_from_slice(&r.pick(&[SERVER6, SERVER6, SHARED6, CLIENT6]));
                let n = r.below(16);
                i.extend(r.bytes(n));
                if r.chance(30) {
                    // An error quoting a segment or datagram sent from here.
                    i.truncate(8);
                    i[0] = r.pick(&[1, 2, 3, 4]);
                    i.extend(quote(r, false));
                }
                i
            } else {
                l4_segment(r, next)
            };
            let mut ip = vec![0u8; 40];
            ip[0] = if r.chance(95) { 0x60 } else { r.next() as u8 };
            let len = if r.chance(85) {
                body.len()
            } else {
                r.below(1600)
            };
            ip[4..6].copy_from_slice(&(len as u16).to_be_bytes());
            ip[6] = next;
            ip[7] = r.pick(&[255, 64, 1]);
            ip[8..24].copy_from_slice(&r.pick(&[
                CLIENT6,
                CLIENT6,
                CLIENT6,
                [0; 16],
                [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            ]));
            ip[24..40].copy_from_slice(&r.pick(&[SERVER6, SERVER6, SHARED6, SHARED6, CLIENT6]));
            f.extend(ip);
            f.extend(body);
        }
        _ => {
            f.extend_from_slice(&(r.next() as u16).to_be_bytes());
            let n = r.below(100);
            f.extend(r.bytes(n));
        }
    }
    if r.chance(15) {
        for _ in 0..1 + r.below(4) {
            let i = r.below(f.len());
            f[i] ^= 1 << r.below(8);
        }
    }
    if r.chance(25) {
        f.truncate(14 + r.below(f.len() - 13));
    }
    f
}
