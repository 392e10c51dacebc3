//! UDP echo on every core: each core binds the port and answers the datagrams that reach its
//! queue.
//!
//! ```text
//! ip netns exec NS target/release/examples/udp_echo --iface IF --addr 10.77.0.3/24 --port 7
//! ```

#[path = "../common/mod.rs"]
mod common;

use std::process::ExitCode;

use clap::Parser;
use corelane::net::UdpSocket;

#[derive(Parser, Debug)]
#[command(about = "UDP echo served by corelane over AF_XDP, on every core")]
struct Args {
    #[command(flatten)]
    common: common::Common,
}

fn main() -> ExitCode {
    common::exit("udp_echo", run(Args::parse()))
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let c = &args.common;
    let port = c.port_or(7);
    let rt = c.builder()?.build()?;
    println!("{}", rt.describe());
    let cores = rt.cores();
    let every = c.stats_every;
    let ready = common::Ready::new(cores);
    let report = rt.run(|core| {
        let sock = UdpSocket::bind(port);
        ready.core_ready(|| {
            println!("udp_echo: serving UDP port {port} on {cores} core(s), AF_XDP sockets in {} mode; Ctrl-C stops", core.bind_mode);
        });
        async move {
            let sock = match sock {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("udp_echo: error: core {}: port {port}: {e}", core.index);
                    return;
                }
            };
            tokio::task::spawn_local(common::stats_task(every));
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = sock.recv_from(&mut buf).await {
                if let Err(e) = sock.send_to(&buf[..n], from).await {
                    eprintln!("udp_echo: core {}: to {from}: {e}", core.index);
                }
            }
        }
    })?;
    common::print_report("udp_echo", &report)?;
    Ok(())
}
