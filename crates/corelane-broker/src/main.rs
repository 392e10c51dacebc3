//! `corelane-broker grant`: attach corelane's XDP program to an interface and grant a server the
//! addresses and ports it may steer, so the server runs with `CAP_NET_RAW` alone.
//!
//! ```text
//! corelane-broker grant veth0 --addr 10.0.0.1 --tcp 7,49152-65535 --udp 7 --user corelane
//! ```
//!
//! It runs until SIGINT or SIGTERM, then detaches the program and puts the interface back as it
//! was. It needs CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON (or root), and keeps only CAP_NET_ADMIN
//! and CAP_BPF once the program is attached.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::{Parser, Subcommand, ValueEnum};
use corelane_broker::{Broker, Grant};
use corelane_xsk::{AttachMode, Cap};

#[derive(Parser, Debug)]
#[command(
    name = "corelane-broker",
    about = "corelane's privileged half: attaches the XDP program and grants a server what it may steer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Attach the program to IFACE and serve one corelane server at a time, until SIGINT or
    /// SIGTERM.
    Grant {
        /// The interface (in this network namespace).
        iface: String,
        /// An address the server may own (repeat for more).
        #[arg(long = "addr", required = true)]
        addrs: Vec<String>,
        /// TCP ports it may steer: 7, 8000-8099, or a comma-separated list (repeatable). A
        /// server that opens connections needs the ephemeral range too (49152-65535).
        #[arg(long = "tcp")]
        tcp: Vec<String>,
        /// UDP ports it may steer, as for --tcp.
        #[arg(long = "udp")]
        udp: Vec<String>,
        /// A user (name or uid) whose processes may take the grant (repeatable; default: the
        /// user running this).
        #[arg(long = "user")]
        users: Vec<String>,
        /// How to attach the program.
        #[arg(long, value_enum, default_value = "auto")]
        mode: Mode,
        /// The most receive queues the server may set the interface to (default: it may not
        /// change them; a server with more cores than queues then fails with this hint).
        #[arg(long, default_value_t = 0)]
        channels: u32,
        /// Serve one 802.1Q VLAN of the interface (1 to 4094) instead of its untagged frames;
        /// the server must be started for the same VLAN (`Builder::vlan`, `--vlan`).
        #[arg(long, default_value_t = 0)]
        vlan: u16,
        /// The 802.1ad service VLAN (1 to 4094) the frames carry outside the VLAN's tag (QinQ);
        /// the server must be started for the same one (`Builder::service_vlan`,
        /// `--service-vlan`).
        #[arg(long, default_value_t = 0)]
        service_vlan: u16,
        /// A granted address the kernel holds that the server may own whole, every port of it
        /// corelane's (repeatable). Without it, an address the kernel holds is served only
        /// shared: the server's ports are corelane's, the rest stay the kernel's.
        #[arg(long = "own-kernel-addr")]
        own_kernel_addrs: Vec<String>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Mode {
    Auto,
    Native,
    Generic,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corelane-broker: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn words(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn uid_of(user: &str) -> Result<u32, String> {
    if let Ok(n) = user.parse::<u32>() {
        return Ok(n);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        _ => Err(format!(
            "no user `{user}` (give a name from /etc/passwd or a uid)"
        )),
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let Command::Grant {
        iface,
        addrs,
        tcp,
        udp,
        users,
        mode,
        channels,
        vlan,
        service_vlan,
        own_kernel_addrs,
    } = cli.command;
    let uids = if users.is_empty() {
        vec![nix::unistd::geteuid().as_raw()]
    } else {
        users.iter().map(|u| uid_of(u)).collect::<Result<_, _>>()?
    };
    let mut grant = Grant::parse(&iface, &words(&addrs), &words(&tcp), &words(&udp), &uids)?;
    grant.channels = channels;
    for a in words(&own_kernel_addrs) {
        let ip: std::net::IpAddr = a
            .parse()
            .map_err(|_| format!("--own-kernel-addr {a}: not an IP address"))?;
        if !grant.addrs.contains(&ip) {
            return Err(format!("--own-kernel-addr {a}: not granted (add --addr {a})").into());
        }
        grant.whole.push(ip);
    }
    grant.vlan = corelane_xsk::Vlan::qinq(service_vlan, vlan);
    grant.attach = match mode {
        Mode::Auto => AttachMode::Auto,
        Mode::Native => AttachMode::Native,
        Mode::Generic => AttachMode::Generic,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let broker = Broker::start(grant)?;
    // Attached: what is left to do is map updates, queue changes and the kernel sockets that
    // hold a shared address's ports for its servers (below 1024 they need
    // CAP_NET_BIND_SERVICE). Dropped before any session thread starts, so none of them holds
    // more.
    corelane_xsk::retain_caps(&[Cap::NetAdmin, Cap::Bpf, Cap::NetBindService])?;
    println!("{}", broker.describe());
    println!("corelane-broker: serving");
    broker.serve(&stop)?;
    drop(broker);
    println!("corelane-broker: stopped; program detached");
    Ok(())
}
