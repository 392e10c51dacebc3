//! Errors of the AF_XDP layer, each naming the cause and the fix.

use std::ffi::CString;
use std::io;

/// What can go wrong setting up or running AF_XDP.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Not root and missing a capability AF_XDP or BPF needs.
    #[error(
        "missing privilege: {0}; run as root (sudo) or grant CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and CAP_IPC_LOCK"
    )]
    Privilege(String),
    /// The interface does not exist in this network namespace.
    #[error(
        "no interface `{0}` in this network namespace; check `ip link show`, or run inside the namespace that holds it (`ip netns exec NS ...`)"
    )]
    NoInterface(String),
    /// The driver refused the XDP program in the requested mode.
    #[error("{ifname}: the driver refused the XDP program in {mode} mode: {detail}; {hint}")]
    XdpMode {
        /// Interface.
        ifname: String,
        /// Mode asked for.
        mode: &'static str,
        /// What the kernel said.
        detail: String,
        /// What to do about it.
        hint: String,
    },
    /// Another XDP program is attached to the interface.
    #[error(
        "{0} already has an XDP program attached (another corelane, or an XDP tool?); see `ip link show dev {0}`, detach it with `ip link set dev {0} xdp off`"
    )]
    XdpBusy(String),
    /// Loading the embedded program failed.
    #[error("loading the XDP program failed: {0}")]
    Load(String),
    /// A BPF map operation failed.
    #[error("XDP map `{map}`: {detail}")]
    Map {
        /// Map name.
        map: &'static str,
        /// What failed.
        detail: String,
    },
    /// Creating the UMEM failed.
    #[error("creating the UMEM failed: {detail}")]
    Umem {
        /// errno, when known.
        errno: Option<i32>,
        /// What failed.
        detail: String,
    },
    /// Binding the AF_XDP socket failed.
    #[error("binding an AF_XDP socket to {ifname} queue {queue} failed: {detail}{}", bind_hint(*errno, ifname, *queue))]
    Bind {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// errno, when known.
        errno: Option<i32>,
        /// What failed.
        detail: String,
    },
    /// An address or port is already owned.
    #[error("{0} is already in use by this corelane instance")]
    InUse(String),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An I/O error from the rings.
    #[error(transparent)]
    Io(#[from] io::Error),
}

fn bind_hint(errno: Option<i32>, ifname: &str, queue: u32) -> String {
    match errno {
        Some(libc::EBUSY) => format!(
            " (queue {queue} of {ifname} already has an AF_XDP socket: is another corelane running on it?)"
        ),
        Some(libc::EINVAL) => {
            format!(" (does {ifname} have queue {queue}? `ethtool -l {ifname}` lists its channels)")
        }
        Some(libc::EOPNOTSUPP) => " (the driver does not support this bind mode)".to_string(),
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (AF_XDP needs root or CAP_NET_RAW and CAP_NET_ADMIN)".to_string()
        }
        Some(e) => format!(" ({})", io::Error::from_raw_os_error(e)),
        None => String::new(),
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Privilege(_) => io::ErrorKind::PermissionDenied,
            Error::NoInterface(_) => io::ErrorKind::NotFound,
            Error::InUse(_) | Error::XdpBusy(_) => io::ErrorKind::AddrInUse,
            Error::Config(_) => io::ErrorKind::InvalidInput,
            Error::Io(io) => io.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// The errno at the bottom of an error chain, if any.
pub(crate) fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>()
            && let Some(n) = io.raw_os_error()
        {
            return Some(n);
        }
        cur = err.source();
    }
    None
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// Checks that this process may load XDP programs and open AF_XDP sockets.
pub fn check_privileges() -> Result<(), Error> {
    let eff = effective_caps();
    let has = |c: u32| eff & (1u64 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(CAP_NET_RAW) {
        missing.push("CAP_NET_RAW");
    }
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Privilege(format!(
            "this process lacks {}",
            missing.join(", ")
        )))
    }
}

fn effective_caps() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

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
fn if_ioctl(ifname: &str, request: libc::c_ulong, req: &mut libc::ifreq) -> Result<(), Error> {
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
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_SCHANNELS: u32 = 0x3d;
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// An interface's queues (ethtool channels): what it has and the most it can have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Channels {
    /// RX-only channels now.
    pub rx: u32,
    /// TX-only channels now.
    pub tx: u32,
    /// Combined (RX and TX) channels now.
    pub combined: u32,
    /// Most RX-only channels.
    pub max_rx: u32,
    /// Most TX-only channels.
    pub max_tx: u32,
    /// Most combined channels.
    pub max_combined: u32,
}

impl Channels {
    /// Receive queues now (rx + combined, at least 1).
    pub fn rx_queues(&self) -> u32 {
        (self.rx + self.combined).max(1)
    }

    /// The most receive queues the driver allows.
    pub fn max_rx_queues(&self) -> u32 {
        (self.max_rx + self.max_combined).max(1)
    }
}

fn ethtool<T>(ifname: &str, data: &mut T) -> Result<(), Error> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    req.ifr_ifru.ifru_data = (data as *mut T).cast();
    if_ioctl(ifname, SIOCETHTOOL, &mut req)
}

fn is_unsupported(e: &Error) -> bool {
    matches!(e, Error::Io(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP))
}

/// The interface's channels (ethtool -l); None when the driver does not report them (one queue).
pub fn channels(ifname: &str) -> Result<Option<Channels>, Error> {
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    match ethtool(ifname, &mut ch) {
        Ok(()) => Ok(Some(Channels {
            rx: ch.rx_count,
            tx: ch.tx_count,
            combined: ch.combined_count,
            max_rx: ch.max_rx,
            max_tx: ch.max_tx,
            max_combined: ch.max_combined,
        })),
        Err(e) if is_unsupported(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The interface's RX queue count (ethtool channels: rx + combined; 1 when the driver does not
/// report channels).
pub fn rx_queue_count(ifname: &str) -> Result<u32, Error> {
    Ok(channels(ifname)?.map_or(1, |c| c.rx_queues()))
}

/// Sets the interface's channels (ethtool -L). Setting more queues than the driver's maximum,
/// or on a driver without channel control, is a [`Error::Config`] that says so.
pub fn set_channels(ifname: &str, want: Channels) -> Result<(), Error> {
    let now = channels(ifname)?.ok_or_else(|| {
        Error::Config(format!(
            "{ifname}: the driver does not report or set its queues (ethtool -l {ifname})"
        ))
    })?;
    if want.rx > now.max_rx || want.tx > now.max_tx || want.combined > now.max_combined {
        return Err(Error::Config(format!(
            "{ifname} allows at most {} rx, {} tx and {} combined queue(s); asked for {}, {} and {}",
            now.max_rx, now.max_tx, now.max_combined, want.rx, want.tx, want.combined
        )));
    }
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_SCHANNELS,
        rx_count: want.rx,
        tx_count: want.tx,
        combined_count: want.combined,
        ..EthtoolChannels::default()
    };
    ethtool(ifname, &mut ch)
}

/// An interface's driver and bus (ethtool -i).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// Driver name (`veth`, `ice`, `mlx5_core`, ...).
    pub driver: String,
    /// Bus address (`0000:3b:00.0` for a PCI device; empty for a virtual one).
    pub bus_info: String,
}

#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// The interface's driver name and bus address.
pub fn driver_info(ifname: &str) -> Result<DriverInfo, Error> {
    // SAFETY: the struct is plain data; all-zero is a valid value.
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    match ethtool(ifname, &mut info) {
        Ok(()) => {}
        Err(e) if is_unsupported(&e) => return Ok(DriverInfo::default()),
        Err(e) => return Err(e),
    }
    let text = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    };
    Ok(DriverInfo {
        driver: text(&info.driver),
        bus_info: text(&info.bus_info),
    })
}

/// The interface's hardware (MAC) address.
pub fn mac_address(ifname: &str) -> Result<[u8; 6], Error> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if_ioctl(ifname, libc::SIOCGIFHWADDR, &mut req)?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member of the union.
    let addr = unsafe { req.ifr_ifru.ifru_hwaddr };
    if addr.sa_family != libc::ARPHRD_ETHER {
        return Err(Error::Config(format!(
            "{ifname} is not an Ethernet interface (hardware type {})",
            addr.sa_family
        )));
    }
    let mut mac = [0u8; 6];
    for (m, b) in mac.iter_mut().zip(addr.sa_data) {
        *m = b as u8;
    }
    Ok(mac)
}

/// The interface's MTU.
pub fn mtu(ifname: &str) -> Result<u32, Error> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if_ioctl(ifname, libc::SIOCGIFMTU, &mut req)?;
    // SAFETY: SIOCGIFMTU filled the mtu member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}
