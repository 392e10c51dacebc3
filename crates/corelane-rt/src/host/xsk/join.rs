//! Taking over from a running process ([`Builder::upgrade_from`](crate::Builder::upgrade_from)):
//! the new process's side of an upgrade (the old one's is `upgrade.rs`).
//!
//! `build` connects to the old process, receives the XDP program and one offer per queue
//! with the run's secret ([`Joining::connect`]), and joins each queue with a socket of its own
//! registered as the next generation ([`Joining::join`]). Once the cores run and the
//! application listens on every port the old process listened on, the new process says
//! `joined` ([`Joining::serve`]): the old one then switches the program to it. When the old
//! process's connection ends (its cores have all left), the split ends: every frame comes
//! here and the kept connections are forgotten; the interface's record passes to this process.
//! When a `corelane-broker grant` holds the program, the hand-over carries only the queues: this
//! process asks the broker as the old one's successor (`hello upgrade`), which registers its
//! sockets and makes the program's changes for it, and keeps the interface's record.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use corelane_xsk::grant::{open_connection, recv_message, set_read_deadline};
use corelane_xsk::{PendingJoin, Steering, UpgradeOffer};

use crate::Error;
use crate::access::Access;
use crate::control::Shared;
use crate::host::xsk::handover::SocketTalk;
use crate::lock::lock;
use crate::upgrade_new::NewSide;
use crate::upgrade_words::Extras;

/// How long the new process waits for the old one's hand-over.
const HANDOVER_WAIT: Duration = Duration::from_secs(10);
/// How long it waits for the old process's record of the interface to go.
const CLAIM_WAIT: Duration = Duration::from_secs(30);

/// A runtime taking over from an old process, between `build` and the switch.
pub(crate) struct Joining {
    conn: OwnedFd,
    offers: Vec<UpgradeOffer>,
    pub(crate) extras: Extras,
    /// A broker holds the program (and the interface's record).
    granted: bool,
    /// The old process (its pid and a pidfd), to tell its death from its leaving.
    old_process: Option<(u32, OwnedFd)>,
}

fn refused(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Upgrade(format!("from {}: {what}", path.display()))
}

impl Joining {
    /// Connects to the old process listening at `path` and receives its hand-over. Returns the
    /// program, adopted, and the rest.
    /// With `optional`, nothing listening at `path` (no socket, or one a dead process left) is
    /// not an error: `None`, and the runtime starts afresh.
    pub(crate) fn connect(
        path: &Path,
        ifname: &str,
        optional: bool,
    ) -> Result<Option<(Access, Joining)>, Error> {
        let conn = match open_connection(path) {
            Ok(c) => c,
            Err(e)
                if optional
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) =>
            {
                tracing::info!(
                    "{ifname}: no server to take over from at {} ({e}): starting afresh",
                    path.display()
                );
                return Ok(None);
            }
            Err(e) => {
                return Err(refused(
                    path,
                    format!(
                        "nothing takes an upgrade there ({e}); the running server must be built \
                         with Builder::upgrades at that path"
                    ),
                ));
            }
        };
        // Only root or this process's own user may hand it a run: anyone else listening there
        // would feed it a program and queues of their making.
        let (pid, uid) = corelane_xsk::grant::peer(&conn).map_err(|e| refused(path, e))?;
        let me = corelane_xsk::effective_uid();
        if uid != 0 && uid != me {
            return Err(refused(
                path,
                format!(
                    "the process listening there (pid {pid}) is user {uid}'s, not root's or this \
                     user's ({me}): not taken over"
                ),
            ));
        }
        // Whether it has ended tells its death from its leaving, should the connection end
        // before it has left every queue.
        let old_process = match corelane_xsk::grant::peer_pidfd(&conn) {
            Ok(fd) => Some((pid, fd)),
            Err(e) => {
                tracing::warn!(
                    "upgrade: no pidfd of the old process ({e}): should it die during the \
                     upgrade, this one stands down"
                );
                None
            }
        };
        // Its proof first: nothing is handed to a process that has not shown it holds
        // CAP_NET_RAW here (`corelane_xsk::peer`).
        corelane_xsk::peer::send_proof(&conn).map_err(|e| refused(path, e))?;
        set_read_deadline(&conn, Some(HANDOVER_WAIT))?;
        let handover = corelane_xsk::recv_handover(conn.as_fd()).map_err(|e| refused(path, e))?;
        let text = match recv_message(conn.as_raw_fd()) {
            Ok(Some((t, None))) => t,
            Ok(_) => return Err(refused(path, "the old process ended the hand-over early")),
            Err(e) => return Err(refused(path, e)),
        };
        let extras = Extras::parse(&text)
            .ok_or_else(|| refused(path, format!("the old process said `{text}`")))?;
        set_read_deadline(&conn, None)?;
        let granted = handover.steering.is_none();
        let access = match handover.steering {
            Some(share) => {
                corelane_xsk::check_privileges()?;
                Access::Adopted(Box::new(Steering::adopt(ifname, share)?))
            }
            // The old process steers through a broker: this one asks it as its successor.
            None => {
                corelane_xsk::check_socket_privileges()?;
                Access::Granted(corelane_xsk::GrantClient::connect_successor(ifname)?)
            }
        };
        Ok(Some((
            access,
            Joining {
                conn,
                offers: handover.queues,
                extras,
                granted,
                old_process,
            },
        )))
    }

    /// Binds a socket to the queue of each lane (`(queue, cpu)`, the thread on the lane's CPU
    /// meanwhile, as `open_sockets` does) and registers it in the new generation. The lanes
    /// must be the old process's queues. The fill and completion rings stay the old process's
    /// until each core takes them over as it starts ([`PendingJoin::take_over`] in `run`):
    /// however long the application takes between `build` and `run`, the old process fills
    /// them meanwhile.
    pub(crate) fn join(
        &mut self,
        ifname: &str,
        lanes: &[(u32, usize)],
        steering: &mut Steering,
    ) -> Result<Vec<PendingJoin>, Error> {
        let mut offered: Vec<u32> = self.offers.iter().map(|o| o.queue_id).collect();
        let mut wanted: Vec<u32> = lanes.iter().map(|&(q, _)| q).collect();
        offered.sort_unstable();
        wanted.sort_unstable();
        if offered != wanted {
            return Err(Error::Upgrade(format!(
                "the old process serves queue(s) {offered:?} of {ifname} and this one \
                 would serve {wanted:?}: build it with the same cores and placement"
            )));
        }
        let generation = self.extras.generation;
        let before = crate::cpu::allowed_cpus();
        let joined = (|| {
            let mut out = Vec::with_capacity(lanes.len());
            for &(q, cpu) in lanes {
                crate::cpu::pin(cpu)?;
                let i = self
                    .offers
                    .iter()
                    .position(|o| o.queue_id == q)
                    .ok_or_else(|| Error::Upgrade(format!("queue {q} offered twice")))?;
                let sock = PendingJoin::bind(ifname, self.offers.swap_remove(i))?;
                steering.register_in(generation, q, sock.fd())?;
                out.push(sock);
            }
            Ok(out)
        })();
        crate::cpu::set_allowed(&before)?;
        joined
    }

    /// While the run lasts, on its own thread: polls the new process's side ([`NewSide`])
    /// until it ends; once the split has ended, takes the interface's record over.
    pub(crate) fn serve(self, weak: &Weak<Shared>, ifname: &str) {
        let Joining {
            conn,
            extras,
            granted,
            old_process,
            ..
        } = self;
        let mut talk = match SocketTalk::new(conn) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("upgrade: the connection to the old process: {e}");
                if let Some(shared) = weak.upgrade() {
                    crate::upgrade_new::stand_down(&shared);
                }
                return;
            }
        };
        let Some(start) = weak.upgrade().map(|s| {
            *lock(&s.upgrades.partner_process) = old_process.map(|(pid, fd)| {
                Box::new(super::Pidfd { pid, fd }) as Box<dyn crate::host::Partner>
            });
            s.clock.now()
        }) else {
            return;
        };
        let mut side = NewSide::Listening { since: start };
        loop {
            // This run has ended meanwhile: nothing to do.
            let Some(shared) = weak.upgrade() else { return };
            side.poll(&shared, &extras, &mut talk, shared.clock.now());
            match side {
                NewSide::Ended => {
                    if !granted {
                        Joining::inherit(&extras, &shared, ifname);
                    }
                    return;
                }
                NewSide::StoodDown => return,
                _ => {}
            }
            drop(shared);
            // This thread is not a core's: it may wait between polls.
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Takes the interface's record over once the old process has let it go, with the
    /// queue count to put back at the end.
    fn inherit(extras: &Extras, shared: &Shared, ifname: &str) {
        let start = Instant::now();
        let claim = loop {
            match corelane_xsk::Claim::take(ifname) {
                Ok(c) => break c,
                Err(corelane_xsk::Error::InterfaceBusy { .. }) if start.elapsed() < CLAIM_WAIT => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    tracing::warn!(
                        "upgrade: the interface's record was not taken over ({e}): a crash of \
                         this process would leave its changes for the next one to undo"
                    );
                    return;
                }
            }
        };
        let claim = Arc::new(claim);
        // The program notes in it what a crash would leave (its keeper, multicast groups).
        let noted = claim.clone();
        if let Err(e) = shared.steer.run(move |s| s.set_claim(noted)) {
            tracing::warn!(
                "upgrade: the interface's record does not list the program's keeper: {e}"
            );
        }
        *lock(&shared.upgrades.inherited) = Some(crate::queues::RestoreQueues::new(
            ifname,
            extras.channels,
            Some(claim),
        ));
    }
}
