//! A routed test network: a server subnet and a client subnet joined by a Linux router, IPv4
//! and IPv6, so the client is off the server's link and every packet between them crosses a
//! forwarding hop (and its MTU).

use std::sync::atomic::Ordering;

use crate::{End, Netns, Result, SEQ, up_with_addrs, veth};

/// How to build a [`RoutedNet`].
#[derive(Debug, Clone)]
pub struct RoutedBuilder {
    queues: u32,
    far_mtu: u32,
    server_routes: bool,
}

impl Default for RoutedBuilder {
    fn default() -> Self {
        RoutedBuilder {
            queues: 1,
            far_mtu: 1500,
            server_routes: true,
        }
    }
}

impl RoutedBuilder {
    /// Receive and transmit queues of the server's interface (default 1).
    pub fn queues(mut self, n: u32) -> Self {
        self.queues = n.max(1);
        self
    }

    /// The MTU of the router's hop toward the client (default 1500; set as the route's MTU,
    /// the links stay at 1500). Below 1500, full-size packets from the server must shrink on
    /// the way: the router answers them with ICMP "fragmentation needed" / "packet too big",
    /// while the client, which knows nothing of the hop, still announces a 1460-byte MSS.
    pub fn far_mtu(mut self, mtu: u32) -> Self {
        self.far_mtu = mtu;
        self
    }

    /// Whether the server namespace's kernel gets default routes through the router (default
    /// on), as a host's network configuration would give it. Off: the server side knows only
    /// its own subnet.
    pub fn server_routes(mut self, on: bool) -> Self {
        self.server_routes = on;
        self
    }

    /// Creates the three namespaces, the two links, the addresses and the routes.
    pub fn build(self) -> Result<RoutedNet> {
        let server_ns = Netns::new("s")?;
        let router_ns = Netns::new("r")?;
        let client_ns = Netns::new("c")?;
        // No duplicate address detection, link-local addresses included: a router whose
        // link-local address is still tentative cannot solicit its neighbours for the first
        // seconds, and every IPv6 packet it forwards would wait for that.
        for ns in [&server_ns, &router_ns, &client_ns] {
            ns.exec(
                "sysctl",
                &[
                    "-qw",
                    "net.ipv6.conf.default.accept_dad=0",
                    "net.ipv6.conf.all.accept_dad=0",
                ],
            )?;
        }
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}{}", std::process::id() % 100_000, seq % 1000);
        let (server_if, client_if) = (format!("cls{tag}"), format!("clc{tag}"));
        let (rs, rc) = (format!("clrs{tag}"), format!("clrc{tag}"));
        for (end, end_ns, port, queues) in [
            (&server_if, &server_ns, &rs, self.queues),
            (&client_if, &client_ns, &rc, 1),
        ] {
            veth(
                End {
                    name: end,
                    ns: end_ns,
                    queues,
                },
                End {
                    name: port,
                    ns: &router_ns,
                    queues: 1,
                },
                1500,
            )?;
        }
        let s = RoutedNet::SERVER_SIDE;
        let c = RoutedNet::CLIENT_SIDE;
        up_with_addrs(
            &router_ns,
            &rs,
            &[format!("{}/24", s.router_v4), format!("{}/64", s.router_v6)],
        )?;
        up_with_addrs(
            &router_ns,
            &rc,
            &[format!("{}/24", c.router_v4), format!("{}/64", c.router_v6)],
        )?;
        if self.far_mtu < 1500 {
            // The hop's MTU as a route metric, not the link's: the links stay at 1500, so
            // the client's full-size frames still reach the router (a veth drops a frame
            // larger than its receiving end's MTU), while what the router forwards toward the
            // client must fit the smaller MTU or be refused with an ICMP error.
            let mtu = self.far_mtu.to_string();
            // Locked: IPv6 forwarding honours only a locked route MTU.
            router_ns.ip(&[
                "route",
                "replace",
                "10.81.2.0/24",
                "dev",
                &rc,
                "mtu",
                "lock",
                &mtu,
            ])?;
            router_ns.ip(&[
                "-6",
                "route",
                "replace",
                "fd00:81:2::/64",
                "dev",
                &rc,
                // The kernel's own prefix route's metric: replaced, not shadowed.
                "metric",
                "256",
                "mtu",
                "lock",
                &mtu,
            ])?;
        }
        router_ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        router_ns.exec("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])?;
        up_with_addrs(
            &server_ns,
            &server_if,
            &[format!("{}/24", s.host_v4), format!("{}/64", s.host_v6)],
        )?;
        up_with_addrs(
            &client_ns,
            &client_if,
            &[format!("{}/24", c.host_v4), format!("{}/64", c.host_v6)],
        )?;
        client_ns.ip(&["route", "add", "default", "via", c.router_v4])?;
        client_ns.ip(&["-6", "route", "add", "default", "via", c.router_v6])?;
        if self.server_routes {
            server_ns.ip(&["route", "add", "default", "via", s.router_v4])?;
            server_ns.ip(&["-6", "route", "add", "default", "via", s.router_v6])?;
        }
        // The kernel's checksum offload leaves TCP checksums unfilled on veth; corelane on the
        // server end checks every checksum it receives.
        for (ns, ifname) in [
            (&client_ns, &client_if),
            (&router_ns, &rs),
            (&router_ns, &rc),
        ] {
            crate::lossy::offloads_off(ns, ifname, true)?;
        }
        Ok(RoutedNet {
            server_if,
            client_if,
            router_server_if: rs,
            queues: self.queues,
            far_mtu: self.far_mtu,
            client_ns,
            router_ns,
            server_ns,
        })
    }
}

/// The addresses on one side of the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Side {
    /// The router's IPv4 address on this side (the hosts' gateway).
    pub router_v4: &'static str,
    /// The router's IPv6 address on this side.
    pub router_v6: &'static str,
    /// The kernel host's IPv4 address on this side.
    pub host_v4: &'static str,
    /// The kernel host's IPv6 address on this side.
    pub host_v6: &'static str,
    /// A free IPv4 address on this side for corelane to own (prefix /24).
    pub free_v4: &'static str,
    /// A free IPv6 address on this side for corelane to own (prefix /64).
    pub free_v6: &'static str,
}

/// Three namespaces: a server on subnet 10.81.1.0/24 and fd00:81:1::/64, a router, and a
/// kernel client on 10.81.2.0/24 and fd00:81:2::/64 whose default route is the router.
/// Dropping it removes them.
///
/// ```no_run
/// use corelane_testnet::RoutedNet;
/// let net = RoutedNet::builder().far_mtu(1280).build()?;
/// let s = RoutedNet::SERVER_SIDE;
/// // A corelane server owns s.free_v4 on net.server_if(), with s.router_v4 as its gateway;
/// // the client reaches it through the router.
/// let ping = net.client_ns().exec("ping", &["-c1", "-W2", s.host_v4])?;
/// # let _ = ping;
/// # Ok::<(), corelane_testnet::Error>(())
/// ```
#[derive(Debug)]
pub struct RoutedNet {
    server_if: String,
    client_if: String,
    router_server_if: String,
    queues: u32,
    far_mtu: u32,
    // Field order: removed client first, then router, then server.
    client_ns: Netns,
    router_ns: Netns,
    server_ns: Netns,
}

impl RoutedNet {
    /// The server's subnet.
    pub const SERVER_SIDE: Side = Side {
        router_v4: "10.81.1.254",
        router_v6: "fd00:81:1::fe",
        host_v4: "10.81.1.1",
        host_v6: "fd00:81:1::1",
        free_v4: "10.81.1.3",
        free_v6: "fd00:81:1::3",
    };

    /// The client's subnet.
    pub const CLIENT_SIDE: Side = Side {
        router_v4: "10.81.2.254",
        router_v6: "fd00:81:2::fe",
        host_v4: "10.81.2.2",
        host_v6: "fd00:81:2::2",
        free_v4: "10.81.2.3",
        free_v6: "fd00:81:2::3",
    };

    /// Starts a builder.
    pub fn builder() -> RoutedBuilder {
        RoutedBuilder::default()
    }

    /// The server's namespace.
    pub fn server_ns(&self) -> &Netns {
        &self.server_ns
    }

    /// The router's namespace.
    pub fn router_ns(&self) -> &Netns {
        &self.router_ns
    }

    /// The client's namespace.
    pub fn client_ns(&self) -> &Netns {
        &self.client_ns
    }

    /// The server's interface (in the server namespace).
    pub fn server_if(&self) -> &str {
        &self.server_if
    }

    /// The client's interface (in the client namespace).
    pub fn client_if(&self) -> &str {
        &self.client_if
    }

    /// The router's interface on the server's link (in the router namespace): a host on the
    /// server's subnet, e.g. to send raw frames to the server from.
    pub fn router_server_if(&self) -> &str {
        &self.router_server_if
    }

    /// Queues of the server's interface.
    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// The MTU of the router's hop toward the client.
    pub fn far_mtu(&self) -> u32 {
        self.far_mtu
    }

    /// Adds `n` more IPv4 addresses to the client's interface, 10.81.128.0 upward (a /17 the
    /// router routes to the client side), and returns them: one host that looks like `n`.
    pub fn add_client_v4(&self, n: u32) -> Result<Vec<std::net::Ipv4Addr>> {
        let base = u32::from(std::net::Ipv4Addr::new(10, 81, 128, 0));
        let mut batch = String::new();
        let mut out = Vec::new();
        for i in 0..n.min(32_000) {
            let a = std::net::Ipv4Addr::from(base + 1 + i);
            batch.push_str(&format!("addr add {a}/32 dev {}\n", self.client_if));
            out.push(a);
        }
        self.client_ns.ip_batch(&batch)?;
        // The router sends the /17 to the client's link.
        self.router_ns.ip(&[
            "route",
            "replace",
            "10.81.128.0/17",
            "via",
            Self::CLIENT_SIDE.host_v4,
        ])?;
        Ok(out)
    }
}
