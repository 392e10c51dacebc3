//! Tests of `handover.rs`: a hand-over through a real unix connection, descriptors and all.

use super::*;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use std::os::unix::fs::MetadataExt;

/// A file of its own (a distinct inode), as a descriptor.
fn file(dir: &std::path::Path, name: &str) -> OwnedFd {
    OwnedFd::from(std::fs::File::create(dir.join(name)).unwrap())
}

fn inode(fd: &OwnedFd) -> u64 {
    std::fs::File::from(fd.try_clone().unwrap())
        .metadata()
        .unwrap()
        .ino()
}

fn pair() -> (OwnedFd, OwnedFd) {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap()
}

fn sample(dir: &std::path::Path) -> Handover {
    let queue = |q: u32| UpgradeOffer {
        socket: file(dir, &format!("socket{q}")),
        umem: file(dir, &format!("umem{q}")),
        exchange: file(dir, &format!("exchange{q}")),
        queue_id: q,
        config: XskConfig {
            frames: 4096,
            frame_size: 4096,
            ring_size: 1024,
            max_packet: 9018,
            ..XskConfig::default()
        },
    };
    Handover {
        steering: Some(SteeringShare {
            maps: MAPS
                .iter()
                .map(|(name, _)| (name.to_string(), file(dir, name)))
                .collect(),
            link: file(dir, "link"),
            mode: AttachedMode::Generic,
        }),
        queues: vec![queue(0), queue(3)],
    }
}

#[test]
fn a_hand_over_arrives_whole_with_every_descriptor() {
    let dir = std::env::temp_dir().join(format!("corelane-handover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sent = sample(&dir);
    let (a, b) = pair();
    send_handover(a.as_fd(), &sent).unwrap();
    let got = recv_handover(b.as_fd()).unwrap();
    let (s, g) = (
        sent.steering.as_ref().unwrap(),
        got.steering.as_ref().unwrap(),
    );
    assert_eq!(g.mode, AttachedMode::Generic);
    assert_eq!(g.maps.len(), MAPS.len());
    for ((n1, f1), (n2, f2)) in s.maps.iter().zip(&g.maps) {
        assert_eq!(n1, n2);
        assert_eq!(inode(f1), inode(f2), "map {n1}: the same file");
    }
    assert_eq!(inode(&s.link), inode(&g.link));
    assert_eq!(got.queues.len(), 2);
    for (s, g) in sent.queues.iter().zip(&got.queues) {
        assert_eq!(s.queue_id, g.queue_id);
        let (c, d) = (s.config, g.config);
        assert_eq!(
            (c.frames, c.frame_size, c.ring_size, c.max_packet),
            (d.frames, d.frame_size, d.ring_size, d.max_packet)
        );
        assert_eq!(inode(&s.socket), inode(&g.socket));
        assert_eq!(inode(&s.umem), inode(&g.umem));
        assert_eq!(inode(&s.exchange), inode(&g.exchange));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hand_over_of_a_brokers_program_carries_only_the_queues() {
    let dir = std::env::temp_dir().join(format!("corelane-handover-g-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut sent = sample(&dir);
    sent.steering = None;
    let (a, b) = pair();
    send_handover(a.as_fd(), &sent).unwrap();
    let got = recv_handover(b.as_fd()).unwrap();
    assert!(got.steering.is_none());
    assert_eq!(
        got.queues.iter().map(|q| q.queue_id).collect::<Vec<_>>(),
        [0, 3]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hand_over_that_breaks_the_protocol_is_refused_with_what_was_wrong() {
    let cases: [(&[(&str, bool)], &str); 5] = [
        (
            &[("corelane-upgrade 2 mode native maps 12 queues 0", false)],
            "version 2",
        ),
        (&[("hello", false)], "expected `corelane-upgrade"),
        (
            &[("corelane-upgrade 1 mode granted maps 11 queues 0", false)],
            "11 maps",
        ),
        (
            &[("corelane-upgrade 1 mode native maps 3 queues 0", false)],
            "3 maps",
        ),
        (
            &[
                ("corelane-upgrade 1 mode native maps 12 queues 0", false),
                ("map owned_v4", false),
            ],
            "without a descriptor",
        ),
    ];
    let dir = std::env::temp_dir().join(format!("corelane-handover-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (messages, want) in cases {
        let (a, b) = pair();
        for (text, with_fd) in messages {
            let fd = with_fd.then(|| file(&dir, "x"));
            send_message(a.as_raw_fd(), text, fd.as_ref().map(|f| f.as_raw_fd())).unwrap();
        }
        let e = recv_handover(b.as_fd()).unwrap_err().to_string();
        assert!(e.contains(want), "{e:?} should say {want:?}");
    }
    // The old process gone mid-way.
    let (a, b) = pair();
    send_message(
        a.as_raw_fd(),
        "corelane-upgrade 1 mode native maps 12 queues 0",
        None,
    )
    .unwrap();
    drop(a);
    let e = recv_handover(b.as_fd()).unwrap_err().to_string();
    assert!(e.contains("closed the connection"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sizes_out_of_range_in_a_hand_over_are_refused_before_anything_is_mapped() {
    let dir = std::env::temp_dir().join(format!("corelane-handover-geo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = [
        (4096u32, 8192u32, 256u32, "frames of 8192 bytes"),
        (64, 100, 16, "frames of 100 bytes"),
        (4096, 2048, 1000, "rings of 1000 entries"),
        (3, 2048, 16, "3 frames"),
        (64, 2048, 128, "rings of 128 entries"),
    ];
    for (frames, frame_size, ring_size, want) in bad {
        let mut h = sample(&dir);
        for q in &mut h.queues {
            q.config.frames = frames;
            q.config.frame_size = frame_size;
            q.config.ring_size = ring_size;
        }
        let (a, b) = pair();
        send_handover(a.as_fd(), &h).unwrap();
        let e = recv_handover(b.as_fd()).unwrap_err().to_string();
        assert!(e.contains(want), "{e:?} should say {want:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
