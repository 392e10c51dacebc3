//! What a driver takes of AF_XDP TX metadata in zero-copy, from the kernel's `netdev` generic
//! netlink family (Linux 6.8+): `dev-get` answers a device's `xsk-features`, the TX metadata
//! requests its driver honours (`tx-timestamp`, `tx-checksum`, `tx-launch-time-fifo`). In copy
//! mode the kernel honours a checksum request itself, whatever the driver; in zero-copy only a
//! driver that says `tx-checksum` does, and the rest send the checksum field as it is.

use netlink_sys::{Socket, protocols::NETLINK_GENERIC};

/// `xsk-features`' `tx-checksum` bit (`NETDEV_XSK_FLAGS_TX_CHECKSUM`).
pub(crate) const TX_CHECKSUM: u64 = 2;

const NLMSG_ERROR: u16 = 2;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XSK_FEATURES: u16 = 6;

/// A generic netlink request: the netlink header, the generic one (`cmd`, version 1) and one
/// attribute.
fn request(family: u16, cmd: u8, attr: u16, value: &[u8]) -> Vec<u8> {
    let attr_len = 4 + value.len();
    let len = 16 + 4 + attr_len.next_multiple_of(4);
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's
    m.extend_from_slice(&[cmd, 1, 0, 0]);
    m.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    m.extend_from_slice(&attr.to_ne_bytes());
    m.extend_from_slice(value);
    m.resize(len, 0);
    m
}

/// The attributes of the first message of a generic netlink answer, or the error it carries.
fn attributes(answer: &[u8]) -> Result<Vec<(u16, &[u8])>, String> {
    let word = |at: usize| {
        answer
            .get(at..at + 2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
    };
    let len = answer
        .get(..4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .filter(|&l| l >= 20 && l <= answer.len())
        .ok_or("a short answer")?;
    if word(4) == Some(NLMSG_ERROR) {
        let code = answer
            .get(16..20)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or("a short error")?;
        return Err(std::io::Error::from_raw_os_error(-code).to_string());
    }
    let mut out = Vec::new();
    let mut at = 20;
    while at + 4 <= len {
        let (Some(alen), Some(kind)) = (word(at), word(at + 2)) else {
            break;
        };
        let alen = usize::from(alen);
        if alen < 4 || at + alen > len {
            return Err("a malformed attribute".into());
        }
        // The top bits say nested or byte order, not which attribute.
        out.push((kind & 0x3fff, &answer[at + 4..at + alen]));
        at += alen.next_multiple_of(4);
    }
    Ok(out)
}

fn ask(socket: &Socket, msg: &[u8]) -> Result<Vec<u8>, String> {
    crate::netlink::exchange(socket, msg).map_err(|(what, e)| format!("{what}: {e}"))
}

/// The `xsk-features` of interface `ifindex`: what its driver honours of TX metadata in
/// zero-copy. An error says why it is not known (a kernel without the `netdev` family, before
/// 6.3, or without `xsk-features`, before 6.8).
pub(crate) fn xsk_features(ifindex: u32) -> Result<u64, String> {
    let socket = crate::netlink::kernel_socket(NETLINK_GENERIC)
        .map_err(|(what, e)| format!("a generic netlink socket: {what}: {e}"))?;
    let family = ask(
        &socket,
        &request(
            GENL_ID_CTRL,
            CTRL_CMD_GETFAMILY,
            CTRL_ATTR_FAMILY_NAME,
            b"netdev\0",
        ),
    )?;
    let family = attributes(&family)
        .map_err(|e| format!("the netdev netlink family: {e}"))?
        .into_iter()
        .find(|(k, v)| *k == CTRL_ATTR_FAMILY_ID && v.len() >= 2)
        .map(|(_, v)| u16::from_ne_bytes([v[0], v[1]]))
        .ok_or("the netdev netlink family has no id")?;
    let dev = ask(
        &socket,
        &request(
            family,
            NETDEV_CMD_DEV_GET,
            NETDEV_A_DEV_IFINDEX,
            &ifindex.to_ne_bytes(),
        ),
    )?;
    attributes(&dev)
        .map_err(|e| format!("netdev dev-get: {e}"))?
        .into_iter()
        .find(|(k, v)| *k == NETDEV_A_DEV_XSK_FEATURES && v.len() == 8)
        .map(|(_, v)| u64::from_ne_bytes(v.try_into().unwrap_or([0; 8])))
        .ok_or_else(|| "this kernel reports no xsk-features (Linux 6.8+)".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_one_padded_attribute_after_both_headers() {
        let m = request(
            0x1d,
            NETDEV_CMD_DEV_GET,
            NETDEV_A_DEV_IFINDEX,
            &7u32.to_ne_bytes(),
        );
        assert_eq!(m.len(), 28);
        assert_eq!(m[..4], 28u32.to_ne_bytes());
        assert_eq!(m[4..6], 0x1du16.to_ne_bytes());
        assert_eq!(m[16..18], [NETDEV_CMD_DEV_GET, 1]);
        assert_eq!(m[20..22], 8u16.to_ne_bytes());
        assert_eq!(m[24..28], 7u32.to_ne_bytes());
        // "netdev\0" is 7 bytes: the attribute says 11, the message pads it to 12.
        let m = request(
            GENL_ID_CTRL,
            CTRL_CMD_GETFAMILY,
            CTRL_ATTR_FAMILY_NAME,
            b"netdev\0",
        );
        assert_eq!(m.len(), 32);
        assert_eq!(m[20..22], 11u16.to_ne_bytes());
        assert_eq!(m[31], 0);
    }

    #[test]
    fn answers_are_read_and_bad_ones_refused() {
        // An answer: both headers, then a u32 attribute 1 and a u64 attribute 6.
        let mut a = request(0x1d, 1, 1, &3u32.to_ne_bytes());
        a.extend_from_slice(&12u16.to_ne_bytes());
        a.extend_from_slice(&6u16.to_ne_bytes());
        a.extend_from_slice(&2u64.to_ne_bytes());
        let len = a.len() as u32;
        a[..4].copy_from_slice(&len.to_ne_bytes());
        let got = attributes(&a).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], (6, &2u64.to_ne_bytes()[..]));
        // An attribute running past the message, a length past the buffer, an error.
        let mut bad = a.clone();
        bad[28..30].copy_from_slice(&40u16.to_ne_bytes());
        assert!(attributes(&bad).is_err());
        let mut short = a.clone();
        short[..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(attributes(&short).is_err());
        let mut err = a[..20].to_vec();
        err[..4].copy_from_slice(&20u32.to_ne_bytes());
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[16..20].copy_from_slice(&(-libc::ENODEV).to_ne_bytes());
        assert!(attributes(&err).unwrap_err().contains("No such device"));
        for n in 0..a.len() {
            let _ = attributes(&a[..n]);
        }
    }

    #[test]
    fn the_loopback_device_honours_no_tx_metadata() {
        // Every kernel this runs on (6.8+) answers; loopback has no AF_XDP driver part.
        assert_eq!(xsk_features(1), Ok(0));
    }
}
