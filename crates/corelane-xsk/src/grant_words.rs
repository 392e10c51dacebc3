//! The grant protocol's requests, written by the server's [`GrantClient`](crate::GrantClient)
//! and read by `corelane-broker`, as one type: each request has one spelling, made and read
//! here alone (`to_text` and `parse` are each other's inverse: `grant_words_tests.rs`).

use std::net::{IpAddr, SocketAddr};

use corelane_frame::Proto;

/// What a granted server asks of the broker after its hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Steer `addr` to the server (`shared`: only its ports, the kernel keeping the rest).
    Addr {
        /// The address.
        addr: IpAddr,
        /// Shared with the kernel.
        shared: bool,
    },
    /// Stop steering an address.
    Unaddr(IpAddr),
    /// Steer a port to the server (`on`), or stop.
    Port {
        /// TCP or UDP.
        proto: Proto,
        /// The port.
        port: u16,
        /// Steer it (true) or stop (false).
        on: bool,
    },
    /// Register the AF_XDP socket passed with the request for `queue` (in `generation`,
    /// during an upgrade).
    Queue {
        /// The queue.
        queue: u32,
        /// The upgrade generation it serves (None: the current one).
        generation: Option<u32>,
    },
    /// Give the interface this many receive queues.
    Channels(u32),
    /// What the program noted of a shared address's neighbour.
    Neigh(IpAddr),
    /// The program's counters.
    Counters,
    /// A stats file of this many bytes.
    Stats(u64),
    /// The VLAN the program serves.
    Vlan,
    /// The server's user's restart key.
    RestartKey,
    /// A capture file of this many bytes.
    Capture(u64),
    /// The upgrade's current generation and whether frames are split.
    UpgradeState,
    /// Set the upgrade's current generation and split.
    Upgrade {
        /// The generation new flows go to.
        current: u32,
        /// Whether kept flows go to the other generation.
        split: bool,
    },
    /// Keep a flow (`peer` to local port `port`) on `generation` while frames are split.
    Keep {
        /// The peer's address and port.
        peer: SocketAddr,
        /// The local port.
        port: u16,
        /// The generation that keeps it.
        generation: u32,
    },
    /// Stop keeping a flow.
    Forget {
        /// The peer's address and port.
        peer: SocketAddr,
        /// The local port.
        port: u16,
    },
}

/// `tcp` or `udp`, as the protocol spells them.
pub fn proto_name(p: Proto) -> &'static str {
    match p {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
    }
}

impl Request {
    /// The request as it goes over the grant socket.
    pub fn to_text(&self) -> String {
        match self {
            Request::Addr {
                addr,
                shared: false,
            } => format!("addr {addr}"),
            Request::Addr { addr, shared: true } => format!("addr {addr} shared"),
            Request::Unaddr(a) => format!("unaddr {a}"),
            Request::Port { proto, port, on } => format!(
                "{} {} {port}",
                if *on { "port" } else { "unport" },
                proto_name(*proto)
            ),
            Request::Queue {
                queue,
                generation: None,
            } => format!("queue {queue}"),
            Request::Queue {
                queue,
                generation: Some(g),
            } => format!("queue {queue} {g}"),
            Request::Channels(n) => format!("channels {n}"),
            Request::Neigh(ip) => format!("neigh {ip}"),
            Request::Counters => "counters".into(),
            Request::Stats(b) => format!("stats {b}"),
            Request::Vlan => "vlan".into(),
            Request::RestartKey => "restart-key".into(),
            Request::Capture(b) => format!("capture {b}"),
            Request::UpgradeState => "upgrade-state".into(),
            Request::Upgrade { current, split } => {
                format!("upgrade {current} {}", u8::from(*split))
            }
            Request::Keep {
                peer,
                port,
                generation,
            } => format!("keep {peer} {port} {generation}"),
            Request::Forget { peer, port } => format!("forget {peer} {port}"),
        }
    }

    /// Whether the request carries a descriptor (only a queue's registration does).
    pub fn takes_descriptor(&self) -> bool {
        matches!(self, Request::Queue { .. })
    }

    /// A request as it came over the grant socket.
    ///
    /// # Errors
    /// What is wrong with it, for the broker's answer: an unknown request (the words "unknown
    /// request", which an older client looks for), or a word that is not what its place
    /// needs, named.
    pub fn parse(text: &str) -> Result<Request, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let number = |w: &str, what: &str| -> Result<u32, String> {
            w.parse().map_err(|_| format!("`{w}` is not a {what}"))
        };
        let addr = |w: &str| -> Result<IpAddr, String> {
            w.parse().map_err(|_| format!("`{w}` is not an address"))
        };
        let peer = |w: &str| -> Result<SocketAddr, String> {
            w.parse()
                .map_err(|_| format!("`{w}` is not an address and port"))
        };
        let port = |w: &str| -> Result<u16, String> {
            w.parse().map_err(|_| format!("`{w}` is not a port"))
        };
        let size = |w: &str| -> Result<u64, String> {
            w.parse().map_err(|_| format!("malformed size in `{text}`"))
        };
        Ok(match words[..] {
            ["addr", a] => Request::Addr {
                addr: addr(a)?,
                shared: false,
            },
            ["addr", a, "shared"] => Request::Addr {
                addr: addr(a)?,
                shared: true,
            },
            ["unaddr", a] => Request::Unaddr(addr(a)?),
            [verb @ ("port" | "unport"), proto, p] => Request::Port {
                proto: match proto {
                    "tcp" => Proto::Tcp,
                    "udp" => Proto::Udp,
                    _ => return Err(format!("`{proto}` is not tcp or udp")),
                },
                port: port(p)?,
                on: verb == "port",
            },
            ["queue", q] => Request::Queue {
                queue: number(q, "queue")?,
                generation: None,
            },
            ["queue", q, g] => Request::Queue {
                queue: number(q, "queue")?,
                generation: Some(number(g, "generation")?),
            },
            ["channels", n] => Request::Channels(number(n, "count")?),
            ["neigh", ip] => Request::Neigh(addr(ip)?),
            ["counters"] => Request::Counters,
            ["stats", b] => Request::Stats(size(b)?),
            ["vlan"] => Request::Vlan,
            ["restart-key"] => Request::RestartKey,
            ["capture", b] => Request::Capture(size(b)?),
            ["upgrade-state"] => Request::UpgradeState,
            ["upgrade", current, split] => Request::Upgrade {
                current: number(current, "generation")?,
                split: number(split, "split (0 or 1)")? != 0,
            },
            ["keep", p, local, g] => Request::Keep {
                peer: peer(p)?,
                port: port(local)?,
                generation: number(g, "generation")?,
            },
            ["forget", p, local] => Request::Forget {
                peer: peer(p)?,
                port: port(local)?,
            },
            _ => return Err(format!("unknown request `{text}`")),
        })
    }
}

#[cfg(test)]
#[path = "grant_words_tests.rs"]
mod tests;
