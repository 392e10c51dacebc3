//! Shared parts of corelane's end-to-end experiments: medians, Markdown tables, PNG line plots
//! and a paced kernel-socket sender.

#![deny(unsafe_code)]

/// The few system calls the experiments make, behind safe functions.
pub mod sys {
    #![allow(unsafe_code)]

    /// Clock ticks per second, the unit of /proc/stat's CPU times.
    pub fn clock_ticks_per_sec() -> f64 {
        // SAFETY: sysconf has no preconditions and only reads a system constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        hz.max(1) as f64
    }

    /// Busy time per CPU (user, nice, system, irq, softirq, steal) in seconds, from /proc/stat.
    pub fn cpu_busy() -> Result<Vec<f64>, String> {
        let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
        let hz = clock_ticks_per_sec();
        let mut out = Vec::new();
        for line in stat.lines() {
            let mut f = line.split_whitespace();
            let Some(name) = f.next() else { continue };
            let Some(idx) = name
                .strip_prefix("cpu")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let v: Vec<f64> = f.filter_map(|x| x.parse().ok()).collect();
            if v.len() < 8 {
                return Err(format!("/proc/stat: short line for {name}"));
            }
            if out.len() <= idx {
                out.resize(idx + 1, 0.0);
            }
            // user nice system idle iowait irq softirq steal
            out[idx] = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;
        }
        Ok(out)
    }

    /// Raises this process's open-file limit (soft and hard) to at least `n`.
    pub fn raise_nofile(n: u64) -> std::io::Result<()> {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit through a valid pointer to a local.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if lim.rlim_cur >= n {
            return Ok(());
        }
        lim.rlim_cur = n;
        lim.rlim_max = lim.rlim_max.max(n);
        // SAFETY: setrlimit reads one rlimit through a valid pointer to a local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sets a kernel listener's backlog (listen(2) again).
    pub fn set_backlog(l: &std::net::TcpListener, n: usize) -> std::io::Result<()> {
        let n = libc::c_int::try_from(n).unwrap_or(libc::c_int::MAX);
        // SAFETY: the descriptor is open for the call; listen(2) only changes its backlog.
        if unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(l), n) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sets a kernel socket's receive buffer (SO_RCVBUF: the kernel doubles it for its
    /// bookkeeping and stops autotuning it; a listener's is inherited by what it accepts).
    pub fn set_rcvbuf(sock: &impl std::os::fd::AsRawFd, bytes: usize) -> std::io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: the descriptor is open for the call; the value is an int, valid for it.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub use corelane_testnet::sockopt::set_congestion;

    /// A kernel TCP socket's retransmitted segments and smoothed RTT in microseconds
    /// (TCP_INFO), None when the call fails.
    pub fn tcp_retrans(sock: &impl std::os::fd::AsRawFd) -> Option<(u64, u64)> {
        corelane_testnet::sockopt::tcp_info(sock)
            .ok()
            .map(|info| (u64::from(info.tcpi_total_retrans), u64::from(info.tcpi_rtt)))
    }
}

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use plotters::prelude::*;

pub mod h3;
mod sink;
mod sweep;
pub use sink::{Sink, SinkSample, load_name, offered_panels, parse_loads, write_report};
pub use sweep::{SweepArgs, commit_and_cpu, sweep, write_sweep};

/// The median of `v` (0 for none).
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// A Markdown table.
pub fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n", header.join(" | "));
    s.push_str(&format!(
        "|{}\n",
        header.iter().map(|_| "---|").collect::<String>()
    ));
    for r in rows {
        s.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    s
}

/// One line of a plot: a name and its points.
pub type Series = (String, Vec<(f64, f64)>);

/// One panel of a plot.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Title above the panel.
    pub title: String,
    /// X axis label.
    pub x: String,
    /// Y axis label.
    pub y: String,
    /// Lines.
    pub series: Vec<Series>,
}

const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn register_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = FONT_PATHS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| {
                format!(
                    "no font for the plot labels at {}: install Debian's fonts-dejavu-core",
                    FONT_PATHS[0]
                )
            })?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| "the plot font could not be read".to_string())
    })
    .clone()
}

/// Draws panels side by side into a PNG.
pub fn plot_png(path: &Path, panels: &[Panel]) -> Result<(), String> {
    register_font()?;
    let w = 640 * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (w, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (area, p) in areas.iter().zip(panels) {
        let pts = p.series.iter().flat_map(|s| s.1.iter());
        let (mut xmax, mut ymax) = (0.0f64, 0.0f64);
        for &(x, y) in pts {
            xmax = xmax.max(x);
            ymax = ymax.max(y);
        }
        let (xmax, ymax) = ((xmax * 1.05).max(1e-9), (ymax * 1.15).max(1e-9));
        let mut chart = ChartBuilder::on(area)
            .caption(&p.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(p.x.as_str())
            .y_desc(p.y.as_str())
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, points)) in p.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
                )
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// Sends to `addr` over a kernel TCP socket at about `bits_per_sec` (None: as fast as it
/// can) for `dur`, in `chunk`-byte writes, then closes and waits for the peer to close.
/// Returns the bytes written and the time from the connection to the peer's close.
pub fn paced_send(
    addr: SocketAddr,
    bits_per_sec: Option<f64>,
    dur: Duration,
    chunk: usize,
) -> std::io::Result<(u64, Duration)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    let buf = vec![0x5au8; chunk];
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < dur {
        if let Some(rate) = bits_per_sec {
            let due = Duration::from_secs_f64(sent as f64 * 8.0 / rate);
            let el = start.elapsed();
            if due > el {
                std::thread::sleep(due - el);
            }
        }
        s.write_all(&buf)?;
        sent += chunk as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    // Wait for the server to close: everything was read.
    let mut b = [0u8; 64];
    let _ = std::io::Read::read(&mut s, &mut b);
    Ok((sent, start.elapsed()))
}

/// Pins the calling thread to `cpu` (false when it cannot).
pub fn pin(cpu: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}

/// Starts a one-core corelane runtime (CPU 0) on `ifname` in `ns`, owning `cidr` and listening
/// on `port`, built as `tune` says beyond that (`|b| b` for the defaults); every accepted
/// connection is given to `serve` as a task of its own. Returns once the listener is bound,
/// with the handle that stops it.
pub fn corelane_server<F, Fut>(
    ns: &corelane_testnet::Netns,
    ifname: &str,
    cidr: &str,
    port: u16,
    tune: impl FnOnce(corelane::Builder) -> corelane::Builder + Send + 'static,
    serve: F,
) -> Result<CorelaneServer, String>
where
    F: Fn(corelane::net::TcpStream) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    use std::sync::{Mutex, mpsc};
    use std::time::Duration;
    let ifname = ifname.to_string();
    let addr: corelane::Cidr = cidr.parse().map_err(|e| format!("{e}"))?;
    let (stop_tx, stop_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let thread = ns
        .spawn(move || -> Result<(), String> {
            let b = corelane::Runtime::builder(&ifname).addr(addr).cpus(vec![0]);
            let rt = tune(b).build().map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            let ready_tx = Mutex::new(ready_tx);
            rt.run(|_| {
                let ready = ready_tx.lock().ok().map(|t| t.clone());
                let serve = serve.clone();
                async move {
                    let l = corelane::net::TcpListener::bind(port)
                        .await
                        .map_err(|e| e.to_string());
                    if let Some(t) = ready {
                        let _ = t.send(l.as_ref().map(|_| ()).map_err(Clone::clone));
                    }
                    let Ok(l) = l else { return };
                    while let Ok((s, _)) = l.accept().await {
                        tokio::task::spawn_local(serve(s));
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let Ok(stop) = stop_rx.recv_timeout(Duration::from_secs(10)) else {
        return Err(match thread.join() {
            Ok(Err(e)) => format!("the corelane server did not start: {e}"),
            _ => "the corelane server did not start".into(),
        });
    };
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the corelane server did not start")??;
    Ok(CorelaneServer { stop, thread })
}

/// A kernel TCP listener on `ip`:`port` in `ns`, running congestion control `cc` ("default":
/// the machine's).
pub fn kernel_listener(
    ns: &corelane_testnet::Netns,
    ip: &str,
    port: u16,
    cc: &str,
) -> Result<std::net::TcpListener, String> {
    let ip = ip.to_string();
    let l = ns
        .run(move || std::net::TcpListener::bind((ip.as_str(), port)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("kernel listener on port {port}: {e}"))?;
    if cc != "default" {
        sys::set_congestion(&l, cc)?;
    }
    Ok(l)
}

/// A kernel TCP echo server on `ip`:`port` in `ns` (a thread per connection, the accepting one
/// pinned to CPU 0), with listen backlog `backlog` when given.
pub fn kernel_echo(
    ns: &corelane_testnet::Netns,
    ip: &str,
    port: u16,
    backlog: Option<usize>,
) -> Result<(), String> {
    use std::io::{Read, Write};
    let ip = ip.to_string();
    let l = ns
        .run(move || -> std::io::Result<std::net::TcpListener> {
            let l = std::net::TcpListener::bind((ip.as_str(), port))?;
            if let Some(n) = backlog {
                sys::set_backlog(&l, n)?;
            }
            Ok(l)
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("kernel listener: {e}"))?;
    ns.spawn(move || {
        pin(0);
        while let Ok((mut s, _)) = l.accept() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    })
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// A corelane TCP echo server owning `cidr` on `ifname` in `ns`, on `port` (see
/// [`corelane_server`]).
pub fn corelane_echo(
    ns: &corelane_testnet::Netns,
    ifname: &str,
    cidr: &str,
    port: u16,
    tune: impl FnOnce(corelane::Builder) -> corelane::Builder + Send + 'static,
) -> Result<CorelaneServer, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    corelane_server(ns, ifname, cidr, port, tune, |mut s| async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    })
}

/// A corelane server started by [`corelane_server`].
pub struct CorelaneServer {
    stop: corelane::StopHandle,
    thread: corelane_testnet::NsThread<Result<(), String>>,
}

impl std::fmt::Debug for CorelaneServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CorelaneServer").finish_non_exhaustive()
    }
}

impl CorelaneServer {
    /// Stops the runtime and waits until it has ended (its XDP program detached), so another
    /// may start on the interface.
    pub fn stop(self) {
        self.stop.stop();
        if let Ok(Err(e)) = self.thread.join() {
            eprintln!("corelane server: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn table_has_a_row_per_entry() {
        let t = markdown_table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }

    #[test]
    fn plot_writes_a_png() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("corelane-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("p.png");
        let panel = Panel {
            title: "t".into(),
            x: "x".into(),
            y: "y".into(),
            series: vec![("s".into(), vec![(0.0, 1.0), (1.0, 2.0)])],
        };
        plot_png(&path, &[panel.clone(), panel])?;
        let bytes = std::fs::read(&path)?;
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(dir)?;
        Ok(())
    }
}
