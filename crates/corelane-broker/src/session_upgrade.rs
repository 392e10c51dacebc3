//! The requests of a server's upgrade under the broker: its successor's sockets as the next
//! generation, the program's current generation and split, and the connections the old
//! server keeps (see corelane-rt's `upgrade.rs`).

use std::os::fd::{AsRawFd, OwnedFd};

use corelane_xsk::Steering;
use corelane_xsk::grant::Request;

type Reply = (String, Option<std::fs::File>);

/// Carries out `req` when it is an upgrade's request (None: it is not one).
pub(crate) fn request(
    steering: &mut Steering,
    req: &Request,
    passed: Option<&OwnedFd>,
) -> Option<Result<Reply, String>> {
    let e = |e: corelane_xsk::Error| e.to_string();
    let ok = |text: String| Ok((text, None));
    Some(match *req {
        Request::Queue {
            queue: q,
            generation: Some(generation),
        } => (|| {
            let Some(sock) = passed else {
                return Err("`queue` needs the AF_XDP socket's descriptor".into());
            };
            steering
                .register_in(generation, q, sock.as_raw_fd())
                .map_err(|err| format!("queue {q} generation {generation}: {err}"))?;
            ok(String::new())
        })(),
        Request::UpgradeState => steering
            .upgrade_state()
            .map_err(e)
            .and_then(|(current, split)| ok(format!("{current} {}", u8::from(split)))),
        Request::Upgrade { current, split } => (|| {
            steering.set_upgrade(current, split).map_err(e)?;
            if !split {
                // The upgrade is over: nothing is kept for the old generation.
                steering.clear_flows().map_err(e)?;
            }
            ok(String::new())
        })(),
        Request::Keep {
            peer,
            port,
            generation,
        } => (|| {
            steering.keep_flow(peer, port, generation).map_err(e)?;
            ok(String::new())
        })(),
        Request::Forget { peer, port } => (|| {
            steering.forget_flow(peer, port).map_err(e)?;
            ok(String::new())
        })(),
        _ => return None,
    })
}
