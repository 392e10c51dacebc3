//! A kernel-stack client that checks an echo server: TCP streams of the sizes given, several
//! at once, every byte checked as it comes back; UDP datagrams, each answered with its own
//! bytes. With `--http N`, the server is the http example instead: N requests for
//! `/bytes/1000` on each keep-alive connection, every answer a 200 with its 1000 bytes. Exits 0 when everything came back, 1 otherwise, saying what did not. The peer in the
//! zero-copy guest (`scripts/zerocopy-vm.sh`); no root needed.
//!
//! ```text
//! echo-check 10.99.0.2:7 --tcp 1000,1000000 --parallel 4 --udp 300
//! echo-check 10.99.0.2:8080 --http 200 --parallel 4
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::Duration;

/// The byte at `off` of stream `key`.
fn byte_at(key: u64, off: u64) -> u8 {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ off.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .to_le_bytes()[((off >> 3) & 7) as usize]
}

/// How long any one read or write may wait: the guest runs under software emulation.
const PATIENCE: Duration = Duration::from_secs(120);

fn tcp(server: SocketAddr, key: u64, bytes: u64) -> Result<(), String> {
    let s = TcpStream::connect_timeout(&server, PATIENCE).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let writer = std::thread::spawn(move || -> Result<(), String> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut sent = 0u64;
        while sent < bytes {
            let n = ((bytes - sent) as usize).min(buf.len());
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = byte_at(key, sent + k as u64);
            }
            w.write_all(&buf[..n])
                .map_err(|e| format!("write at {sent}: {e}"))?;
            sent += n as u64;
        }
        w.shutdown(Shutdown::Write)
            .map_err(|e| format!("shutdown: {e}"))
    });
    let mut r = s;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| format!("read at {got}: {e}"))?;
        if n == 0 {
            break;
        }
        for (k, &b) in buf[..n].iter().enumerate() {
            let off = got + k as u64;
            if off >= bytes || b != byte_at(key, off) {
                return Err(format!(
                    "byte {off} came back wrong (or past the {bytes} sent)"
                ));
            }
        }
        got += n as u64;
    }
    writer
        .join()
        .map_err(|_| "the writer panicked".to_string())??;
    if got != bytes {
        return Err(format!("{got} of {bytes} bytes came back before the close"));
    }
    Ok(())
}

/// `requests` GETs of `/bytes/1000` on one keep-alive connection, each answer checked.
fn http(server: SocketAddr, requests: u32) -> Result<(), String> {
    let mut s =
        TcpStream::connect_timeout(&server, PATIENCE).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    for i in 0..requests {
        s.write_all(b"GET /bytes/1000 HTTP/1.1\r\nHost: corelane\r\n\r\n")
            .map_err(|e| format!("request {i}: {e}"))?;
        // The head, then the body its Content-Length says.
        let head_end = loop {
            if let Some(p) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = s.read(&mut buf).map_err(|e| format!("answer {i}: {e}"))?;
            if n == 0 {
                return Err(format!("the server closed before answer {i}"));
            }
            pending.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&pending[..head_end]).to_string();
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("answer {i}: {}", head.lines().next().unwrap_or("")));
        }
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse().ok())
            })
            .ok_or_else(|| format!("answer {i} has no Content-Length"))?;
        while pending.len() < head_end + len {
            let n = s.read(&mut buf).map_err(|e| format!("body {i}: {e}"))?;
            if n == 0 {
                return Err(format!("the server closed in body {i}"));
            }
            pending.extend_from_slice(&buf[..n]);
        }
        if len != 1000 {
            return Err(format!("answer {i}: {len} bytes, not 1000"));
        }
        pending.drain(..head_end + len);
    }
    Ok(())
}

fn udp(server: SocketAddr, count: u32) -> Result<u32, String> {
    let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    s.connect(server).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut retries = 0;
    let mut buf = [0u8; 2048];
    for i in 0..count {
        let len = 16 + (i as usize * 37) % 1400;
        let msg: Vec<u8> = (0..len).map(|k| byte_at(u64::from(i), k as u64)).collect();
        let mut answered = false;
        for _ in 0..5 {
            s.send(&msg).map_err(|e| format!("datagram {i}: {e}"))?;
            match s.recv(&mut buf) {
                Ok(n) if buf[..n] == msg[..] => {
                    answered = true;
                    break;
                }
                Ok(_) => return Err(format!("datagram {i} came back different")),
                Err(_) => retries += 1,
            }
        }
        if !answered {
            return Err(format!("datagram {i} was not answered in 5 tries"));
        }
    }
    Ok(retries)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: echo-check HOST:PORT [--tcp N,N,...] [--parallel K] [--udp N] [--http N]";
    let Some(server) = args.first().and_then(|a| a.parse::<SocketAddr>().ok()) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let (mut sizes, mut parallel, mut datagrams) = (vec![100_000u64], 1u64, 0u32);
    let mut requests: Option<u32> = None;
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let v = it.next();
        let ok = match (a.as_str(), v) {
            ("--tcp", Some(v)) => v
                .split(',')
                .map(|x| x.parse().ok())
                .collect::<Option<Vec<u64>>>()
                .map(|s| sizes = s)
                .is_some(),
            ("--parallel", Some(v)) => v.parse().map(|p| parallel = p).is_ok(),
            ("--udp", Some(v)) => v.parse().map(|n| datagrams = n).is_ok(),
            ("--http", Some(v)) => v.parse().map(|n| requests = Some(n)).is_ok(),
            _ => false,
        };
        if !ok {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    }
    let mut failed = false;
    if let Some(n) = requests {
        let runs: Vec<_> = (0..parallel)
            .map(|_| std::thread::spawn(move || http(server, n)))
            .collect();
        for (p, r) in runs.into_iter().enumerate() {
            match r.join().unwrap_or_else(|_| Err("panicked".into())) {
                Ok(()) => {
                    println!("echo-check: http {n} requests, connection {p}: every answer whole")
                }
                Err(e) => {
                    println!("echo-check: FAILED http, connection {p}: {e}");
                    failed = true;
                }
            }
        }
        return if failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        };
    }
    for &size in &sizes {
        let runs: Vec<_> = (0..parallel)
            .map(|p| std::thread::spawn(move || tcp(server, size ^ (p << 40), size)))
            .collect();
        for (p, r) in runs.into_iter().enumerate() {
            match r.join().unwrap_or_else(|_| Err("panicked".into())) {
                Ok(()) => println!("echo-check: tcp {size} bytes, connection {p}: every byte back"),
                Err(e) => {
                    println!("echo-check: FAILED tcp {size} bytes, connection {p}: {e}");
                    failed = true;
                }
            }
        }
    }
    if datagrams > 0 {
        match udp(server, datagrams) {
            Ok(retries) => {
                println!("echo-check: udp {datagrams} datagrams answered ({retries} sent again)")
            }
            Err(e) => {
                println!("echo-check: FAILED udp: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
