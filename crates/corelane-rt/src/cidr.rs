//! Addresses with their prefix length, in std types: what the builder, the routes and
//! [`AddrHandle`](crate::AddrHandle) take.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use corelane_stack::smoltcp::wire::IpCidr;

use crate::Error;

/// An IP address and a prefix length, like `10.0.0.5/24` or `fd00::5/64`.
///
/// ```
/// # use corelane_rt as corelane;
/// use corelane::Cidr;
/// let c: Cidr = "10.0.0.5/24".parse()?;
/// assert_eq!((c.addr().to_string(), c.prefix()), ("10.0.0.5".into(), 24));
/// assert_eq!(Cidr::new("fd00::5".parse()?, 64)?.to_string(), "fd00::5/64");
/// assert!("10.0.0.5/33".parse::<Cidr>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `addr` with prefix length `prefix`.
    ///
    /// # Errors
    /// A prefix longer than the address (32 bits for IPv4, 128 for IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Cidr, Error> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(Error::Config(format!(
                "{addr}/{prefix}: the prefix length is at most {max}"
            )));
        }
        Ok(Cidr { addr, prefix })
    }

    /// The address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// True when `ip` is in this prefix.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.to_smoltcp().contains_addr(&ip.into())
    }

    pub(crate) fn to_smoltcp(self) -> IpCidr {
        IpCidr::new(self.addr.into(), self.prefix)
    }

    pub(crate) fn from_smoltcp(c: IpCidr) -> Cidr {
        Cidr {
            addr: c.address().into(),
            prefix: c.prefix_len(),
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Cidr, Error> {
        let bad = || {
            Error::Config(format!(
                "`{s}` is not an address with prefix, like 10.0.0.1/24 or fd00::1/64"
            ))
        };
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = a.trim().parse().map_err(|_| bad())?;
        let prefix: u8 = p.trim().parse().map_err(|_| bad())?;
        Cidr::new(addr, prefix)
    }
}

/// What can be taken as a [`Cidr`]: a `Cidr`, a string like `"10.0.0.5/24"`, or an address and
/// a prefix length (`(ip, 24)`). A string that does not parse is reported by
/// [`Builder::build`](crate::Builder::build) (or the call that took it).
pub trait IntoCidr {
    /// The address and prefix, or why not.
    ///
    /// # Errors
    /// Not an address with a prefix length.
    fn into_cidr(self) -> Result<Cidr, Error>;
}

impl IntoCidr for Cidr {
    fn into_cidr(self) -> Result<Cidr, Error> {
        Ok(self)
    }
}

impl IntoCidr for &str {
    fn into_cidr(self) -> Result<Cidr, Error> {
        self.parse()
    }
}

impl IntoCidr for String {
    fn into_cidr(self) -> Result<Cidr, Error> {
        self.parse()
    }
}

impl IntoCidr for &String {
    fn into_cidr(self) -> Result<Cidr, Error> {
        self.parse()
    }
}

impl IntoCidr for (IpAddr, u8) {
    fn into_cidr(self) -> Result<Cidr, Error> {
        Cidr::new(self.0, self.1)
    }
}

impl IntoCidr for (Ipv4Addr, u8) {
    fn into_cidr(self) -> Result<Cidr, Error> {
        Cidr::new(self.0.into(), self.1)
    }
}

impl IntoCidr for (Ipv6Addr, u8) {
    fn into_cidr(self) -> Result<Cidr, Error> {
        Cidr::new(self.0.into(), self.1)
    }
}

/// Parses an address with its prefix length, like `10.0.0.5/24` or `fd00::5/64`.
///
/// # Errors
/// [`Error::Config`] naming the text when it is not one.
pub fn parse_cidr(s: &str) -> Result<Cidr, Error> {
    s.parse()
}
