//! Tests of `grant.rs`.

use super::*;
use nix::sys::socket::{AddressFamily, SockFlag, SockType};

fn pair() -> (OwnedFd, OwnedFd) {
    socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap()
}

fn client(sock: OwnedFd) -> GrantClient {
    GrantClient {
        sock,
        path: PathBuf::from("/test/grant"),
        mode: AttachedMode::Generic,
        fallback_reason: None,
    }
}

#[test]
fn a_refusal_the_broker_sent_before_closing_is_read_whatever_the_order() {
    // The hello arrived before the broker closed (unread there), or after (the send fails):
    // either way the refusal is what the caller sees.
    for hello_first in [true, false] {
        let (a, b) = pair();
        if hello_first {
            send_message(a.as_raw_fd(), "hello", None).unwrap();
        }
        send_message(b.as_raw_fd(), "err uid 7 is not granted veth0", None).unwrap();
        drop(b);
        let c = client(a);
        let e = c.request("hello", None).unwrap_err().to_string();
        assert!(e.contains("uid 7 is not granted"), "{hello_first}: {e}");
    }
}

#[test]
fn a_neighbour_s_address_reads_from_the_broker_s_words_or_not_at_all() {
    assert_eq!(
        parse_mac("02:00:0a:4d:00:ff"),
        Some([2, 0, 0x0a, 0x4d, 0, 0xff])
    );
    for bad in [
        "none",
        "",
        "02:00:0a:4d:00",
        "02:00:0a:4d:00:ff:01",
        "zz:00:00:00:00:00",
    ] {
        assert_eq!(parse_mac(bad), None, "{bad:?}");
    }
}
