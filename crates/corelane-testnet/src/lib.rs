//! Test hosts for corelane: uniquely named network namespaces joined by a veth pair, by a
//! bridge that drops, duplicates, reorders and rate-limits ([`LossyPath`]), or by a router
//! between two subnets ([`RoutedNet`]).
//!
//! ```no_run
//! use corelane_testnet::VethPair;
//! let net = VethPair::builder()
//!     .server_addr("10.77.0.1/24")
//!     .client_addr("10.77.0.2/24")
//!     .queues(2)
//!     .build()?;
//! // net.server_ns() holds net.server_if(), net.client_ns() holds net.client_if().
//! let out = net.client_ns().run(|| std::net::TcpStream::connect("10.77.0.1:7").is_ok())?;
//! # let _ = out;
//! # Ok::<(), corelane_testnet::Error>(())
//! ```
//!
//! Everything is set up with iproute2 and ethtool, the tools an operator would use, and torn down
//! when the [`VethPair`] (or a lone [`Netns`]) is dropped, including while a test panics. Names
//! carry the creating process id; namespaces left by a process that no longer exists (one killed
//! with SIGKILL, say) are removed the next time a namespace is created.

pub mod attacks;
pub mod craft;
mod flood;
mod lossy;
mod packet;
mod reorder;
mod routed;
pub mod sockopt;
mod veth;

pub use flood::{FloodReport, SynFlood, SynFloodBuilder};
pub use lossy::{Loss, LossyBuilder, LossyPath, PathCounters};
pub use routed::{RoutedBuilder, RoutedNet, Side};
pub use veth::{VethBuilder, VethPair};

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// What can go wrong while building test hosts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setup command failed; the message carries the command and what it printed.
    #[error("`{cmd}` failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A tool could not be started at all.
    #[error("cannot run `{tool}` ({source}); install it with `apt-get install {package}`")]
    MissingTool {
        /// The program.
        tool: String,
        /// The Debian package that provides it.
        package: String,
        /// The spawn error.
        source: std::io::Error,
    },
    /// Entering a namespace failed.
    #[error(
        "cannot enter network namespace {name}: {source} (network namespaces need root or CAP_SYS_ADMIN)"
    )]
    Enter {
        /// The namespace.
        name: String,
        /// The setns or open error.
        source: std::io::Error,
    },
    /// A system call made for a test host failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The closure run inside a namespace panicked.
    #[error("the code run inside namespace {0} panicked")]
    Panicked(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The address after `link/ether` in `ip -o link` output.
fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == "link/ether")?;
    let mut mac = [0u8; 6];
    let mut parts = words.next()?.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    Some(mac)
}

static SEQ: AtomicU32 = AtomicU32::new(0);

const PREFIX: &str = "clt";

/// True when this process runs as root (the privileged tests need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Decides what a privileged test does without root: in CI (`CI` set) it fails with the reason;
/// elsewhere it prints a loud message and returns `false` so the test can skip.
///
/// Returns `true` when the test may go on.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    let msg = format!(
        "{test}: needs root (network namespaces, veth, XDP and AF_XDP sockets); run as root"
    );
    if std::env::var_os("CI").is_some() {
        panic!("{msg}; CI must run the privileged tests");
    }
    eprintln!("\n*** SKIPPED {msg} ***\n");
    false
}

fn run_tool(tool: &str, package: &str, args: &[&str]) -> Result<Output> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|source| Error::MissingTool {
            tool: tool.to_string(),
            package: package.to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: format!("{tool} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

fn ip(args: &[&str]) -> Result<Output> {
    run_tool("ip", "iproute2", args)
}

/// One end of a veth pair: its name, its namespace and its queues.
pub(crate) struct End<'a> {
    pub(crate) name: &'a str,
    pub(crate) ns: &'a Netns,
    pub(crate) queues: u32,
}

/// Creates a veth pair between two namespaces, both ends with `mtu`.
pub(crate) fn veth(a: End<'_>, b: End<'_>, mtu: u32) -> Result<()> {
    let (qa, qb, mtu) = (a.queues.to_string(), b.queues.to_string(), mtu.to_string());
    ip(&[
        "link",
        "add",
        a.name,
        "netns",
        a.ns.name(),
        "numtxqueues",
        &qa,
        "numrxqueues",
        &qa,
        "mtu",
        &mtu,
        "type",
        "veth",
        "peer",
        "name",
        b.name,
        "netns",
        b.ns.name(),
        "numtxqueues",
        &qb,
        "numrxqueues",
        &qb,
        "mtu",
        &mtu,
    ])?;
    Ok(())
}

/// A network namespace, deleted (with every interface in it) on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace named `clt<pid>x<seq><tag>` with loopback up.
    pub fn new(tag: &str) -> Result<Self> {
        sweep_stale();
        let name = format!(
            "{PREFIX}{}x{}{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            tag
        );
        ip(&["netns", "add", &name])?;
        let ns = Netns { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name, as `ip netns exec NAME` takes it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside this namespace (through `ip netns exec`).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs `ip -n NS ARGS...` and returns its standard output.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        let out = ip(&full)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs many `ip` commands at once in this namespace (`ip -n NS -batch -`), one per line of
    /// `commands` (e.g. `addr add 10.0.0.5/32 dev eth0`).
    pub fn ip_batch(&self, commands: &str) -> Result<()> {
        use std::io::Write;
        let cmd = format!("ip -n {} -batch -", self.name);
        let mut child = Command::new("ip")
            .args(["-n", &self.name, "-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|source| Error::MissingTool {
                tool: "ip".into(),
                package: "iproute2".into(),
                source,
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(commands.as_bytes())
                .map_err(|source| Error::Io {
                    what: format!("writing to `{cmd}`"),
                    source,
                })?;
        }
        let out = child.wait_with_output().map_err(|source| Error::Io {
            what: format!("waiting for `{cmd}`"),
            source,
        })?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// The hardware address of `ifname` in this namespace.
    pub fn mac(&self, ifname: &str) -> Result<[u8; 6]> {
        let out = self.ip(&["-o", "link", "show", "dev", ifname])?;
        parse_mac(&out).ok_or_else(|| Error::Command {
            cmd: format!("ip -n {} -o link show dev {ifname}", self.name),
            stderr: format!("no link/ether address in {out:?}"),
        })
    }

    /// Runs a program inside the namespace and returns its output, failing on a non-zero exit.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        let out = ip(&full)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Attaches the XDP program of the object file `object` (section `xdp.frags`) to `ifname` in
    /// native mode. On veth a peer needs one for the other end's XDP_TX to reach it; corelane's
    /// own object, owning nothing, passes everything.
    pub fn attach_xdp(&self, ifname: &str, object: &str) -> Result<()> {
        let args = [
            "link",
            "set",
            "dev",
            ifname,
            "xdpdrv",
            "obj",
            object,
            "sec",
            "xdp.frags",
        ];
        self.exec("ip", &args).map(|_| ())
    }

    /// Moves the calling thread into this namespace for good. Use [`Netns::run`] or
    /// [`Netns::spawn`] to keep the caller where it is.
    pub fn enter_current_thread(&self) -> Result<()> {
        let path = format!("/run/netns/{}", self.name);
        let file = File::open(&path).map_err(|source| Error::Enter {
            name: self.name.clone(),
            source,
        })?;
        // SAFETY: setns takes a valid open descriptor (kept alive by `file` for the call) and a
        // namespace type; it only changes the calling thread's network namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(Error::Enter {
                name: self.name.clone(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Runs `f` on a new thread inside this namespace and waits for its result.
    pub fn run<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.spawn(f)?.join()
    }

    /// Starts `f` on a new thread inside this namespace.
    pub fn spawn<T, F>(&self, f: F) -> Result<NsThread<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let path = CString::new(format!("/run/netns/{}", self.name)).expect("no NUL in name");
        let name = self.name.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name(format!("ns-{name}"))
            .spawn(move || {
                // SAFETY: `path` is a valid NUL-terminated string; open has no other preconditions.
                let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                let entered = if fd < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    // SAFETY: fd is an open namespace descriptor we own; setns only affects
                    // this thread. The descriptor is closed right after.
                    let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
                    let err = std::io::Error::last_os_error();
                    // SAFETY: fd is ours and open.
                    unsafe { libc::close(fd) };
                    if rc == 0 { Ok(()) } else { Err(err) }
                };
                let ok = entered.is_ok();
                let _ = tx.send(entered);
                if ok { Some(f()) } else { None }
            })
            .map_err(|source| Error::Enter {
                name: name.clone(),
                source,
            })?;
        match rx.recv() {
            Ok(Ok(())) => Ok(NsThread { handle, name }),
            Ok(Err(source)) => {
                let _ = handle.join();
                Err(Error::Enter { name, source })
            }
            Err(_) => Err(Error::Panicked(name)),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A thread running inside a namespace; see [`Netns::spawn`].
#[derive(Debug)]
pub struct NsThread<T> {
    handle: std::thread::JoinHandle<Option<T>>,
    name: String,
}

impl<T> NsThread<T> {
    /// Waits for the thread and returns what it returned.
    pub fn join(self) -> Result<T> {
        match self.handle.join() {
            Ok(Some(v)) => Ok(v),
            _ => Err(Error::Panicked(self.name)),
        }
    }

    /// True once the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

/// Removes namespaces whose creating process is gone.
fn sweep_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('x').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
}

/// Adds `addrs` (CIDRs; IPv6 ones skip duplicate address detection so they are usable at once)
/// to `ifname` in `ns` and sets it up.
fn up_with_addrs(ns: &Netns, ifname: &str, addrs: &[String]) -> Result<()> {
    for a in addrs {
        if a.contains(':') {
            ns.ip(&["addr", "add", a, "dev", ifname, "nodad"])?;
        } else {
            ns.ip(&["addr", "add", a, "dev", ifname])?;
        }
    }
    ns.ip(&["link", "set", ifname, "up"])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mac_is_read_from_ip_link_output() {
        let line = "7: clc1@if8: <BROADCAST,UP> mtu 1500 qdisc noqueue state UP \\    link/ether 0e:85:63:c4:32:85 brd ff:ff:ff:ff:ff:ff";
        assert_eq!(
            super::parse_mac(line),
            Some([0x0e, 0x85, 0x63, 0xc4, 0x32, 0x85])
        );
        assert_eq!(
            super::parse_mac("1: lo: <LOOPBACK> link/loopback 00:00"),
            None
        );
    }
}
