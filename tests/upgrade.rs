//! A running server replaced by a new process under load (`--upgrades`, `--upgrade-from`,
//! `--take-over`): the echo example on a multi-queue veth, the kernel's TCP as the clients.
//! Long transfers, request/response on kept connections and connections opened and closed all
//! the time run across the switch, on a clean veth, through a router that loses and reorders,
//! and under a `corelane-broker grant` broker; none may fail or lose a byte, and the old process
//! must end by itself.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Echo, SERVER_V4, payload, sha256};
use corelane_testnet::{Loss, Netns, NsThread};

/// The echo example in `ns` serving `ifname` with `args`, logging the upgrade's steps.
fn echo(ns: &Netns, ifname: &str, args: &[&str]) -> Echo {
    let mut cmd = ns.command(common::echo_bin().to_str().expect("a path"));
    cmd.args(["--iface", ifname])
        .args(args)
        .env("RUST_LOG", "corelane_rt=info");
    Echo::start_cmd(cmd, "echo")
}

/// One request of `len` bytes and its echo on `s`.
fn round_trip(s: &mut TcpStream, req: &[u8], buf: &mut [u8]) -> std::io::Result<()> {
    s.write_all(req)?;
    let mut got = 0;
    while got < req.len() {
        let k = s.read(&mut buf[got..req.len()])?;
        if k == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed mid-answer",
            ));
        }
        got += k;
    }
    if &buf[..req.len()] != req {
        return Err(std::io::Error::other("the answer differs"));
    }
    Ok(())
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    /// The longest answer, in microseconds (printed, not asserted).
    slowest_us: AtomicU64,
}

impl Tally {
    fn count(&self, r: std::io::Result<()>, took: Duration, what: &str) {
        match r {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                self.slowest_us
                    .fetch_max(took.as_micros() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                eprintln!("{what}: {e}");
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// Traffic of the shapes a service meets, from the client namespace until [`Load::finish`]:
/// long echoes paced to span the upgrade, request/response on kept connections, and a new
/// connection for each request.
struct Load {
    stop: Arc<AtomicBool>,
    kept: Arc<Tally>,
    fresh: Arc<Tally>,
    transfers: Vec<NsThread<Result<(), String>>>,
    clients: Vec<NsThread<()>>,
}

/// How a [`Load`] went: each transfer, and (answered, failed, slowest in µs) of the kept and
/// the new connections' requests.
#[derive(Debug)]
struct Outcome {
    transfers: Vec<Result<(), String>>,
    kept: (u64, u64, u64),
    fresh: (u64, u64, u64),
}

impl Outcome {
    /// Every transfer whole, no request failed, some answered of each kind.
    fn clean(&self) -> bool {
        self.transfers.iter().all(Result::is_ok)
            && self.kept.1 == 0
            && self.fresh.1 == 0
            && self.kept.0 > 0
            && (self.fresh.0 > 0 || self.fresh == (0, 0, 0))
    }
}

impl Load {
    /// `transfers` echoes of `bytes` each at `rate` bytes a second, `kept` connections doing
    /// request/response, and `fresh` clients opening a connection per request.
    fn start(
        client: &Netns,
        addr: SocketAddr,
        (transfers, bytes, rate): (u64, usize, usize),
        kept: u64,
        fresh: u64,
    ) -> Load {
        let mut load = Load {
            stop: Arc::new(AtomicBool::new(false)),
            kept: Arc::new(Tally::default()),
            fresh: Arc::new(Tally::default()),
            transfers: Vec::new(),
            clients: Vec::new(),
        };
        for seed in 0..transfers {
            let data = payload(bytes, seed);
            let want = sha256(&data);
            let t = client.spawn(
                move || match common::tcp_echo_paced(addr, &data, Some(rate)) {
                    Ok((got, n)) if (n, got) == (bytes, want) => Ok(()),
                    Ok((_, n)) => Err(format!(
                        "transfer {seed}: {n} bytes back, not all or changed"
                    )),
                    Err(e) => Err(format!("transfer {seed}: {e}")),
                },
            );
            load.transfers
                .push(t.expect("a thread in the client namespace"));
        }
        for i in 0..kept + fresh {
            let (stop, kept_tally, fresh_tally) =
                (load.stop.clone(), load.kept.clone(), load.fresh.clone());
            let keep = i < kept;
            let c = client.spawn(move || {
                let req = payload(200, 100 + i);
                let mut buf = vec![0u8; 256];
                let mut s = keep.then(|| common::connect(addr).expect("a kept connection"));
                while !stop.load(Ordering::Relaxed) {
                    if let Some(s) = s.as_mut() {
                        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                        let t = Instant::now();
                        let r = round_trip(s, &req, &mut buf);
                        let failed = r.is_err();
                        kept_tally.count(r, t.elapsed(), "kept connection");
                        if failed {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    } else {
                        let t = Instant::now();
                        let r = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).and_then(
                            |mut s| {
                                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                                round_trip(&mut s, &req, &mut buf)
                            },
                        );
                        fresh_tally.count(r, t.elapsed(), "new connection");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            });
            load.clients
                .push(c.expect("a thread in the client namespace"));
        }
        load
    }

    /// Requests answered so far (kept connections, new connections).
    fn answered(&self) -> (u64, u64) {
        (self.kept.ok(), self.fresh.ok())
    }

    /// Waits for the transfers, then stops the request/response clients.
    fn finish(self) -> Outcome {
        let transfers = self
            .transfers
            .into_iter()
            .map(|t| t.join().expect("a transfer's thread"))
            .collect();
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().expect("a client's thread");
        }
        let tally = |t: &Tally| (t.ok(), t.failed(), t.slowest_us.load(Ordering::Relaxed));
        let outcome = Outcome {
            transfers,
            kept: tally(&self.kept),
            fresh: tally(&self.fresh),
        };
        eprintln!("{outcome:?}");
        outcome
    }
}

#[test]
fn a_server_replaced_under_load_drops_no_connection_and_loses_no_byte() {
    if !corelane_testnet::require_root(
        "a_server_replaced_under_load_drops_no_connection_and_loses_no_byte",
    ) {
        return;
    }
    // Four queues, two cores: the old process lowers the queues to two for its run, and the
    // one that puts them back at the end is the new one.
    let net = common::net(4);
    // New connections all the time, each closed first by the client: its TIME-WAITs reused.
    net.client_ns()
        .exec("sysctl", &["-qw", "net.ipv4.tcp_tw_reuse=1"])
        .expect("sysctl");
    let sock = std::env::temp_dir().join(format!("corelane-upgrade-{}.sock", std::process::id()));
    let sock = sock.to_str().expect("a path").to_string();
    let addr: SocketAddr = format!("{SERVER_V4}:7").parse().expect("an address");
    let args = |from: bool| {
        let mut a = vec![
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "2",
            "--upgrades",
            sock.as_str(),
            "--upgrade-grace",
            "30",
        ];
        if from {
            a.extend(["--upgrade-from", sock.as_str()]);
        } else {
            // Nothing to take over from yet: a fresh start.
            a.extend(["--take-over", sock.as_str()]);
        }
        a
    };
    let start = |from: bool| echo(net.server_ns(), net.server_if(), &args(from));
    let old = start(false);

    // Two long transfers, 24 MB each at 4 MB/s: six seconds across the switch; two kept
    // connections and two clients opening one per request.
    let load = Load::start(net.client_ns(), addr, (2, 24 << 20, 4 << 20), 2, 2);
    std::thread::sleep(Duration::from_millis(1500));
    let before = load.answered();
    let new = start(true);
    // The old process drains: its long transfers finish, its listeners are closed, and it
    // ends by itself (its kept request/response connections are the clients' to close).
    std::thread::sleep(Duration::from_millis(1500));
    let after_switch = load.answered();
    // Meanwhile the new process's published counters show the frames the old one holds.
    let stat = common::workspace_bin("corelane-stat").expect("corelane-stat");
    let cores = net
        .server_ns()
        .exec(
            stat.to_str().expect("a path"),
            &["--iface", net.server_if(), "--json", "cores"],
        )
        .expect("corelane-stat");
    assert!(
        common::sum_field(&cores, "frames_away") > 0,
        "frames with the old process not published: {cores}"
    );
    let outcome = load.finish();
    let (status, out) = old.wait();
    assert!(
        outcome.clean(),
        "{outcome:?}\nold:\n{out}\nnew:\n{}",
        new.output()
    );
    assert!(
        outcome.kept.0 > before.0 && outcome.fresh.0 > after_switch.1,
        "no requests were answered after the switch: {outcome:?}"
    );
    assert!(status.success(), "the old process failed:\n{out}");
    assert!(
        out.contains("echo: upgraded"),
        "the old process did not hand over:\n{out}"
    );
    assert!(
        out.contains(" 0 in use") && out.contains(" 0 tx "),
        "the old process ended holding frames:\n{out}"
    );
    assert!(
        out.contains(", 0 reset at stop"),
        "the old process reset connections at its end:\n{out}"
    );
    assert_eq!(
        common::rx_queues(&net),
        Ok(2),
        "the old process put the queues back while the new one serves"
    );
    // The interface's record is the new process's now (a crash of it is undone by the next).
    let ifname = net.server_if().to_string();
    let owner = net
        .server_ns()
        .run(move || corelane_xsk::iface_dir(&ifname).map(|d| d.join("owner")))
        .expect("the server namespace")
        .expect("the run directory");
    // With the new process's death keeper in it: a crash of the new process is undone by the
    // next runtime.
    let pid = format!("pid {}\n", new.pid());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&owner)
        .is_ok_and(|t| t.starts_with(&pid) && t.contains("\nlinger "))
    {
        assert!(
            Instant::now() < deadline,
            "the new process did not take the interface's record: {:?}",
            std::fs::read_to_string(&owner)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The new process alone now: it answers, and ends cleanly with the program detached.
    common::assert_echoes(&net, addr, 1 << 20, 9);
    let (status, out) = new.stop();
    common::assert_clean_exit(status, &out);
    assert!(
        out.contains("+ 0 with the other process of an upgrade"),
        "frames the old process held did not all come back:\n{out}"
    );
    common::assert_no_xdp(&net);
    assert!(
        !std::path::Path::new(&sock).exists(),
        "the upgrade socket was left behind"
    );
    assert_eq!(
        common::rx_queues(&net),
        Ok(4),
        "the queues were not put back"
    );
    assert!(!owner.exists(), "the interface's record was left behind");
}

#[test]
fn a_new_process_that_goes_away_before_taking_over_leaves_the_old_one_serving() {
    if !corelane_testnet::require_root(
        "a_new_process_that_goes_away_before_taking_over_leaves_the_old_one_serving",
    ) {
        return;
    }
    let net = common::net(2);
    let sock =
        std::env::temp_dir().join(format!("corelane-upgrade-gone-{}.sock", std::process::id()));
    let path = sock.to_str().expect("a path").to_string();
    let addr: SocketAddr = format!("{SERVER_V4}:7").parse().expect("an address");
    let old = Echo::start(
        &net,
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "2",
            "--upgrades",
            &path,
        ],
    );
    common::assert_echoes(&net, addr, 64 << 10, 1);

    // Nothing listens at the path given: refused, saying where and what to do.
    let (status, out) = common::run_echo(
        &net,
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "2",
            "--upgrade-from",
            "/nonexistent/upgrade.sock",
        ],
    );
    assert!(!status.success(), "{out}");
    assert!(
        out.contains("/nonexistent/upgrade.sock") && out.contains("Builder::upgrades"),
        "{out}"
    );
    // An upgrade's failure says so, not "invalid configuration".
    assert!(
        out.contains("upgrade: from /nonexistent") && !out.contains("invalid configuration"),
        "{out}"
    );

    // A process that takes the hand-over (the program, both queues, the secret) and goes away
    // without joining: the old one takes its queues back and serves on.
    {
        use std::os::fd::{AsFd, AsRawFd};
        let conn = corelane_xsk::grant::open_connection(&sock).expect("the upgrade socket");
        // It proves it holds CAP_NET_RAW here, as a successor does (root, here).
        corelane_xsk::peer::send_proof(&conn).expect("a proof");
        let h = corelane_xsk::recv_handover(conn.as_fd()).expect("a hand-over");
        assert_eq!(h.queues.len(), 2, "one offer per queue");
        let (extras, _) = corelane_xsk::grant::recv_message(conn.as_raw_fd())
            .expect("the run's secret")
            .expect("a message");
        assert!(
            extras.starts_with("runtime key "),
            "a 128-bit key: {extras}"
        );
        assert!(
            extras.contains(" ports 7"),
            "the old process listens on 7: {extras}"
        );
    }
    common::assert_echoes(&net, addr, 64 << 10, 2);

    // And a real upgrade after it still goes through.
    let new = echo(
        net.server_ns(),
        net.server_if(),
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "2",
            "--upgrade-from",
            &path,
        ],
    );
    let (status, out) = old.wait();
    assert!(status.success() && out.contains("echo: upgraded"), "{out}");
    common::assert_echoes(&net, addr, 64 << 10, 3);
    let (status, out) = new.stop();
    common::assert_clean_exit(status, &out);
}

#[test]
fn a_server_steering_through_a_grant_broker_is_replaced_under_load() {
    if !corelane_testnet::require_root(
        "a_server_steering_through_a_grant_broker_is_replaced_under_load",
    ) {
        return;
    }
    let net = common::net(2);
    let broker_bin = common::workspace_bin("corelane-broker").expect("corelane-broker");
    let mut cmd = net
        .server_ns()
        .command(broker_bin.to_str().expect("a path"));
    cmd.args([
        "grant",
        net.server_if(),
        "--addr",
        SERVER_V4,
        "--tcp",
        "7",
        "--udp",
        "7",
    ])
    .args(["--user", "root"]);
    let broker = Echo::start_cmd(cmd, "corelane-broker");
    let sock = std::env::temp_dir().join(format!("corelane-upgrade-g-{}.sock", std::process::id()));
    let path = sock.to_str().expect("a path").to_string();
    let addr: SocketAddr = format!("{SERVER_V4}:7").parse().expect("an address");
    let args = [
        "--addr",
        "10.77.0.3/24",
        "--cores",
        "2",
        "--xdp",
        "granted",
        "--upgrades",
        &path,
        "--take-over",
        &path,
    ];
    let start = || echo(net.server_ns(), net.server_if(), &args);
    let old = start();

    let load = Load::start(net.client_ns(), addr, (1, 12 << 20, 4 << 20), 1, 1);
    std::thread::sleep(Duration::from_millis(800));
    let new = start();
    let outcome = load.finish();
    let (status, out) = old.wait();
    assert!(
        outcome.clean(),
        "{outcome:?}\nold:\n{out}\nnew:\n{}\nbroker:\n{}",
        new.output(),
        broker.output()
    );
    assert!(status.success() && out.contains("echo: upgraded"), "{out}");
    assert!(out.contains(", 0 reset at stop"), "{out}");
    // The old server's grant session ended; the successor's ports and address stay steered.
    common::assert_echoes(&net, addr, 1 << 20, 7);
    let (status, out) = new.stop();
    assert!(status.success(), "{out}");
    let (_, out) = broker.stop();
    // The old server and its successor each took the grant, one after the other's hello.
    assert_eq!(out.matches("took the grant").count(), 2, "{out}");
    assert!(!out.contains("refused"), "{out}");
}

#[test]
fn a_server_is_replaced_under_load_through_a_router_that_loses_and_reorders() {
    if !corelane_testnet::require_root(
        "a_server_is_replaced_under_load_through_a_router_that_loses_and_reorders",
    ) {
        return;
    }
    const KERNEL: &str = "10.89.0.1";
    const CLIENT: &str = "10.89.0.2";
    let net = corelane_testnet::LossyPath::builder()
        .queues(2)
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr(&format!("{CLIENT}/24"))
        .build()
        .expect("lossy path");
    net.client_ns()
        .exec("sysctl", &["-qw", "net.ipv4.tcp_tw_reuse=1"])
        .expect("sysctl");
    let sock = std::env::temp_dir().join(format!("corelane-upgrade-l-{}.sock", std::process::id()));
    let path = sock.to_str().expect("a path").to_string();
    let addr: SocketAddr = "10.89.0.3:7".parse().expect("an address");
    let args = [
        "--addr",
        "10.89.0.3/24",
        "--cores",
        "2",
        "--upgrades",
        &path,
        "--take-over",
        &path,
    ];
    let start = || echo(net.server_ns(), net.server_if(), &args);
    let old = start();
    net.set_loss(Loss::percent(1.0), Loss::percent(1.0))
        .expect("loss");
    net.set_reorder(
        Loss::percent(2.0),
        Loss::percent(2.0),
        Duration::from_micros(200),
    )
    .expect("reordering");
    let load = Load::start(net.client_ns(), addr, (1, 8 << 20, 2 << 20), 1, 1);
    std::thread::sleep(Duration::from_millis(1500));
    let new = start();
    let outcome = load.finish();
    let (status, out) = old.wait();
    let counters = net.counters().expect("the router's counters");
    assert!(
        outcome.clean(),
        "{outcome:?} {counters:?}\nold:\n{out}\nnew:\n{}",
        new.output()
    );
    assert!(
        status.success() && out.contains("echo: upgraded") && out.contains(", 0 reset at stop"),
        "{out}"
    );
    let (status, out) = new.stop();
    common::assert_clean_exit(status, &out);
}

/// A new process that takes long between `build` and `run` (loading its data, say): the old
/// one keeps the fill and completion rings until the new one's cores start, so it serves all
/// along; and when the new process goes away without running, the old one serves on.
#[test]
fn the_old_process_serves_while_the_new_one_is_slow_to_run() {
    if !corelane_testnet::require_root("the_old_process_serves_while_the_new_one_is_slow_to_run") {
        return;
    }
    let net = common::net(1);
    let sock =
        std::env::temp_dir().join(format!("corelane-upgrade-slow-{}.sock", std::process::id()));
    let path = sock.to_str().expect("a path").to_string();
    let addr: SocketAddr = format!("{SERVER_V4}:7").parse().expect("an address");
    let old = echo(
        net.server_ns(),
        net.server_if(),
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "1",
            "--upgrades",
            &path,
        ],
    );
    common::assert_echoes(&net, addr, 64 << 10, 1);
    // The new process builds (it receives the program and the queue, binds its socket beside
    // the old one's) and then holds until told to go on.
    let (built_tx, built) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let builder = common::one_core(net.server_if(), SERVER_V4);
    let new = net
        .server_ns()
        .spawn(move || {
            let rt = builder().upgrade_from(&sock).build();
            let ok = rt.as_ref().map(|_| ()).map_err(|e| e.to_string());
            built_tx.send(ok).expect("the test waits");
            // Its data loads; the test ends the wait.
            let _ = released.recv_timeout(Duration::from_secs(120));
            drop(rt);
        })
        .expect("the new process's thread");
    built
        .recv_timeout(Duration::from_secs(30))
        .expect("built in time")
        .expect("the new process builds");
    // Meanwhile the old process serves every byte: the rings are still its own. (8 MiB: more
    // frames than the fill ring holds, so a fill ring nobody tops up would stall it.)
    for seed in 2..6 {
        common::assert_echoes(&net, addr, 2 << 20, seed);
    }
    release.send(()).expect("the new process waits");
    new.join().expect("the new process's thread");
    // It went away without running: the old process calls the upgrade off and serves on.
    common::assert_echoes(&net, addr, 64 << 10, 7);
    let (status, out) = old.stop();
    common::assert_clean_exit(status, &out);
    assert!(out.contains("called off"), "{out}");
}

/// A new process stopped (`SIGSTOP`, a debugger) while it holds the fill and completion rings:
/// the old one calls the upgrade off when it does not join, and once it has not stood down
/// within the old one's deadline ends it and takes its queue back, saying so, and serves on.
#[test]
fn a_successor_stopped_while_it_holds_the_rings_is_ended_and_the_old_process_serves_on() {
    if !corelane_testnet::require_root(
        "a_successor_stopped_while_it_holds_the_rings_is_ended_and_the_old_process_serves_on",
    ) {
        return;
    }
    let net = common::net(1);
    let sock = std::env::temp_dir().join(format!(
        "corelane-upgrade-stopped-{}.sock",
        std::process::id()
    ));
    let path = sock.to_str().expect("a path").to_string();
    let addr: SocketAddr = format!("{SERVER_V4}:7").parse().expect("an address");
    let mut cmd = net
        .server_ns()
        .command(common::echo_bin().to_str().expect("a path"));
    cmd.args(["--iface", net.server_if()])
        .args([
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "1",
            "--upgrades",
            &path,
        ])
        .env("RUST_LOG", "corelane_rt=info,corelane_xsk=info");
    let old = Echo::start_cmd(cmd, "echo");
    common::assert_echoes(&net, addr, 64 << 10, 1);
    // The new process serves another port: it takes the rings and never says it joined.
    let new = echo(
        net.server_ns(),
        net.server_if(),
        &[
            "--addr",
            "10.77.0.3/24",
            "--cores",
            "1",
            "--port",
            "8",
            "--upgrade-from",
            &path,
        ],
    );
    let until = |who: &Echo, text: &str, secs: u64| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !who.output().contains(text) {
            assert!(Instant::now() < deadline, "no `{text}`:\n{}", who.output());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    until(&old, "rings handed to the new process", 30);
    new.signal(libc::SIGSTOP);
    // Called off after the join's deadline; the stopped process never stands down.
    until(&old, "ended it (SIGKILL)", 60);
    until(&old, "the queue is back", 10);
    common::assert_echoes(&net, addr, 2 << 20, 2);
    let (status, out) = new.wait();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{out}");
    let (status, out) = old.stop();
    common::assert_clean_exit(status, &out);
}
