//! Errors of the AF_XDP layer, each naming the cause and the fix.

use std::io;

/// What can go wrong setting up or running AF_XDP.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Not root and missing a capability AF_XDP or BPF needs.
    #[error("missing privilege: {0}")]
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
        "{0} already has an XDP program attached: another corelane runtime (one started with another CORELANE_RUN_DIR, or by another user) or an XDP tool; `ip link show dev {0}` gives its id and `bpftool prog show id ID` its name (corelane's is corelane_steer): stop the server that owns it, and detach it (`ip link set dev {0} xdp off`) only if nothing uses it, as that cuts whatever it serves"
    )]
    XdpBusy(String),
    /// Another corelane runtime serves the interface.
    #[error("{ifname} is served by another corelane runtime{}; stop it first, or use another interface", busy_pid(*pid))]
    InterfaceBusy {
        /// Interface.
        ifname: String,
        /// The owner's process id, when its record says.
        pid: Option<u32>,
    },
    /// The grant broker refused a request or went away.
    #[error("{0}")]
    Grant(String),
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
    /// Zero-copy was required and the driver refused it.
    #[error("zero-copy refused on {ifname} queue {queue}: {why}")]
    ZeroCopyRefused {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// errno of the bind.
        errno: Option<i32>,
        /// Why, and what to do.
        why: String,
    },
    /// An address or port is already owned.
    #[error("{0} is already in use by this corelane instance")]
    InUse(String),
    /// A port of a shared address is held by a kernel socket (the message names it).
    #[error("{0}")]
    KernelPort(String),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An I/O error from the rings.
    #[error(transparent)]
    Io(#[from] io::Error),
}

fn busy_pid(pid: Option<u32>) -> String {
    match pid {
        Some(p) if p == std::process::id() => format!(" in this process (pid {p})"),
        Some(p) => format!(" (pid {p}: `kill {p}`)"),
        None => String::new(),
    }
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
            " (an AF_XDP socket needs CAP_NET_RAW)".to_string()
        }
        Some(e) => format!(" ({})", io::Error::from_raw_os_error(e)),
        None => String::new(),
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Privilege(_) | Error::Grant(_) => io::ErrorKind::PermissionDenied,
            Error::NoInterface(_) => io::ErrorKind::NotFound,
            Error::InUse(_) | Error::KernelPort(_) | Error::XdpBusy(_) => io::ErrorKind::AddrInUse,
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
