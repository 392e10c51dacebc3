//! An AF_XDP socket in copy mode may have a whole TX ring of frames in flight. Each frame it
//! sends is a socket buffer charged to it until the last holder frees it; on a veth that holder
//! is the peer's stack, whose busy socket keeps them in its backlog. At the kernel's default
//! budget (`net.core.wmem_default`, about 80 frames) a corelane sender idled while a kernel
//! receiver drained its backlog: bulk sending to a kernel client ran at 0.6 of the kernel
//! sender's rate on the same veth (`matrix --work send --impair clean`), the client never
//! falling behind. Opened with CAP_NET_ADMIN, the socket's budget covers every TX slot.

mod common;

use common::*;
use corelane_testnet::require_root;
use corelane_xsk::{XskConfig, XskQueue};

#[test]
fn datapath_send_buffer_covers_the_tx_ring() {
    if !require_root("datapath_send_buffer_covers_the_tx_ring") {
        return;
    }
    let net = net(1);
    let ifname = net.server_if().to_string();
    for config in [
        XskConfig::default(),
        XskConfig {
            ring_size: 4096,
            frames: 8192,
            frame_size: 4096,
            ..XskConfig::default()
        },
    ] {
        let ifname = ifname.clone();
        let (granted, wanted) = net
            .server_ns()
            .run(move || {
                let q = XskQueue::open(&ifname, 0, &config).map_err(|e| e.to_string())?;
                Ok::<_, String>((
                    q.send_buffer(),
                    config.ring_size as usize * config.frame_bytes() as usize,
                ))
            })
            .unwrap()
            .unwrap();
        assert!(
            granted >= wanted,
            "send buffer {granted} bytes for a ring of {} frames of {} bytes",
            config.ring_size,
            config.frame_bytes()
        );
    }
}
