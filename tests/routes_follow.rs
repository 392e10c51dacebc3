//! The kernel's routes are followed while the runtime runs: a router advertisement that
//! arrives after the start gives the kernel a default route through the router's link-local
//! address, and corelane's connections to an off-link IPv6 address, refused for want of a
//! route until then, go through it.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use corelane::Runtime;
use corelane::net::TcpStream;
use corelane_testnet::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An address the client namespace holds on its loopback: off every link of the server's.
const FAR: &str = "fd99::1";

/// Sends one router advertisement (default router, lifetime 1800 s, the source link-layer
/// address) to all nodes on `ifname`, from the calling thread's network namespace.
fn advertise(ifname: &str, mac: [u8; 6]) -> std::io::Result<()> {
    let name = std::ffi::CString::new(ifname).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated name, valid for the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // A router advertisement must arrive with hop limit 255 (RFC 4861 section 6.1.2).
    let hops: libc::c_int = 255;
    // SAFETY: an int option, valid for the call, on the socket opened above.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MULTICAST_HOPS,
            (&hops as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    let mut ra = vec![
        134, 0, 0, 0, // type, code, checksum (the kernel's, on a raw ICMPv6 socket)
        64, 0, 0x07, 0x08, // hop limit, flags, router lifetime 1800 s
        0, 0, 0, 0, 0, 0, 0, 0, // reachable time, retransmit timer
        1, 1, // source link-layer address option, 8 bytes
    ];
    ra.extend_from_slice(&mac);
    // SAFETY: sockaddr_in6 is plain data; all-zero is a valid value.
    let mut to: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    to.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    to.sin6_addr.s6_addr = "ff02::1"
        .parse::<std::net::Ipv6Addr>()
        .map_err(std::io::Error::other)?
        .octets();
    to.sin6_scope_id = index;
    // SAFETY: the buffer and address are valid for the lengths given, for the call.
    let n = unsafe {
        libc::sendto(
            fd,
            ra.as_ptr().cast(),
            ra.len(),
            0,
            (&to as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as u32,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: the socket opened above, not used after.
    unsafe { libc::close(fd) };
    if n < 0 { Err(err) } else { Ok(()) }
}

#[test]
fn routes_a_router_advertisement_after_the_start_is_followed() -> Result<(), String> {
    if !require_root("routes_follow") {
        return Ok(());
    }
    let net = net(1);
    net.client_ns()
        .ip(&["-6", "addr", "add", &format!("{FAR}/128"), "dev", "lo"])
        .map_err(|e| e.to_string())?;
    let listener = net
        .client_ns()
        .run(|| std::net::TcpListener::bind(format!("[{FAR}]:7100")))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { break };
            std::thread::spawn(move || {
                let Ok(mut r) = s.try_clone() else { return };
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    let client_mac = net
        .client_ns()
        .mac(net.client_if())
        .map_err(|e| e.to_string())?;

    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let out = log.clone();
    let ifname = net.server_if().to_string();
    let server = net
        .server_ns()
        .spawn(move || {
            Runtime::builder(&ifname)
                .addr(format!("{SERVER_V6}/64"))
                .cores(1)
                .build()
                .map_err(|e| e.to_string())?
                .run(move |_core| {
                    let out = out.clone();
                    async move {
                        let say = |s: String| out.lock().map(|mut o| o.push(s)).unwrap_or(());
                        let to: SocketAddr = format!("[{FAR}]:7100").parse().expect("addr");
                        let deadline = Instant::now() + Duration::from_secs(20);
                        while Instant::now() < deadline {
                            let attempt = async {
                                let mut s = TcpStream::connect(to).await?;
                                let data = payload(64 << 10, 9);
                                s.write_all(&data).await?;
                                let mut back = vec![0u8; data.len()];
                                s.read_exact(&mut back).await?;
                                std::io::Result::Ok(back == data)
                            };
                            match tokio::time::timeout(Duration::from_secs(3), attempt).await {
                                Ok(Ok(true)) => {
                                    say("echoed".into());
                                    return;
                                }
                                Ok(Ok(false)) => say("echo differs".into()),
                                Ok(Err(e)) => say(format!("refused: {:?} {e}", e.kind())),
                                Err(_) => say("timed out".into()),
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                })
                .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    // Refused first: the runtime started with no IPv6 route.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log
        .lock()
        .map(|l| l.iter().any(|s| s.starts_with("refused")))
        .unwrap_or(false)
    {
        if Instant::now() > deadline {
            return Err(format!("no attempt was refused: {:?}", log.lock().ok()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // A router advertises from its link-local address, usable once duplicate address
    // detection has passed (a second or two after the link came up).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = net
            .client_ns()
            .ip(&[
                "-6",
                "addr",
                "show",
                "dev",
                net.client_if(),
                "scope",
                "link",
            ])
            .map_err(|e| e.to_string())?;
        if shown.contains("fe80::") && !shown.contains("tentative") {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the client's link-local address stays tentative:\n{shown}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let client_if = net.client_if().to_string();
    net.client_ns()
        .run(move || advertise(&client_if, client_mac))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("router advertisement: {e}"))?;
    let report = server
        .join()
        .map_err(|_| "the runtime's thread panicked")??;
    let log = log.lock().map_err(|_| "lock")?.clone();
    let routes = net
        .server_ns()
        .ip(&["-6", "route", "show", "dev", net.server_if()])
        .map_err(|e| e.to_string())?;
    assert!(
        routes.contains("default via fe80::") && routes.contains("proto ra"),
        "the kernel took no route from the advertisement:\n{routes}"
    );
    assert_eq!(
        log.last().map(String::as_str),
        Some("echoed"),
        "corelane did not follow the kernel's new route:\n{}\nkernel routes:\n{routes}",
        log.join("\n")
    );
    assert!(report.frames_balanced());
    Ok(())
}
