//! Records of network namespaces that no longer exist: a runtime's start removes them.
//!
//! The run directory keeps a directory per network namespace (`net-COOKIE`, the cookie never
//! reused while the machine is up) with a record per claimed interface. A runtime that ends
//! cleanly removes its own; one that was killed leaves its record for the next claim of the
//! interface to undo. When the namespace itself is gone (a container stopped, a test's
//! namespace deleted), its interfaces went with it, nothing is left to undo and nothing will
//! ever claim there again: those directories would pile up for as long as the machine runs.

#![allow(unsafe_code)] // flock(2) and setns(2).

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A directory changed this recently is left alone: a namespace made after the walk of the
/// live ones may be claiming there.
const SETTLED: Duration = Duration::from_secs(60);

/// Removes the directories of `run_dir` that name a network namespace no longer alive, and
/// returns them. A namespace is alive while a task is in it, a descriptor holds it or it is
/// mounted (`ip netns add`); a directory is kept whenever that cannot be told (another
/// namespace's cookie could not be read), while a live process holds a claim in it, and for
/// a minute after it last changed. Only root removes anything (only root can enter another
/// namespace to read its cookie); for anyone else this returns nothing.
///
/// # Errors
/// The run directory cannot be read, or another user than root can change it or a directory
/// above it ([`check_dir`](crate::check_dir)): then nothing is removed.
pub fn prune_gone_namespaces(run_dir: &Path) -> io::Result<Vec<PathBuf>> {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(Vec::new());
    }
    // Root removes directories here: only in a run directory nobody else can change (one
    // another user could swap for a link would have root remove what it points at).
    match crate::check_dir(run_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r?,
    }
    let own = crate::netns_id()?;
    let candidates: Vec<PathBuf> = match std::fs::read_dir(run_dir) {
        Ok(d) => d
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("net-") && name != own
            })
            .map(|e| e.path())
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let walked = SystemTime::now();
    let Some(live) = live_namespaces() else {
        return Ok(Vec::new());
    };
    let mut removed = Vec::new();
    for dir in candidates {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if live.contains(&name) || recently_changed(&dir, walked) || held(&dir) {
            continue;
        }
        // Never through a link: the run directory is root's (`check_dir`), and
        // `remove_dir_all` does not follow links inside.
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
            && std::fs::remove_dir_all(&dir).is_ok()
        {
            removed.push(dir);
        }
    }
    Ok(removed)
}

/// The ids (`net-COOKIE` and `net-inoINODE`, as [`netns_id`](crate::netns_id) names them) of
/// every network namespace a task is in, a descriptor holds or a mount pins; None when one
/// of them could not be read.
fn live_namespaces() -> Option<BTreeSet<String>> {
    let mut paths: Vec<PathBuf> = Vec::new();
    let procs = std::fs::read_dir("/proc").ok()?;
    for p in procs.filter_map(Result::ok) {
        let pid = p.path();
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        // Each thread: one may have entered another namespace than its process.
        if let Ok(tasks) = std::fs::read_dir(pid.join("task")) {
            paths.extend(
                tasks
                    .filter_map(Result::ok)
                    .map(|t| t.path().join("ns/net")),
            );
        }
        if let Ok(fds) = std::fs::read_dir(pid.join("fd")) {
            for fd in fds.filter_map(Result::ok) {
                let is_ns = std::fs::read_link(fd.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("net:["));
                if is_ns {
                    paths.push(fd.path());
                }
            }
        }
    }
    // Namespaces mounted on a file (`ip netns add` mounts them under /run/netns).
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        for line in info.lines() {
            let mut halves = line.split(" - ");
            let (Some(left), Some(right)) = (halves.next(), halves.next()) else {
                continue;
            };
            if right.split(' ').next() == Some("nsfs")
                && let Some(point) = left.split(' ').nth(4)
            {
                paths.push(PathBuf::from(unescape(point)));
            }
        }
    }
    let mut seen = BTreeSet::new();
    let mut live = BTreeSet::new();
    for path in paths {
        // Gone since it was listed (a task ended, a descriptor closed): skipped.
        let Ok(file) = File::open(&path) else {
            continue;
        };
        let Ok(meta) = file.metadata() else {
            continue;
        };
        if !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        live.insert(format!("net-ino{}", meta.ino()));
        // EINVAL: a mount of another kind of namespace, not a network one.
        // A thread that cannot be started (a limit on threads): nothing is pruned.
        let cookie = std::thread::scope(|s| {
            std::thread::Builder::new()
                .spawn_scoped(s, || cookie_of(&file))
                .ok()?
                .join()
                .ok()
        })?;
        match cookie {
            Ok(id) => {
                live.insert(id);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(_) => return None,
        }
    }
    Some(live)
}

/// The id of the network namespace `ns` refers to, read from a thread that enters it (the
/// calling thread, which should end after).
fn cookie_of(ns: &File) -> io::Result<String> {
    // SAFETY: setns(2) on a descriptor we hold open; it changes this thread only, which its
    // caller ends right after.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    crate::netns_id()
}

/// Whether something under `dir` changed after `walked` less [`SETTLED`].
fn recently_changed(dir: &Path, walked: SystemTime) -> bool {
    let since = walked
        .checked_sub(SETTLED)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let changed = |p: &Path| {
        std::fs::symlink_metadata(p)
            .and_then(|m| m.modified())
            .map_or(true, |t| t > since)
    };
    if changed(dir) {
        return true;
    }
    std::fs::read_dir(dir).map_or(true, |d| {
        d.filter_map(Result::ok).any(|e| changed(&e.path()))
    })
}

/// Whether a live process holds a claim under `dir` (its `owner` record is locked).
fn held(dir: &Path) -> bool {
    let Ok(ifaces) = std::fs::read_dir(dir) else {
        return true;
    };
    ifaces.filter_map(Result::ok).any(|e| {
        let Ok(f) = crate::open_file(&e.path().join("owner"), false, None) else {
            return false;
        };
        // SAFETY: flock(2) on a descriptor we own; released when it closes below.
        let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
        !free
    })
}

/// A mount point as mountinfo writes it: space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = b
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        if b[i] == b'\\'
            && let Some(v) = code
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    /// A run directory another user could change is refused before anything in it is read.
    #[test]
    fn nothing_is_removed_from_a_run_directory_others_can_change() {
        // SAFETY: geteuid(2) takes nothing and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var_os("CI").is_none(), "CI runs this as root");
            eprintln!("skipped: needs root (only root prunes)");
            return;
        }
        let run = std::env::temp_dir().join(format!("corelane-gone-open-{}", std::process::id()));
        let gone = run.join("net-ino1");
        std::fs::create_dir_all(&gone).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = super::prune_gone_namespaces(&run).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        assert!(gone.exists());
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(super::prune_gone_namespaces(&run).is_ok());
        let _ = std::fs::remove_dir_all(&run);
    }
}
