//! Shows how corelane would place its work on this machine: the machine as hwloc reads it
//! (cores, threads, caches, NUMA nodes), where the interface sits, and the plan for a
//! placement policy (which CPU runs the protocol and which the application of each queue, what
//! they share, and why), next to what the other policies would do.
//!
//! ```text
//! target/release/examples/topology                                  # this machine, no NIC
//! ip netns exec NS target/release/examples/topology --iface IF --placement shared-cache
//! target/release/examples/topology --synthetic "package:2 l2:2 core:2 pu:1" --placement spread
//! ```
//!
//! Takes the same flags as echo (those that do not concern placement are accepted and
//! ignored), plus `--synthetic` and `--xml` to plan for a machine this one is not. Needs no
//! privileges: nothing is attached.

#[path = "../common/mod.rs"]
mod common;

use std::process::ExitCode;

use clap::Parser;
use corelane::topo::{Nic, Request};
use corelane::{Machine, Placement, Plan};

#[derive(Parser, Debug)]
#[command(about = "Print corelane's placement plan for this machine (or a described one)")]
struct Cli {
    #[command(flatten)]
    common: common::Common,
    /// Plan for an hwloc synthetic topology instead of this machine (e.g. "package:2 l2:2 core:2 pu:1").
    #[arg(long, conflicts_with = "xml")]
    synthetic: Option<String>,
    /// Plan for an hwloc XML topology file instead of this machine.
    #[arg(long)]
    xml: Option<std::path::PathBuf>,
    /// With --synthetic or --xml: the NUMA node the NIC is attached to.
    #[arg(long)]
    nic_node: Option<usize>,
}

fn machine(cli: &Cli) -> Result<Machine, Box<dyn std::error::Error>> {
    Ok(match (&cli.synthetic, &cli.xml) {
        (Some(d), _) => Machine::synthetic(d)?,
        (_, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            Machine::from_xml(&text, &path.display().to_string())?
        }
        _ => Machine::this()?,
    })
}

fn print_machine(m: &Machine) {
    println!("machine: {}", m.summary());
    for c in m.cpus().iter().take(64) {
        let caches: Vec<String> = c
            .caches
            .iter()
            .map(|k| format!("L{} #{}", k.level, k.id))
            .collect();
        println!(
            "  CPU {:>3}: core {:>3}, package {}, NUMA node {}, under {}",
            c.os,
            c.core,
            c.package,
            c.node,
            if caches.is_empty() {
                "no cache hwloc knows of".to_string()
            } else {
                caches.join(", ")
            }
        );
    }
    if m.cpus().len() > 64 {
        println!("  ... {} CPUs in all", m.cpus().len());
    }
    let cpus: Vec<usize> = m.cpus().iter().map(|c| c.os).collect();
    if cpus.len() <= 8 {
        for (i, &a) in cpus.iter().enumerate() {
            for &b in &cpus[i + 1..] {
                println!("  CPU {a} and CPU {b}: {}", m.sharing(a, b));
            }
        }
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let described = cli.synthetic.is_some() || cli.xml.is_some();
    let m = machine(&cli)?;
    print_machine(&m);
    let plan_for = |p: &Placement| -> Result<Plan, Box<dyn std::error::Error>> {
        match (&cli.common.iface, described) {
            (Some(_), false) => {
                // Exactly what the runtime would do with these flags.
                let b = cli.common.builder()?.placement(p.clone());
                Ok(b.plan()?)
            }
            (iface, _) => {
                let nic = match (iface, cli.nic_node) {
                    (Some(name), Some(node)) => Nic {
                        name: name.clone(),
                        pci: None,
                        node: Some(node),
                        locality: format!("given as attached to NUMA node {node}"),
                    },
                    (Some(name), None) => m.nic(name, None),
                    (None, _) => Nic {
                        name: "(no interface given)".into(),
                        pci: None,
                        node: cli.nic_node,
                        locality: "every CPU counts as equally close".into(),
                    },
                };
                let allowed = if described {
                    m.cpus().iter().map(|c| c.os).collect()
                } else {
                    corelane::allowed_cpus()
                };
                let req = Request {
                    lanes: cli.common.cores,
                    max_lanes: None,
                    allowed,
                    nic,
                };
                Ok(corelane::topo::plan(&m, p, &req)?)
            }
        }
    };
    let chosen = &cli.common.placement;
    println!();
    print!("{}", plan_for(chosen)?);
    println!();
    println!("the other policies here:");
    for other in [
        Placement::SameCore,
        Placement::SharedCache,
        Placement::Spread,
    ] {
        if &other == chosen {
            continue;
        }
        match plan_for(&other) {
            Ok(p) => {
                let lanes: Vec<String> = p
                    .lanes
                    .iter()
                    .map(|l| {
                        if l.split() {
                            format!("CPU {}+{} ({})", l.protocol_cpu, l.app_cpu, l.sharing)
                        } else {
                            format!("CPU {}", l.protocol_cpu)
                        }
                    })
                    .collect();
                println!("  {}: {}", other.name(), lanes.join("; "));
            }
            Err(e) => println!("  {}: does not fit: {e}", other.name()),
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    common::exit("topology", run(cli))
}
