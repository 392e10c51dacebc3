//! Attack scripts against a kernel TCP echo server and a corelane one on the same veth pair,
//! results side by side: blind resets, SYNs and data, forged ACKs, a guessed SYN cookie with no
//! flood, ICMP errors quoting sequence numbers not in flight, a forged source MAC, and a probe
//! of the IP IDs (see `corelane_testnet::attacks`). Writes `attacks.md`.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin attacks
//! ```

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::path::PathBuf;

use clap::Parser;
use corelane_bench::markdown_table;
use corelane_testnet::VethPair;
use corelane_testnet::attacks::{Outcome, neighbour_advert, run_all};

const KERNEL: Ipv4Addr = Ipv4Addr::new(10, 86, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 86, 0, 2);
const CORELANE: Ipv4Addr = Ipv4Addr::new(10, 86, 0, 3);
const SPARE: Ipv4Addr = Ipv4Addr::new(10, 86, 0, 9);
const PORT: u16 = 7;
const KERNEL6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x86, 0, 0, 0, 0, 0, 1);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x86, 0, 0, 0, 0, 0, 2);
const CORELANE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x86, 0, 0, 0, 0, 0, 3);

#[derive(Parser, Debug)]
#[command(about = "Attack scripts against the kernel and corelane, side by side")]
struct Args {
    /// Where attacks.md goes.
    #[arg(long, default_value = "target/attacks")]
    out: PathBuf,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("attacks: {e}");
        std::process::exit(1);
    }
}

fn cell(o: &Outcome) -> String {
    let mut parts = vec![format!("answer: {}", o.answer)];
    if let Some(s) = o.survived {
        parts.push(if s { "still echoes" } else { "connection lost" }.into());
    }
    if let Some(i) = o.injected {
        parts.push(
            if i {
                "**forged data delivered**"
            } else {
                "forged data not delivered"
            }
            .into(),
        );
    }
    if !o.detail.is_empty() {
        parts.push(o.detail.clone());
    }
    parts.join("; ")
}

fn run(args: &Args) -> Result<(), String> {
    let net = VethPair::builder()
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr(&format!("{CLIENT}/24"))
        .server_addr(&format!("{KERNEL6}/64"))
        .client_addr(&format!("{CLIENT6}/64"))
        .build()
        .map_err(|e| e.to_string())?;
    corelane_bench::kernel_echo(net.server_ns(), &KERNEL.to_string(), PORT, None)?;
    corelane_bench::kernel_echo(net.server_ns(), &KERNEL6.to_string(), PORT, None)?;
    let server = corelane_bench::corelane_echo(
        net.server_ns(),
        net.server_if(),
        &format!("{CORELANE}/24"),
        PORT,
        |b| b.addr(format!("{CORELANE6}/64").as_str()),
    )?;
    let both = |v4: Ipv4Addr, v6: Ipv6Addr| -> Result<Vec<Outcome>, String> {
        let mut out =
            run_all(&net, SocketAddrV4::new(v4, PORT), CLIENT, SPARE).map_err(|e| e.to_string())?;
        out.extend(
            neighbour_advert(&net, SocketAddrV6::new(v6, PORT, 0, 0), CLIENT6)
                .map_err(|e| e.to_string())?,
        );
        Ok(out)
    };
    let kernel = both(KERNEL, KERNEL6).map_err(|e| format!("against the kernel: {e}"))?;
    let corelane = both(CORELANE, CORELANE6).map_err(|e| format!("against corelane: {e}"))?;
    server.stop();
    let rows: Vec<Vec<String>> = kernel
        .iter()
        .zip(&corelane)
        .map(|(k, c)| vec![k.attack.into(), k.expected.into(), cell(k), cell(c)])
        .collect();
    let md = format!(
        "# Attack scripts: the kernel and corelane side by side\n\n\
         An attacker on the client's link who knows a connection's four-tuple (and, for the \
         blind attacks, not its sequence numbers) against a kernel echo server and a corelane \
         echo server on the same veth pair; the client's connections without timestamps. \
         \"answer\" is what the server sent back within 200 ms; \"still echoes\" that the \
         connection then carried an echo; controls show that the forged frames reach the \
         server.\n\n{}\n\nReproduce: `cargo run --release -p corelane-bench --bin attacks`\n",
        markdown_table(
            &["attack", "a stack following the RFCs", "kernel", "corelane"],
            &rows
        )
    );
    println!("{md}");
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    let path = args.out.join("attacks.md");
    std::fs::write(&path, md).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
