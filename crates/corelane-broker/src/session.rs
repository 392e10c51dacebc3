//! One server's session with the broker: its hello, its requests (addresses, ports, queues,
//! sockets, statistics), and what is undone when it leaves.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use corelane_xsk::Error;
use corelane_xsk::grant::{
    Request, peer, proto_name, recv_message, send_message, set_read_deadline,
};

use super::{Grant, Session, State, list_or_none, lock, ranges};

/// One server's connection: the hello, then requests until it closes.
pub(crate) fn session(state: &Mutex<State>, grant: &Grant, conn: &OwnedFd) {
    let (pid, uid) = match peer(conn) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("a connection without credentials: {e}");
            return;
        }
    };
    let fd = conn.as_raw_fd();
    // `hello upgrade`: the successor of the server holding the grant, which steers beside it
    // until it leaves (an upgrade without dropping a connection).
    // A hello takes no descriptor: one sent with it is closed here, by this session's thread
    // and under no lock (a descriptor whose last close blocks holds up this session only).
    let successor = match recv_message(fd) {
        Ok(Some((hello, None))) if hello == "hello" => false,
        Ok(Some((hello, None))) if hello == "hello upgrade" => true,
        _ => return,
    };
    // A successor of the holder's user proves it could have made what it takes over: the
    // rules of `corelane_xsk::peer` (its user ids, this user namespace, a socket it marked),
    // checked before any lock is taken. Another user's (or one with no holder) is refused
    // below, in those words.
    if successor && lock(state).sessions.first().map(|s| s.uid) == Some(uid) {
        let vetted = send_message(fd, "ok prove", None)
            .map_err(|e| format!("its connection failed ({e})"))
            .and_then(|()| match recv_message(fd) {
                Ok(Some((word, proof))) if word == corelane_xsk::peer::PROVE => {
                    corelane_xsk::peer::vet_successor(conn, uid, 0, proof.as_ref()).map(drop)
                }
                Ok(Some((word, _))) => Err(format!(
                    "process {pid} said `{word}` where its proof was asked for"
                )),
                Ok(None) => Err(format!("process {pid} closed before its proof")),
                Err(e) => Err(format!("process {pid} sent no proof ({e})")),
            });
        if let Err(why) = vetted {
            println!("corelane-broker: refused pid {pid} (uid {uid}): {why}");
            let _ = send_message(fd, &format!("err {why}"), None);
            return;
        }
    }
    let welcome = {
        let mut st = lock(state);
        if !grant.uids.contains(&uid) {
            Err(grant.not_granted(uid))
        } else if let Some(s) = st.sessions.first().filter(|_| !successor) {
            Err(format!(
                "{} is served by another corelane runtime (pid {}: `kill {}`); stop it first",
                grant.ifname, s.pid, s.pid
            ))
        } else if successor && st.sessions.len() != 1 {
            Err(match st.sessions.len() {
                0 => format!(
                    "no server holds the grant of {} to take over from",
                    grant.ifname
                ),
                _ => format!("an upgrade on {} is already under way", grant.ifname),
            })
        } else if let Some(s) = st.sessions.first().filter(|s| successor && s.uid != uid) {
            // A successor steers beside the holder, registers sockets in its place and ends
            // its connections' split: only the holder's own user may be one.
            Err(format!(
                "{} is served by pid {} of uid {}: only uid {} may take its place (an upgrade \
                 is started by the same user as the running server)",
                grant.ifname, s.pid, s.uid, s.uid
            ))
        } else if let Some(steering) = st.steering.as_mut() {
            let mode = match steering.fallback_reason() {
                Some(why) => format!("{} {why}", steering.mode()),
                None => steering.mode().to_string(),
            };
            if !successor {
                // A fresh start: its sockets are the first generation, and nothing is kept
                // for another.
                let _ = steering.set_upgrade(0, false);
                let _ = steering.clear_flows();
                st.end_lingering(true);
            }
            st.sessions.push(Session {
                pid,
                uid,
                ..Session::default()
            });
            Ok(mode)
        } else {
            Err("the broker is stopping".to_string())
        }
    };
    match welcome {
        Ok(mode) => {
            println!("corelane-broker: pid {pid} (uid {uid}) took the grant");
            // The server's connection lasts as long as the server: no deadline from here.
            if set_read_deadline(conn, None).is_err()
                || send_message(fd, &format!("ok {mode}"), None).is_err()
            {
                end_session(state, grant, pid);
                return;
            }
        }
        Err(why) => {
            println!("corelane-broker: refused pid {pid} (uid {uid}): {why}");
            let _ = send_message(fd, &format!("err {why}"), None);
            return;
        }
    }
    // Requests until the server closes (or dies: the kernel closes for it).
    while let Ok(Some((text, passed))) = recv_message(fd) {
        let (reply, out) = match handle(state, grant, pid, &text, passed.as_ref()) {
            Ok((r, out)) => (format!("ok {r}").trim_end().to_string(), out),
            Err(why) => (format!("err {why}"), None),
        };
        // Closed after the state's lock is let go (the program keeps its own reference to a
        // queue's socket).
        drop(passed);
        let sent = send_message(fd, &reply, out.as_ref().map(|f| f.as_raw_fd()));
        if sent.is_err() {
            break;
        }
    }
    end_session(state, grant, pid);
}

/// Stops steering everything the departed server asked for (what its successor in an
/// upgrade asked for too stays).
fn end_session(state: &Mutex<State>, grant: &Grant, pid: u32) {
    let mut st = lock(state);
    let Some(i) = st.sessions.iter().position(|s| s.pid == pid) else {
        return;
    };
    let s = st.sessions.remove(i);
    if let Some(steering) = st.steering.as_mut() {
        // Counted per session: a port the successor holds stays steered.
        for (proto, port) in &s.ports {
            let _ = steering.release_port(*proto, *port);
        }
    }
    // The addresses stay owned a while: the program resets what the departed server's peers
    // still send (a process that died leaves no peer waiting), and SYNs are refused at once.
    // Those its successor owns are its successor's.
    let until = std::time::Instant::now() + super::ADDR_LINGER;
    let held: Vec<IpAddr> = st.sessions.iter().flat_map(|o| o.addrs.clone()).collect();
    st.lingering.extend(
        s.addrs
            .iter()
            .filter(|a| !held.contains(a))
            .map(|&a| (a, until)),
    );
    s.remove_files();
    println!(
        "corelane-broker: pid {} (uid {}) left {}: released {} port(s); its {} address(es) answer \
         with resets for {} s or until the next server takes the grant",
        s.pid,
        s.uid,
        grant.ifname,
        s.ports.len(),
        s.addrs.len(),
        super::ADDR_LINGER.as_secs()
    );
}

type Reply = (String, Option<std::fs::File>);

/// Carries out one request, or says why not.
fn handle(
    state: &Mutex<State>,
    grant: &Grant,
    pid: u32,
    text: &str,
    passed: Option<&OwnedFd>,
) -> Result<Reply, String> {
    let mut st = lock(state);
    let st = &mut *st;
    let others: Vec<IpAddr> = st
        .sessions
        .iter()
        .filter(|s| s.pid != pid)
        .flat_map(|s| s.addrs.clone())
        .collect();
    let session = st.sessions.iter_mut().find(|s| s.pid == pid);
    let (Some(steering), Some(session)) = (st.steering.as_mut(), session) else {
        return Err("the broker is stopping".into());
    };
    // Only a queue's registration takes a descriptor.
    if passed.is_some() && text.split_whitespace().next() != Some("queue") {
        return Err(format!("`{text}` takes no descriptor"));
    }
    let req = Request::parse(text)?;
    if let Some(r) = super::session_upgrade::request(steering, &req, passed) {
        return r;
    }
    let e = |e: Error| e.to_string();
    let ok = || Ok((String::new(), None));
    match req {
        Request::Unaddr(a) => {
            if let Some(i) = session.addrs.iter().position(|x| *x == a) {
                session.addrs.remove(i);
                // Its successor's too, during an upgrade: then it stays.
                if !others.contains(&a) {
                    steering.disown_addr(a).map_err(e)?;
                }
            }
            ok()
        }
        // "addr A shared": A is the kernel's too, corelane's only for its ports.
        Request::Addr {
            addr: a,
            shared: share,
        } => {
            if !grant.addrs.contains(&a) {
                return Err(format!(
                    "{a} is not granted to this server on {} (granted: {}); add --addr {a} to \
                     corelane-broker grant",
                    grant.ifname,
                    list_or_none(
                        &grant
                            .addrs
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>()
                    )
                ));
            }
            if !share && !grant.whole.contains(&a) {
                // The kernel's own address is served shared, whatever the server asks.
                let held = corelane_xsk::kernel_addrs_anywhere().map_err(|err| {
                    format!("the kernel's addresses cannot be read ({err}): {a} not steered")
                })?;
                if let Some((_, _, on)) = held.iter().find(|(x, _, _)| *x == a) {
                    return Err(format!(
                        "{a} is the kernel's address (on {on}): under a grant it is served only \
                         shared (`addr {a} shared`: Builder::share_kernel_addrs, `--shared`), \
                         so the host's own listeners on it stay; to let a server own it whole, \
                         start corelane-broker grant with --own-kernel-addr {a}"
                    ));
                }
            }
            if !session.addrs.contains(&a) {
                if share {
                    steering.own_shared_addr(a).map_err(e)?;
                } else {
                    steering.own_addr(a).map_err(e)?;
                }
                session.addrs.push(a);
            }
            ok()
        }
        Request::Port { proto, port, on } => {
            if !on {
                if session.ports.remove(&(proto, port)) {
                    steering.release_port(proto, port).map_err(e)?;
                }
                return ok();
            }
            if !grant.allows_port(proto, port) {
                let name = proto_name(proto);
                return Err(format!(
                    "{name} port {port} is not granted to this server on {} (granted {name}: \
                     {}); add --{name} {port} to corelane-broker grant",
                    grant.ifname,
                    ranges(grant.ports(proto))
                ));
            }
            if session.ports.insert((proto, port)) {
                steering.own_port(proto, port).map_err(e)?;
            }
            ok()
        }
        Request::Queue { queue: q, .. } => {
            let Some(sock) = passed else {
                return Err("`queue` needs the AF_XDP socket's descriptor".into());
            };
            if q >= corelane_xsk::MAX_QUEUES {
                return Err(format!(
                    "queue {q}: the program serves queues below {}",
                    corelane_xsk::MAX_QUEUES
                ));
            }
            steering.register(q, sock.as_raw_fd()).map_err(|err| {
                format!("queue {q}: the descriptor is not a bound AF_XDP socket ({err})")
            })?;
            ok()
        }
        Request::Channels(need) => {
            let now = corelane_xsk::channels(&grant.ifname)
                .map_err(e)?
                .ok_or_else(|| format!("{}: the driver does not set its queues", grant.ifname))?;
            grant.allows_channels(now.rx_queues(), need)?;
            if now.rx_queues() != need {
                let old = corelane_xsk::set_rx_queues(&grant.ifname, now, need).map_err(e)?;
                if st.restore.is_none() {
                    st.restore = Some(old);
                    st.claim.note_channels(Some(old));
                }
            }
            ok()
        }
        // What the program noted of a shared address's neighbour (`none`: nothing yet).
        Request::Neigh(ip) => {
            let mac = steering
                .shared_neighbour(ip)
                .map_or("none".to_string(), |m| {
                    m.iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<Vec<_>>()
                        .join(":")
                });
            Ok((mac, None))
        }
        Request::Counters => {
            let c = steering.counters().map_err(e)?;
            Ok((
                format!("{} {} {} {}", c.steered, c.passed, c.malformed, c.no_socket),
                None,
            ))
        }
        Request::Stats(bytes) => {
            // A sealed memory file of the size asked for, within a cap: the server can neither
            // grow it (fill /run, or memory past the cap) nor shrink it under root's reader.
            // The run directory gets a pointer to it (`corelane_stat::write_pointer`).
            let path = st.claim.dir().join("stats");
            let file = corelane_stat::sealed_file("stats", bytes)
                .map_err(|err| format!("{}: {err}", path.display()))?;
            let id = corelane_stat::write_pointer(&path, &file, 0o644)
                .map_err(|err| format!("{}: {err}", path.display()))?;
            let handed = file.try_clone().map_err(|err| format!("stats: {err}"))?;
            session.stats = Some((path.clone(), id));
            // The last one's file goes (no pointer leads to it any more; a reader that mapped
            // it keeps its mapping).
            session.kept_stats = Some(file);
            Ok((path.display().to_string(), Some(handed)))
        }
        Request::Vlan => Ok((grant.vlan.to_wire(), None)),
        Request::RestartKey => {
            // The server's user's own key, kept root's alone: the server cannot write the run
            // directory, and a key per user tells one user nothing of another's ISNs.
            let dir = corelane_stat::run_dir()
                .join("keys")
                .join(format!("uid-{}", session.uid));
            corelane_stat::make_dir(&dir).map_err(|err| format!("{}: {err}", dir.display()))?;
            let [a, b] = corelane_stat::restart_key(&dir)
                .map_err(|err| format!("{}: {err}", dir.display()))?;
            Ok((format!("{a:016x}{b:016x}"), None))
        }
        Request::Capture(bytes) => {
            // As the stats; the frames are the traffic, so the pointer is root's alone.
            let path = st.claim.dir().join("capture");
            let file = corelane_stat::sealed_file("capture", bytes)
                .map_err(|err| format!("{}: {err}", path.display()))?;
            let id = corelane_stat::write_pointer(&path, &file, 0o600)
                .map_err(|err| format!("{}: {err}", path.display()))?;
            let handed = file.try_clone().map_err(|err| format!("capture: {err}"))?;
            session.capture = Some((path.clone(), id));
            session.kept_capture = Some(file);
            Ok((path.display().to_string(), Some(handed)))
        }
        // The upgrade's requests, carried out above.
        Request::UpgradeState
        | Request::Upgrade { .. }
        | Request::Keep { .. }
        | Request::Forget { .. } => Err(format!("unknown request `{text}`")),
    }
}
