//! TCP and UDP echo on one port, served by corelane on every core.
//!
//! Run it inside the network namespace that holds the interface, as root:
//!
//! ```text
//! ip netns exec NS target/release/examples/echo --iface IF --addr 10.77.0.3/24
//! ```
//!
//! Each core binds the port, accepts the connections whose SYN reached its queue, and echoes on
//! them. The address must be one the kernel does not hold on that interface (corelane answers ARP
//! and NDP for it). Ctrl-C (or SIGTERM) shuts it down: listeners close, connections finish and
//! close (what is left after 5 s is reset; a second signal stops at once), the XDP program is
//! detached, and the counters and frame accounting are printed.

#[path = "../common/mod.rs"]
mod common;

use std::cell::Cell;
use std::process::ExitCode;
use std::rc::Rc;

use clap::Parser;
use corelane::net::{TcpListener, TcpStream, UdpSocket};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::spawn_local;

#[derive(Parser, Debug)]
#[command(about = "TCP and UDP echo served by corelane over AF_XDP, on every core")]
struct Args {
    #[command(flatten)]
    common: common::Common,
}

fn main() -> ExitCode {
    common::exit("echo", run(Args::parse()))
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let port = args.common.port_or(7);
    common::serve(
        "echo",
        &args.common,
        &format!("TCP and UDP port {port}"),
        || async move { Ok((TcpListener::bind(port).await?, UdpSocket::bind(port).await?)) },
        |core, (listener, udp)| async move {
            spawn_local(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                    let _ = udp.send_to(&buf[..n], from).await;
                }
            });
            let open = Rc::new(Cell::new(0usize));
            loop {
                match listener.accept().await {
                    Ok((s, _peer)) => {
                        let open = open.clone();
                        open.set(open.get() + 1);
                        spawn_local(async move {
                            echo(s).await;
                            open.set(open.get() - 1);
                        });
                    }
                    Err(e) => {
                        eprintln!("echo: core {}: accept: {e}", core.index);
                        break;
                    }
                }
            }
        },
    )
}

async fn echo(mut s: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = s.shutdown().await;
}
