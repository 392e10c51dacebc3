//! Shared pieces of the privileged tests: the echo example run inside a server namespace, and
//! kernel clients in the peer namespace.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelane_testnet::VethPair;
use sha2::{Digest, Sha256};

pub mod quic;

/// A binary of another workspace package (built by `cargo test --workspace` for that
/// package's own tests), next to the test binaries' directory.
pub fn workspace_bin(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or("no target directory")?;
    let bin = dir.join(name);
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} is missing: build it with `cargo build --release -p {name}`",
            bin.display()
        ))
    }
}

/// The echo example binary, built by `cargo test` next to the test binaries.
pub fn echo_bin() -> PathBuf {
    example_bin("echo")
}

/// An example binary, built by `cargo test` next to the test binaries.
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo test` (which builds examples) or `cargo build --examples`",
        bin.display()
    );
    bin
}

/// A standard test network: kernel address .1 on the server end, .2 on the client end; the
/// echo server owns .3 (and fd00::3 for IPv6).
pub fn net(queues: u32) -> VethPair {
    VethPair::builder()
        .queues(queues)
        .server_addr("10.77.0.1/24")
        .client_addr("10.77.0.2/24")
        .server_addr("fd00:77::1/64")
        .client_addr("fd00:77::2/64")
        .build()
        .expect("veth pair")
}

pub const SERVER_V4: &str = "10.77.0.3";
pub const SERVER_V6: &str = "fd00:77::3";

/// The echo example running in the server namespace.
pub struct Echo {
    child: Option<Child>,
    out: Arc<Mutex<String>>,
    /// The threads copying its stdout and stderr; they end when the process exits.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Echo {
    /// Starts echo with `args` (after `--iface IF`) and waits until it serves.
    pub fn start(net: &VethPair, args: &[&str]) -> Echo {
        Echo::start_example(net, "echo", args)
    }

    /// Starts example `name` with `args` (after `--iface IF`) and waits until it serves.
    pub fn start_example(net: &VethPair, name: &str, args: &[&str]) -> Echo {
        Echo::start_in(net.server_ns(), net.server_if(), name, args)
    }

    /// Starts example `name` in namespace `ns` on interface `ifname` with `args` and waits
    /// until it serves.
    pub fn start_in(ns: &corelane_testnet::Netns, ifname: &str, name: &str, args: &[&str]) -> Echo {
        let mut cmd = ns.command(example_bin(name).to_str().unwrap());
        cmd.args(["--iface", ifname]).args(args);
        Echo::start_cmd(cmd, name)
    }

    /// Runs `cmd` and waits until it prints `{name}: serving`.
    pub fn start_cmd(cmd: Command, name: &str) -> Echo {
        let mut e = Echo::spawn_cmd(cmd);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !e.output().contains(&format!("{name}: serving")) {
            if let Some(status) = e.child.as_mut().unwrap().try_wait().unwrap() {
                e.join_readers();
                panic!("{name} exited early ({status}):\n{}", e.output());
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not start:\n{}",
                e.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        e
    }

    /// Runs `cmd`, collecting what it prints.
    pub fn spawn_cmd(mut cmd: Command) -> Echo {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn echo");
        let out = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let out = out.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let mut o = out.lock().unwrap();
                    o.push_str(&line);
                    o.push('\n');
                }
            }));
        }
        Echo {
            child: Some(child),
            out,
            readers,
        }
    }

    /// Waits until everything the process printed has been read (its pipes closed).
    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Its process id (`ip netns exec` execs the program, so it is the example's own).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends `signal` and returns at once.
    pub fn signal(&self, signal: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill with a valid pid of our own child and a signal number has no memory
            // effects.
            unsafe { libc::kill(c.id() as i32, signal) };
        }
    }

    /// Waits for it to exit by itself; returns the status and everything it printed.
    pub fn wait(mut self) -> (ExitStatus, String) {
        let status = self.child.take().unwrap().wait().unwrap();
        self.join_readers();
        (status, self.output())
    }

    /// Sends SIGINT and waits for it to exit; returns the status and everything it printed.
    pub fn stop(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill with a valid pid of our own child and a signal number has no memory
        // effects. `ip netns exec` execs the program, so the pid is echo's own.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.join_readers();
        (status, self.output())
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs echo to completion with `args` and returns its status and output (for error cases).
pub fn run_echo(net: &VethPair, args: &[&str]) -> (ExitStatus, String) {
    let mut cmd = net.server_ns().command(echo_bin().to_str().unwrap());
    cmd.arg("--iface").arg(net.server_if()).args(args);
    let out = cmd.output().expect("run echo");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status, text)
}

/// The receive queues `ethtool -l` reports as current for the server's interface.
pub fn rx_queues(net: &VethPair) -> Result<u32, String> {
    let out = net
        .server_ns()
        .exec("ethtool", &["-l", net.server_if()])
        .map_err(|e| e.to_string())?;
    out.split("Current hardware settings:")
        .nth(1)
        .and_then(|cur| cur.lines().find_map(|l| l.strip_prefix("RX:")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no current RX count in:\n{out}"))
}

/// A deterministic pseudo-random payload.
pub fn payload(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Connects (retrying briefly while ARP/NDP resolves), sends `data`, half-closes, reads the
/// echo until EOF and returns the SHA-256 of what came back and its length.
pub fn tcp_echo(addr: SocketAddr, data: &[u8]) -> std::io::Result<([u8; 32], usize)> {
    tcp_echo_paced(addr, data, None)
}

/// [`tcp_echo`], sending at about `rate` bytes a second when given (in 16 KiB writes), so that
/// the transfer lasts.
pub fn tcp_echo_paced(
    addr: SocketAddr,
    data: &[u8],
    rate: Option<usize>,
) -> std::io::Result<([u8; 32], usize)> {
    let mut s = connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.set_nodelay(true)?;
    let mut r = s.try_clone()?;
    let n = data.len();
    let reader = std::thread::spawn(move || -> std::io::Result<([u8; 32], usize)> {
        let mut h = Sha256::new();
        let mut got = 0usize;
        let mut buf = vec![0u8; 256 * 1024];
        while got < n {
            let k = r.read(&mut buf)?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
            got += k;
        }
        Ok((h.finalize().into(), got))
    });
    match rate {
        None => s.write_all(data)?,
        Some(rate) => {
            let start = Instant::now();
            let chunk = 16 * 1024;
            for (i, c) in data.chunks(chunk).enumerate() {
                s.write_all(c)?;
                let due = Duration::from_secs_f64(((i + 1) * chunk) as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
    }
    let res = reader.join().expect("reader thread")?;
    s.shutdown(std::net::Shutdown::Write)?;
    Ok(res)
}

pub fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let mut last = None;
    for _ in 0..50 {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
            Ok(s) => return Ok(s),
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Err(last.unwrap())
}

/// Connects once (no retry), sends a line and reads it back; returns how long the connect
/// took.
pub fn echo_once(addr: SocketAddr) -> Result<Duration, String> {
    echo_once_within(addr, Duration::from_secs(3))
}

/// [`echo_once`], the connect allowed `connect` (3 s: the first SYN and one retry; 7.5 s: two
/// retries).
pub fn echo_once_within(addr: SocketAddr, connect: Duration) -> Result<Duration, String> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, connect).map_err(|e| format!("connect: {e}"))?;
    let took = t.elapsed();
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"ping\n").map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
    if &buf != b"ping\n" {
        return Err(format!("echoed {buf:?}"));
    }
    Ok(took)
}

/// Floods `target` (IPv4 or IPv6) from the client end (at most `syns` SYNs in `time`), and once it has run
/// `settle`, connects and echoes ten times, 50 ms apart; returns the flood's report and how
/// each connection went. A connection may take two SYN retries: the client's SYN shares the
/// link with the flood, and a link that full drops a frame now and then before any program
/// sees it (in eleven runs of ten here, 17 connections needed one retry, 4 two).
pub fn flood_and_connect(
    net: &VethPair,
    target: SocketAddr,
    syns: u64,
    time: Duration,
    settle: Duration,
) -> Result<(corelane_testnet::FloodReport, Vec<Result<Duration, String>>), String> {
    let mac = net
        .server_ns()
        .mac(net.server_if())
        .map_err(|e| e.to_string())?;
    let builder = match target {
        SocketAddr::V4(t) => corelane_testnet::SynFlood::builder(t, mac),
        SocketAddr::V6(t) => corelane_testnet::SynFlood::builder_v6(t, mac),
    };
    let flood = builder
        .limit(syns, time)
        .start(net.client_ns(), net.client_if())
        .map_err(|e| e.to_string())?;
    std::thread::sleep(settle);
    let addr = target;
    let tries = net
        .client_ns()
        .run(move || {
            (0..10)
                .map(|_| {
                    let r = echo_once_within(addr, Duration::from_millis(7500));
                    std::thread::sleep(Duration::from_millis(50));
                    r
                })
                .collect::<Vec<_>>()
        })
        .map_err(|e| e.to_string())?;
    let report = flood.stop().map_err(|e| e.to_string())?;
    Ok((report, tries))
}

/// Builds the runtime `build` describes on a thread in `ns` and hands it to `run` there;
/// returns, once it is built, the handle that stops it and the thread (whose result is `run`'s,
/// or why the runtime could not be built).
pub fn serve_in<T: Send + 'static>(
    ns: &corelane_testnet::Netns,
    build: impl FnOnce() -> corelane::Builder + Send + 'static,
    run: impl FnOnce(corelane::Runtime) -> T + Send + 'static,
) -> Result<
    (
        corelane::StopHandle,
        corelane_testnet::NsThread<Result<T, String>>,
    ),
    String,
> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let thread = ns
        .spawn(move || {
            let rt = build().build().map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            Ok(run(rt))
        })
        .map_err(|e| e.to_string())?;
    match stop_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(stop) => Ok((stop, thread)),
        Err(_) => Err(match thread.join() {
            Ok(Err(e)) => format!("the runtime did not start: {e}"),
            _ => "the runtime did not start".to_string(),
        }),
    }
}

/// Echoes what a corelane connection sends until it closes (or fails).
pub async fn echo_stream(mut s: corelane::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = [0u8; 64];
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// `ip link show` of the server end has no XDP program.
pub fn assert_no_xdp(net: &VethPair) {
    let link = net.server_link().unwrap();
    assert!(!link.contains("xdp"), "XDP program left attached:\n{link}");
}

/// The frame accounting line echo prints at exit adds up with nothing in use.
pub fn assert_clean_exit(status: ExitStatus, out: &str) {
    assert!(status.success(), "echo failed ({status}):\n{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("frames:"))
        .unwrap_or_else(|| panic!("no accounting line:\n{out}"));
    assert!(line.contains(" 0 in use"), "{line}");
    assert!(out.contains("XDP program detached"), "{out}");
}

/// Echoes `len` pseudo-random bytes (from `seed`) through `addr` from the client namespace and
/// asserts every byte came back.
pub fn assert_echoes(net: &VethPair, addr: SocketAddr, len: usize, seed: u64) {
    let data = payload(len, seed);
    let want = sha256(&data);
    let (got, n) = net
        .client_ns()
        .run(move || tcp_echo(addr, &data))
        .unwrap()
        .unwrap_or_else(|e| panic!("echo through {addr}: {e}"));
    assert_eq!(n, len, "echoed {n} of {len} bytes through {addr}");
    assert_eq!(got, want, "echoed bytes through {addr} differ");
}

/// A failed run: non-zero exit, exactly one error line, containing every one of `needles`, and
/// no XDP program left on the server end.
pub fn assert_fails_with(net: &VethPair, status: ExitStatus, out: &str, needles: &[&str]) {
    assert!(!status.success(), "expected a failure:\n{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "want exactly one error line:\n{out}");
    for n in needles {
        assert!(lines[0].contains(n), "`{n}` missing from: {}", lines[0]);
    }
    assert_no_xdp(net);
}

/// The last `stats:` line echo printed.
fn stats_line(out: &str) -> &str {
    out.lines()
        .rev()
        .find(|l| l.starts_with("stats:"))
        .unwrap_or_else(|| panic!("no stats line:\n{out}"))
}

/// An XDP program counter from echo's stats line (`steered`, `passed`, `malformed`,
/// `no-socket`).
pub fn xdp_counter(out: &str, name: &str) -> u64 {
    let line = stats_line(out);
    let xdp = line.split("xdp ").nth(1).expect("xdp counters");
    let mut words = xdp.split_whitespace();
    while let Some(w) = words.next() {
        if w == name {
            return words.next().and_then(|v| v.parse().ok()).expect("a number");
        }
    }
    panic!("no xdp counter `{name}` in: {line}")
}

/// A device counter from echo's stats line, written as `N name` (`bad checksum`,
/// `malformed`, `SYN dropped`).
pub fn device_counter(out: &str, name: &str) -> u64 {
    let line = stats_line(out);
    let device = line.split("xdp ").next().unwrap();
    let at = device
        .find(&format!(" {name}"))
        .unwrap_or_else(|| panic!("no device counter `{name}` in: {line}"));
    let before = device[..at].trim_end_matches(|c: char| !c.is_ascii_digit());
    let start = before
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    before[start..].parse().expect("a number")
}

/// Per-core `N connections accepted` from the report's core lines, in core order.
pub fn accepted_per_core(out: &str) -> Vec<u64> {
    out.lines()
        .filter(|l| l.starts_with("core ") && l.contains(" connections accepted"))
        .map(|l| {
            let before = l.split(" connections accepted").next().unwrap();
            before.rsplit(' ').next().unwrap().parse().expect("a count")
        })
        .collect()
}

/// A runtime running in a thread of the server namespace.
pub struct Served {
    pub thread: corelane_testnet::NsThread<Result<corelane::RunReport, String>>,
    pub stop: corelane::StopHandle,
    pub addrs: corelane::AddrHandle,
}

/// Builds a runtime on the server end of `net` owning 10.77.0.3/24 (`configure` adds to the
/// builder: cores, policies), in a thread of the server namespace, and runs `f` on every core.
/// Returns once the runtime is built.
pub fn serve_on<C, F, Fut>(
    net: &VethPair,
    configure: C,
    f: F,
) -> Result<Served, Box<dyn std::error::Error>>
where
    C: FnOnce(corelane::Builder) -> corelane::Builder + Send + 'static,
    F: Fn(corelane::CoreInfo) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let ifname = net.server_if().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = net.server_ns().spawn(move || {
        let rt = configure(corelane::Runtime::builder(&ifname).addr("10.77.0.3/24"))
            .build()
            .map_err(|e| e.to_string())?;
        let _ = tx.send((rt.stop_handle(), rt.addr_handle()));
        rt.run(f).map_err(|e| e.to_string())
    })?;
    let (stop, addrs) = rx.recv_timeout(Duration::from_secs(20))?;
    Ok(Served {
        thread,
        stop,
        addrs,
    })
}

/// A lossy path (`corelane_testnet::LossyPath`) with the kernel server at `server/24` and the
/// client at `client/24`, in the server and client namespaces.
pub fn lossy_path(server: &str, client: &str) -> corelane_testnet::LossyPath {
    corelane_testnet::LossyPath::builder()
        .server_addr(&format!("{server}/24"))
        .client_addr(&format!("{client}/24"))
        .build()
        .expect("lossy path")
}

/// What `serve_in` builds on a lossy path's server side: one core at `addr/24`.
pub fn one_core_on(
    net: &corelane_testnet::LossyPath,
    addr: &str,
) -> impl FnOnce() -> corelane::Builder + Send + 'static {
    one_core(net.server_if(), addr)
}

/// A builder of a runtime on `ifname` with one core (CPU 0) at `addr/24`; callers add their
/// options to what it returns.
pub fn one_core(ifname: &str, addr: &str) -> impl FnOnce() -> corelane::Builder + Send + 'static {
    let ifname = ifname.to_string();
    let addr = format!("{addr}/24");
    move || corelane::Runtime::builder(&ifname).addr(addr).cpus(vec![0])
}

/// Connects to a server that may still be starting, with a minute's read timeout.
pub fn connect_patiently(addr: SocketAddr) -> TcpStream {
    let s = connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s
}

/// Connects (see `connect_patiently`) and reads until the server closes.
pub fn download(addr: SocketAddr) -> Vec<u8> {
    let mut s = connect_patiently(addr);
    let mut v = Vec::new();
    s.read_to_end(&mut v).expect("receive");
    v
}

/// A runtime `serve_reporting` started: stop it and wait with `end`.
pub struct Reporting {
    stop: corelane::StopHandle,
    thread: corelane_testnet::NsThread<Result<Result<(), String>, String>>,
}

impl Reporting {
    /// Stops the runtime and waits for its thread; panics with why if it failed.
    pub fn end(self) {
        self.stop.stop();
        let r = self.thread.join().expect("corelane thread");
        r.expect("corelane").expect("run");
    }
}

/// `serve_in` for an application that reports through a channel: each core's future gets its
/// own clone of `tx`.
pub fn serve_reporting<R, F, Fut>(
    ns: &corelane_testnet::Netns,
    build: impl FnOnce() -> corelane::Builder + Send + 'static,
    tx: std::sync::mpsc::Sender<R>,
    app: F,
) -> Result<Reporting, String>
where
    R: Send + 'static,
    F: Fn(std::sync::mpsc::Sender<R>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let (stop, thread) = serve_in(ns, build, move |rt| {
        let tx = Mutex::new(tx);
        rt.run(|_| app(tx.lock().unwrap_or_else(|p| p.into_inner()).clone()))
            .map(|_| ())
            .map_err(|e| e.to_string())
    })?;
    Ok(Reporting { stop, thread })
}

/// Sum of a JSON number field `"name":N` over the text.
pub fn sum_field(json: &str, name: &str) -> u64 {
    json.match_indices(&format!("\"{name}\":"))
        .filter_map(|(i, m)| {
            let rest = &json[i + m.len()..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..end].parse::<u64>().ok()
        })
        .sum()
}
