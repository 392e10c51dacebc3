//! The upgrade's hand-over on the wire: what the old process passes the new one over a unix
//! `SOCK_SEQPACKET` connection: the steering program (a descriptor of each map and of its link,
//! [`SteeringShare`]) and each queue's offer ([`UpgradeOffer`]: its socket, its UMEM's memory
//! file, its exchange). One descriptor a message (`grant`'s `send_message` and
//! `recv_message`), each with a line saying what it is:
//!
//! ```text
//! corelane-upgrade 1 mode native maps 12 queues 2     (mode granted maps 0: a broker's program)
//! map owned_v4            + fd     (one per map; none when granted)
//! link                    + fd     (none when granted)
//! queue 0 frames 4096 frame-size 2048 ring 2048 max-packet 1792   + the socket
//! umem                    + fd
//! exchange                + fd     (the three for each queue)
//! end
//! ```

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::error::Error;
use crate::grant::{recv_message, send_message};
use crate::program::AttachedMode;
use crate::socket::{UpgradeOffer, XskConfig};
use crate::steering::{MAPS, MAX_QUEUES, SteeringShare};

/// What the old process hands the new one.
#[derive(Debug)]
pub struct Handover {
    /// The steering program (None: a `corelane-broker grant` holds it, and the new process asks
    /// the broker for it).
    pub steering: Option<SteeringShare>,
    /// One offer per queue the old process serves.
    pub queues: Vec<UpgradeOffer>,
}

const VERSION: u32 = 1;

fn io(e: std::io::Error) -> Error {
    Error::Io(e)
}

/// Sends `h` on the connected `sock`.
///
/// # Errors
/// The connection failed.
pub fn send_handover(sock: BorrowedFd<'_>, h: &Handover) -> Result<(), Error> {
    let s = sock.as_raw_fd();
    let send = |text: &str, fd: Option<BorrowedFd<'_>>| {
        send_message(s, text, fd.map(|f| f.as_raw_fd())).map_err(io)
    };
    let (mode, maps) = match &h.steering {
        Some(s) => (s.mode.to_string(), s.maps.len()),
        None => ("granted".to_string(), 0),
    };
    send(
        &format!(
            "corelane-upgrade {VERSION} mode {mode} maps {maps} queues {}",
            h.queues.len()
        ),
        None,
    )?;
    if let Some(s) = &h.steering {
        for (name, fd) in &s.maps {
            send(&format!("map {name}"), Some(fd.as_fd()))?;
        }
        send("link", Some(s.link.as_fd()))?;
    }
    for q in &h.queues {
        let c = &q.config;
        send(
            &format!(
                "queue {} frames {} frame-size {} ring {} max-packet {}",
                q.queue_id,
                c.frames,
                c.frame_bytes(),
                c.ring_size,
                c.max_packet
            ),
            Some(q.socket.as_fd()),
        )?;
        send("umem", Some(q.umem.as_fd()))?;
        send("exchange", Some(q.exchange.as_fd()))?;
    }
    send("end", None)
}

/// A refused hand-over: what was expected and what came.
fn bad(what: impl std::fmt::Display) -> Error {
    Error::Config(format!("upgrade hand-over: {what}"))
}

/// The next message, which must carry a descriptor when `with_fd`.
fn next(sock: BorrowedFd<'_>, with_fd: bool) -> Result<(String, Option<OwnedFd>), Error> {
    let (text, fd) = recv_message(sock.as_raw_fd())
        .map_err(io)?
        .ok_or_else(|| bad("the old process closed the connection"))?;
    if with_fd != fd.is_some() {
        return Err(bad(format!(
            "`{text}` {} a descriptor",
            if with_fd { "without" } else { "with" }
        )));
    }
    Ok((text, fd))
}

/// `text`'s words after `first`, which must be its first word.
fn words<'a>(text: &'a str, first: &str) -> Result<Vec<&'a str>, Error> {
    let mut w = text.split_ascii_whitespace();
    if w.next() != Some(first) {
        return Err(bad(format!("expected `{first} ...`, got `{text}`")));
    }
    Ok(w.collect())
}

/// The value after `key` in `w` (`key value` pairs), parsed.
fn field<T: std::str::FromStr>(w: &[&str], key: &str, text: &str) -> Result<T, Error> {
    w.chunks(2)
        .find(|kv| kv[0] == key)
        .and_then(|kv| kv.get(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad(format!("no valid `{key}` in `{text}`")))
}

/// Receives a hand-over on the connected `sock`.
///
/// # Errors
/// The connection failed or closed early, or a message is not what the protocol says (a
/// different version, too many maps or queues, a descriptor missing).
pub fn recv_handover(sock: BorrowedFd<'_>) -> Result<Handover, Error> {
    let (head, _) = next(sock, false)?;
    let w = words(&head, "corelane-upgrade")?;
    let version: u32 = w
        .first()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad(format!("no version in `{head}`")))?;
    if version != VERSION {
        return Err(bad(format!(
            "the old process speaks version {version}, this one {VERSION}"
        )));
    }
    let rest = &w[1..];
    let mode = match rest
        .chunks(2)
        .find(|kv| kv[0] == "mode")
        .and_then(|kv| kv.get(1))
    {
        Some(&"native") => Some(AttachedMode::Native),
        Some(&"generic") => Some(AttachedMode::Generic),
        Some(&"granted") => None,
        _ => return Err(bad(format!("no valid `mode` in `{head}`"))),
    };
    let maps: usize = field(rest, "maps", &head)?;
    let queues: u32 = field(rest, "queues", &head)?;
    let want_maps = if mode.is_some() { MAPS.len() } else { 0 };
    if maps != want_maps || queues > MAX_QUEUES {
        return Err(bad(format!(
            "{maps} maps and {queues} queues (this build has {} maps, at most {MAX_QUEUES} \
             queues)",
            MAPS.len()
        )));
    }
    let mut shared = Vec::with_capacity(maps);
    for _ in 0..maps {
        let (text, fd) = next(sock, true)?;
        let w = words(&text, "map")?;
        let name = w.first().ok_or_else(|| bad("a map without a name"))?;
        if !MAPS.iter().any(|(m, _)| m == name) {
            return Err(bad(format!("unknown map `{name}`")));
        }
        shared.push((name.to_string(), fd.ok_or_else(|| bad("no descriptor"))?));
    }
    let link = match mode {
        Some(_) => {
            let (text, link) = next(sock, true)?;
            words(&text, "link")?;
            link
        }
        None => None,
    };
    let mut offers = Vec::with_capacity(queues as usize);
    for _ in 0..queues {
        let (text, socket) = next(sock, true)?;
        let w = words(&text, "queue")?;
        let queue_id: u32 = w
            .first()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(format!("no queue number in `{text}`")))?;
        let config = XskConfig {
            frames: field(&w[1..], "frames", &text)?,
            frame_size: field(&w[1..], "frame-size", &text)?,
            ring_size: field(&w[1..], "ring", &text)?,
            max_packet: field(&w[1..], "max-packet", &text)?,
            ..XskConfig::default()
        };
        config
            .check_received()
            .map_err(|why| bad(format!("queue {queue_id}: {why}")))?;
        let (t, umem) = next(sock, true)?;
        words(&t, "umem")?;
        let (t, exchange) = next(sock, true)?;
        words(&t, "exchange")?;
        let (Some(socket), Some(umem), Some(exchange)) = (socket, umem, exchange) else {
            return Err(bad("a queue without its descriptors"));
        };
        offers.push(UpgradeOffer {
            socket,
            umem,
            exchange,
            queue_id,
            config,
        });
    }
    let (text, _) = next(sock, false)?;
    words(&text, "end")?;
    let steering = match mode {
        Some(mode) => Some(SteeringShare {
            maps: shared,
            link: link.ok_or_else(|| bad("no link descriptor"))?,
            mode,
        }),
        None => None,
    };
    Ok(Handover {
        steering,
        queues: offers,
    })
}

#[cfg(test)]
#[path = "handover_tests.rs"]
mod tests;
