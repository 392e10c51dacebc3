//! How the runtime gets at its interface: by attaching the XDP program itself (it needs the
//! privileges for that), or through a grant from `corelane-broker grant` (it needs only
//! `CAP_NET_RAW`); opening the AF_XDP sockets; and dropping the capabilities nothing needs
//! afterwards.

use std::sync::Arc;

use corelane_xsk::{AttachMode, Cap, Channels, Claim, GrantClient, Steering, XskConfig, XskQueue};

use crate::Error;

/// Where the runtime's XDP program comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Xdp {
    /// Through the grant of a `corelane-broker grant` serving the interface, if one does;
    /// attached by the runtime otherwise.
    #[default]
    Auto,
    /// Attached by the runtime (root, or `CAP_NET_ADMIN`, `CAP_NET_RAW`, `CAP_BPF` and
    /// `CAP_PERFMON`).
    Attach,
    /// Only through a grant: an error when no broker serves the interface.
    Granted,
}

/// The runtime's hold on its interface before the program is there.
pub(crate) enum Access {
    /// It attaches the program itself, under its own claim.
    Attach(Arc<Claim>),
    /// A broker holds the program and the claim.
    Granted(GrantClient),
    /// The program came from the process this one takes over from (an upgrade); the claim
    /// comes once that one has ended (`host/xsk/join.rs`).
    Adopted(Box<Steering>),
}

impl Access {
    /// Connects to the broker or claims the interface, as `xdp` says, after checking the
    /// privileges that mode needs and that `umem` bytes can be locked (all in one error).
    pub(crate) fn get(ifname: &str, xdp: Xdp, umem: u64) -> Result<Access, Error> {
        let grant = match xdp {
            Xdp::Attach => None,
            Xdp::Auto => GrantClient::connect(ifname)?,
            Xdp::Granted => Some(GrantClient::connect(ifname)?.ok_or_else(|| {
                Error::Config(format!(
                    "no corelane-broker grant serves {ifname} (nothing listens at {}); start one \
                     as root: corelane-broker grant {ifname} --addr ADDR --tcp PORTS --user USER",
                    corelane_xsk::grant::grant_socket_path(ifname)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ))
            })?),
        };
        match grant {
            Some(g) => {
                corelane_xsk::check_runtime_needs(true, umem)?;
                Ok(Access::Granted(g))
            }
            None => {
                corelane_xsk::check_runtime_needs(false, umem)?;
                // Before anything reads or changes the interface: one runtime per interface,
                // and what a dead one left behind is undone first.
                Ok(Access::Attach(Arc::new(Claim::take(ifname)?)))
            }
        }
    }

    pub(crate) fn claim(&self) -> Option<&Arc<Claim>> {
        match self {
            Access::Attach(c) => Some(c),
            Access::Granted(_) | Access::Adopted(_) => None,
        }
    }

    /// The live statistics' writer: in the claim's directory, or in the file the broker
    /// makes (a server without privileges cannot write the run directory).
    pub(crate) fn publisher(
        &self,
        ifname: &str,
        cores: usize,
        conn_cap: usize,
    ) -> std::io::Result<corelane_stat::Publisher> {
        let names = crate::publish::NAMES;
        match self {
            Access::Attach(c) => corelane_stat::Publisher::create(
                &c.dir().join("stats"),
                ifname,
                cores,
                names,
                conn_cap,
            ),
            // In the old process's place: its file stays until it ends, unread.
            Access::Adopted(_) => corelane_stat::Publisher::create(
                &corelane_xsk::iface_dir(ifname)?.join("stats"),
                ifname,
                cores,
                names,
                conn_cap,
            ),
            Access::Granted(g) => {
                let bytes = corelane_stat::Publisher::bytes_for(cores, names, conn_cap);
                let (file, path) = g.stats_file(bytes).map_err(std::io::Error::from)?;
                let p = corelane_stat::Publisher::create_in(
                    &file, &path, ifname, cores, names, conn_cap,
                )?;
                // Packet capture through the file the broker makes beside the stats.
                let capture = g
                    .capture_file(corelane_stat::CaptureFile::bytes_for(cores))
                    .map_err(std::io::Error::from)
                    .and_then(|(file, path)| {
                        corelane_stat::CaptureFile::create_in(&file, &path, cores)
                    });
                Ok(match capture {
                    Ok(c) => p.with_capture(c),
                    Err(e) => {
                        tracing::debug!("{ifname}: no packet capture through the broker: {e}");
                        p
                    }
                })
            }
        }
    }

    /// Gives the interface `need` receive queues. Returns the channels to put back when the
    /// runtime ends (None under a grant: the broker puts them back).
    pub(crate) fn set_queues(
        &self,
        ifname: &str,
        now: Channels,
        need: u32,
    ) -> Result<Option<Channels>, corelane_xsk::Error> {
        match self {
            Access::Attach(_) => corelane_xsk::set_rx_queues(ifname, now, need).map(Some),
            Access::Granted(g) => g.set_rx_queues(need).map(|()| None),
            Access::Adopted(_) => Err(corelane_xsk::Error::Config(format!(
                "{ifname} has {} receive queue(s) and an upgrade keeps the old process's queues: \
                 serve them with as many cores as it did",
                now.rx_queues()
            ))),
        }
    }

    /// The steering program: attached now, or the broker's.
    pub(crate) fn steering(
        self,
        ifname: &str,
        mode: AttachMode,
        vlan: corelane_xsk::Vlan,
    ) -> Result<Steering, Error> {
        Ok(match self {
            Access::Attach(claim) => {
                let mut s = Steering::attach_vlan(ifname, mode, vlan)?;
                s.set_claim(claim);
                s
            }
            Access::Adopted(s) => *s,
            Access::Granted(g) => {
                let served = g.vlan()?;
                if served != vlan {
                    return Err(Error::Config(format!(
                        "{ifname}: this server is built for {vlan} but the grant broker's \
                         program serves {served}: start both for the same VLAN (corelane-broker \
                         grant --vlan ID [--service-vlan ID], Builder::vlan, \
                         Builder::service_vlan)"
                    )));
                }
                Steering::granted(ifname, g)
            }
        })
    }
}

/// Opens one AF_XDP socket per lane (`(queue, cpu)`) on the calling thread, so that the
/// capabilities can be dropped before any core thread starts, and puts each behind its queue.
/// The thread runs on each lane's CPU while it opens that lane's socket: the kernel pins the
/// UMEM's pages where the thread that registers it runs, so they land on the lane's NUMA node.
pub(crate) fn open_sockets(
    ifname: &str,
    lanes: &[(u32, usize)],
    xsk: &XskConfig,
    steering: &mut Steering,
) -> Result<Vec<XskQueue>, Error> {
    // The kernel counts every UMEM of the user against one locked-memory limit: checked for
    // all of them at once, so the error gives the whole amount.
    let umem = u64::from(xsk.frames) * u64::from(xsk.frame_bytes());
    corelane_xsk::check_memlock(umem * lanes.len() as u64)?;
    let before = crate::cpu::allowed_cpus();
    let opened = (|| {
        let mut out = Vec::with_capacity(lanes.len());
        for &(q, cpu) in lanes {
            crate::cpu::pin(cpu)?;
            let sock = XskQueue::open(ifname, q, xsk)?;
            steering.register(q, sock.fd())?;
            out.push(sock);
        }
        Ok(out)
    })();
    crate::cpu::set_allowed(&before)?;
    opened
}

/// Drops the capabilities the runtime no longer needs, in the calling thread (the one that
/// builds the runtime, before it starts any other): none under a grant; `CAP_NET_ADMIN` and
/// `CAP_BPF` when it holds the program (to change addresses and put the queues back), and
/// `CAP_NET_BIND_SERVICE` with a shared address.
pub(crate) fn drop_capabilities(granted: bool, shared: bool) -> Result<(), Error> {
    // A shared address's ports are held by placeholder sockets bound as ports are served
    // (`crates/corelane-xsk/src/shared.rs`); under a grant the broker binds them.
    let keep: &[Cap] = match (granted, shared) {
        (true, _) => &[],
        (false, false) => &[Cap::NetAdmin, Cap::Bpf],
        (false, true) => &[Cap::NetAdmin, Cap::Bpf, Cap::NetBindService],
    };
    corelane_xsk::retain_caps(keep).map_err(|e| Error::Os {
        what: "dropping capabilities".into(),
        source: e,
    })
}

/// Sizes the frames for `mtu` when the application left it to the runtime (`frame_size` 0):
/// 2048 bytes, or a page when a full frame and the kernel's 256 bytes of headroom do not fit
/// half of one. A full frame (with its `tags` bytes of VLAN tags) larger than one UMEM frame
/// spans several (multi-buffer AF_XDP, `XskConfig::max_packet`), up to
/// [`corelane_xsk::MAX_PIECES`] of them.
pub(crate) fn fit_frames(
    ifname: &str,
    mtu: usize,
    tags: usize,
    xsk: &mut XskConfig,
) -> Result<(), Error> {
    let l2 = 14 + tags;
    if xsk.frame_size == 0 {
        xsk.frame_size = if mtu + l2 + 256 > 2048 { 4096 } else { 2048 };
    }
    let capacity = xsk.frame_capacity() as usize;
    let most = capacity * corelane_xsk::MAX_PIECES - l2;
    if mtu > most {
        return Err(Error::Config(format!(
            "MTU {mtu} of {ifname} needs more than {} frames of {} bytes a packet; lower the \
             MTU to at most {most}",
            corelane_xsk::MAX_PIECES,
            xsk.frame_size
        )));
    }
    if mtu + l2 > capacity {
        xsk.max_packet = xsk.max_packet.max((mtu + l2) as u32);
    }
    Ok(())
}

/// Drops every capability of the calling thread (capabilities are per thread in Linux): a
/// thread that parses frames from the wire, or runs the application's tasks, holds none. What
/// needs `CAP_NET_ADMIN` or `CAP_BPF` after start is done by the thread that built the runtime.
pub(crate) fn drop_thread_capabilities() -> Result<(), Error> {
    corelane_xsk::retain_caps(&[]).map_err(|e| Error::Os {
        what: "dropping this thread's capabilities".into(),
        source: e,
    })
}
