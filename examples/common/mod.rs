//! Flags and reporting shared by the examples: every example takes the same flags as echo.

#![allow(dead_code)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::Args;
use corelane::{
    AttachMode, Builder, Cidr, Placement, PollMode, RunReport, Runtime, Xdp, XskConfig, ZeroCopy,
};

/// Flags every example takes.
#[derive(Args, Debug, Clone)]
pub(crate) struct Common {
    /// Interface to serve (in the current network namespace).
    #[arg(long)]
    pub(crate) iface: Option<String>,
    /// Address the server owns, with prefix (IPv4 or IPv6); may repeat. Use one the kernel does
    /// not hold on the interface, or give `--shared`.
    #[arg(long = "addr", value_parser = parse_cidr)]
    pub(crate) addrs: Vec<Cidr>,
    /// Serve on addresses the kernel holds too: corelane takes only the ports it serves there,
    /// the kernel keeps the rest (ssh, ping, ARP, its own connections;
    /// `Builder::share_kernel_addrs`).
    #[arg(long)]
    pub(crate) shared: bool,
    /// Default gateway (IPv4 or IPv6, on an owned subnet); may repeat, once per family.
    /// Replaces the kernel's default route of that family.
    #[arg(long = "gateway")]
    pub(crate) gateways: Vec<std::net::IpAddr>,
    /// A route: PREFIX via GATEWAY, written PREFIX=GATEWAY (e.g. 192.168.0.0/16=10.0.0.254);
    /// may repeat.
    #[arg(long = "route", value_parser = parse_route)]
    pub(crate) routes: Vec<(Cidr, std::net::IpAddr)>,
    /// Do not start from the kernel's routes through the interface.
    #[arg(long)]
    pub(crate) no_kernel_routes: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics on the kernel's stack (e.g.
    /// 127.0.0.1:9464).
    #[arg(long)]
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// Port to serve (each example has its default).
    #[arg(long)]
    pub(crate) port: Option<u16>,
    /// Install no signal handler: SIGINT and SIGTERM get the runtime's default handling (1 s
    /// graceful, then the process ends by the signal; `Builder::default_signals`) instead of
    /// this example's (5 s graceful, a second signal stops at once).
    #[arg(long)]
    pub(crate) runtime_signals: bool,
    /// Seconds the XDP program answers for this server with resets after it dies, however it
    /// dies (`Builder::linger_on_death`; 0: none).
    #[arg(long, default_value_t = 60)]
    pub(crate) linger_on_death: u64,
    /// Cores to run, one interface queue each (default: one per physical core this process may
    /// use, up to the interface's queues).
    #[arg(long)]
    pub(crate) cores: Option<usize>,
    /// Where protocol and application run: same-core, shared-cache, spread,
    /// fewest:<Gbit/s>[:<Gbit/s per core>], or CPUs (0,1 or protocol/application 0/1).
    #[arg(long, default_value = "same-core", value_parser = parse_placement)]
    pub(crate) placement: Placement,
    /// XDP attach mode: auto (native, else generic), native, generic.
    #[arg(long, default_value = "auto")]
    pub(crate) xdp_mode: String,
    /// Serve this 802.1Q VLAN (1-4094) on the interface instead of its untagged frames
    /// (`Builder::vlan`); the addresses are the VLAN's.
    #[arg(long, default_value_t = 0)]
    pub(crate) vlan: u16,
    /// The 802.1ad service VLAN (1-4094) around the VLAN's tag (QinQ;
    /// `Builder::service_vlan`).
    #[arg(long, default_value_t = 0)]
    pub(crate) service_vlan: u16,
    /// Where the XDP program comes from: auto (the grant of a `corelane-broker grant` serving
    /// the interface, else attached here), attach, granted.
    #[arg(long, default_value = "auto")]
    pub(crate) xdp: String,
    /// Zero-copy: try (fall back to copy), off, require.
    #[arg(long, default_value = "try")]
    pub(crate) zero_copy: String,
    /// Leave TCP checksums to the kernel and the NIC (`XskConfig::tx_checksum_offload`;
    /// copy mode, Linux 6.11+; over a veth only towards a kernel stack).
    #[arg(long)]
    pub(crate) tx_checksum_offload: bool,
    /// TCP listen backlog.
    #[arg(long, default_value_t = 256)]
    pub(crate) backlog: usize,
    /// Poll mode: adaptive (spin, then sleep) or busy (never sleep).
    #[arg(long, default_value = "adaptive")]
    pub(crate) poll: String,
    /// The longest spin before sleeping in adaptive mode, in microseconds (the spin itself is
    /// four times what a wake-up is measured to cost, at most this).
    #[arg(long, default_value_t = 200)]
    pub(crate) spin_us: u64,
    /// Caps the socket buffers at a bandwidth-delay product: link rate in Gbit/s (default 10
    /// when `--rtt-us` is given) ...
    #[arg(long)]
    pub(crate) bdp_gbit: Option<f64>,
    /// ... and round-trip time in microseconds (default 200 when `--bdp-gbit` is given). Without
    /// either, the library's caps (6 MiB receive, 4 MiB send), below which each connection's
    /// buffers follow its own window.
    #[arg(long)]
    pub(crate) rtt_us: Option<u64>,
    /// Let a new process take this one's place without dropping a connection: listen for it
    /// on a unix socket at PATH (`Builder::upgrades`).
    #[arg(long, value_name = "PATH")]
    pub(crate) upgrades: Option<std::path::PathBuf>,
    /// Seconds this process's connections have to finish once a new process has taken over
    /// (what is left then is reset).
    #[arg(long, default_value_t = 30)]
    pub(crate) upgrade_grace: u64,
    /// Take over from the server listening for upgrades at PATH (`Builder::upgrade_from`):
    /// it drains and ends, no connection dropped. Give the same cores and addresses.
    #[arg(long, value_name = "PATH")]
    pub(crate) upgrade_from: Option<std::path::PathBuf>,
    /// Take over from the server listening for upgrades at PATH if one does, else start afresh
    /// (`Builder::take_over`): with `--upgrades PATH`, the one command that starts the service
    /// and replaces it.
    #[arg(long, value_name = "PATH", conflicts_with = "upgrade_from")]
    pub(crate) take_over: Option<std::path::PathBuf>,
    /// Print counters every N seconds (0: only at exit).
    #[arg(long, default_value_t = 0)]
    pub(crate) stats_every: u64,
}

fn parse_placement(s: &str) -> Result<Placement, String> {
    Placement::parse(s).map_err(|e| e.to_string())
}

fn parse_cidr(s: &str) -> Result<Cidr, String> {
    s.parse::<Cidr>().map_err(|e| e.to_string())
}

fn parse_route(s: &str) -> Result<(Cidr, std::net::IpAddr), String> {
    let (prefix, via) = s.split_once('=').ok_or_else(|| {
        format!("`{s}`: write a route as PREFIX=GATEWAY, like 10.9.0.0/16=10.0.0.254")
    })?;
    let via = via
        .parse()
        .map_err(|_| format!("`{via}` in --route {s} is not an address"))?;
    Ok((parse_cidr(prefix)?, via))
}

impl Common {
    /// The port, or the example's default.
    pub(crate) fn port_or(&self, default: u16) -> u16 {
        self.port.unwrap_or(default)
    }

    /// A runtime builder configured from the flags.
    pub(crate) fn builder(&self) -> Result<Builder, String> {
        let attach = match self.xdp_mode.as_str() {
            "auto" => AttachMode::Auto,
            "native" => AttachMode::Native,
            "generic" => AttachMode::Generic,
            m => return Err(format!("--xdp-mode {m}: use auto, native or generic")),
        };
        let xdp = match self.xdp.as_str() {
            "auto" => Xdp::Auto,
            "attach" => Xdp::Attach,
            "granted" => Xdp::Granted,
            m => return Err(format!("--xdp {m}: use auto, attach or granted")),
        };
        let zero_copy = match self.zero_copy.as_str() {
            "try" => ZeroCopy::Try,
            "off" => ZeroCopy::Off,
            "require" => ZeroCopy::Require,
            m => return Err(format!("--zero-copy {m}: use try, off or require")),
        };
        let poll = match self.poll.as_str() {
            "busy" => PollMode::Busy,
            "adaptive" => PollMode::Adaptive {
                spin: Duration::from_micros(self.spin_us),
            },
            m => return Err(format!("--poll {m}: use adaptive or busy")),
        };
        if self.bdp_gbit.is_some_and(|g| g.is_nan() || g <= 0.0) {
            return Err("--bdp-gbit must be positive".into());
        }
        let iface = self
            .iface
            .as_deref()
            .ok_or("--iface is required: the interface to serve")?;
        let mut b = Runtime::builder(iface)
            .placement(self.placement.clone())
            .attach_mode(attach)
            .vlan(self.vlan)
            .service_vlan(self.service_vlan)
            .xdp(xdp)
            .xsk(XskConfig {
                zero_copy,
                tx_checksum_offload: self.tx_checksum_offload,
                ..XskConfig::default()
            })
            .backlog(self.backlog)
            .poll_mode(poll)
            .linger_on_death(Duration::from_secs(self.linger_on_death))
            .share_kernel_addrs(self.shared);
        if self.bdp_gbit.is_some() || self.rtt_us.is_some() {
            b = b.bdp(
                (self.bdp_gbit.unwrap_or(10.0) * 1e9) as u64,
                Duration::from_micros(self.rtt_us.unwrap_or(200)),
            );
        }
        if let Some(n) = self.cores {
            if n == 0 {
                return Err("--cores must be at least 1".into());
            }
            b = b.cores(n);
        }
        for a in &self.addrs {
            b = b.addr(*a);
        }
        for g in &self.gateways {
            b = b.gateway(*g);
        }
        for (prefix, via) in &self.routes {
            b = b.route(*prefix, *via);
        }
        if let Some(m) = self.metrics {
            b = b.metrics(m);
        }
        if let Some(p) = &self.upgrades {
            b = b.upgrades(p, Duration::from_secs(self.upgrade_grace));
        }
        if let Some(p) = &self.upgrade_from {
            b = b.upgrade_from(p);
        }
        if let Some(p) = &self.take_over {
            b = b.take_over(p);
        }
        Ok(b.kernel_routes(!self.no_kernel_routes))
    }
}

/// Prints this core's counters every `every` (a task to spawn on each core).
pub(crate) async fn stats_task(every: u64) {
    if every == 0 {
        return;
    }
    loop {
        tokio::time::sleep(Duration::from_secs(every)).await;
        if let Some(s) = corelane::core_stats() {
            println!("{}", core_line(&s));
        }
    }
}

fn core_line(s: &corelane::CoreStats) -> String {
    let st =
        |name: &str, x: &corelane::Stage| format!("{name} {}/{:.0}ns", x.items, x.ns_per_item());
    format!(
        "core {} (CPU {}{}, queue {}): {} turns ({} busy, {} sleeps); \
         queue registered {} times, unregistered {}; {}; stages: {}, {}, {}, {}, {}, {}; \
         {} connections accepted, handed off {} out; accept wake-ups {} ({} spurious); batch {}",
        s.core,
        s.cpu,
        if s.app_cpu != s.cpu {
            format!(", application on CPU {}", s.app_cpu)
        } else {
            String::new()
        },
        s.queue,
        s.pipeline.turns,
        s.pipeline.busy_turns,
        s.parks,
        s.queue_registrations,
        s.queue_unregistrations,
        wait_line(s),
        st("rx", &s.pipeline.rx),
        st("classify", &s.pipeline.classify),
        st("handoff-in", &s.pipeline.handoff_in),
        st("protocol", &s.pipeline.protocol),
        st("egress", &s.pipeline.egress),
        st("tx", &s.pipeline.tx),
        s.stack.established,
        s.stack.handed_off,
        s.stack.accept_wakeups,
        s.accept_spurious,
        batch_line(&s.batch),
    )
}

/// How long frames waited for the core: after waking it from a sleep, and when it was awake.
fn wait_line(s: &corelane::CoreStats) -> String {
    let us = |x: &corelane::Stage| x.ns_per_item() / 1000.0;
    let (w, a) = (&s.rx_wait_woken, &s.rx_wait_awake);
    if w.items + a.items == 0 {
        return "frame waits: none measured (no receive stamps)".into();
    }
    let cost = s.wake_cost.map_or("not measured".into(), |c| {
        format!("{:.1} us", c.as_secs_f64() * 1e6)
    });
    format!(
        "frame waits: {:.1} us after a sleep ({} measured), {:.1} us awake ({} sampled); \
         wake-up cost {cost}, longest spin {} us",
        us(w),
        w.items,
        us(a),
        a.items,
        s.spin.as_micros()
    )
}

fn batch_line(b: &corelane::BatchStats) -> String {
    if !b.adaptive {
        return format!("{} (fixed), fill ring {}", b.current, b.fill_target);
    }
    format!(
        "{} now, settled at {} (cap {} for {} KiB of L2, {} changes), fill ring {}",
        b.current,
        b.settled,
        b.cap,
        b.l2_bytes / 1024,
        b.changes,
        b.fill_target
    )
}

/// Prints the end-of-run report: one line per core, the totals, the XDP counters and the frame
/// accounting. Fails if any frame is unaccounted for.
pub(crate) fn print_report(name: &str, r: &RunReport) -> Result<(), String> {
    let d = r.device();
    let (mut syn_dropped, mut accepted) = (0, 0);
    for c in &r.cores {
        println!("{}", core_line(&c.stats));
        syn_dropped += c.stats.stack.syn_dropped;
        accepted += c.stats.stack.established;
    }
    let x = &r.xdp;
    println!(
        "stats: connections {accepted} accepted; rx {} frames ({} bad checksum, {} malformed, {} SYN dropped, {} handed over; \
         {} dropped by the kernel with the receive ring full); tx {} frames in {} batches ({} checksums offloaded); xdp steered {} passed {} malformed \
         {} no-socket {}",
        d.rx_frames,
        d.rx_bad_checksum,
        d.rx_malformed,
        syn_dropped,
        d.rx_injected,
        d.rx_ring_drops,
        d.tx_frames,
        d.tx_batches,
        d.tx_checksum_offloaded,
        x.steered,
        x.passed,
        x.malformed,
        x.no_socket
    );
    let mut tcp = corelane::TcpStats::default();
    let mut echoes = 0;
    let reset: u64 = r.cores.iter().map(|c| c.stats.stack.reset_at_stop).sum();
    let fin: u64 = r.cores.iter().map(|c| c.stats.stack.fin_at_stop).sum();
    let (mut frag, mut udp) = (Vec::new(), Vec::new());
    for c in &r.cores {
        tcp += c.stats.stack.tcp;
        echoes += c.stats.stack.icmp_echoes;
        frag.push(c.stats.stack.frag);
        udp.push(c.stats.stack.udp);
    }
    let sum = |f: &dyn Fn(&corelane::FragStats) -> u64| frag.iter().map(f).sum::<u64>();
    println!(
        "ip: {} fragments in, {} datagrams reassembled ({} evicted, {} timed out, {} overlapping, \
         {} malformed), {} datagrams sent as fragments; udp: {} datagrams in, {} out, {} dropped \
         in (queue full), {} dropped out (no route or neighbour); {} neighbours known",
        sum(&|f| f.fragments),
        sum(&|f| f.reassembled),
        sum(&|f| f.evicted),
        sum(&|f| f.timeouts),
        sum(&|f| f.overlaps),
        sum(&|f| f.malformed),
        sum(&|f| f.fragmented),
        udp.iter().map(|u| u.rx).sum::<u64>(),
        udp.iter().map(|u| u.tx).sum::<u64>(),
        udp.iter().map(|u| u.rx_dropped).sum::<u64>(),
        udp.iter().map(|u| u.tx_dropped).sum::<u64>(),
        r.cores.iter().map(|c| c.stats.stack.neighbors).sum::<u64>(),
    );
    println!(
        "tcp: {} segments out, {} retransmitted ({} loss probes, {} timeouts of the RTO, {} fast \
         recoveries), {} path MTU updates, {} ICMP errors acted on, {} connections timed out, \
         {reset} reset at stop ({fin} idle ones closed with a FIN); {} frames over the MTU built; icmp: {echoes} echo requests \
         answered",
        tcp.segs_out,
        tcp.retrans_segs,
        tcp.tail_probes + tcp.recovery_probes,
        tcp.rto_expiries,
        tcp.fast_recoveries,
        tcp.pmtu_updates,
        tcp.icmp_errors,
        tcp.timeouts,
        d.tx_oversize,
    );
    for w in &r.warnings {
        println!("warning: {w}");
    }
    let t = r.frames();
    println!(
        "frames: {} total = {} free + {} fill + {} rx + {} in use + {} tx + {} completion + {} \
         with the other process of an upgrade",
        t.total, t.free, t.fill, t.rx, t.in_use, t.tx, t.completion, t.away
    );
    if !r.frames_balanced() {
        return Err("frame accounting does not add up after shutdown".into());
    }
    if r.upgraded {
        println!("{name}: upgraded: the queues and the XDP program are the new process's");
    } else {
        println!("{name}: XDP program detached");
    }
    Ok(())
}

/// The skeleton every server example shares: the runtime from the common flags, its plan
/// printed, `bind` run on every core (a core whose bind fails serves nothing, and the first
/// such failure is the run's error once it ends),
/// one "NAME: serving WHAT on N core(s)" line once every core has bound, the periodic stats,
/// then `serve` on every core, and the report when the run ends.
pub(crate) fn serve<T, B, BF, S, Fut>(
    name: &'static str,
    c: &Common,
    what: &str,
    bind: B,
    serve: S,
) -> Result<(), Box<dyn std::error::Error>>
where
    T: 'static,
    B: Fn() -> BF + Sync,
    BF: std::future::Future<Output = std::io::Result<T>> + 'static,
    S: Fn(corelane::CoreInfo, T) -> Fut + Clone + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    init_logging();
    let rt = c.builder()?.build()?;
    println!("{}", rt.describe());
    if !c.runtime_signals {
        handle_signals(name, &rt)?;
    }
    let cores = rt.cores();
    let every = c.stats_every;
    let offload_asked = c.tx_checksum_offload;
    let ready = std::sync::Arc::new(Ready::new(cores));
    let failed = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let report = rt.run(|core| {
        let bound = bind();
        let (ready, serve, failed) = (ready.clone(), serve.clone(), failed.clone());
        let what = what.to_string();
        async move {
            let bound = bound.await;
            ready.core_ready(|| {
                if offload_asked {
                    println!(
                        "{name}: transmit checksums: {}",
                        if core.tx_checksum_offload {
                            "left to the kernel and the NIC (AF_XDP TX metadata)"
                        } else {
                            "summed here (AF_XDP TX metadata needs copy mode on Linux 6.11+, or a zero-copy driver that takes checksum requests)"
                        }
                    );
                }
                println!(
                    "{name}: serving {what} on {cores} core(s), AF_XDP sockets in {} mode; Ctrl-C stops",
                    core.bind_mode
                );
            });
            match bound {
                Ok(t) => {
                    tokio::task::spawn_local(stats_task(every));
                    serve(core, t).await;
                }
                // The first core's failure ends the run with an error; the others serve on.
                Err(e) => {
                    let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
                    f.get_or_insert_with(|| format!("core {}: {what}: {e}", core.index));
                }
            }
        }
    })?;
    if report.stopped {
        println!("{name}: stopping");
    }
    print_report(name, &report)?;
    let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
    match failed {
        Some(why) => Err(why.into()),
        None => Ok(()),
    }
}

/// Runs an example's body and turns its outcome into the exit code, with one error line.
pub(crate) fn exit(name: &str, r: Result<(), Box<dyn std::error::Error>>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr through `tracing` (corelane logs with it, a span per core): warnings and
/// errors by default, more with `RUST_LOG` (e.g. `RUST_LOG=corelane_rt=debug`).
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The example's own signal handling (the runtime installs none): SIGINT or SIGTERM shuts the
/// runtime down gracefully (listeners close, connections finish, at most 5 s), a second one
/// stops it at once. SIGHUP is left alone.
pub(crate) fn handle_signals(name: &'static str, rt: &Runtime) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let handle = rt.stop_handle();
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new()
        .name(format!("{name}-signals"))
        .spawn(move || {
            for (n, _) in signals.forever().enumerate() {
                if n == 0 {
                    println!("{name}: shutting down (5 s at most; again to stop now)");
                    handle.shutdown(Duration::from_secs(5));
                } else {
                    handle.stop();
                }
            }
        })
        .map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot start the signal thread: {e}"))
        })?;
    Ok(())
}

/// Counts cores as they finish their setup; the last one prints the "serving" line.
pub(crate) struct Ready {
    done: AtomicUsize,
    cores: usize,
}

impl Ready {
    pub(crate) fn new(cores: usize) -> Ready {
        Ready {
            done: AtomicUsize::new(0),
            cores,
        }
    }

    /// Marks one core ready; runs `announce` when it is the last.
    pub(crate) fn core_ready(&self, announce: impl FnOnce()) {
        if self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.cores {
            announce();
        }
    }
}

/// hyper's executor for the tasks of an HTTP/2 connection (the http and grpc examples): on this
/// core, with `spawn_local`, since a corelane stream is not `Send` and neither are they.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalExec;

impl<F: std::future::Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}
