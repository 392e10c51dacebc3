//! One corelane process per interface, and nothing left behind when one dies.
//!
//! A runtime claims its interface with an exclusive `flock` on
//! `/run/corelane/net-COOKIE/IFNAME/owner` (COOKIE: the network namespace's cookie, never reused
//! while the machine is up), held for the life of the runtime. The file records what the runtime
//! changed on the interface that the kernel would not undo by itself when the process dies: the
//! queue count it raised or lowered, the link-layer multicast groups it joined. (The XDP
//! program is attached through a BPF link and the AF_XDP sockets are file descriptors: the kernel
//! releases both with the process.) A clean exit undoes the changes and removes the file. The
//! next runtime on the interface takes the lock, finds a dead owner's record, and undoes it
//! before it starts; while the owner lives, the lock is refused and its pid named.

#![allow(unsafe_code)] // flock(2) and getsockopt(2) on descriptors this module owns.

use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::Error;
use crate::ethtool::{Channels, channels, set_channels};

pub use corelane_stat::{netns_id, run_dir};

/// The directory of an interface's claim and published state, in the calling thread's network
/// namespace.
pub fn iface_dir(ifname: &str) -> io::Result<PathBuf> {
    Ok(run_dir().join(netns_id()?).join(ifname))
}

/// What a runtime changed on its interface, as written in the claim file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Record {
    pid: u32,
    ifindex: u32,
    /// The channels before this runtime changed them (None: unchanged).
    channels: Option<Channels>,
    /// Multicast groups joined on the interface.
    groups: Vec<[u8; 6]>,
    /// The keeper holding the XDP program for a while after a death (`linger`).
    linger: Option<u32>,
}

impl Record {
    fn to_text(&self) -> String {
        let mut s = format!("pid {}\nifindex {}\n", self.pid, self.ifindex);
        if let Some(c) = self.channels {
            s += &format!(
                "channels {} {} {} {} {} {}\n",
                c.rx, c.tx, c.combined, c.max_rx, c.max_tx, c.max_combined
            );
        }
        for g in &self.groups {
            s += &format!("group {}\n", hex(g));
        }
        if let Some(pid) = self.linger {
            s += &format!("linger {pid}\n");
        }
        s
    }

    /// Parses a record; unknown or malformed lines are skipped (a record is advice for undoing,
    /// never trusted further than that).
    fn parse(text: &str) -> Record {
        let mut r = Record::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let key = words.next().unwrap_or("");
            let nums: Vec<u32> = words.clone().filter_map(|w| w.parse().ok()).collect();
            match (key, nums.as_slice()) {
                ("pid", [p]) => r.pid = *p,
                ("linger", [p]) => r.linger = Some(*p),
                ("ifindex", [i]) => r.ifindex = *i,
                ("channels", [rx, tx, combined, max_rx, max_tx, max_combined]) => {
                    r.channels = Some(Channels {
                        rx: *rx,
                        tx: *tx,
                        combined: *combined,
                        max_rx: *max_rx,
                        max_tx: *max_tx,
                        max_combined: *max_combined,
                    })
                }
                ("group", _) => {
                    if let Some(mac) = words.next().and_then(unhex) {
                        r.groups.push(mac);
                    }
                }
                _ => {}
            }
        }
        r
    }
}

fn hex(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn unhex(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// An interface claimed by this process. Shared by the parts that change the interface (they
/// note each change); the last one dropped removes the record.
#[derive(Debug)]
pub struct Claim {
    ifname: String,
    dir: PathBuf,
    path: PathBuf,
    file: Mutex<File>,
    record: Mutex<Record>,
    undone: Vec<String>,
}

impl Claim {
    /// Claims `ifname` for this process: refused while another live process (or another
    /// runtime of this one) holds it, naming its pid. A dead owner's leftovers are undone first
    /// ([`undone`](Self::undone) says what).
    ///
    /// # Errors
    /// [`Error::InterfaceBusy`] while another runtime holds the interface; [`Error::Io`] when
    /// the run directory cannot be written (it needs root, or `CORELANE_RUN_DIR`).
    pub fn take(ifname: &str) -> Result<Claim, Error> {
        let ifindex = crate::netdev::check_interface(ifname)?;
        // Records of namespaces that are gone (their interfaces went with them) would pile
        // up for as long as the machine runs: each start clears them.
        match corelane_stat::prune_gone_namespaces(&run_dir()) {
            Ok(gone) if !gone.is_empty() => tracing::info!(
                "removed the records of {} network namespaces that no longer exist from {}",
                gone.len(),
                run_dir().display()
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!("the run directory's old namespaces: {e}"),
        }
        let dir = iface_dir(ifname)?;
        // Only a directory nobody but root and this user can change, and the record never
        // through a link: root truncates and writes it.
        corelane_stat::make_dir(&dir).map_err(|e| run_dir_error(&dir, e))?;
        let path = dir.join("owner");
        let mut file = loop {
            let mut file = corelane_stat::open_file(&path, true, Some(0o644))
                .map_err(|e| run_dir_error(&path, e))?;
            // SAFETY: flock on a descriptor we own; no memory is passed.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(Error::Io(e));
                }
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let pid = Record::parse(&text).pid;
                return Err(Error::InterfaceBusy {
                    ifname: ifname.to_string(),
                    pid: (pid != 0).then_some(pid),
                });
            }
            // A clean exit removes the file: if it went between our open and our lock, the
            // lock is on a file nobody else will look at; open again.
            let same = match (file.metadata(), fs::symlink_metadata(&path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if same {
                break file;
            }
        };
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let left = Record::parse(&text);
        let undone = if left == Record::default() {
            Vec::new()
        } else {
            undo(ifname, ifindex, &left)
        };
        let record = Record {
            pid: std::process::id(),
            ifindex,
            ..Record::default()
        };
        write_record(&mut file, &record)?;
        Ok(Claim {
            ifname: ifname.to_string(),
            dir,
            path,
            file: Mutex::new(file),
            record: Mutex::new(record),
            undone,
        })
    }

    /// What a dead owner had left on the interface and this claim undid.
    pub fn undone(&self) -> &[String] {
        &self.undone
    }

    /// The directory of this interface's claim, where state is published beside it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Notes the channels the interface had before this runtime changed them (None: they are
    /// back).
    pub fn note_channels(&self, old: Option<Channels>) {
        self.update(|r| r.channels = old);
    }

    /// Notes the keeper that holds the XDP program after a death (None: ended).
    pub fn note_linger(&self, pid: Option<u32>) {
        self.update(|r| r.linger = pid);
    }

    /// Notes a multicast group joined (`true`) or left on the interface.
    pub fn note_group(&self, mac: [u8; 6], joined: bool) {
        self.update(|r| {
            r.groups.retain(|g| *g != mac);
            if joined {
                r.groups.push(mac);
            }
        });
    }

    fn update(&self, f: impl FnOnce(&mut Record)) {
        let mut record = self.record.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut record);
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = write_record(&mut file, &record) {
            tracing::warn!(
                "{}: recording a change in {} failed ({e}); a crash now would leave it behind",
                self.ifname,
                self.path.display()
            );
        }
    }
}

impl Claim {
    /// Removes the record: everything it lists has been undone. What dropping the claim does,
    /// for an owner that may end while other threads still hold it (a broker stopped while a
    /// server's session is open).
    pub fn release(&self) {
        // Removed while still locked, so the next owner opens a fresh file.
        let _ = fs::remove_file(&self.path);
        let _ = fs::remove_dir(&self.dir);
        if let Some(parent) = self.dir.parent() {
            let _ = fs::remove_dir(parent);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Everything is undone by the parts that made it (they drop first): nothing to record.
        self.release();
    }
}

fn run_dir_error(path: &Path, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none() {
        // Already says what is wrong and the fix (an untrusted directory, a link).
        return Error::Io(e);
    }
    Error::Io(io::Error::new(
        e.kind(),
        format!(
            "{}: {e} (corelane records what it changes on an interface there; run as root, or \
             set CORELANE_RUN_DIR to a directory this user may write)",
            path.display()
        ),
    ))
}

fn write_record(file: &mut File, r: &Record) -> io::Result<()> {
    let text = r.to_text();
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(text.as_bytes())?;
    file.sync_data()
}

/// Undoes a dead owner's changes on the interface, if it is still the same interface.
fn undo(ifname: &str, ifindex: u32, left: &Record) -> Vec<String> {
    let mut done = Vec::new();
    // First: the keeper still answering for the dead owner holds its program.
    if let Some(pid) = left.linger
        && crate::linger::end_keeper(pid, left.ifindex)
    {
        done.push(format!(
            "its keeper (pid {pid}, answering for it with resets) ended, its XDP program detached"
        ));
    }
    if left.ifindex != ifindex {
        // The interface was deleted and made again since: nothing of the old one is left.
        return done;
    }
    if let Some(old) = left.channels {
        let now = channels(ifname).ok().flatten();
        if now.is_some_and(|n| n.rx_queues() != old.rx_queues()) {
            match set_channels_retrying(ifname, old) {
                Ok(()) => done.push(format!(
                    "receive queues put back to {} (ethtool -L)",
                    old.rx_queues()
                )),
                Err(e) => done.push(format!(
                    "putting receive queues back to {} failed: {e}",
                    old.rx_queues()
                )),
            }
        }
    }
    let mut left_groups = 0;
    for mac in &left.groups {
        if crate::netdev::multicast(ifname, *mac, false).is_ok() {
            left_groups += 1;
        }
    }
    if left_groups > 0 {
        done.push(format!("{left_groups} multicast group(s) left"));
    }
    if !done.is_empty() {
        let pid = left.pid;
        tracing::warn!(
            "{ifname}: corelane process {pid} died without cleaning up; undone: {}",
            done.join(", ")
        );
    }
    done
}

/// Sets channels, retrying for up to a second: the driver refuses fewer queues while an XDP
/// program is attached, and a link can outlive its process's exit for a moment.
pub fn set_channels_retrying(ifname: &str, want: Channels) -> Result<(), Error> {
    let mut last = None;
    for _ in 0..100 {
        match set_channels(ifname, want) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(last.unwrap_or_else(|| Error::Config(format!("{ifname}: setting channels failed"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_and_junk_is_skipped() {
        let r = Record {
            pid: 42,
            ifindex: 7,
            channels: Some(Channels {
                rx: 0,
                tx: 0,
                combined: 1,
                max_rx: 0,
                max_tx: 0,
                max_combined: 4,
            }),
            groups: vec![[0x33, 0x33, 0xff, 0, 0, 3]],
            linger: Some(4242),
        };
        assert_eq!(Record::parse(&r.to_text()), r);
        let junk = "pid x\ngroup zz:00\nchannels 1 2\nifindex 3\nwhat\n";
        let parsed = Record::parse(junk);
        assert_eq!(parsed.ifindex, 3);
        assert_eq!(
            (parsed.pid, parsed.channels, parsed.groups.len()),
            (0, None, 0)
        );
    }

    #[test]
    fn the_namespace_id_is_stable_within_a_thread() -> io::Result<()> {
        let a = netns_id()?;
        assert!(a.starts_with("net-"), "{a}");
        assert_eq!(a, netns_id()?);
        Ok(())
    }
}
