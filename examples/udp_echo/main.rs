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
    let port = args.common.port_or(7);
    common::serve(
        "udp_echo",
        &args.common,
        &format!("UDP port {port}"),
        || UdpSocket::bind(port),
        |core, sock| async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = sock.recv_from(&mut buf).await {
                if let Err(e) = sock.send_to(&buf[..n], from).await {
                    eprintln!("udp_echo: core {}: to {from}: {e}", core.index);
                }
            }
        },
    )
}
