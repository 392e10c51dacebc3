//! The network device: does it exist here, its hardware address and MTU.

#![allow(unsafe_code)] // Interface ioctls read a C union.

use std::ffi::CString;

use crate::error::Error;
use crate::sys::if_ioctl;

/// The interface's index, or [`Error::NoInterface`].
pub fn check_interface(ifname: &str) -> Result<u32, Error> {
    let c = CString::new(ifname).map_err(|_| Error::NoInterface(ifname.to_string()))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        Err(Error::NoInterface(ifname.to_string()))
    } else {
        Ok(idx)
    }
}

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

/// The interface's MTU.
pub fn mtu(ifname: &str) -> Result<u32, Error> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if_ioctl(ifname, libc::SIOCGIFMTU, &mut req)?;
    // SAFETY: SIOCGIFMTU filled the mtu member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}
