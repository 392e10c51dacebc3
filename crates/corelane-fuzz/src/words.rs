//! The two line protocols between processes as fuzz targets: the grant protocol's requests
//! (`corelane_xsk::grant::Request`, read by the broker from any process its socket lets in)
//! and the upgrade's words (`corelane_rt::fuzzing::upgrade_words`, read by each process of
//! an upgrade from the other). An input is a few lines of text; each line must read as a
//! message or an error, never a panic, and what reads as a message must be written back to
//! text that reads as the same message.

use corelane_xsk::grant::Request;

/// Which protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Words {
    Grant,
    Upgrade,
}

impl Words {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Words::Grant => "grant",
            Words::Upgrade => "upgrade-words",
        }
    }

    pub(crate) fn run(self, input: &[u8]) {
        match self {
            Words::Grant => grant(input),
            Words::Upgrade => corelane_rt::fuzzing::upgrade_words(input),
        }
    }

    /// Every kind of message, as the processes write them.
    pub(crate) fn seeds(self) -> Vec<Vec<u8>> {
        let lines: &[&str] = match self {
            Words::Grant => &[
                "addr 10.0.0.1",
                "addr fd00::1 shared",
                "unaddr 10.0.0.1",
                "port tcp 443",
                "unport udp 53",
                "queue 3",
                "queue 3 1",
                "channels 4",
                "neigh 10.0.0.2",
                "counters",
                "stats 65536",
                "vlan",
                "restart-key",
                "capture 1048576",
                "upgrade-state",
                "upgrade 1 1",
                "keep [fd00::2]:40000 80 0",
                "forget 10.0.0.2:40000 80",
            ],
            Words::Upgrade => &[
                "joined",
                "switched",
                "error the new process could not join queue 1",
                "runtime key 000000000000000100000000000000ff generation 1 ports 80,443",
                "runtime seed 2a generation 0 ports - channels 0 0 4 0 0 8",
            ],
        };
        let mut seeds: Vec<Vec<u8>> = lines.iter().map(|l| l.as_bytes().to_vec()).collect();
        seeds.push(lines.join("\n").into_bytes());
        seeds
    }

    /// A mutation of `base`: words swapped in from `other`, numbers pushed to their edges,
    /// bytes flipped, cut short.
    pub(crate) fn mutate(
        self,
        r: &mut impl FnMut(usize) -> usize,
        base: &[u8],
        other: &[u8],
    ) -> Vec<u8> {
        let text = String::from_utf8_lossy(base);
        let mut words: Vec<String> = text.split(' ').map(str::to_string).collect();
        let others: Vec<&[u8]> = other.split(|b| *b == b' ').collect();
        for _ in 0..1 + r(3) {
            let i = r(words.len());
            match r(6) {
                0 => {
                    words[i] = String::from_utf8_lossy(others[r(others.len())]).into_owned();
                }
                1 => {
                    words[i] =
                        ["0", "65535", "65536", "4294967296", "-1", "+7", "", "::"][r(8)].into()
                }
                2 => words.insert(i, words[i].clone()),
                3 if words.len() > 1 => {
                    words.remove(i);
                }
                _ => {}
            }
        }
        let mut v = words.join(" ").into_bytes();
        if !v.is_empty() && r(3) == 0 {
            let i = r(v.len());
            v[i] ^= 1 << r(8);
        }
        if !v.is_empty() && r(5) == 0 {
            v.truncate(r(v.len()));
        }
        v
    }
}

/// Each line read as a request; one that reads is written and read back the same.
fn grant(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    for line in text.split('\n') {
        if let Ok(r) = Request::parse(line) {
            assert_eq!(Request::parse(&r.to_text()), Ok(r), "{line:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Words;

    /// The seeds and a few thousand mutations of each protocol, each read without a panic
    /// and written back the same.
    #[test]
    fn crafted_lines_are_messages_or_errors_and_messages_read_back_the_same() {
        for w in [Words::Grant, Words::Upgrade] {
            let seeds = w.seeds();
            assert!(seeds.len() > 4, "{}: seeds", w.name());
            let mut s = 0x5eed_u64;
            let mut r = |n: usize| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % n.max(1) as u64) as usize
            };
            for k in 0..5_000 {
                let (a, b) = (&seeds[k % seeds.len()], &seeds[(k * 7 + 1) % seeds.len()]);
                let input = w.mutate(&mut r, a, b);
                w.run(&input);
            }
        }
    }
}
