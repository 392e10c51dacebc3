//! The network device: does it exist here, its hardware address and MTU.

#![allow(unsafe_code)] // Interface ioctls read a C union.

use crate::error::Error;
pub use crate::sys::check_interface;
use crate::sys::if_ioctl;

/// The interface's hardware (MAC) address.
pub fn mac_address(ifname: &str) -> Result<[u8; 6], Error> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if_ioctl(ifname, libc::SIOCGIFHWADDR, &mut req)?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member of the union.
    let addr = unsafe { req.ifr_ifru.ifru_hwaddr };
    if addr.sa_family != libc::ARPHRD_ETHER {
        return Err(Error::Config(format!(
            "{ifname} is not an Ethernet interface (hardware type {})",
            addr.sa_family
        )));
    }
    let mut mac = [0u8; 6];
    for (m, b) in mac.iter_mut().zip(addr.sa_data) {
        *m = b as u8;
    }
    Ok(mac)
}

/// Adds (`join`) or removes a link-layer multicast address on the interface, so its
/// receive filter lets frames to it in (the kernel counts references: one call each way).
pub(crate) fn multicast(ifname: &str, mac: [u8; 6], join: bool) -> Result<(), Error> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    // SAFETY: writing the hwaddr member of the union, which SIOCADDMULTI/SIOCDELMULTI read.
    let hw = unsafe { &mut req.ifr_ifru.ifru_hwaddr };
    hw.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    for (d, s) in hw.sa_data.iter_mut().zip(mac) {
        *d = s as libc::c_char;
    }
    let request = if join {
        libc::SIOCADDMULTI
    } else {
        libc::SIOCDELMULTI
    };
    if_ioctl(ifname, request, &mut req)
}

/// The interface's MTU.
pub fn mtu(ifname: &str) -> Result<u32, Error> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if_ioctl(ifname, libc::SIOCGIFMTU, &mut req)?;
    // SAFETY: SIOCGIFMTU filled the mtu member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}
