//! What the sockets take as an address: tokio's forms, without name resolution (but for
//! `localhost`, which needs none).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// An address and port as [`TcpListener::bind`](super::TcpListener::bind),
/// [`TcpStream::connect`](super::TcpStream::connect) and [`UdpSocket::bind`](super::UdpSocket::bind)
/// take it: a `SocketAddr`, `(ip, port)` (the IP typed or as text), a string like `"10.0.0.5:80"` or `"[fd00::5]:80"`,
/// or a bare port (`7`, meaning every owned address). Names are not resolved (a core must not
/// block on DNS): resolve them first, with `tokio::net::lookup_host` on a thread that may.
/// The one exception is `localhost` (and names under `.localhost`), which RFC 6761 makes
/// the loopback address without asking anyone: it is `127.0.0.1`.
pub trait ToSocketAddr {
    /// The address.
    ///
    /// # Errors
    /// `InvalidInput` for text that is not an IP address and port.
    fn to_socket_addr(&self) -> io::Result<SocketAddr>;
}

impl ToSocketAddr for SocketAddr {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        Ok(*self)
    }
}

impl ToSocketAddr for SocketAddrV4 {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(*self))
    }
}

impl ToSocketAddr for SocketAddrV6 {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V6(*self))
    }
}

impl ToSocketAddr for u16 {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, *self)))
    }
}

impl ToSocketAddr for (IpAddr, u16) {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::from(*self))
    }
}

impl ToSocketAddr for (Ipv4Addr, u16) {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::from(*self))
    }
}

impl ToSocketAddr for (Ipv6Addr, u16) {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::from(*self))
    }
}

/// `localhost` and names under it (RFC 6761 section 6.3), with or without the final dot.
fn is_localhost(host: &str) -> bool {
    let h = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    h == "localhost" || h.ends_with(".localhost")
}

impl ToSocketAddr for str {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        if let Some((host, port)) = self.rsplit_once(':')
            && is_localhost(host)
            && let Ok(port) = port.parse::<u16>()
        {
            return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        }
        self.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "`{self}` is not an IP address and port (like 10.0.0.5:80 or [fd00::5]:80); \
                     corelane resolves no names: look them up first (tokio::net::lookup_host)"
                ),
            )
        })
    }
}

impl ToSocketAddr for (&str, u16) {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        if is_localhost(self.0) {
            return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, self.1)));
        }
        let ip: IpAddr = self.0.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "`{}` is not an IP address; corelane resolves no names: look them up first \
                     (tokio::net::lookup_host)",
                    self.0
                ),
            )
        })?;
        Ok(SocketAddr::new(ip, self.1))
    }
}

impl ToSocketAddr for (String, u16) {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        (self.0.as_str(), self.1).to_socket_addr()
    }
}

impl ToSocketAddr for String {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        self.as_str().to_socket_addr()
    }
}

impl<T: ToSocketAddr + ?Sized> ToSocketAddr for &T {
    fn to_socket_addr(&self) -> io::Result<SocketAddr> {
        (**self).to_socket_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokio_forms_are_taken_and_names_but_localhost_are_refused_with_the_reason() -> io::Result<()>
    {
        assert_eq!(7.to_socket_addr()?.to_string(), "0.0.0.0:7");
        assert_eq!("10.0.0.5:80".to_socket_addr()?.port(), 80);
        assert_eq!("[fd00::5]:80".to_string().to_socket_addr()?.port(), 80);
        assert_eq!((Ipv4Addr::LOCALHOST, 9).to_socket_addr()?.port(), 9);
        assert_eq!(
            ("fd00::5", 443).to_socket_addr()?.to_string(),
            "[fd00::5]:443"
        );
        let e = ("example.com", 80).to_socket_addr().err();
        assert!(e.is_some_and(|e| e.to_string().contains("resolves no names")));
        let e = "example.com:80".to_socket_addr().err();
        assert!(e.is_some_and(|e| e.to_string().contains("resolves no names")));
        // localhost needs no resolver (RFC 6761), in every form tokio takes.
        for a in [
            "localhost:8".to_socket_addr()?,
            "LocalHost.:8".to_string().to_socket_addr()?,
            ("localhost", 8).to_socket_addr()?,
            ("api.localhost".to_string(), 8).to_socket_addr()?,
        ] {
            assert_eq!(a.to_string(), "127.0.0.1:8");
        }
        assert!("localhost:x".to_socket_addr().is_err());
        assert!("notlocalhost:8".to_socket_addr().is_err());
        Ok(())
    }
}
