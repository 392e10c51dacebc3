//! The router's reordering stage: a thread in the router's namespace that holds each frame
//! the router sends it for a fixed delay and then puts it back on the bridge, so it arrives
//! after the frames sent behind it. In its depth mode the router sends it every frame, and it
//! holds a share of them each behind a number of later frames to the same destination (a
//! path that reorders by depth, however fast the frames come), passing the others at once.
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

/// In depth mode, the longest a frame waits for the later frames that release it (the tail
/// of a transfer has none behind it).
pub(crate) const DEPTH_LIMIT: Duration = Duration::from_millis(2);

/// How the stage reorders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every frame sent to the stage held this long.
    Delay(Duration),
    /// Of every frame, `share` in 100 000 held until `depth` later frames to the same
    /// destination passed it (or [`DEPTH_LIMIT`]); the others passed at once.
    Depth { share: u32, depth: u32 },
}

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
    mode: Arc<std::sync::Mutex<Mode>>,
    pub(crate) counters: Arc<StageCounters>,
    thread: Option<NsThread<std::io::Result<()>>>,
}

impl Stage {
    /// Starts the stage on `ifname` in `ns`, reordering as `mode` says.
    pub(crate) fn start(ns: &Netns, ifname: &str, mode: Mode) -> Result<Stage> {
        let stop = Arc::new(AtomicBool::new(false));
        let mode = Arc::new(std::sync::Mutex::new(mode));
        let counters = Arc::new(StageCounters::default());
        let (s, d, c) = (stop.clone(), mode.clone(), counters.clone());
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
            mode,
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

    /// Changes how frames are reordered from now on.
    pub(crate) fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
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

/// A frame the stage holds.
struct Held {
    due: Instant,
    /// Later frames to its destination still to pass it (depth mode).
    left: u32,
    frame: Vec<u8>,
}

fn run(
    sock: &PacketSocket,
    stop: &AtomicBool,
    mode: &std::sync::Mutex<Mode>,
    counters: &StageCounters,
) -> std::io::Result<()> {
    let mut held: VecDeque<Held> = VecDeque::new();
    let mut buf = vec![0u8; 65_536];
    // A fixed-seed generator: which frames are held only has to look random.
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let send = |frame: &[u8]| -> std::io::Result<()> {
        let ctr = if sock.send(frame)? {
            &counters.released
        } else {
            &counters.dropped
        };
        ctr.fetch_add(1, Ordering::Relaxed);
        Ok(())
    };
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Frames whose time is up, in the order they came (a depth-mode frame whose later
        // frames never came goes at its limit).
        let mut i = 0;
        while i < held.len() {
            if held[i].due <= now {
                if let Some(h) = held.remove(i) {
                    send(&h.frame)?;
                }
            } else {
                i += 1;
            }
        }
        let mode_now = *mode.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(n) = sock.recv(&mut buf)? {
            if held.len() >= MAX_HELD {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let frame = &buf[..n];
            match mode_now {
                Mode::Delay(delay) => held.push_back(Held {
                    due: Instant::now() + delay,
                    left: 0,
                    frame: frame.to_vec(),
                }),
                Mode::Depth { share, depth } => {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if (rng % 100_000) < u64::from(share) {
                        held.push_back(Held {
                            due: Instant::now() + DEPTH_LIMIT,
                            left: depth.max(1),
                            frame: frame.to_vec(),
                        });
                        continue;
                    }
                    send(frame)?;
                    // Every frame held for this destination has one more past it; those
                    // passed by enough follow it now.
                    let dst = frame.get(..6);
                    let mut i = 0;
                    while i < held.len() {
                        if held[i].frame.get(..6) == dst {
                            held[i].left = held[i].left.saturating_sub(1);
                            if held[i].left == 0 {
                                if let Some(h) = held.remove(i) {
                                    send(&h.frame)?;
                                }
                                continue;
                            }
                        }
                        i += 1;
                    }
                }
            }
        }
        let idle = Duration::from_millis(5);
        let wait = held
            .iter()
            .map(|h| h.due)
            .min()
            .map_or(idle, |due| due.saturating_duration_since(Instant::now()))
            .min(idle);
        if !wait.is_zero() {
            sock.wait(wait);
        }
    }
    Ok(())
}
