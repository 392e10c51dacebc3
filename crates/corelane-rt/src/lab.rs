//! A corelane runtime for a service's own tests: one core whose queue is in memory, so it runs
//! without root, without an interface and without the XDP program, in any test binary.
//!
//! The core is the one a real run has (the same stack, driver, sockets and wakers); only its
//! queue differs: the in-memory kernel (`corelane_xsk::SimKernel`) stands for the AF_XDP
//! socket, and the in-memory program for the XDP program's maps. The lab owns `127.0.0.1/8`
//! and `::1` unless told otherwise ([`Lab::addr`]); a connection or datagram to an owned
//! address comes back through the device, as the kernel's loopback does, so a service's
//! listener and its own client meet inside the lab. Nothing else is on its link: a
//! connection to another address fails as it would on a link where no one answers.
//!
//! A service ported to corelane keeps its integration tests: where they ran under
//! `#[tokio::test]` on the kernel's sockets, they run in [`run`] on corelane's.
//!
//! ```
//! # use corelane_rt as corelane;
//! use corelane::net::{TcpListener, TcpStream};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let echoed = corelane::lab::run(async {
//!     let listener = TcpListener::bind("127.0.0.1:0").await?;
//!     let addr = listener.local_addr()?;
//!     tokio::task::spawn_local(async move {
//!         let (mut s, _) = listener.accept().await?;
//!         let (mut r, mut w) = s.split();
//!         tokio::io::copy(&mut r, &mut w).await?;
//!         Ok::<_, std::io::Error>(())
//!     });
//!     let mut client = TcpStream::connect(addr).await?;
//!     client.write_all(b"ping").await?;
//!     let mut back = [0u8; 4];
//!     client.read_exact(&mut back).await?;
//!     Ok::<_, std::io::Error>(back)
//! })??;
//! assert_eq!(&echoed, b"ping");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Instant as StdInstant;

use crate::host::mem::{MemProgram, SimKernel, XskConfig};
use corelane_stack::smoltcp::wire::IpCidr;
use corelane_stack::{Pipeline, Stack, StackConfig, XdpDevice};

use crate::clock::Clock;
use crate::control::Shared;
use crate::driver::Driver;
use crate::lane::{self, Core, CoreStats};
use crate::peers::CorePeers;
use crate::{Error, IntoCidr};

/// The lab's hardware address (locally administered).
const MAC: [u8; 6] = [2, 0, 0, 0x1a, 0xb0, 1];
/// The IP MTU of the lab's link.
const MTU: usize = 1500;

/// A lab: the addresses its core owns and its stack's settings (see the [module](self)).
#[derive(Debug, Clone)]
pub struct Lab {
    addrs: Vec<IpCidr>,
    /// The addresses are the caller's (not the loopback ones of [`Lab::new`]).
    chosen: bool,
    stack: StackConfig,
}

impl Default for Lab {
    fn default() -> Self {
        Lab::new()
    }
}

impl Lab {
    /// A lab owning `127.0.0.1/8` and `::1/128`, with the stack's default settings.
    pub fn new() -> Lab {
        use corelane_stack::smoltcp::wire::{Ipv4Address, Ipv6Address};
        Lab {
            addrs: vec![
                IpCidr::new(Ipv4Address::new(127, 0, 0, 1).into(), 8),
                IpCidr::new(Ipv6Address::LOCALHOST.into(), 128),
            ],
            chosen: false,
            stack: StackConfig::default(),
        }
    }

    /// Owns `cidr` (for example `"10.0.0.1/24"`) instead of the loopback addresses; called
    /// again, owns that one too.
    ///
    /// # Errors
    /// `cidr` is not an address with a prefix, or is not unicast.
    pub fn addr(mut self, cidr: impl IntoCidr) -> Result<Lab, Error> {
        let c = cidr.into_cidr()?.to_smoltcp();
        let a = c.address();
        if a.is_unspecified() || a.is_multicast() || a.is_broadcast() {
            return Err(Error::Config(format!(
                "lab address {c}: an owned address must be unicast"
            )));
        }
        if !self.chosen {
            self.chosen = true;
            self.addrs.clear();
        }
        if !self.addrs.iter().any(|o| o.address() == a) {
            self.addrs.push(c);
        }
        Ok(self)
    }

    /// Seeds the stack's secrets and choices (sequence numbers, ports): a run with a seed
    /// picks the same ones each time.
    pub fn seed(mut self, seed: u64) -> Lab {
        self.stack.seed = Some(seed);
        self
    }

    /// Runs `fut` on the lab's core, as [`Runtime::run`](crate::Runtime::run) runs a core's
    /// future: corelane's sockets work inside it and in the tasks it spawns with
    /// `tokio::task::spawn_local`, and tokio's timers too. Returns `fut`'s output once it
    /// completes; the tasks still running are dropped and the connections still open reset.
    /// A panic in `fut` goes on in the caller (a test fails with it). Call it from a plain
    /// `#[test] fn`, not from inside a tokio runtime (tokio does not start one runtime inside
    /// another, and panics saying so).
    ///
    /// # Errors
    /// The in-memory queue cannot be made (memory files: the process's limits).
    pub fn run<Fut: Future>(self, fut: Fut) -> Result<Fut::Output, Error> {
        let config = XskConfig {
            frames: 4096,
            frame_size: 2048,
            ring_size: 1024,
            ..XskConfig::default()
        };
        let (kernel, queue) = SimKernel::open(&config)?;
        // Nothing else is on the lab's link: what leaves for the wire is dropped.
        kernel.discard_wire();
        let program = MemProgram::new();
        program.add_queue(0, kernel.clone());
        let shared =
            Shared::in_memory(&program, &self.addrs, &Clock::Wall).map_err(|source| Error::Os {
                what: "the lab's control plane".into(),
                source,
            })?;
        let fd = queue.fd();
        shared.steer.run(move |s| s.register(0, fd))??;
        let mut dev = XdpDevice::new(queue, MTU, 64);
        if std::env::var_os("CORELANE_STRICT").is_some_and(|v| v == "1") {
            dev.set_strict(true);
        }
        let stack = Stack::new(
            &mut dev,
            MAC,
            &self.addrs,
            StackConfig {
                core: 0,
                cores: 1,
                ..self.stack
            },
        );
        let core = Arc::new(Core::new(0, stack, shared.clone(), CoreStats::default()));
        let peers = CorePeers::new(0, Vec::new(), vec![None], shared.bells.clone());
        let epoch = StdInstant::now();
        let driver = Driver::new(
            core.clone(),
            Pipeline::new(dev, None),
            peers,
            // Nothing arrives from outside: an idle core sleeps at once, until a task gives it
            // work or the stack's next deadline.
            crate::PollMode::Adaptive {
                spin: std::time::Duration::ZERO,
            },
            epoch,
        );
        // Declared before the executor: dropped after it (its tasks' destructors reach the
        // core), and on a panic too, so the thread is no core's once the lab is gone.
        let _current = OnCore::enter(core.clone());
        let exec = crate::executor::executor().map_err(|source| Error::Os {
            what: "the lab's executor".into(),
            source,
        })?;
        let out = exec.block_on(async {
            let driver = tokio::task::spawn_local(driver.run());
            let out = fut.await;
            shared.stop_all();
            // The lab's driver waits on its tasks' kicks and its timers, not the doorbells.
            core.wake_driver();
            (out, driver.await)
        });
        let (out, driver) = out;
        // The tasks still alive are dropped while the core is reachable for their destructors.
        drop(exec);
        if let Ok(mut d) = driver {
            let since = epoch.elapsed();
            let now = corelane_stack::smoltcp::time::Instant::from_micros(
                since.as_micros().min(i64::MAX as u128) as i64,
            );
            let _ = core.stack().shutdown(now, &mut d.pipe.dev);
        }
        Ok(out)
    }
}

/// The calling thread is `core`'s until dropped; then it is again what it was.
struct OnCore(Option<Arc<Core>>);

impl OnCore {
    fn enter(core: Arc<Core>) -> OnCore {
        let before = lane::current().ok();
        lane::set_current(Some(core));
        OnCore(before)
    }
}

impl Drop for OnCore {
    fn drop(&mut self) {
        lane::set_current(self.0.take());
    }
}

/// Runs `fut` in a [`Lab::new`] (owning `127.0.0.1/8` and `::1`): see [`Lab::run`].
///
/// # Errors
/// As [`Lab::run`].
pub fn run<Fut: Future>(fut: Fut) -> Result<Fut::Output, Error> {
    Lab::new().run(fut)
}
