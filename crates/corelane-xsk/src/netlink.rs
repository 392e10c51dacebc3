//! One netlink exchange with the kernel: a socket of a protocol, bound and connected to the
//! kernel, one request sent and one answer read. The VLAN filter (rtnetlink) and the
//! `xsk-features` query (generic netlink) each build and read their own messages.

use std::io;

use netlink_sys::{Socket, SocketAddr};

/// What failed, and how: the step (`socket`, `bind`, `connect`, `send`, `recv`) and the error.
pub(crate) type Failed = (&'static str, io::Error);

/// A netlink socket of `protocol` (`netlink_sys::protocols`), connected to the kernel.
pub(crate) fn kernel_socket(protocol: isize) -> Result<Socket, Failed> {
    let mut socket = Socket::new(protocol).map_err(|e| ("socket", e))?;
    socket.bind_auto().map_err(|e| ("bind", e))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(|e| ("connect", e))?;
    Ok(socket)
}

/// Sends `msg` on `socket` and returns the kernel's answer (one datagram, up to 8 KiB).
pub(crate) fn exchange(socket: &Socket, msg: &[u8]) -> Result<Vec<u8>, Failed> {
    socket.send(msg, 0).map_err(|e| ("send", e))?;
    let mut buf = vec![0u8; 8192];
    let n = socket.recv(&mut &mut buf[..], 0).map_err(|e| ("recv", e))?;
    buf.truncate(n);
    Ok(buf)
}
