//! Two namespaces joined by one veth pair: the simplest test host.

use std::process::Command;
use std::sync::atomic::Ordering;

use crate::{End, Error, Netns, Result, SEQ, up_with_addrs, veth};

/// How to build a [`VethPair`].
#[derive(Debug, Clone)]
pub struct VethBuilder {
    queues: u32,
    mtu: u32,
    server_addrs: Vec<String>,
    client_addrs: Vec<String>,
    server_tx_csum_off: bool,
    client_tx_csum_on: bool,
}

impl Default for VethBuilder {
    fn default() -> Self {
        VethBuilder {
            queues: 1,
            mtu: 1500,
            server_addrs: Vec::new(),
            client_addrs: Vec::new(),
            server_tx_csum_off: false,
            client_tx_csum_on: false,
        }
    }
}

impl VethBuilder {
    /// Number of RX and TX queues on each end (default 1).
    pub fn queues(mut self, n: u32) -> Self {
        self.queues = n.max(1);
        self
    }

    /// MTU of both ends (default 1500).
    pub fn mtu(mut self, mtu: u32) -> Self {
        self.mtu = mtu;
        self
    }

    /// A kernel address (CIDR) on the server end; may repeat. IPv6 addresses skip duplicate
    /// address detection so they are usable at once.
    pub fn server_addr(mut self, cidr: &str) -> Self {
        self.server_addrs.push(cidr.to_string());
        self
    }

    /// A kernel address (CIDR) on the client end; may repeat.
    pub fn client_addr(mut self, cidr: &str) -> Self {
        self.client_addrs.push(cidr.to_string());
        self
    }

    /// Also turn TX checksum offload off on the server end (it is always off on the client end,
    /// whose frames the XDP program and the user-space stack read).
    pub fn server_tx_checksum_off(mut self, off: bool) -> Self {
        self.server_tx_csum_off = off;
        self
    }

    /// Leaves transmit checksum offload on at the client end (off by default): its TCP and UDP
    /// frames then reach the server end with partial checksums, as from a misconfigured peer.
    pub fn client_tx_checksum_on(mut self, on: bool) -> Self {
        self.client_tx_csum_on = on;
        self
    }

    /// Creates both namespaces and the veth pair between them.
    pub fn build(self) -> Result<VethPair> {
        let server_ns = Netns::new("s")?;
        let client_ns = Netns::new("c")?;
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        // Interface names must stay under 16 bytes.
        let tag = format!("{}{}", std::process::id() % 100_000, seq % 1000);
        let server_if = format!("cls{tag}");
        let client_if = format!("clc{tag}");
        veth(
            End {
                name: &server_if,
                ns: &server_ns,
                queues: self.queues,
            },
            End {
                name: &client_if,
                ns: &client_ns,
                queues: self.queues,
            },
            self.mtu,
        )?;
        for (ns, ifname, addrs) in [
            (&server_ns, &server_if, &self.server_addrs),
            (&client_ns, &client_if, &self.client_addrs),
        ] {
            up_with_addrs(ns, ifname, addrs)?;
        }
        set_tx_csum(&client_ns, &client_if, self.client_tx_csum_on)?;
        if self.server_tx_csum_off {
            set_tx_csum(&server_ns, &server_if, false)?;
        }
        Ok(VethPair {
            server_if,
            client_if,
            queues: self.queues,
            client_ns,
            server_ns,
        })
    }
}

fn set_tx_csum(ns: &Netns, ifname: &str, on: bool) -> Result<()> {
    let mut args = vec!["netns", "exec", ns.name(), "ethtool", "-K", ifname, "tx"];
    args.push(if on { "on" } else { "off" });
    let out = Command::new("ip")
        .args(&args)
        .output()
        .map_err(|source| Error::MissingTool {
            tool: "ip".into(),
            package: "iproute2".into(),
            source,
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if stderr.contains("No such file") || stderr.contains("not found") {
            return Err(Error::MissingTool {
                tool: "ethtool".into(),
                package: "ethtool".into(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, stderr),
            });
        }
        return Err(Error::Command {
            cmd: format!("ip {}", args.join(" ")),
            stderr,
        });
    }
    Ok(())
}

/// Two namespaces joined by a veth pair: the server end is where corelane runs, the client end is
/// a kernel host. Dropping it removes both namespaces and the pair.
#[derive(Debug)]
pub struct VethPair {
    server_if: String,
    client_if: String,
    queues: u32,
    // Field order: the client namespace is removed first, then the server's.
    client_ns: Netns,
    server_ns: Netns,
}

impl VethPair {
    /// Starts a builder.
    pub fn builder() -> VethBuilder {
        VethBuilder::default()
    }

    /// The namespace that holds the server end.
    pub fn server_ns(&self) -> &Netns {
        &self.server_ns
    }

    /// The namespace that holds the client end.
    pub fn client_ns(&self) -> &Netns {
        &self.client_ns
    }

    /// The server end's interface name.
    pub fn server_if(&self) -> &str {
        &self.server_if
    }

    /// The client end's interface name.
    pub fn client_if(&self) -> &str {
        &self.client_if
    }

    /// Queues on each end.
    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// `ip link show dev IF` on the server end, as text (shows an attached XDP program).
    pub fn server_link(&self) -> Result<String> {
        self.server_ns.ip(&["link", "show", "dev", &self.server_if])
    }
}
