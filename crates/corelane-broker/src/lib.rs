//! The privileged half of corelane: a broker that attaches the XDP steering program to an
//! interface and grants one server at a time the addresses and ports it may steer.
//!
//! The server then needs only `CAP_NET_RAW` (for its AF_XDP sockets) and locked memory; it asks
//! the broker over a Unix socket for every change (the protocol is in
//! [`corelane_xsk::grant`]), and the broker refuses what the grant does not cover. The broker
//! holds the interface's claim, so a crash of either side leaves nothing behind: when the
//! server goes, the broker stops steering what it asked for; when the broker goes, the kernel
//! detaches the program, and the next broker or runtime puts back the queue count.
//!
//! ```no_run
//! use corelane_broker::{Broker, Grant};
//! let grant = Grant::parse("veth0", &["10.0.0.1"], &["7", "49152-65535"], &["7"], &[0])?;
//! let broker = Broker::start(grant)?;
//! println!("{}", broker.describe());
//! let stop = std::sync::atomic::AtomicBool::new(false);
//! broker.serve(&stop)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::fs;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use corelane_xsk::grant::{accept, grant_socket_path, listen_refusing, set_read_deadline};
use corelane_xsk::{AttachMode, Channels, Claim, Error, Proto, Steering};

/// What a server may steer on one interface, and who may ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The interface.
    pub ifname: String,
    /// Addresses the server may own.
    pub addrs: Vec<IpAddr>,
    /// TCP ports it may steer.
    pub tcp: Vec<RangeInclusive<u16>>,
    /// UDP ports it may steer.
    pub udp: Vec<RangeInclusive<u16>>,
    /// The users whose processes may take the grant.
    pub uids: Vec<u32>,
    /// How to attach the program.
    pub attach: AttachMode,
    /// The most receive queues a server may set the interface to (0: it may not change
    /// them): the queue count is the whole interface's, not the server's.
    pub channels: u32,
    /// The VLAN served (by default untagged frames).
    pub vlan: corelane_xsk::Vlan,
    /// Addresses the kernel holds that a server may still own whole (`addr A`, every port
    /// corelane's). Any other address the kernel holds is served only shared (`addr A
    /// shared`: corelane's ports alone), whatever the server asks: owned whole, it would take
    /// the host's own ssh and kernel listeners on it.
    pub whole: Vec<IpAddr>,
}

impl Grant {
    /// Why `uid` is refused, and the fix.
    pub(crate) fn not_granted(&self, uid: u32) -> String {
        format!(
            "uid {uid} is not granted {} (granted: uid {}); start corelane-broker grant with --user \
             {uid}",
            self.ifname,
            list_or_none(&self.uids.iter().map(|u| u.to_string()).collect::<Vec<_>>())
        )
    }

    /// A grant from the command line's words: addresses, port lists (`7`, `8000-8099`, or
    /// several separated by commas) and user ids.
    ///
    /// # Errors
    /// A word that is not an address, a port, a range or a user id, named.
    pub fn parse(
        ifname: &str,
        addrs: &[&str],
        tcp: &[&str],
        udp: &[&str],
        uids: &[u32],
    ) -> Result<Grant, String> {
        let addrs = addrs
            .iter()
            .map(|a| {
                a.parse::<IpAddr>()
                    .map_err(|_| format!("`{a}` is not an IP address"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Grant {
            ifname: ifname.to_string(),
            addrs,
            tcp: parse_ports(tcp)?,
            udp: parse_ports(udp)?,
            uids: uids.to_vec(),
            attach: AttachMode::Auto,
            channels: 0,
            vlan: corelane_xsk::Vlan::default(),
            whole: Vec::new(),
        })
    }

    fn ports(&self, proto: Proto) -> &[RangeInclusive<u16>] {
        match proto {
            Proto::Tcp => &self.tcp,
            Proto::Udp => &self.udp,
        }
    }

    /// True when the grant lets the server steer `proto` port `port`.
    pub fn allows_port(&self, proto: Proto, port: u16) -> bool {
        self.ports(proto).iter().any(|r| r.contains(&port))
    }

    /// One line: addresses, ports, users and queues.
    pub fn summary(&self) -> String {
        let addrs: Vec<String> = self.addrs.iter().map(|a| a.to_string()).collect();
        let uids: Vec<String> = self.uids.iter().map(|u| u.to_string()).collect();
        let queues = match self.channels {
            0 => "as they are".to_string(),
            n => format!("up to {n}"),
        };
        format!(
            "addresses {}; tcp {}; udp {}; uid {}; queues {queues}",
            list_or_none(&addrs),
            ranges(&self.tcp),
            ranges(&self.udp),
            list_or_none(&uids)
        )
    }

    /// Whether a server may have the interface's `now` receive queues set to `need`.
    ///
    /// # Errors
    /// A change the grant does not allow, with the option that would.
    pub fn allows_channels(&self, now: u32, need: u32) -> Result<(), String> {
        if need == now {
            return Ok(());
        }
        if need == 0 || need > self.channels {
            return Err(match self.channels {
                0 => format!(
                    "{} has {now} receive queue(s) and the grant allows no change (to let a \
                     server set up to N: corelane-broker grant ... --channels N)",
                    self.ifname
                ),
                max => format!(
                    "{need} receive queues asked for {}; the grant allows 1 to {max}",
                    self.ifname
                ),
            });
        }
        Ok(())
    }
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn ranges(r: &[RangeInclusive<u16>]) -> String {
    let v: Vec<String> = r
        .iter()
        .map(|r| {
            if r.start() == r.end() {
                r.start().to_string()
            } else {
                format!("{}-{}", r.start(), r.end())
            }
        })
        .collect();
    list_or_none(&v)
}

/// Parses port words: `7`, `8000-8099`, `7,9,1000-1100`.
///
/// # Errors
/// A word that is not a port or an ascending range, named.
pub fn parse_ports(words: &[&str]) -> Result<Vec<RangeInclusive<u16>>, String> {
    let mut out = Vec::new();
    for part in words.iter().flat_map(|w| w.split(',')) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let bad = || format!("`{part}` is not a port (1-65535) or a range of ports (8000-8099)");
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let lo: u16 = lo.trim().parse().map_err(|_| bad())?;
        let hi: u16 = hi.trim().parse().map_err(|_| bad())?;
        if lo == 0 || hi < lo {
            return Err(bad());
        }
        out.push(lo..=hi);
    }
    Ok(out)
}

/// What the current server asked for, undone when it goes.
#[derive(Debug, Default)]
struct Session {
    pid: u32,
    uid: u32,
    addrs: Vec<IpAddr>,
    ports: HashSet<(Proto, u16)>,
    /// The files made for it, with their identity (device, inode): removed when it goes
    /// while their paths still name them (its successor makes its own at the same paths).
    stats: Option<(PathBuf, (u64, u64))>,
    capture: Option<(PathBuf, (u64, u64))>,
    /// The sealed memory files those pointers lead to (`corelane_stat::sealed_file`), kept
    /// open for root's readers while the session lasts: the latest of each kind only, so that
    /// asking again and again holds no more memory files than asking once.
    kept_stats: Option<fs::File>,
    kept_capture: Option<fs::File>,
}

impl Session {
    /// Removes the files made for this session that are still its own.
    fn remove_files(&self) {
        use std::os::unix::fs::MetadataExt;
        for (p, id) in self.stats.iter().chain(&self.capture) {
            if fs::metadata(p).is_ok_and(|m| (m.dev(), m.ino()) == *id) {
                let _ = fs::remove_file(p);
            }
        }
    }
}

#[derive(Debug)]
struct State {
    /// None once the broker has stopped.
    steering: Option<Steering>,
    claim: Arc<Claim>,
    /// The interface's channels before the first change (put back when the broker stops).
    restore: Option<Channels>,
    /// The server holding the grant, and during an upgrade its successor after it (at most
    /// two).
    sessions: Vec<Session>,
    /// Addresses of a server that left, still owned until the given time so that the
    /// program answers its peers' segments with resets (as a host does for a process that
    /// died) instead of dropping them: disowned when the next server takes the grant, or
    /// after ADDR_LINGER.
    lingering: Vec<(IpAddr, std::time::Instant)>,
}

/// How long a departed server's addresses keep answering with resets.
const ADDR_LINGER: std::time::Duration = std::time::Duration::from_secs(60);

impl State {
    /// Disowns the lingering addresses (`all`), or those whose time is up.
    fn end_lingering(&mut self, all: bool) {
        let now = std::time::Instant::now();
        let Some(steering) = self.steering.as_mut() else {
            return;
        };
        self.lingering.retain(|&(a, until)| {
            let keep = !all && now < until;
            if !keep {
                let _ = steering.disown_addr(a);
            }
            keep
        });
    }
}

/// The broker: the program attached, the grant's socket listening.
#[derive(Debug)]
pub struct Broker {
    grant: Arc<Grant>,
    listener: OwnedFd,
    path: PathBuf,
    state: Arc<Mutex<State>>,
    mode: String,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Broker {
    /// Claims the interface, attaches the program and listens for a server.
    ///
    /// # Errors
    /// Missing privileges (one line, naming them), no such interface, another corelane on
    /// it, a driver that refuses the program, or a run directory that cannot be written.
    pub fn start(grant: Grant) -> Result<Broker, Error> {
        corelane_xsk::check_attach_privileges()?;
        if grant.uids.is_empty() {
            return Err(Error::Config(
                "a grant needs at least one user (--user NAME)".into(),
            ));
        }
        let claim = Arc::new(Claim::take(&grant.ifname)?);
        let mut steering = Steering::attach_vlan(&grant.ifname, grant.attach, grant.vlan)?;
        steering.set_claim(claim.clone());
        let mode = match steering.fallback_reason() {
            Some(why) => format!("{} {why}", steering.mode()),
            None => steering.mode().to_string(),
        };
        let path = grant_socket_path(&grant.ifname)?;
        // accept() wakes every 200 ms to see whether the broker should stop.
        // No descriptor is taken from a connection before its user is known to be granted
        // (`serve`): a refused one cannot leave one whose last close blocks the broker.
        let (listener, refuses) =
            listen_refusing(&path, std::time::Duration::from_millis(200), 0o666, true)?;
        if !refuses {
            tracing::warn!(
                "this kernel cannot refuse descriptors on the grant socket (SO_PASSRIGHTS, Linux \
                 6.16): a user not granted can send one whose last close blocks the broker's \
                 refusals"
            );
        }
        Ok(Broker {
            grant: Arc::new(grant),
            listener,
            path,
            state: Arc::new(Mutex::new(State {
                steering: Some(steering),
                claim,
                restore: None,
                sessions: Vec::new(),
                lingering: Vec::new(),
            })),
            mode,
        })
    }

    /// The grant's socket.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// One paragraph: interface, mode, socket, the grant, and what a crash of the last
    /// process left behind (undone).
    pub fn describe(&self) -> String {
        let st = lock(&self.state);
        let mut s = format!(
            "{}: XDP program attached in {} mode; grant socket {}\ngrant: {}",
            self.grant.ifname,
            self.mode,
            self.path.display(),
            self.grant.summary()
        );
        if !st.claim.undone().is_empty() {
            s += &format!(
                "\na corelane process died on {} without cleaning up; undone: {}",
                self.grant.ifname,
                st.claim.undone().join(", ")
            );
        }
        s
    }

    /// Serves servers, one at a time, until `stop` is set; then detaches the program, puts
    /// the interface's queues back and removes the socket.
    ///
    /// # Errors
    /// Accepting failed for a reason other than the wake-up timeout.
    pub fn serve(&self, stop: &AtomicBool) -> Result<(), Error> {
        // Nothing a local user does to the socket ends this loop (which would detach the
        // program under the server it serves), nor keeps a granted user out: a failed accept
        // (out of descriptors) or thread is logged and survived; a connection from a user
        // not granted is closed at once, before it holds anything; each granted user has
        // MAX_CONNECTIONS_PER_USER of its own (one user's idle connections never fill
        // another's); one that does not say hello within HELLO_DEADLINE is dropped.
        let open: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
        let refuser = refuse::Refuser::start().map_err(Error::Io)?;
        let mut complained = None::<std::time::Instant>;
        let mut complain = |what: String| {
            if complained.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(1)) {
                complained = Some(std::time::Instant::now());
                tracing::warn!("{}: {what}", self.grant.ifname);
            }
        };
        while !stop.load(Ordering::SeqCst) {
            lock(&self.state).end_lingering(false);
            let conn = match accept(&self.listener) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => {
                    complain(format!("accepting a connection to the grant socket: {e}"));
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                }
            };
            let uid = match corelane_xsk::grant::peer(&conn) {
                Ok((_, uid)) => uid,
                Err(e) => {
                    complain(format!(
                        "a connection to the grant socket without credentials: {e}"
                    ));
                    continue;
                }
            };
            if !self.grant.uids.contains(&uid) {
                // Told why and closed (`refuse.rs`): it holds no slot and no session.
                refuser.refuse(conn, format!("err {}", self.grant.not_granted(uid)));
                complain(format!(
                    "uid {uid} is not granted the interface: its connections are closed at once"
                ));
                continue;
            }
            {
                let mut open = open.lock().unwrap_or_else(|p| p.into_inner());
                let n = open.entry(uid).or_default();
                if *n >= MAX_CONNECTIONS_PER_USER {
                    refuser.refuse(
                        conn,
                        format!(
                            "err uid {uid} has {MAX_CONNECTIONS_PER_USER} connections to the \
                             grant socket open already"
                        ),
                    );
                    complain(format!(
                        "uid {uid} has {MAX_CONNECTIONS_PER_USER} connections to the grant socket \
                         open: its new ones are closed"
                    ));
                    continue;
                }
                *n += 1;
            }
            // A granted user's connection takes descriptors (its queues' sockets, a
            // successor's proof); their closes happen on its session's thread.
            if let Err(e) = corelane_xsk::grant::take_descriptors(&conn, true)
                .and_then(|_| set_read_deadline(&conn, Some(HELLO_DEADLINE)))
            {
                complain(format!("a connection to the grant socket: {e}"));
                release_slot(&open, uid);
                continue;
            }
            let (state, grant, held) = (self.state.clone(), self.grant.clone(), open.clone());
            let spawned = std::thread::Builder::new()
                .name("corelane-broker-session".into())
                .spawn(move || {
                    session(&state, &grant, &conn);
                    release_slot(&held, uid);
                });
            if let Err(e) = spawned {
                release_slot(&open, uid);
                complain(format!(
                    "no thread for a connection to the grant socket: {e}"
                ));
            }
        }
        Ok(())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        let mut st = lock(&self.state);
        // A session still open (its server's end not yet seen closing): its files go too.
        for s in std::mem::take(&mut st.sessions) {
            s.remove_files();
        }
        // Detach first: the driver may refuse fewer queues while a program is attached.
        drop(st.steering.take());
        let mut undone = true;
        if let Some(old) = st.restore.take() {
            match corelane_xsk::set_channels_retrying(&self.grant.ifname, old) {
                Ok(()) => st.claim.note_channels(None),
                Err(e) => {
                    undone = false;
                    tracing::warn!("{}: restoring its queues: {e}", self.grant.ifname)
                }
            }
        }
        // A session's thread may still hold the state (and the claim) while the process
        // exits: the record goes now, unless it still lists what the next owner must undo.
        if undone {
            st.claim.release();
        }
    }
}

/// Most connections to the grant socket one granted user has open at once (its server, its
/// successor during an upgrade, `corelane-stat`-like tools; the rest are refused at their
/// hello). A user not granted has none.
const MAX_CONNECTIONS_PER_USER: usize = 8;

/// A granted user's connection ended.
fn release_slot(open: &Mutex<HashMap<u32, usize>>, uid: u32) {
    let mut open = open.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = open.get_mut(&uid) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            open.remove(&uid);
        }
    }
}

/// How long a connection may take to say hello.
const HELLO_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

mod refuse;
mod session;
mod session_upgrade;
use session::session;

#[cfg(test)]
mod tests;
