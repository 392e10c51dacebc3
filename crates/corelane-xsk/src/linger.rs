//! A runtime that dies leaves no peer waiting.
//!
//! A process killed with SIGKILL runs nothing more, and the kernel then releases its BPF link:
//! the XDP program goes, the owned addresses belong to nobody, and a peer in the middle of a
//! transfer waits for its timeout (minutes) instead of learning at once that the connection is
//! gone, as it would from a host whose process died. So a runtime that attached the program
//! starts a keeper, `corelane-linger`: a shell holding one more reference to the program's
//! link and no other descriptor but a pipe from the runtime, which it reads. While the runtime
//! lives the keeper waits and changes nothing. When the runtime dies its AF_XDP sockets close,
//! the program finds no socket for what it would steer, and answers instead: a reset for
//! every TCP segment to an owned address, port unreachable for every UDP datagram (its
//! closed-port rules); the pipe's end tells the keeper, which waits `time` (a `sleep` it starts
//! without the link), removes the dead runtime's statistics and capture files (megabytes of
//! tmpfs nothing would free if no runtime ever came again; the claim record, which a next
//! runtime needs to undo the rest, stays), then exits, and the kernel detaches the program. A clean exit ends the keeper first, so the program is
//! detached with its owner as before; the next runtime on the interface ends a keeper it finds
//! in the claim record at once.
//!
//! Between `fork` and `execve` the child of a multi-threaded process may only make system
//! calls: everything it needs is computed before.

#![allow(unsafe_code)] // fork(2), dup2(2), close_range(2), execve(2), kill(2) and pidfds.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

/// The keeper's first argument, by which a later runtime knows it.
pub(crate) const KEEPER_NAME: &str = "corelane-linger";
/// What runs the keeper: a shell that waits, then the program that holds on.
const SHELL: &str = "/bin/bash";
const SLEEP: &str = "/bin/sleep";

/// `s` quoted for the shell (single quotes; a single quote inside as `'\''`).
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The keeper of a runtime's XDP program.
#[derive(Debug)]
pub(crate) struct Linger {
    pid: libc::pid_t,
    /// The only writer of the keeper's standard input: closed when this process ends.
    _tell: OwnedFd,
}

/// The descriptors of this process that are BPF links to program `prog_id` (read from
/// `/proc/self/fdinfo`).
pub(crate) fn link_fds(prog_id: u32) -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<RawFd>().ok()) else {
            continue;
        };
        // The kernel names its inode `bpf_link` (maps and programs `bpf-map`, `bpf-prog`).
        let is_link = std::fs::read_link(e.path()).is_ok_and(|t| {
            let t = t.to_string_lossy();
            t == "anon_inode:bpf_link" || t == "anon_inode:bpf-link"
        });
        if !is_link {
            continue;
        }
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
        let prog = info
            .lines()
            .find_map(|l| l.strip_prefix("prog_id:"))
            .and_then(|v| v.trim().parse::<u32>().ok());
        if prog == Some(prog_id) {
            out.push(fd);
        }
    }
    out
}

/// A new descriptor of this process's BPF link to program `prog_id` (close-on-exec), to keep
/// the program attached from elsewhere (another process it is passed to).
pub(crate) fn dup_link(prog_id: u32) -> io::Result<OwnedFd> {
    let fd = link_fds(prog_id)
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no BPF link to the program"))?;
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor of this process returns a new one or -1.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` was just made by fcntl and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

impl Linger {
    /// Starts the keeper of `link` (the program's BPF link), for `time` after the runtime dies;
    /// then it removes the files `tidy` names.
    pub(crate) fn start(link: RawFd, time: Duration, tidy: &[PathBuf]) -> io::Result<Linger> {
        let c = |s: &str| CString::new(s).map_err(|_| io::ErrorKind::InvalidInput);
        let shell = c(SHELL)?;
        let argv0 = c(KEEPER_NAME)?;
        let dash_c = c("-c")?;
        // Waits for the runtime to die (end of file on its pipe: the runtime holds the only
        // writer), then holds the link for `time` (the sleep without it: a keeper ended by a
        // next runtime leaves nothing holding the program), then tidies up. A clean exit kills
        // it before.
        let secs = time.as_secs().max(1);
        let tidy: Vec<String> = tidy.iter().map(|p| quoted(&p.to_string_lossy())).collect();
        let script = c(&if tidy.is_empty() {
            format!("read -r line || exec -a {KEEPER_NAME} {SLEEP} {secs}")
        } else {
            format!(
                "read -r line || {{ {SLEEP} {secs} 3<&-; rm -f -- {}; }}",
                tidy.join(" ")
            )
        })?;
        let argv = [
            argv0.as_ptr(),
            dash_c.as_ptr(),
            script.as_ptr(),
            std::ptr::null(),
        ];
        let envp = [std::ptr::null()];
        let null = c("/dev/null")?;
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned here.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let rd_raw = rd.as_raw_fd();
        // Copies above both, so that moving them into place clobbers neither.
        let (t_link, t_rd) = (link.max(rd_raw).max(3) + 1, link.max(rd_raw).max(3) + 2);
        // SAFETY: fork has no preconditions. The child only makes system calls on memory made
        // above (async-signal-safe, as a child of a multi-threaded process requires): the pipe
        // becomes its standard input, the link descriptor 3 (neither close-on-exec), standard
        // output and error /dev/null, every other descriptor is closed, signals a terminal's
        // process group would get are ignored, and it becomes the keeper or exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: see above.
            unsafe {
                let ok = libc::dup2(link, t_link) == t_link
                    && libc::dup2(rd_raw, t_rd) == t_rd
                    && libc::dup2(t_rd, 0) == 0
                    && libc::dup2(t_link, 3) == 3;
                let devnull = libc::open(null.as_ptr(), libc::O_RDWR);
                if ok && devnull >= 0 && libc::dup2(devnull, 1) == 1 && libc::dup2(devnull, 2) == 2
                {
                    libc::syscall(libc::SYS_close_range, 4u32, libc::c_uint::MAX, 0u32);
                    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGTERM] {
                        libc::signal(sig, libc::SIG_IGN);
                    }
                    libc::setsid();
                    libc::execve(shell.as_ptr(), argv.as_ptr(), envp.as_ptr());
                }
                libc::_exit(127);
            }
        }
        drop(rd);
        Ok(Linger { pid, _tell: wr })
    }

    /// The keeper's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid as u32
    }
}

impl Drop for Linger {
    /// A clean exit: the keeper ends and is waited for, so that the program is detached when
    /// its owner lets it go.
    fn drop(&mut self) {
        let mut status = 0;
        // SAFETY: signals and waits for our own child; `status` is a valid int.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}

/// Ends the keeper `pid` a dead runtime left (recorded in its claim), if it still is one, and
/// waits until it is gone (at most 2 s). True when one was ended.
///
/// A keeper is known by its name and by the XDP link on its descriptor 3 being on interface
/// `ifindex` (the recorded one): a pid reused by another process, even another interface's
/// keeper, is left alone. The process is held by a pidfd from before it is looked at, and
/// signalled through it, so the pid cannot change hands in between.
pub(crate) fn end_keeper(pid: u32, ifindex: u32) -> bool {
    // SAFETY: pidfd_open(2) with a pid and no flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: a fresh descriptor, owned by nothing else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    if !is_keeper_of(pid, ifindex) || ended(&pidfd, 0) {
        return false;
    }
    if crate::unixsock::kill_process(&pidfd).is_err() {
        return false;
    }
    ended(&pidfd, 2000);
    // Its descriptors close as it exits; give the kernel a moment to let the link go.
    std::thread::sleep(Duration::from_millis(50));
    true
}

/// Whether process `pid` is a keeper holding an XDP link on interface `ifindex`.
fn is_keeper_of(pid: u32, ifindex: u32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !cmdline.starts_with(KEEPER_NAME.as_bytes()) {
        return false;
    }
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/3")).unwrap_or_default();
    link_on(&info, ifindex)
}

/// Whether a descriptor's fdinfo is an XDP link's on interface `ifindex`.
fn link_on(fdinfo: &str, ifindex: u32) -> bool {
    let field = |key: &str| {
        fdinfo.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(key)).then(|| w.next().unwrap_or("").to_string())
        })
    };
    field("link_type:").as_deref() == Some("xdp")
        && field("ifindex:").and_then(|v| v.parse::<u32>().ok()) == Some(ifindex)
}

/// Waits up to `ms` for the process of `pidfd` to end; whether it has.
fn ended(pidfd: &OwnedFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call's duration.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0
}

#[cfg(test)]
#[path = "linger_tests.rs"]
mod tests;
