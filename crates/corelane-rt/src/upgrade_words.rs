//! What the two processes of an upgrade say to each other, each as one type written and read
//! here alone: the words of the exchange ([`Word`]), and what the old process tells the new
//! one besides the hand-over ([`Extras`]: the run's secret, the generation of the new
//! process's sockets, the TCP ports the old one listens on and the queue count to put back at
//! the end).

/// A word of the upgrade's exchange, after the hand-over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Word {
    /// The new process: every queue joined; switch the program to me.
    Joined,
    /// The old process: the program switched; serve, I drain and end.
    Switched,
    /// Either: the upgrade is called off, and why.
    Error(String),
    /// Anything else (what a process of another version may say): never acted on as one of
    /// the above.
    Other(String),
}

impl Word {
    /// The word as it goes over the connection.
    pub(crate) fn to_text(&self) -> String {
        match self {
            Word::Joined => "joined".into(),
            Word::Switched => "switched".into(),
            Word::Error(why) => format!("error {why}"),
            Word::Other(w) => w.clone(),
        }
    }

    /// A word as it came over the connection.
    pub(crate) fn parse(text: &str) -> Word {
        match text {
            "joined" => Word::Joined,
            "switched" => Word::Switched,
            "error" => Word::Error(String::new()),
            _ => match text.strip_prefix("error ") {
                Some(why) => Word::Error(why.to_string()),
                None => Word::Other(text.to_string()),
            },
        }
    }
}

/// The run's secret as the old process passes it on: the 128-bit key its stacks draw every
/// key from, or the seed a run fixed for reproducibility.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunSecret {
    Key([u64; 2]),
    Seed(u64),
}

impl RunSecret {
    /// What a run's stack configuration holds.
    pub(crate) fn of(cfg: &corelane_stack::StackConfig) -> RunSecret {
        match (cfg.key, cfg.seed) {
            (Some(k), _) => RunSecret::Key(k),
            (None, s) => RunSecret::Seed(s.unwrap_or_default()),
        }
    }

    /// Puts it in a run's stack configuration.
    pub(crate) fn apply(self, cfg: &mut corelane_stack::StackConfig) {
        match self {
            RunSecret::Key(k) => cfg.key = Some(k),
            RunSecret::Seed(s) => {
                cfg.key = None;
                cfg.seed = Some(s);
            }
        }
    }
}

/// What the old process tells the new one besides the hand-over: the run's secret, the
/// generation the new one's sockets take, and the queues to put back at the end.
pub(crate) struct Extras {
    pub(crate) secret: RunSecret,
    pub(crate) generation: u32,
    pub(crate) channels: Option<crate::host::data::Channels>,
    /// The TCP ports the old process listens on.
    pub(crate) ports: Vec<u16>,
}

impl Extras {
    pub(crate) fn to_text(&self) -> String {
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        let secret = match self.secret {
            RunSecret::Key([a, b]) => format!("key {a:016x}{b:016x}"),
            RunSecret::Seed(x) => format!("seed {x:x}"),
        };
        let mut s = format!(
            "runtime {secret} generation {} ports {}",
            self.generation,
            if ports.is_empty() {
                "-".into()
            } else {
                ports.join(",")
            }
        );
        if let Some(c) = self.channels {
            s.push_str(&format!(
                " channels {} {} {} {} {} {}",
                c.rx, c.tx, c.combined, c.max_rx, c.max_tx, c.max_combined
            ));
        }
        s
    }

    pub(crate) fn parse(text: &str) -> Option<Extras> {
        let w: Vec<&str> = text.split_ascii_whitespace().collect();
        if w.first() != Some(&"runtime") || w.get(3) != Some(&"generation") {
            return None;
        }
        let value = *w.get(2)?;
        let secret = match *w.get(1)? {
            "key" if value.len() == 32 && value.is_ascii() => RunSecret::Key([
                u64::from_str_radix(&value[..16], 16).ok()?,
                u64::from_str_radix(&value[16..], 16).ok()?,
            ]),
            "seed" => RunSecret::Seed(u64::from_str_radix(value, 16).ok()?),
            _ => return None,
        };
        let generation: u32 = w.get(4)?.parse().ok()?;
        if w.get(5) != Some(&"ports") {
            return None;
        }
        let ports = match *w.get(6)? {
            "-" => Vec::new(),
            list => list
                .split(',')
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u16>>>()?,
        };
        let channels = match w.get(7) {
            None => None,
            Some(&"channels") => {
                let n: Vec<u32> = w[8..]
                    .iter()
                    .map(|v| v.parse().ok())
                    .collect::<Option<_>>()?;
                let [rx, tx, combined, max_rx, max_tx, max_combined] = n[..] else {
                    return None;
                };
                Some(crate::host::data::Channels {
                    rx,
                    tx,
                    combined,
                    max_rx,
                    max_tx,
                    max_combined,
                })
            }
            Some(_) => return None,
        };
        (generation < crate::host::data::GENERATIONS).then_some(Extras {
            secret,
            generation,
            channels,
            ports,
        })
    }
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;

/// The upgrade's words as a fuzz target (`corelane-fuzz --target upgrade-words`): what the
/// other process sent, as any bytes, read as a [`Word`] and as [`Extras`] without a panic,
/// and what reads as either written back and read again to the same thing.
pub(crate) fn fuzz(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    for line in text.split('\n') {
        let word = Word::parse(line);
        assert_eq!(Word::parse(&word.to_text()), word, "{line:?}");
        if let Some(e) = Extras::parse(line) {
            let again = Extras::parse(&e.to_text()).expect("written extras read back");
            assert_eq!(again.to_text(), e.to_text(), "{line:?}");
        }
    }
}
