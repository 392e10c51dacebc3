//! Socket options of the kernel TCP peers the tests and benchmarks run: the congestion control a
//! flow uses (the machine's default may be BBR, and a comparison of loss-based controllers must
//! not depend on it) and what `TCP_INFO` says of a connection.

#![allow(unsafe_code)] // setsockopt / getsockopt on a descriptor the caller holds open.

use std::os::fd::AsRawFd;

/// Sets the congestion control of a kernel TCP socket (`TCP_CONGESTION`; a listener's is
/// inherited by what it accepts).
pub fn set_congestion(sock: &impl AsRawFd, cc: &str) -> Result<(), String> {
    // SAFETY: the descriptor is open for the call; the option value is the bytes of `cc` with
    // their length.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr().cast(),
            cc.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(format!(
            "kernel congestion control {cc:?}: {} (is the module loaded? see \
             /proc/sys/net/ipv4/tcp_available_congestion_control)",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Gives a kernel socket a receive buffer of `bytes`, past `net.core.rmem_max`
/// (`SO_RCVBUFFORCE`, which needs `CAP_NET_ADMIN`: the privileged tests have it): a test
/// receiver that a busy machine leaves unscheduled for a while then loses nothing to its
/// buffer.
pub fn force_receive_buffer(sock: &impl AsRawFd, bytes: usize) -> std::io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is open for the call; the option value is an int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A kernel TCP socket's `TCP_INFO`.
pub fn tcp_info(sock: &impl AsRawFd) -> std::io::Result<libc::tcp_info> {
    // SAFETY: tcp_info is plain integers, for which all zeros is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is open for the call; `info` and `len` are valid for writes of the
    // sizes given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connected_socket_reports_its_info_and_takes_a_controller() -> Result<(), String> {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        set_congestion(&l, "cubic")?;
        assert!(set_congestion(&l, "no-such-controller").is_err());
        let c = std::net::TcpStream::connect(l.local_addr().map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let info = tcp_info(&c).map_err(|e| e.to_string())?;
        assert_eq!(info.tcpi_state, 1, "established");
        assert!(info.tcpi_snd_mss > 0);
        Ok(())
    }
}
