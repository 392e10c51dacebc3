//! Tests of the successor's vetting (`peer.rs`).

use super::*;

const STATUS: &str = "Name:\tcat\nUmask:\t0022\nUid:\t65534\t65534\t65534\t65534\n\
                      Gid:\t65534\t65534\t65534\t65534\nCapInh:\t0000000000000000\n\
                      CapPrm:\t0000000000003000\nCapEff:\t0000000000003000\n";

#[test]
fn status_facts_are_read_from_the_uid_and_capprm_lines() {
    let f = StatusFacts::parse(STATUS).expect("parsed");
    assert_eq!(f.uids, [65534; 4]);
    assert_eq!(f.cap_prm, 0x3000);
    assert_eq!(StatusFacts::parse("Uid:\t1\t2\t3\nCapPrm:\t0\n"), None);
    assert_eq!(StatusFacts::parse("Uid:\t1\t1\t1\t1\n"), None);
    assert_eq!(StatusFacts::parse("Uid:\t1\t1\t1\t1\nCapPrm:\tzz\n"), None);
}

#[test]
fn a_mixed_set_of_user_ids_is_refused_even_with_every_capability() {
    let all = |u| StatusFacts {
        uids: [u; 4],
        cap_prm: u64::MAX,
    };
    assert_eq!(all(65534).refusal(65534, 0x3000), None);
    assert_eq!(all(0).refusal(65534, 0x3000), None, "root may");
    assert!(
        all(1000).refusal(65534, 0).is_some(),
        "another user may not"
    );
    // A set-user-id root program run by the owner: effective and saved ids are root's.
    let setuid = StatusFacts {
        uids: [65534, 0, 0, 0],
        cap_prm: u64::MAX,
    };
    let why = setuid.refusal(65534, 0x3000).expect("refused");
    assert!(why.contains("set-user-id"), "{why}");
}

#[test]
fn missing_capabilities_are_named_in_the_refusal() {
    let f = StatusFacts {
        uids: [7; 4],
        cap_prm: 0x2000,
    };
    let why = f.refusal(7, 0x3000).expect("refused");
    assert!(why.contains("0x2000") && why.contains("0x3000"), "{why}");
}

#[test]
fn an_unmarked_socket_or_one_of_another_family_proves_nothing() {
    let (a, b) = std::os::unix::net::UnixStream::pair().expect("a pair");
    let (a, b): (OwnedFd, OwnedFd) = (a.into(), b.into());
    let why = proof_refusal(&a, &b).expect("refused");
    assert!(why.contains("not marked"), "{why}");
    let udp: OwnedFd = std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("udp")
        .into();
    let why = proof_refusal(&udp, &b).expect("refused");
    assert!(why.contains("not a unix one"), "{why}");
    // Marked (as root) and made here: a proof; as anyone else none can be made.
    match proof_socket() {
        Ok(p) => assert_eq!(proof_refusal(&p, &b), None),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
    }
}

#[test]
fn this_process_is_in_its_own_user_namespace() {
    let (a, _b) = std::os::unix::net::UnixStream::pair().expect("a pair");
    let a: OwnedFd = a.into();
    let pidfd = peer_pidfd(&a).expect("a pidfd of this process");
    let dir = ProcDir::open(std::process::id(), &pidfd).expect("its /proc directory");
    assert_eq!(same_user_ns(&dir), Ok(true));
}
