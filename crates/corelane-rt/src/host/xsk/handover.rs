//! The old process's thread of an upgrade: the socket a new process connects to, what it is
//! told besides the hand-over, and the stages the cores are walked through (see `upgrade.rs`).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use corelane_xsk::Handover;
use corelane_xsk::grant::{recv_message, send_message, set_read_deadline};

use crate::Error;
use crate::host::{Heard, Talk, UpgradeOffer};
use crate::lock::lock;
use crate::upgrade_old::{OldRun, OldSide};
use crate::upgrade_words::Word;

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
        let failed =
            |e: std::io::Error| Error::Upgrade(format!("cannot listen at {}: {e}", path.display()));
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
        // Nothing is handed over before the new process has shown who it is: its proof comes
        // first, within PROOF_WAIT.
        let successor = match vet(&conn, listener.owner, listener.caps) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("upgrades: {e}");
                continue;
            }
        };
        // Whether it ends is what lets the cores take their queues back should the upgrade
        // be called off while it holds them.
        *lock(&shared.upgrades.partner_process) = Some(Box::new(super::Pidfd {
            pid: successor.pid,
            fd: successor.pidfd,
        }));
        if run_upgrade(conn, run) {
            return;
        }
    }
}

/// The permitted capabilities of `/proc/{who}/status` (`thread-self`, or a pid).
fn permitted_caps(who: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{who}/status")).ok()?;
    corelane_xsk::peer::StatusFacts::parse(&status).map(|f| f.cap_prm)
}

/// How long a new process has, once connected, to send its proof.
const PROOF_WAIT: Duration = Duration::from_secs(2);

/// Only a process that could have made what it is handed may take this server's place (the
/// program, the queues and the UMEM): root or this user in this user namespace, holding every
/// capability this one started with, and proving `CAP_NET_RAW` with a socket it marked
/// (`corelane_xsk::peer`).
fn vet(conn: &OwnedFd, owner: u32, caps: u64) -> Result<corelane_xsk::peer::Successor, String> {
    set_read_deadline(conn, Some(PROOF_WAIT)).map_err(|e| e.to_string())?;
    let proof = match recv_message(conn.as_raw_fd()) {
        Ok(Some((word, fd))) if word == corelane_xsk::peer::PROVE => fd,
        Ok(Some((word, _))) => {
            return Err(format!(
                "a new process said `{word}` before its proof: nothing handed over"
            ));
        }
        Ok(None) => return Err("a new process closed its connection before its proof".into()),
        Err(e) => {
            return Err(format!(
                "a new process sent no proof within {PROOF_WAIT:?} ({e}): nothing handed over"
            ));
        }
    };
    corelane_xsk::peer::vet_successor(conn, owner, caps, proof.as_ref())
}

/// The upgrade's connection as a unix socket: words are messages; reads wait at most a
/// millisecond, so that the side polling it keeps its deadlines.
pub(crate) struct SocketTalk {
    pub(crate) conn: OwnedFd,
}

impl SocketTalk {
    pub(crate) fn new(conn: OwnedFd) -> std::io::Result<SocketTalk> {
        set_read_deadline(&conn, Some(Duration::from_millis(1)))?;
        Ok(SocketTalk { conn })
    }
}

impl Talk for SocketTalk {
    fn say(&mut self, word: &Word) -> std::io::Result<()> {
        send_message(self.conn.as_raw_fd(), &word.to_text(), None)
    }

    fn hear(&mut self) -> Heard {
        match recv_message(self.conn.as_raw_fd()) {
            // A descriptor sent with a word is not asked for: dropped (closed) here.
            Ok(Some((t, _))) => Heard::Word(Word::parse(&t)),
            Ok(None) => Heard::Ended,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                Heard::Nothing
            }
            Err(e) => {
                tracing::debug!("upgrade: the connection failed: {e}");
                Heard::Ended
            }
        }
    }

    fn hand_over(
        &mut self,
        program: Option<corelane_xsk::SteeringShare>,
        offers: Vec<UpgradeOffer>,
        extras: &str,
    ) -> Result<(), Error> {
        let handover = Handover {
            steering: program,
            queues: offers,
        };
        corelane_xsk::send_handover(self.conn.as_fd(), &handover)?;
        send_message(self.conn.as_raw_fd(), extras, None).map_err(Error::Io)
    }
}

/// Runs the old process's side of one upgrade over `conn` to its end: true once the program
/// has switched to the new process.
fn run_upgrade(conn: OwnedFd, run: &OldRun<'_>) -> bool {
    let shared = run.shared;
    let mut talk = match SocketTalk::new(conn) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("upgrade refused: its connection: {e}; this process serves on");
            return false;
        }
    };
    let mut side = OldSide::start(run, shared.clock.now());
    loop {
        side.poll(run, &mut talk, shared.clock.now());
        match side.over() {
            Some(Ok(())) => {
                *lock(&shared.upgrades.partner) = Some(talk.conn);
                return true;
            }
            Some(Err(why)) => {
                tracing::error!("upgrade called off: {why}");
                return false;
            }
            // This thread is not a core's: it may wait between polls.
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}
