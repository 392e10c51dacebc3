//! A corelane TCP sink fed by kernel senders over a veth pair: the receive side of the seed
//! experiments (placement, lanes), one run at a time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use corelane::Runtime;
use corelane::net::TcpListener;
use corelane_testnet::VethPair;
use tokio::io::AsyncReadExt;

use crate::{paced_send, pin};

/// What one sink run received and what it cost.
#[derive(Debug, Clone)]
pub struct SinkSample {
    /// What the sink's application read, in Gbit/s over the senders' time.
    pub gbit: f64,
    /// CPU seconds of the runtime's threads (protocol and application) over the run.
    pub cpu_s: f64,
    /// Busy seconds of every CPU of the machine while the senders ran (theirs included).
    pub machine_cpu_s: f64,
    /// Gigabytes received.
    pub gb: f64,
    /// Frames each lane (core) received, in core order.
    pub lane_frames: Vec<u64>,
}

impl SinkSample {
    /// The runtime's CPU seconds per gigabyte received.
    pub fn cpu_s_per_gb(&self) -> f64 {
        self.cpu_s / self.gb.max(1e-12)
    }

    /// The whole machine's busy seconds per gigabyte received.
    pub fn machine_cpu_s_per_gb(&self) -> f64 {
        self.machine_cpu_s / self.gb.max(1e-12)
    }
}

/// One run of the sink.
#[derive(Debug, Clone)]
pub struct Sink {
    /// The server's address (a /24 on `net`'s server side).
    pub ip: String,
    /// The port it listens on.
    pub port: u16,
    /// Kernel sender connections; the offered load is split evenly between them.
    pub conns: usize,
    /// Offered load in Gbit/s over all connections; None: each sends as fast as it can.
    pub gbit: Option<f64>,
    /// The senders' CPU (each sender thread is pinned to it).
    pub client_cpu: usize,
    /// Seconds the senders send.
    pub secs: f64,
}

impl Sink {
    /// Starts a corelane runtime on `net`'s server side (built by `tune` beyond its address),
    /// reading every connection to the end; runs the senders in the client namespace; stops
    /// the runtime and returns what was received and what it cost.
    pub fn run(
        &self,
        net: &VethPair,
        tune: impl FnOnce(corelane::Builder) -> corelane::Builder + Send + 'static,
    ) -> Result<SinkSample, String> {
        let received = Arc::new(AtomicU64::new(0));
        let (stop_tx, stop_rx) = std::sync::mpsc::channel();
        let ifname = net.server_if().to_string();
        let (rcv, cidr, port) = (received.clone(), format!("{}/24", self.ip), self.port);
        let server = net
            .server_ns()
            .spawn(move || -> Result<corelane::RunReport, String> {
                let rt = tune(Runtime::builder(&ifname).addr(cidr))
                    .build()
                    .map_err(|e| e.to_string())?;
                let _ = stop_tx.send(rt.stop_handle());
                rt.run(move |_core| read_all(port, rcv.clone()))
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| e.to_string())?;
        let Ok(stop) = stop_rx.recv_timeout(Duration::from_secs(10)) else {
            return Err(match server.join() {
                Ok(Err(e)) => e,
                _ => "the server did not start".to_string(),
            });
        };
        let sent = self.send(net);
        stop.stop();
        let report = server.join().map_err(|e| e.to_string())??;
        let (sent, elapsed, machine_cpu_s) = sent?;
        let got = received.load(Ordering::Relaxed);
        if got < sent / 2 {
            return Err(format!("the sink received {got} of {sent} bytes"));
        }
        let cpu_s: f64 = report
            .cores
            .iter()
            .map(|c| (c.stats.cpu_time + c.stats.app_cpu_time).as_secs_f64())
            .sum();
        Ok(SinkSample {
            gbit: got as f64 * 8.0 / elapsed.as_secs_f64() / 1e9,
            cpu_s,
            machine_cpu_s,
            gb: got as f64 / 1e9,
            lane_frames: report
                .cores
                .iter()
                .map(|c| c.stats.device.rx_frames)
                .collect(),
        })
    }

    /// The senders: one thread per connection in the client namespace, all pinned to the
    /// client CPU. Returns the bytes sent, the longest sender's time and the machine's busy
    /// seconds meanwhile.
    fn send(&self, net: &VethPair) -> Result<(u64, Duration, f64), String> {
        let addr: SocketAddr = format!("{}:{}", self.ip, self.port)
            .parse()
            .map_err(|_| format!("{}: not an IP address", self.ip))?;
        let (conns, cpu, dur) = (
            self.conns.max(1),
            self.client_cpu,
            Duration::from_secs_f64(self.secs),
        );
        let each = self.gbit.map(|g| g * 1e9 / conns as f64);
        net.client_ns()
            .run(move || -> Result<(u64, Duration, f64), String> {
                let before = crate::sys::cpu_busy()?;
                let senders: Vec<_> = (0..conns)
                    .map(|_| {
                        std::thread::spawn(move || {
                            pin(cpu);
                            // The first connection may race the listener's start: retry.
                            let mut last = None;
                            for _ in 0..50 {
                                match paced_send(addr, each, dur, 64 * 1024) {
                                    Ok(n) => return Ok(n),
                                    Err(e) => last = Some(e),
                                }
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            Err(last.map(|e| e.to_string()).unwrap_or_default())
                        })
                    })
                    .collect();
                let (mut sent, mut longest) = (0, Duration::ZERO);
                for s in senders {
                    let (n, t) = s.join().map_err(|_| "a sender panicked")??;
                    sent += n;
                    longest = longest.max(t);
                }
                let after = crate::sys::cpu_busy()?;
                let busy = after
                    .iter()
                    .zip(before.iter().chain(std::iter::repeat(&0.0)))
                    .map(|(a, b)| a - b)
                    .sum();
                Ok((sent, longest, busy))
            })
            .map_err(|e| e.to_string())?
    }
}

/// A core's future: accepts on `port` and reads every connection to its end, counting bytes.
async fn read_all(port: u16, rcv: Arc<AtomicU64>) {
    let l = match TcpListener::bind(port).await {
        Ok(l) => l,
        Err(e) => return eprintln!("sink: port {port}: {e}"),
    };
    while let Ok((mut s, _)) = l.accept().await {
        let rcv = rcv.clone();
        tokio::task::spawn_local(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = s.read(&mut buf).await {
                rcv.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
    }
}

/// Parses offered loads in Gbit/s, comma separated; `max` (None) sends as fast as it can.
pub fn parse_loads(v: &str) -> Result<Vec<Option<f64>>, String> {
    v.split(',')
        .map(|l| match l.trim() {
            "max" => Ok(None),
            x => x
                .parse::<f64>()
                .ok()
                .filter(|g| *g > 0.0)
                .map(Some)
                .ok_or_else(|| format!("--loads: `{x}` is not a rate in Gbit/s or `max`")),
        })
        .collect()
}

/// An offered load as the reports write it.
pub fn load_name(l: Option<f64>) -> String {
    l.map_or("max".to_string(), |g| format!("{g}"))
}

/// Writes an experiment's report into `dir`: `STEM.md`, `STEM.json` (the rows as a JSON
/// array) and `STEM.png` (the panels), and says where.
pub fn write_report(
    dir: &std::path::Path,
    stem: &str,
    md: &str,
    json_rows: &[String],
    panels: &[crate::Panel],
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (md_path, json_path, png) = (
        dir.join(format!("{stem}.md")),
        dir.join(format!("{stem}.json")),
        dir.join(format!("{stem}.png")),
    );
    std::fs::write(&md_path, md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    let json = format!("[\n  {}\n]\n", json_rows.join(",\n  "));
    std::fs::write(&json_path, json).map_err(|e| format!("{}: {e}", json_path.display()))?;
    crate::plot_png(&png, panels)?;
    println!(
        "wrote {}, {} and {}",
        md_path.display(),
        json_path.display(),
        png.display()
    );
    Ok(())
}

/// The two panels of an offered-load experiment: goodput against the load offered (`max` drawn
/// at the goodput it reached), and CPU per GB (titled `cost`) against goodput.
pub fn offered_panels(
    good: Vec<crate::Series>,
    cost: Vec<crate::Series>,
    cost_title: &str,
) -> Vec<crate::Panel> {
    vec![
        crate::Panel {
            title: "goodput against offered load".into(),
            x: "offered Gbit/s (max: as fast as possible)".into(),
            y: "goodput Gbit/s".into(),
            series: good,
        },
        crate::Panel {
            title: cost_title.into(),
            x: "goodput Gbit/s".into(),
            y: "CPU seconds per GB".into(),
            series: cost,
        },
    ]
}
