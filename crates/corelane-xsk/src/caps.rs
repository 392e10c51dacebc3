//! Capabilities: what each part of corelane needs, checked up front with one-line errors, and
//! dropped once a part no longer needs them.
//!
//! | who | needs |
//! |---|---|
//! | attaching the XDP program ([`Steering::attach`](crate::Steering::attach), `corelane-broker grant`) | `CAP_NET_ADMIN`, `CAP_BPF`, `CAP_PERFMON` |
//! | an AF_XDP socket ([`XskQueue::open`](crate::XskQueue::open)) | `CAP_NET_RAW`, and `CAP_IPC_LOCK` or a locked-memory limit that holds the UMEM |
//!
//! `CAP_SYS_ADMIN` stands in for `CAP_BPF` and `CAP_PERFMON`, as the kernel allows.

use crate::error::Error;

/// A Linux capability corelane asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cap {
    /// Attach XDP programs, change queues and multicast filters.
    NetAdmin,
    /// Open AF_XDP sockets.
    NetRaw,
    /// Lock the UMEM's pages without a locked-memory limit.
    IpcLock,
    /// Create BPF maps and load programs.
    Bpf,
    /// Let the verifier accept the program's pointer arithmetic.
    Perfmon,
    /// The catch-all: stands in for `Bpf` and `Perfmon`.
    SysAdmin,
    /// Bind ports below 1024 (a shared address's placeholder sockets).
    NetBindService,
}

impl Cap {
    /// The capability's number in `linux/capability.h`.
    pub fn number(self) -> u32 {
        match self {
            Cap::NetBindService => 10,
            Cap::NetAdmin => 12,
            Cap::NetRaw => 13,
            Cap::IpcLock => 14,
            Cap::SysAdmin => 21,
            Cap::Perfmon => 38,
            Cap::Bpf => 39,
        }
    }

    /// Its name as `capabilities(7)` and `setpriv` spell it (`CAP_NET_RAW`).
    pub fn name(self) -> &'static str {
        match self {
            Cap::NetBindService => "CAP_NET_BIND_SERVICE",
            Cap::NetAdmin => "CAP_NET_ADMIN",
            Cap::NetRaw => "CAP_NET_RAW",
            Cap::IpcLock => "CAP_IPC_LOCK",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::Perfmon => "CAP_PERFMON",
            Cap::Bpf => "CAP_BPF",
        }
    }

    fn bit(self) -> u64 {
        1 << self.number()
    }
}

impl std::fmt::Display for Cap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What attaching the steering program needs.
pub const ATTACH_CAPS: [Cap; 3] = [Cap::NetAdmin, Cap::Bpf, Cap::Perfmon];
/// What opening AF_XDP sockets needs (plus locked memory: `CAP_IPC_LOCK` or a limit).
pub const SOCKET_CAPS: [Cap; 1] = [Cap::NetRaw];

/// True when the calling thread's effective set holds `cap` (or `CAP_SYS_ADMIN`, for the two
/// it stands in for).
pub fn has_cap(cap: Cap) -> bool {
    let eff = crate::sys::thread_caps().map_or(0, |(e, _)| e);
    let sys_admin = matches!(cap, Cap::Bpf | Cap::Perfmon) && eff & Cap::SysAdmin.bit() != 0;
    eff & cap.bit() != 0 || sys_admin
}

/// The capabilities of `need` the calling thread lacks.
pub fn missing_caps(need: &[Cap]) -> Vec<Cap> {
    need.iter().copied().filter(|c| !has_cap(*c)).collect()
}

/// Checks that this process may both attach the XDP program and open AF_XDP sockets (a runtime
/// that does everything itself).
pub fn check_privileges() -> Result<(), Error> {
    check(&RUNTIME_CAPS, RUNTIME_FIX)
}

/// What a runtime that attaches its own program needs.
const RUNTIME_CAPS: [Cap; 4] = [Cap::NetAdmin, Cap::NetRaw, Cap::Bpf, Cap::Perfmon];
const RUNTIME_FIX: &str = "a corelane runtime that attaches its own XDP program needs CAP_NET_ADMIN, CAP_NET_RAW, \
         CAP_BPF and CAP_PERFMON: run it as root, grant those (setpriv \
         --inh-caps=+net_admin,+net_raw,+bpf,+perfmon \
         --ambient-caps=+net_admin,+net_raw,+bpf,+perfmon PROGRAM, run by root), or let \
         `corelane-broker grant` attach the program so the server needs only CAP_NET_RAW";

/// Checks at once all that a runtime needs before it opens its sockets: the capabilities (those
/// of a server under a grant when `granted`, else those of one that attaches its own program)
/// and `umem` bytes of locked memory. One error names every requirement not met, so an operator
/// fixes them in one round.
pub fn check_runtime_needs(granted: bool, umem: u64) -> Result<(), Error> {
    let caps = if granted {
        check(&SOCKET_CAPS, SOCKET_FIX)
    } else {
        check(&RUNTIME_CAPS, RUNTIME_FIX)
    };
    let unmet: Vec<String> = [caps, check_memlock(umem)]
        .into_iter()
        .filter_map(|r| match r {
            Err(Error::Privilege(m)) => Some(m),
            _ => None,
        })
        .collect();
    if unmet.is_empty() {
        Ok(())
    } else {
        Err(Error::Privilege(unmet.join("; and ")))
    }
}

/// Checks that this process may attach the XDP program (the grant broker's part).
pub fn check_attach_privileges() -> Result<(), Error> {
    check(
        &ATTACH_CAPS,
        "attaching the XDP program needs CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON: run it as root \
         or grant those (setpriv --inh-caps=+net_admin,+bpf,+perfmon \
         --ambient-caps=+net_admin,+bpf,+perfmon PROGRAM, run by root)",
    )
}

/// Checks that this process may open AF_XDP sockets (all a server with a grant needs).
pub fn check_socket_privileges() -> Result<(), Error> {
    check(&SOCKET_CAPS, SOCKET_FIX)
}

const SOCKET_FIX: &str = "an AF_XDP socket needs CAP_NET_RAW: run as root or grant it (setpriv \
                          --inh-caps=+net_raw --ambient-caps=+net_raw PROGRAM, run by root, \
                          or AmbientCapabilities=CAP_NET_RAW in a systemd unit)";

fn check(need: &[Cap], fix: &str) -> Result<(), Error> {
    let missing = missing_caps(need);
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|c| c.name()).collect();
    Err(Error::Privilege(format!(
        "this process lacks {}; {fix}",
        names.join(", ")
    )))
}

/// Checks that `bytes` of UMEM can be locked: `CAP_IPC_LOCK`, or a locked-memory limit that
/// holds them (after raising it as far as this process may).
pub fn check_memlock(bytes: u64) -> Result<(), Error> {
    crate::sys::raise_memlock();
    if has_cap(Cap::IpcLock) {
        return Ok(());
    }
    let limit = crate::sys::memlock_limit();
    if limit >= bytes {
        return Ok(());
    }
    Err(Error::Privilege(memlock_message(bytes, limit)))
}

pub(crate) fn memlock_message(bytes: u64, limit: u64) -> String {
    let fix = "grant CAP_IPC_LOCK, or raise the limit (`ulimit -l unlimited`, `prlimit \
               --memlock=unlimited`, LimitMEMLOCK=infinity in a systemd unit)";
    if bytes <= limit {
        // Refused although this much fits: the kernel counts every page this user has
        // locked, in every process, against the one limit.
        return format!(
            "the kernel refused {} KiB of locked memory for a UMEM although the limit is {} \
             KiB: it counts what this user has locked already, in this process (other UMEMs) \
             and in every other process of the same user, against that one limit; {fix}",
            bytes.div_ceil(1024),
            limit / 1024
        );
    }
    format!(
        "the UMEMs need {} KiB of locked memory and the locked-memory limit is {} KiB (shared \
         by every process of this user); {fix}",
        bytes.div_ceil(1024),
        limit / 1024
    )
}

/// Keeps only `keep` of the calling thread's capabilities (those it has) and drops the rest
/// for good: effective, permitted and inheritable sets, and the ambient set; and sets the
/// thread's no-new-privileges bit, so that no program it (or a thread it starts) executes
/// gains privileges from a set-user-ID bit or file capabilities. Threads started by this
/// thread afterwards start without them. Other threads are not changed: call it before
/// starting them.
///
/// A process running as user 0 regains every capability when it executes a program; a
/// process of another user does not.
///
/// # Errors
/// The kernel refused (it does not refuse dropping).
pub fn retain_caps(keep: &[Cap]) -> std::io::Result<()> {
    let mask = keep.iter().fold(0u64, |m, c| m | c.bit());
    crate::sys::set_thread_caps(mask)?;
    crate::sys::set_no_new_privs()
}

/// The calling thread's effective capabilities, by number (bit N set: capability N held).
pub fn effective_caps() -> u64 {
    crate::sys::thread_caps().map_or(0, |(e, _)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_match_capability_h() {
        assert_eq!(Cap::NetRaw.number(), 13);
        assert_eq!(Cap::Bpf.number(), 39);
        assert_eq!(Cap::Perfmon.name(), "CAP_PERFMON");
    }

    #[test]
    fn a_refusal_within_the_limit_says_what_else_counts_against_it() {
        // Past the limit: the two amounts.
        let over = memlock_message(16 << 20, 8 << 20);
        assert!(
            over.contains("need 16384 KiB") && over.contains("8192 KiB"),
            "{over}"
        );
        // Refused although it fits (what a user met as "8192 KiB needed, limit 8192 KiB"):
        // the rest of the user's locked memory is why.
        let within = memlock_message(8 << 20, 8 << 20);
        assert!(
            within.contains("although the limit is 8192 KiB"),
            "{within}"
        );
        assert!(
            within.contains("every other process of the same user"),
            "{within}"
        );
        assert!(within.contains("CAP_IPC_LOCK"), "{within}");
    }

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// Runs `f` on a fresh thread (dropping capabilities there leaves the test's own alone).
    fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
        std::thread::spawn(f)
            .join()
            .map_err(|_| "the thread panicked".to_string())
    }

    #[test]
    fn dropping_in_a_thread_leaves_it_without_and_other_threads_alone() -> TestResult {
        let before = effective_caps();
        let (after, child, refused) = on_thread(|| -> Result<_, String> {
            retain_caps(&[]).map_err(|e| e.to_string())?;
            let after = effective_caps();
            let child = on_thread(effective_caps)?;
            Ok((after, child, check_socket_privileges().is_err()))
        })??;
        assert_eq!(after, 0, "the thread kept capabilities");
        assert_eq!(child, 0, "a thread it started regained capabilities");
        assert!(refused, "the socket check passed without CAP_NET_RAW");
        assert_eq!(effective_caps(), before, "another thread lost capabilities");
        let nnp = |status: String| status.lines().any(|l| l == "NoNewPrivs:\t1");
        let (dropped, child) = on_thread(|| -> Result<_, String> {
            retain_caps(&[]).map_err(|e| e.to_string())?;
            let own =
                std::fs::read_to_string("/proc/thread-self/status").map_err(|e| e.to_string())?;
            let child = on_thread(|| std::fs::read_to_string("/proc/thread-self/status"))?
                .map_err(|e| e.to_string())?;
            Ok((own, child))
        })??;
        assert!(nnp(dropped), "no new privileges for the thread");
        assert!(nnp(child), "nor for a thread it started");
        let own = std::fs::read_to_string("/proc/thread-self/status")?;
        assert!(!nnp(own), "another thread was left alone");
        Ok(())
    }

    #[test]
    fn a_missing_capability_is_one_line_naming_it_and_the_fix() -> TestResult {
        let msg = on_thread(|| -> Result<String, String> {
            retain_caps(&[]).map_err(|e| e.to_string())?;
            match check_privileges() {
                Ok(()) => Err("the check passed with no capabilities".into()),
                Err(e) => Ok(e.to_string()),
            }
        })??;
        assert!(!msg.contains('\n'), "{msg}");
        for c in [
            "CAP_NET_ADMIN",
            "CAP_NET_RAW",
            "CAP_BPF",
            "CAP_PERFMON",
            "corelane-broker",
        ] {
            assert!(msg.contains(c), "{c} missing from: {msg}");
        }
        Ok(())
    }
}
