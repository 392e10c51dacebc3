//! The old process's thread of an upgrade: the socket a new process connects to, what it is
//! told besides the hand-over, and the stages the cores are walked through (see `upgrade.rs`).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corelane_xsk::grant::{recv_message, send_message, set_read_deadline};
use corelane_xsk::{Handover, UpgradeOffer};

use crate::Error;
use crate::control::Shared;
use crate::lock::lock;
use crate::upgrade::{JOIN_WAIT, Stage};

/// The listening socket of [`Builder::upgrades`](crate::Builder::upgrades), removed with it.
pub(crate) struct Listener {
    sock: OwnedFd,
    path: std::path::PathBuf,
    /// The socket file's owner (this process's user), device and inode.
    owner: u32,
    /// This process's permitted capabilities when it listened (before it dropped any): a
    /// successor must hold at least these.
    caps: u64,
    file: (u64, u64),
}

impl Listener {
    /// Listens at `path`: only root and this process's user may connect (mode 0600).
    pub(crate) fn open(path: &std::path::Path) -> Result<Listener, Error> {
        use std::os::unix::fs::MetadataExt;
        let failed = |e: std::io::Error| {
            Error::Config(format!(
                "upgrades: cannot listen at {}: {e}",
                path.display()
            ))
        };
        // The socket hands over everything this process holds: its directory must be one no
        // other user can change (or swap the socket in).
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            corelane_stat::check_dir(dir).map_err(failed)?;
        }
        let sock = corelane_xsk::grant::listen_at(path, Duration::from_millis(200), 0o600)
            .map_err(failed)?;
        let m = std::fs::symlink_metadata(path).map_err(failed)?;
        Ok(Listener {
            sock,
            path: path.to_path_buf(),
            owner: m.uid(),
            caps: permitted_caps("thread-self").unwrap_or(0),
            file: (m.dev(), m.ino()),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // The new process may listen at the same path by now: only this one's file goes.
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The run's secret as the old process passes it on: the 128-bit key its stacks draw every
/// key from, or the seed a run fixed for reproducibility.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunSecret {
    Key([u64; 2]),
    Seed(u64),
}

impl RunSecret {
    /// What a run's stack configuration holds.
    pub(crate) fn of(cfg: &corelane_stack::StackConfig) -> RunSecret {
        match (cfg.key, cfg.seed) {
            (Some(k), _) => RunSecret::Key(k),
            (None, s) => RunSecret::Seed(s.unwrap_or_default()),
        }
    }

    /// Puts it in a run's stack configuration.
    pub(crate) fn apply(self, cfg: &mut corelane_stack::StackConfig) {
        match self {
            RunSecret::Key(k) => cfg.key = Some(k),
            RunSecret::Seed(s) => {
                cfg.key = None;
                cfg.seed = Some(s);
            }
        }
    }
}

/// What the old process tells the new one besides the hand-over: the run's secret, the
/// generation the new one's sockets take, and the queues to put back at the end.
pub(crate) struct Extras {
    pub(crate) secret: RunSecret,
    pub(crate) generation: u32,
    pub(crate) channels: Option<corelane_xsk::Channels>,
    /// The TCP ports the old process listens on.
    pub(crate) ports: Vec<u16>,
}

impl Extras {
    pub(crate) fn to_text(&self) -> String {
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        let secret = match self.secret {
            RunSecret::Key([a, b]) => format!("key {a:016x}{b:016x}"),
            RunSecret::Seed(x) => format!("seed {x:x}"),
        };
        let mut s = format!(
            "runtime {secret} generation {} ports {}",
            self.generation,
            if ports.is_empty() {
                "-".into()
            } else {
                ports.join(",")
            }
        );
        if let Some(c) = self.channels {
            s.push_str(&format!(
                " channels {} {} {} {} {} {}",
                c.rx, c.tx, c.combined, c.max_rx, c.max_tx, c.max_combined
            ));
        }
        s
    }

    pub(crate) fn parse(text: &str) -> Option<Extras> {
        let w: Vec<&str> = text.split_ascii_whitespace().collect();
        if w.first() != Some(&"runtime") || w.get(3) != Some(&"generation") {
            return None;
        }
        let value = *w.get(2)?;
        let secret = match *w.get(1)? {
            "key" if value.len() == 32 && value.is_ascii() => RunSecret::Key([
                u64::from_str_radix(&value[..16], 16).ok()?,
                u64::from_str_radix(&value[16..], 16).ok()?,
            ]),
            "seed" => RunSecret::Seed(u64::from_str_radix(value, 16).ok()?),
            _ => return None,
        };
        let generation: u32 = w.get(4)?.parse().ok()?;
        if w.get(5) != Some(&"ports") {
            return None;
        }
        let ports = match *w.get(6)? {
            "-" => Vec::new(),
            list => list
                .split(',')
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u16>>>()?,
        };
        let channels = match w.get(7) {
            None => None,
            Some(&"channels") => {
                let n: Vec<u32> = w[8..]
                    .iter()
                    .map(|v| v.parse().ok())
                    .collect::<Option<_>>()?;
                let [rx, tx, combined, max_rx, max_tx, max_combined] = n[..] else {
                    return None;
                };
                Some(corelane_xsk::Channels {
                    rx,
                    tx,
                    combined,
                    max_rx,
                    max_tx,
                    max_combined,
                })
            }
            Some(_) => return None,
        };
        (generation < corelane_xsk::GENERATIONS).then_some(Extras {
            secret,
            generation,
            channels,
            ports,
        })
    }
}

/// What the old process hands over besides its queues, and how long it drains.
pub(crate) struct OldRun<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    /// The run's secret (SYN cookies, ISNs).
    pub(crate) secret: RunSecret,
    pub(crate) grace: Duration,
    /// The queue count to put back at the end, which the new process inherits.
    pub(crate) restore: &'a crate::queues::RestoreQueues,
}

/// The old process's side, on its own thread while the run lasts: waits for a new process,
/// hands over to it, and walks the cores through the stages. One upgrade per run: once it has
/// switched, this process drains and ends.
pub(crate) fn serve(listener: &Listener, run: &OldRun<'_>) {
    let shared = run.shared;
    while !shared.life.ending() {
        let conn = match corelane_xsk::grant::accept(&listener.sock) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                tracing::error!("upgrades: accepting failed ({e}); no upgrade can be made");
                return;
            }
        };
        if let Err(e) = allowed(&conn, listener.owner, listener.caps) {
            tracing::warn!("upgrades: {e}");
            continue;
        }
        // Whether it ends is what lets the cores take their queues back should the upgrade
        // be called off while it holds them.
        *lock(&shared.upgrades.partner_process) = match corelane_xsk::grant::peer_pidfd(&conn) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(
                    "upgrades: no pidfd of the new process ({e}): a call-off waits for it to \
                     stand down"
                );
                None
            }
        };
        match hand_over(&conn, run) {
            Ok(()) => {
                *lock(&shared.upgrades.partner) = Some(conn);
                return;
            }
            Err(e) => {
                tracing::error!("upgrade refused or failed: {e}; this process serves on");
                let _ = send_message(conn.as_raw_fd(), &format!("error {e}"), None);
            }
        }
    }
}

/// The permitted capabilities of `/proc/{who}/status` (`thread-self`, or a pid).
fn permitted_caps(who: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{who}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapPrm:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// Only root and the user that owns the socket (this process's) may take its place, and only
/// a process holding every capability this one started with: the hand-over passes the
/// program, the queues and the UMEM, which a process of the same user without them could not
/// have made itself.
fn allowed(conn: &OwnedFd, owner: u32, caps: u64) -> Result<(), String> {
    let (pid, uid) = corelane_xsk::grant::peer(conn).map_err(|e| e.to_string())?;
    if uid != 0 && uid != owner {
        return Err(format!(
            "process {pid} of user {uid} may not take this server's place (only root or user \
             {owner})"
        ));
    }
    // Read through the pid while a pidfd holds it: a pid reused meanwhile would show as the
    // pidfd's process having ended.
    let pidfd = corelane_xsk::grant::peer_pidfd(conn).map_err(|e| e.to_string())?;
    let theirs = permitted_caps(&pid.to_string());
    if corelane_xsk::grant::process_ended(&pidfd) {
        return Err(format!("process {pid} ended while it asked"));
    }
    match theirs {
        Some(t) if t & caps == caps => Ok(()),
        Some(t) => Err(format!(
            "process {pid} of user {uid} lacks capabilities this server started with \
             (it holds {t:#x}, this one {caps:#x}): it may not take this server's place; start \
             it with the same capabilities (or as root)"
        )),
        None => Err(format!("the capabilities of process {pid} cannot be read")),
    }
}

fn hand_over(conn: &OwnedFd, run: &OldRun<'_>) -> Result<(), Error> {
    let OldRun {
        shared,
        secret,
        grace,
        restore,
    } = *run;
    // One doorbell per core.
    let cores = shared.bells.len();
    let up = &shared.upgrades;
    let steer = &shared.steer;
    let (old_gen, _) = steer.run(|s| s.upgrade_state())??;
    let new_gen = (old_gen + 1) % corelane_xsk::GENERATIONS;
    up.old_gen.store(old_gen as u8, Ordering::Release);
    *lock(&up.offers) = (0..cores).map(|_| None).collect();
    *lock(&up.listening) = vec![Vec::new(); cores];
    up.ask(Stage::Offer);
    shared.ring_all();
    up.wait_done(cores, "offered their queues")?;
    let offers: Vec<UpgradeOffer> = lock(&up.offers)
        .iter_mut()
        .enumerate()
        .map(|(i, o)| match o.take() {
            Some(Ok(o)) => Ok(o),
            Some(Err(e)) => Err(Error::Config(format!("core {i}: {e}"))),
            None => Err(Error::Config(format!("core {i} made no offer"))),
        })
        .collect::<Result<_, _>>()?;
    // A broker's program stays the broker's: the new process asks it as the old one's
    // successor.
    let steering = if steer.read().is_granted() {
        None
    } else {
        Some(steer.run(|s| s.share())??)
    };
    let handover = Handover {
        steering,
        queues: offers,
    };
    let extras = Extras {
        secret,
        generation: new_gen,
        channels: restore.channels(),
        ports: up.listening_ports(),
    };
    let answer = (|| {
        corelane_xsk::send_handover(conn.as_fd(), &handover)?;
        send_message(conn.as_raw_fd(), &extras.to_text(), None).map_err(Error::Io)?;
        // The cores hand their rings over on their next turn: rung until the new process
        // has joined them all (an idle core sleeps).
        set_read_deadline(conn, Some(Duration::from_millis(5))).map_err(Error::Io)?;
        let start = Instant::now();
        let said = loop {
            shared.ring_all();
            match recv_message(conn.as_raw_fd()) {
                Ok(m) => break m,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) && start.elapsed() < JOIN_WAIT => {}
                Err(e) => {
                    return Err(Error::Config(format!(
                        "the new process did not say it joined: {e}"
                    )));
                }
            }
        };
        set_read_deadline(conn, None).map_err(Error::Io)?;
        match said {
            Some((t, None)) if t == "joined" => Ok(()),
            Some((t, _)) => Err(Error::Config(format!("the new process said `{t}`"))),
            None => Err(Error::Config(
                "the new process closed the connection before joining".into(),
            )),
        }
    })();
    drop(handover);
    if let Err(e) = answer {
        // Told first: it stands down at once (each of its queues also sees the call-off on
        // its next turn).
        let _ = send_message(conn.as_raw_fd(), &format!("error {e}"), None);
        call_off(shared, cores);
        return Err(e);
    }
    // The drain's end is set before the cores close their listeners, so that a core whose
    // future ends at once lingers for the whole grace.
    {
        let mut until = lock(&shared.life.drain_until);
        let t = Instant::now() + grace;
        *until = Some(until.map_or(t, |u| u.min(t)));
    }
    // From here on this process gives up nothing it owns: its listeners close now, and the
    // ports they release are the new process's too.
    steer.run(|s| s.hand_on())?;
    up.ask(Stage::Record);
    shared.ring_all();
    up.wait_done(cores, "recorded their connections")?;
    steer.run(move |s| s.set_upgrade(new_gen, true))??;
    restore.hand_on();
    up.ask(Stage::Switched);
    shared.ring_all();
    // Only this word lets the new process end the split when this connection ends: a
    // connection that ends without it means the upgrade was called off.
    if let Err(e) = send_message(conn.as_raw_fd(), "switched", None) {
        tracing::error!(
            "upgrade: the new process did not hear that the program switched to it ({e}); it \
             may have ended"
        );
    }
    tracing::info!("upgrade: the new process serves; this one drains (at most {grace:?}) and ends");
    crate::StopHandle(Arc::downgrade(shared)).shutdown(grace);
    Ok(())
}

/// Calls the upgrade off: every core takes its queue back, each once the new process no
/// longer holds it (it has stood down, or ended). No deadline: until then the rings are the
/// new process's, and taking them would put frames in two hands. Ends early only when this
/// run ends (its cores stop turning).
fn call_off(shared: &Arc<Shared>, cores: usize) {
    let up = &shared.upgrades;
    up.ask(Stage::Reclaim);
    let start = Instant::now();
    let mut said = Duration::ZERO;
    while up.done.load(Ordering::Acquire) < cores && !shared.life.stop.load(Ordering::Acquire) {
        shared.ring_all();
        std::thread::sleep(Duration::from_millis(1));
        let waited = start.elapsed();
        if waited >= said + Duration::from_secs(5) {
            said = waited;
            tracing::warn!(
                "upgrade called off: {} of {cores} core(s) have their queue back after {:?}; \
                 waiting for the new process to stand down or end",
                up.done.load(Ordering::Acquire),
                waited
            );
        }
    }
    up.stage.store(Stage::Idle as u8, Ordering::Release);
    lock(&up.partner_process).take();
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;
