//! The router's reordering stage: a thread in the router's namespace that holds each frame
//! the router sends it for a fixed delay and then puts it back on the bridge, so it arrives
//! after the frames sent behind it.
//!
//! The router's nftables rules pick the frames (`fwd to` the detour veth's bridge end); the
//! stage reads them from the detour's other end and writes them back there once due; the
//! bridge forwards them by their destination address. The detour's bridge port neither learns
//! nor floods, so it carries only what was sent into it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::packet::PacketSocket;
use crate::{Netns, NsThread, Result};

/// Frames held at once before the stage drops (a bound on its memory).
const MAX_HELD: usize = 65_536;

#[derive(Debug, Default)]
pub(crate) struct StageCounters {
    /// Frames put back on the bridge.
    pub(crate) released: AtomicU64,
    /// Frames dropped because the stage already held `MAX_HELD`, or the detour refused them.
    pub(crate) dropped: AtomicU64,
}

/// A running stage; dropping it stops the thread.
#[derive(Debug)]
pub(crate) struct Stage {
    stop: Arc<AtomicBool>,
    delay_us: Arc<AtomicU64>,
    pub(crate) counters: Arc<StageCounters>,
    thread: Option<NsThread<std::io::Result<()>>>,
}

impl Stage {
    /// Starts the stage on `ifname` in `ns`, holding frames for `delay`.
    pub(crate) fn start(ns: &Netns, ifname: &str, delay: Duration) -> Result<Stage> {
        let stop = Arc::new(AtomicBool::new(false));
        let delay_us = Arc::new(AtomicU64::new(delay.as_micros() as u64));
        let counters = Arc::new(StageCounters::default());
        let (s, d, c) = (stop.clone(), delay_us.clone(), counters.clone());
        let ifname = ifname.to_string();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = ns.spawn(move || {
            let sock = match PacketSocket::open(&ifname, true) {
                Ok(sock) => {
                    let _ = ready_tx.send(Ok(()));
                    sock
                }
                Err(e) => {
                    let msg = e.to_string();
                    let _ = ready_tx.send(Err(e));
                    return Err(std::io::Error::other(msg));
                }
            };
            run(&sock, &s, &d, &c)
        })?;
        let opened = ready_rx.recv().unwrap_or_else(|_| {
            Err(std::io::Error::other(
                "the reordering stage ended before opening its socket",
            ))
        });
        let mut stage = Stage {
            stop,
            delay_us,
            counters,
            thread: Some(thread),
        };
        if let Err(source) = opened {
            stage.halt();
            return Err(crate::Error::Io {
                what: "opening the reordering stage's packet socket".into(),
                source,
            });
        }
        Ok(stage)
    }

    /// Changes how long frames are held from now on.
    pub(crate) fn set_delay(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.halt();
    }
}

fn run(
    sock: &PacketSocket,
    stop: &AtomicBool,
    delay_us: &AtomicU64,
    counters: &StageCounters,
) -> std::io::Result<()> {
    let mut held: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            if let Some((_, frame)) = held.pop_front() {
                let ctr = if sock.send(&frame)? {
                    &counters.released
                } else {
                    &counters.dropped
                };
                ctr.fetch_add(1, Ordering::Relaxed);
            }
        }
        let delay = Duration::from_micros(delay_us.load(Ordering::Relaxed));
        while let Some(n) = sock.recv(&mut buf)? {
            if held.len() >= MAX_HELD {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            held.push_back((Instant::now() + delay, buf[..n].to_vec()));
        }
        let idle = Duration::from_millis(5);
        let wait = held
            .front()
            .map_or(idle, |(due, _)| {
                due.saturating_duration_since(Instant::now())
            })
            .min(idle);
        if !wait.is_zero() {
            sock.wait(wait);
        }
    }
    Ok(())
}
