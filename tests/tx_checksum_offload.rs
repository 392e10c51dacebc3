//! Transmit checksum offload (`XskConfig::tx_checksum_offload`, the echo example's
//! `--tx-checksum-offload`), end to end through the XDP program and a copy-mode AF_XDP socket:
//! corelane's TCP segments carry only the pseudo-header's sum and AF_XDP TX metadata asking the
//! kernel to finish them.
//!
//! With transmit checksumming off on corelane's veth the kernel finishes each checksum in
//! software before the frame crosses, and with receive checksumming off on the client's veth
//! the client's kernel checks every one: a request that named the wrong bytes, or a
//! pseudo-header sum that was wrong, loses the segment and the echo stalls. With it on (a veth's default) the frames cross unfinished and the client's
//! kernel trusts them, as it trusts its own offloaded frames.

mod common;

use std::net::SocketAddr;

use common::*;
use corelane_testnet::{VethPair, require_root};

fn echo_offloading(net: &VethPair) {
    let echo = Echo::start(
        net,
        &[
            "--addr",
            "10.77.0.3/24",
            "--addr",
            "fd00:77::3/64",
            "--tx-checksum-offload",
        ],
    );
    let out = echo.output();
    assert!(
        out.contains("transmit checksums: left to the kernel and the NIC"),
        "{out}"
    );
    let v4: SocketAddr = format!("{SERVER_V4}:7").parse().unwrap();
    let v6: SocketAddr = format!("[{SERVER_V6}]:7").parse().unwrap();
    assert_echoes(net, v4, 8 << 20, 11);
    assert_echoes(net, v6, 2 << 20, 12);
    let (status, out) = echo.stop();
    assert_clean_exit(status, &out);
    let offloaded = device_counter(&out, "checksums offloaded");
    let frames = device_counter(&out, "frames in");
    // Every data segment and ACK the server sent, less the SYN-ACKs' cookies path if any.
    assert!(
        offloaded > 5_000 && offloaded * 10 >= frames * 9,
        "{offloaded} of {frames} frames offloaded: {out}"
    );
}

#[test]
fn tx_checksum_offload_finished_by_the_kernel_passes_the_clients_checks() {
    if !require_root("tx_checksum_offload_finished_by_the_kernel") {
        return;
    }
    let net = VethPair::builder()
        .server_addr("10.77.0.1/24")
        .client_addr("10.77.0.2/24")
        .server_addr("fd00:77::1/64")
        .client_addr("fd00:77::2/64")
        .server_tx_checksum_off(true)
        .build()
        .expect("veth pair");
    // A veth marks what it receives as checked unless told not to: the client's kernel is to
    // check every checksum itself.
    net.client_ns()
        .exec("ethtool", &["-K", net.client_if(), "rx", "off"])
        .expect("ethtool -K rx off");
    echo_offloading(&net);
}

#[test]
fn tx_checksum_offload_crosses_a_veth_unfinished_to_a_kernel_that_trusts_it() {
    if !require_root("tx_checksum_offload_crosses_a_veth_unfinished") {
        return;
    }
    echo_offloading(&net(1));
}
