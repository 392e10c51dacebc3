//! Opening a queue's socket: the UMEM, the rings, the bind (zero-copy tried first when asked),
//! and the socket options a copy-mode sender needs.

use super::af_xdp::XdpSocket;
use super::ring::{Desc, Region};
use super::{BindMode, Parts, XskConfig, XskQueue, XskStats, ZeroCopy};
use crate::error::Error;
use crate::sys::{set_send_buffer, set_tx_budget, sockopt_zerocopy};
use corelane_frame::{FramePool, UmemId};
use std::io;

/// How long a busy queue is tried again before it is reported taken (see `XskQueue::open`):
/// usually milliseconds, but 3.2-3.4 s were seen on a loaded machine after a runtime whose
/// peer never answered (the VLAN tests, with their others running beside them).
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl XskQueue {
    /// Binds an AF_XDP socket to queue `queue_id` of `ifname` (in the caller's network namespace).
    /// The XDP program is not loaded here: corelane loads its own with [`crate::Steering`].
    pub fn open(ifname: &str, queue_id: u32, config: &XskConfig) -> Result<Self, Error> {
        crate::caps::check_socket_privileges()?;
        crate::netdev::check_interface(ifname)?;
        crate::caps::check_memlock(u64::from(config.frames) * u64::from(config.frame_bytes()))?;
        // The socket of a process that just ended may hold the queue a moment longer (the
        // kernel releases it once the last frame it sent is freed, which a restart right after
        // a crash can beat): a busy queue is tried again for up to BUSY_WAIT before it is
        // reported taken.
        let start = std::time::Instant::now();
        loop {
            match Self::open_once(ifname, queue_id, config) {
                Err(Error::Bind {
                    errno: Some(libc::EBUSY),
                    ..
                }) if start.elapsed() < BUSY_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                r => return r,
            }
        }
    }

    fn open_once(ifname: &str, queue_id: u32, config: &XskConfig) -> Result<Self, Error> {
        match config.zero_copy {
            ZeroCopy::Off => Self::bind(ifname, queue_id, config, BindMode::Copy),
            ZeroCopy::Require => match Self::bind(ifname, queue_id, config, BindMode::ZeroCopy) {
                Err(Error::Bind { errno, .. })
                    if errno == Some(libc::EOPNOTSUPP) || errno == Some(libc::EINVAL) =>
                {
                    Err(zero_copy_refused(ifname, queue_id, config, errno))
                }
                r => r,
            },
            ZeroCopy::Try => match Self::bind(ifname, queue_id, config, BindMode::ZeroCopy) {
                Ok(q) => Ok(q),
                Err(Error::Bind { errno, .. })
                    if errno == Some(libc::EOPNOTSUPP) || errno == Some(libc::EINVAL) =>
                {
                    tracing::info!(
                        "{ifname} queue {queue_id}: zero-copy refused by the driver, using copy mode"
                    );
                    Self::bind(ifname, queue_id, config, BindMode::Copy)
                }
                Err(e) => Err(e),
            },
        }
    }

    fn bind(ifname: &str, queue_id: u32, c: &XskConfig, mode: BindMode) -> Result<Self, Error> {
        let cfg_err = |what: String| Error::Config(what);
        if !c.ring_size.is_power_of_two() {
            return Err(cfg_err(format!(
                "ring size {} is not a power of two",
                c.ring_size
            )));
        }
        if !matches!(c.frame_bytes(), 2048 | 4096) {
            return Err(cfg_err(format!(
                "frame size {} must be 2048 or 4096",
                c.frame_size
            )));
        }
        if c.frames == 0 {
            return Err(cfg_err("a UMEM needs at least one frame".into()));
        }
        let ifindex = crate::netdev::check_interface(ifname)?;
        let umem_err = |e: io::Error| match e.raw_os_error() {
            Some(libc::EPERM) => crate::caps::check_socket_privileges()
                .err()
                .unwrap_or_else(|| Error::Privilege(format!("creating the UMEM: {e}"))),
            Some(libc::ENOBUFS) => Error::Privilege(crate::caps::memlock_message(
                u64::from(c.frames) * u64::from(c.frame_bytes()),
                crate::sys::memlock_limit(),
            )),
            errno => Error::Umem {
                errno,
                detail: e.to_string(),
            },
        };
        let umem = Region::new(c.frames as usize * c.frame_bytes() as usize).map_err(umem_err)?;
        let socket = XdpSocket::new().map_err(umem_err)?;
        // TX metadata in copy mode, or in zero-copy where the driver says it takes checksum
        // requests: one without its part would send the checksum unfinished.
        let tx_checksum = c.tx_checksum_offload
            && match mode {
                BindMode::Copy => true,
                BindMode::ZeroCopy => match crate::xsk_features::xsk_features(ifindex) {
                    Ok(f) => f & crate::xsk_features::TX_CHECKSUM != 0,
                    Err(e) => {
                        tracing::debug!("{ifname}: the driver's AF_XDP TX metadata: {e}");
                        false
                    }
                },
            };
        let tx_checksum = socket
            .register_umem(&umem, c.frame_bytes(), c.ring_size, tx_checksum)
            .map_err(umem_err)?;
        let (fq, cq) = socket.fill_comp_rings(c.ring_size).map_err(umem_err)?;
        let rings = socket.rx_tx_rings(c.ring_size).map_err(umem_err)?;
        let mut flags = libc::XDP_USE_NEED_WAKEUP;
        if c.multi_buffer() {
            flags |= libc::XDP_USE_SG;
        }
        flags |= match mode {
            BindMode::Copy => libc::XDP_COPY,
            BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
        };
        socket
            .bind(ifindex, queue_id, flags, None)
            .map_err(|e| Error::Bind {
                ifname: ifname.to_string(),
                queue: queue_id,
                errno: e.raw_os_error(),
                detail: if c.multi_buffer() && mode == BindMode::Copy {
                    format!(
                        "{e} (packets of {} bytes span UMEM frames, which needs multi-buffer \
                         AF_XDP, Linux 6.6 or later: lower the MTU of {ifname} so a frame fits \
                         {} bytes)",
                        c.max_packet,
                        c.frame_capacity()
                    )
                } else {
                    e.to_string()
                },
            })?;
        let parts = Parts {
            socket,
            rx: rings.rx,
            tx: rings.tx,
            fq,
            cq,
            umem,
        };
        let mut q = XskQueue::alone(parts, c, queue_id);
        q.tx_checksum = tx_checksum && q.mode == mode;
        q.top_up_fill()?;
        Ok(q)
    }

    /// The frames the fill ring keeps for receive: at most the ring, at most half the frames
    /// (transmit keeps the other half).
    pub(super) fn fill_share(c: &XskConfig) -> usize {
        (c.ring_size as usize).min(c.frames as usize / 2)
    }

    /// The queue over `p` owning its UMEM alone: every frame its own, the fill ring's share set.
    pub(super) fn alone(p: Parts, c: &XskConfig, queue_id: u32) -> XskQueue {
        let pool = FramePool::new(c.frames as usize, Self::fill_share(c));
        XskQueue::assemble(p, c, queue_id, pool)
    }

    /// The queue over a bound socket, its rings and UMEM, with `pool`'s frames.
    pub(super) fn assemble(p: Parts, c: &XskConfig, queue_id: u32, pool: FramePool) -> XskQueue {
        let fd = p.socket.raw();
        let mode = if sockopt_zerocopy(fd) {
            BindMode::ZeroCopy
        } else {
            BindMode::Copy
        };
        set_tx_budget(fd, c.ring_size);
        // Every TX slot may hold a frame in flight, each charged its bytes plus the kernel's
        // per-buffer overhead (under 1 KiB).
        let want = c.ring_size as usize * (c.frame_bytes() as usize + 1024);
        let send_buffer = set_send_buffer(fd, want);
        if send_buffer < want {
            tracing::debug!(
                "queue {queue_id}: AF_XDP send buffer {send_buffer} bytes of {want} wanted \
                 (raise net.core.wmem_max, or open the socket with CAP_NET_ADMIN): a copy-mode \
                 sender may wait for a slow receiver on a veth"
            );
        }
        XskQueue {
            rx: p.rx,
            tx: p.tx,
            fq: p.fq,
            cq: p.cq,
            socket: p.socket,
            umem: p.umem,
            id: UmemId::fresh(),
            frames: c.frames,
            pool,
            scratch: vec![Desc::default(); c.ring_size as usize],
            addrs: vec![0; c.ring_size as usize],
            post: Vec::with_capacity(c.ring_size as usize),
            frame_size: c.frame_bytes() as usize,
            max_packet: (c.max_packet.max(c.frame_capacity())) as usize,
            partial: None,
            stamp_wanted: None,
            stamp: None,
            tx_stalled_since: None,
            spare_chains: Vec::new(),
            ring_size: c.ring_size,
            mode,
            queue_id,
            fd,
            send_buffer,
            stats: XskStats::default(),
            partner: None,
            tx_checksum: false,
            owns_rings: true,
        }
    }
}

/// Why a driver refused a zero-copy bind it was required to take, and what to do about it.
fn zero_copy_refused(ifname: &str, queue: u32, c: &XskConfig, errno: Option<i32>) -> Error {
    let fallback = "`--zero-copy try` (ZeroCopy::Try) falls back to copy mode, `off` uses it";
    let why = if c.multi_buffer() && errno == Some(libc::EOPNOTSUPP) {
        // One frame holds the packet after the kernel's headroom; a larger one needs several
        // frames (multi-buffer), which a driver does in zero-copy only if it says so
        // (`xdp_zc_max_segs` above 1).
        let one_frame = c.frame_capacity().saturating_sub(18);
        format!(
            "packets of up to {} bytes need several frames each (multi-buffer), which this \
             driver does not do in zero-copy; the largest MTU it can serve in zero-copy is \
             {one_frame} (`ip link set {ifname} mtu {one_frame}`), or {fallback}",
            c.max_packet
        )
    } else {
        format!(
            "the driver does not take XDP_ZEROCOPY on this device ({}): {fallback}; on \
             virtio-net zero-copy needs Linux 6.13 or later and a device offering \
             VIRTIO_F_ACCESS_PLATFORM (QEMU: `iommu_platform=on,disable-legacy=on`)",
            errno.map_or_else(
                || "no errno".to_string(),
                |e| io::Error::from_raw_os_error(e).to_string()
            )
        )
    };
    Error::ZeroCopyRefused {
        ifname: ifname.to_string(),
        queue,
        errno,
        why,
    }
}
