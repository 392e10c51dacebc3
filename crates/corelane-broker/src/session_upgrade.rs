//! The requests of a server's upgrade under the broker: its successor's sockets as the next
//! generation, the program's current generation and split, and the connections the old
//! server keeps (see corelane-rt's `upgrade.rs`).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use corelane_xsk::Steering;

type Reply = (String, Option<std::fs::File>);

/// Carries out `words` when it is an upgrade's request (None: it is not one).
pub(crate) fn request(
    steering: &mut Steering,
    words: &[&str],
    passed: Option<&OwnedFd>,
) -> Option<Result<Reply, String>> {
    let e = |e: corelane_xsk::Error| e.to_string();
    let ok = |text: String| Ok((text, None));
    let number = |w: &str, what: &str| -> Result<u32, String> {
        w.parse().map_err(|_| format!("`{w}` is not a {what}"))
    };
    let peer = |w: &str| -> Result<SocketAddr, String> {
        w.parse()
            .map_err(|_| format!("`{w}` is not an address and port"))
    };
    let port =
        |w: &str| -> Result<u16, String> { w.parse().map_err(|_| format!("`{w}` is not a port")) };
    Some(match *words {
        ["queue", q, generation] => (|| {
            let (q, generation) = (number(q, "queue")?, number(generation, "generation")?);
            let Some(sock) = passed else {
                return Err("`queue` needs the AF_XDP socket's descriptor".into());
            };
            steering
                .register_in(generation, q, sock.as_raw_fd())
                .map_err(|err| format!("queue {q} generation {generation}: {err}"))?;
            ok(String::new())
        })(),
        ["upgrade-state"] => steering
            .upgrade_state()
            .map_err(e)
            .and_then(|(current, split)| ok(format!("{current} {}", u8::from(split)))),
        ["upgrade", current, split] => (|| {
            let current = number(current, "generation")?;
            let split = number(split, "split (0 or 1)")? != 0;
            steering.set_upgrade(current, split).map_err(e)?;
            if !split {
                // The upgrade is over: nothing is kept for the old generation.
                steering.clear_flows().map_err(e)?;
            }
            ok(String::new())
        })(),
        ["keep", p, local, generation] => (|| {
            let generation = number(generation, "generation")?;
            steering
                .keep_flow(peer(p)?, port(local)?, generation)
                .map_err(e)?;
            ok(String::new())
        })(),
        ["forget", p, local] => (|| {
            steering.forget_flow(peer(p)?, port(local)?).map_err(e)?;
            ok(String::new())
        })(),
        _ => return None,
    })
}
