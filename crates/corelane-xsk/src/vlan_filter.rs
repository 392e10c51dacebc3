//! A NIC's VLAN filter: a NIC that filters VLANs (virtio-net, and most physical NICs with
//! `rx-vlan-filter` on) drops the frames of a VLAN no VLAN device on it registered, before the
//! XDP program sees them. Serving a VLAN, the runtime registers it with a kernel VLAN device
//! of its own on the interface, left down (it carries nothing: the program takes the frames),
//! and removes it at the end.

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVlan, LinkAttribute, LinkInfo, LinkMessage,
};
use netlink_sys::protocols::NETLINK_ROUTE;

use crate::error::Error;

/// The VLAN device that registers a VLAN with its NIC's filter; removed on drop unless kept.
#[derive(Debug)]
pub(crate) struct VlanFilter {
    name: String,
    keep: bool,
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Io(std::io::Error::other(format!(
        "the VLAN filter: {what}: {e}"
    )))
}

/// Sends one request and reads its acknowledgement: the errno the kernel refused it with
/// (0: done).
fn request(msg: RouteNetlinkMessage, flags: u16) -> Result<i32, Error> {
    let failed = |(what, e): crate::netlink::Failed| err(what, e);
    let socket = crate::netlink::kernel_socket(NETLINK_ROUTE).map_err(failed)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf[..]);
    let rx = crate::netlink::exchange(&socket, &buf).map_err(failed)?;
    let answer = <NetlinkMessage<RouteNetlinkMessage>>::deserialize(&rx)
        .map_err(|e| err("a malformed answer", e))?;
    match answer.payload {
        NetlinkPayload::Error(e) => Ok(e.code.map_or(0, |c| -c.get())),
        _ => Ok(0),
    }
}

fn index_of(name: &str) -> u32 {
    crate::sys::check_interface(name).unwrap_or(0)
}

impl VlanFilter {
    /// Registers VLAN `vid` with the filter of interface `ifindex` (`ifname`). None when it
    /// needs no device of ours: another VLAN device on the NIC holds the VLAN already, or
    /// this kernel has no 802.1Q (then it has no VLAN filter to feed either; said in the log).
    pub(crate) fn register(
        ifname: &str,
        ifindex: u32,
        vid: u16,
    ) -> Result<Option<VlanFilter>, Error> {
        let name = format!("clv{ifindex}.{vid}");
        if index_of(&name) != 0 {
            // Left by a run that did not end cleanly: ours to remove at the end.
            return Ok(Some(VlanFilter { name, keep: false }));
        }
        let mut link = LinkMessage::default();
        link.attributes = vec![
            LinkAttribute::IfName(name.clone()),
            LinkAttribute::Link(ifindex),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Vlan),
                LinkInfo::Data(InfoData::Vlan(vec![InfoVlan::Id(vid)])),
            ]),
        ];
        match request(
            RouteNetlinkMessage::NewLink(link),
            NLM_F_CREATE | NLM_F_EXCL,
        )? {
            0 => Ok(Some(VlanFilter { name, keep: false })),
            libc::EEXIST | libc::EBUSY => Ok(None),
            libc::EOPNOTSUPP => {
                tracing::info!(
                    "{ifname}: this kernel has no 802.1Q VLAN devices: VLAN {vid} is not \
                     registered with the NIC's filter (a NIC that filters VLANs drops its frames)"
                );
                Ok(None)
            }
            e => Err(err(
                &format!("registering VLAN {vid} on {ifname}"),
                std::io::Error::from_raw_os_error(e),
            )),
        }
    }

    /// The device stays when this is dropped (a new process of an upgrade serves the VLAN on).
    pub(crate) fn keep(&mut self) {
        self.keep = true;
    }

    /// The device's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for VlanFilter {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let index = index_of(&self.name);
        if index == 0 {
            return;
        }
        let mut link = LinkMessage::default();
        link.header.index = index;
        match request(RouteNetlinkMessage::DelLink(link), 0) {
            Ok(0) => {}
            Ok(e) => tracing::warn!(
                "removing the VLAN device {}: {}",
                self.name,
                std::io::Error::from_raw_os_error(e)
            ),
            Err(e) => tracing::warn!("removing the VLAN device {}: {e}", self.name),
        }
    }
}
