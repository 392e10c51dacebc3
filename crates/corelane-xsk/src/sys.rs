//! Raw system calls, each behind a safe function that cannot be handed the wrong thing.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

use crate::error::Error;

/// The interface's index, or [`Error::NoInterface`].
pub fn check_interface(ifname: &str) -> Result<u32, Error> {
    let c = CString::new(ifname).map_err(|_| Error::NoInterface(ifname.to_string()))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        Err(Error::NoInterface(ifname.to_string()))
    } else {
        Ok(idx)
    }
}

/// Runs an interface ioctl on a throwaway socket. Works in the calling thread's network
/// namespace (unlike sysfs, which shows the namespace of whoever mounted it).
pub(crate) fn if_ioctl(
    ifname: &str,
    request: libc::c_ulong,
    req: &mut libc::ifreq,
) -> Result<(), Error> {
    check_interface(ifname)?;
    let name = ifname.as_bytes();
    if name.len() >= libc::IFNAMSIZ {
        return Err(Error::NoInterface(ifname.to_string()));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket creation; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::Io(io::Error::last_os_error()));
    }
    // SAFETY: `req` is a valid ifreq for the duration of the call, with the name set; the
    // kernel reads and writes only within it (and whatever ifru_data points to, which the
    // caller sets to a live buffer).
    let r = unsafe { libc::ioctl(fd, request as _, req as *mut libc::ifreq) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` is the socket opened above and is not used after this.
    unsafe { libc::close(fd) };
    if r < 0 { Err(Error::Io(err)) } else { Ok(()) }
}

#[repr(C)]
#[derive(Default)]
pub(crate) struct EthtoolChannels {
    pub(crate) cmd: u32,
    pub(crate) max_rx: u32,
    pub(crate) max_tx: u32,
    pub(crate) max_other: u32,
    pub(crate) max_combined: u32,
    pub(crate) rx_count: u32,
    pub(crate) tx_count: u32,
    pub(crate) other_count: u32,
    pub(crate) combined_count: u32,
}

pub(crate) const ETHTOOL_GDRVINFO: u32 = 0x03;
pub(crate) const ETHTOOL_GCHANNELS: u32 = 0x3c;
pub(crate) const ETHTOOL_SCHANNELS: u32 = 0x3d;
const SIOCETHTOOL: libc::c_ulong = 0x8946;

#[repr(C)]
pub(crate) struct EthtoolDrvinfo {
    cmd: u32,
    pub(crate) driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    pub(crate) bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

impl EthtoolDrvinfo {
    pub(crate) fn new(cmd: u32) -> Self {
        EthtoolDrvinfo {
            cmd,
            driver: [0; 32],
            version: [0; 32],
            fw_version: [0; 32],
            bus_info: [0; 32],
            erom_version: [0; 32],
            reserved2: [0; 12],
            n_priv_flags: 0,
            n_stats: 0,
            testinfo_len: 0,
            eedump_len: 0,
            regdump_len: 0,
        }
    }
}

mod sealed {
    /// Only the ethtool structs of this module: the kernel writes as many bytes as the
    /// command's struct has, so the buffer must be that struct and no other type.
    pub(crate) trait Sealed {}
    impl Sealed for super::EthtoolChannels {}
    impl Sealed for super::EthtoolDrvinfo {}
}

/// An ethtool request the kernel reads and writes in place: a `#[repr(C)]` struct laid out as
/// `<linux/ethtool.h>` has it, starting with its command. Sealed: implemented for the structs
/// above only.
pub(crate) trait EthtoolRequest: sealed::Sealed {}
impl EthtoolRequest for EthtoolChannels {}
impl EthtoolRequest for EthtoolDrvinfo {}

/// Runs the ethtool request `data` (SIOCETHTOOL) on `ifname`.
pub(crate) fn ethtool<T: EthtoolRequest>(ifname: &str, data: &mut T) -> Result<(), Error> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    req.ifr_ifru.ifru_data = (data as *mut T).cast();
    if_ioctl(ifname, SIOCETHTOOL, &mut req)
}

/// `SOL_XDP` socket option level.
const SOL_XDP: libc::c_int = 283;
/// `getsockopt(SOL_XDP, XDP_OPTIONS)`: reports whether the socket is bound in zero-copy mode.
const XDP_OPTIONS: libc::c_int = 8;
const XDP_OPTIONS_ZEROCOPY: u32 = 1;
/// `setsockopt(SOL_XDP, XDP_MAX_TX_SKB_BUDGET)` (Linux 6.16+): frames one copy-mode TX kick may
/// send. The default of 32 would need several kicks for one batch.
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

/// True when the AF_XDP socket `fd` is bound in zero-copy mode.
pub(crate) fn sockopt_zerocopy(fd: RawFd) -> bool {
    let mut opts: u32 = 0;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: opts and len are valid for writes of the sizes given; a bad fd is an error return.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            SOL_XDP,
            XDP_OPTIONS,
            (&mut opts as *mut u32).cast(),
            &mut len,
        )
    };
    rc == 0 && opts & XDP_OPTIONS_ZEROCOPY != 0
}

/// Lets one copy-mode TX kick of the AF_XDP socket `fd` send up to `budget` frames (older
/// kernels refuse the option, which only means more kicks per batch).
pub(crate) fn set_tx_budget(fd: RawFd, budget: u32) {
    let v: u32 = budget;
    // SAFETY: v is a valid u32 for the size given; a bad fd or option is an error return.
    let _ = unsafe {
        libc::setsockopt(
            fd,
            SOL_XDP,
            XDP_MAX_TX_SKB_BUDGET,
            (&v as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
}

/// Lets the AF_XDP socket `fd` have `bytes` of copy-mode frames in flight, and returns what the
/// kernel granted. In copy mode each frame sent becomes a socket buffer charged to this socket
/// until its last holder frees it, and on a veth that holder is the peer's stack: a receiving
/// socket that is busy keeps them in its backlog. At the default (`net.core.wmem_default`,
/// about 200 KiB: some 80 frames) a kick then sends nothing until that receiver has caught up,
/// and the sender idles while the receiver drains. `SO_SNDBUFFORCE` (CAP_NET_ADMIN) may exceed
/// `net.core.wmem_max`; without the capability `SO_SNDBUF` gets what that limit allows.
pub(crate) fn set_send_buffer(fd: RawFd, bytes: usize) -> usize {
    // The kernel doubles the value it is given (its own bookkeeping overhead).
    let v = libc::c_int::try_from(bytes / 2).unwrap_or(libc::c_int::MAX);
    for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
        // SAFETY: v is a valid c_int for the size given; a bad fd or option is an error return.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            break;
        }
    }
    let mut got: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: got and len are valid for writes of the sizes given; a bad fd is an error return.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 { got.max(0) as usize } else { 0 }
}

/// Lifts the locked-memory limit for UMEM and maps (kernels with memcg accounting, 5.11+, do
/// not use it for BPF maps anyway).
pub(crate) fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid rlimit; failure leaves the limit as it was.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// Raises this process's soft limit on open descriptors to its hard limit; returns the limits
/// (soft, hard) as they are after.
pub(crate) fn raise_nofile() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a valid rlimit into `lim`; setrlimit reads it; a failure of
    // either leaves the limit as it was.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    (lim.rlim_cur, lim.rlim_max)
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's (effective, permitted) capability sets as bit masks.
pub(crate) fn thread_caps() -> io::Result<(u64, u64)> {
    let mut head = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData words for version 3 into `data`, which has exactly
    // two; `head` is a valid header for the calling thread (pid 0).
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut head, data.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
    ))
}

/// Sets the calling thread's effective and permitted sets to `keep` (within what it has),
/// its inheritable set to nothing, and clears its ambient set: a capability dropped here
/// cannot come back in this thread, in threads it starts later or in programs it runs (unless
/// they are set-uid or the user is root: see the caller).
/// Sets the calling thread's no-new-privileges bit (inherited by the threads and programs it
/// starts): executing a set-user-ID program or one with file capabilities no longer grants
/// them.
pub(crate) fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes no pointers.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_NO_NEW_PRIVS,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn set_thread_caps(keep: u64) -> io::Result<()> {
    let (_, permitted) = thread_caps()?;
    let keep = keep & permitted;
    let mut head = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let word = |i: u32| (keep >> (32 * i)) as u32;
    let data = [
        CapData {
            effective: word(0),
            permitted: word(0),
            inheritable: 0,
        },
        CapData {
            effective: word(1),
            permitted: word(1),
            inheritable: 0,
        },
    ];
    // SAFETY: prctl with PR_CAP_AMBIENT_CLEAR_ALL takes no pointers.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: capset reads a valid header and two CapData words (version 3) that live for
    // the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut head, data.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`u64::MAX` when unlimited).
pub(crate) fn memlock_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return 0;
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        lim.rlim_cur
    }
}

/// Waits up to `timeout` for `fd` to have something to read. False on a timeout or an error
/// (the caller reads and finds out).
pub(crate) fn wait_readable(fd: std::os::fd::BorrowedFd<'_>, timeout: std::time::Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one pollfd, valid for the call; `fd` is borrowed open for its duration.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0 && p.revents & libc::POLLIN != 0
}
