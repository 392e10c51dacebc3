//! The one thread that keeps the runtime's privileges while it runs.
//!
//! Core and application threads parse what the wire sends and run the application's code, so
//! they hold no capability (Linux keeps capabilities per thread; each drops its own when it
//! starts). What still needs one after start goes to the steward (thread `corelane-priv`),
//! which parses nothing from the wire: the XDP program's maps (a port bound or released, an
//! address taken, the SYN cookies of a flooded listener: on kernels before 6.5 with
//! `kernel.unprivileged_bpf_disabled`, the Debian default, even a map update needs `CAP_BPF`)
//! and the multicast groups of IPv6 addresses (`CAP_NET_ADMIN`). A caller hands it a job and
//! waits for the answer; before the cores start and after they end, jobs run on the calling
//! thread (the one that built the runtime, which kept the capabilities). A port's change, made
//! for every connection a core opens and closes, stays on the core when the core's own map
//! calls work (kernels from 6.5, or a grant: see [`Steer::run_port_change`]).

use std::cell::Cell;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::host::{CookieParams, Steering};

use crate::Error;
use crate::cookies::CookieProgram;
use crate::lock::lock;

type Job = Box<dyn FnOnce() + Send>;

thread_local! {
    /// Whether the calling thread's own calls on the program's maps work (None: not asked).
    static MAPS_HERE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Where privileged jobs go while the cores run.
#[derive(Default)]
pub(crate) struct Steward {
    tx: Mutex<Option<Sender<Job>>>,
}

impl Steward {
    /// Starts taking jobs; the returned receiver is the steward thread's to [`serve`].
    pub(crate) fn open(&self) -> Receiver<Job> {
        let (tx, rx) = mpsc::channel();
        *lock(&self.tx) = Some(tx);
        rx
    }

    /// Stops taking jobs: the steward thread ends once it has run those already queued, and
    /// jobs from now on run on their caller's thread.
    pub(crate) fn close(&self) {
        lock(&self.tx).take();
    }

    /// Runs `f` on the steward thread while it serves, else here, and returns its result.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = done_tx.send(f());
        });
        let tx = lock(&self.tx).clone();
        match tx {
            Some(tx) => {
                if let Err(mpsc::SendError(job)) = tx.send(job) {
                    job();
                }
            }
            None => job(),
        }
        done_rx
            .recv()
            .map_err(|_| Error::Ended("its privileged thread ended during a change".into()))
    }

    /// Runs `f` on the calling thread when `works_here` says the thread can do the job itself
    /// (asked once per thread, the answer kept), else as [`Steward::run`].
    pub(crate) fn run_here_if<T: Send + 'static>(
        &self,
        works_here: impl FnOnce() -> bool,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        let here = MAPS_HERE.with(|h| {
            h.get().unwrap_or_else(|| {
                let v = works_here();
                h.set(Some(v));
                v
            })
        });
        if here { Ok(f()) } else { self.run(f) }
    }
}

/// The steward thread's loop: each job in turn until the runtime closes the steward.
pub(crate) fn serve(jobs: Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        // A job that panics answers nothing (its caller gets an error); the steward goes on.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

/// The steering program and the thread that changes it: what the cores and the handles
/// reach the program through.
pub(crate) struct Steer {
    steering: Mutex<Steering>,
    steward: Steward,
    /// Whether an address is shared with the kernel, as of the last change: read every turn
    /// without the lock.
    shared: std::sync::atomic::AtomicBool,
}

impl Steer {
    pub(crate) fn new(steering: Steering) -> Arc<Steer> {
        let shared = std::sync::atomic::AtomicBool::new(steering.has_shared());
        Arc::new(Steer {
            steering: Mutex::new(steering),
            steward: Steward::default(),
            shared,
        })
    }

    /// Whether an address is shared with the kernel (one atomic load; no lock).
    pub(crate) fn has_shared(&self) -> bool {
        self.shared.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The program, to read (changes go through [`Steer::run`]).
    pub(crate) fn read(&self) -> MutexGuard<'_, Steering> {
        lock(&self.steering)
    }

    /// Runs `f` on the steering program with the runtime's privileges (see the module).
    pub(crate) fn run<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Steering) -> T + Send + 'static,
    ) -> Result<T, Error> {
        let this = Arc::clone(self);
        self.steward.run(move || {
            let mut s = lock(&this.steering);
            let out = f(&mut s);
            this.shared
                .store(s.has_shared(), std::sync::atomic::Ordering::Release);
            out
        })
    }

    /// Runs a change of the program's port maps (a port bound or released, once per
    /// connection a core opens and closes): on the calling thread when its own calls on the
    /// maps work, else as [`Steer::run`]. A kernel from 6.5 checks no capability to use a map
    /// whose descriptor is already open, and a grant's changes are requests to the broker; on
    /// older kernels with unprivileged BPF disabled every bpf() call needs `CAP_BPF`, which a
    /// core thread does not have, so there the change waits for the steward. (A round trip to
    /// the steward per connection opened and per connection closed held corelane's connection
    /// rate with corelane on both ends to 30k/s from 79k/s.)
    ///
    /// `binds`: the change may bind this port in the kernel (a shared address's placeholder),
    /// which below 1024 needs `CAP_NET_BIND_SERVICE`: the steward's, never a core's.
    pub(crate) fn run_port_change<T: Send + 'static>(
        self: &Arc<Self>,
        binds: Option<u16>,
        f: impl FnOnce(&mut Steering) -> T + Send + 'static,
    ) -> Result<T, Error> {
        let this = Arc::clone(self);
        self.steward.run_here_if(
            || {
                let s = self.read();
                let privileged = binds.is_some_and(|p| p < 1024) && s.has_shared();
                !privileged && s.counters().is_ok()
            },
            move || f(&mut lock(&this.steering)),
        )
    }

    /// The steward, to open while the cores run and close after.
    pub(crate) fn steward(&self) -> &Steward {
        &self.steward
    }
}

impl CookieProgram for Arc<Steer> {
    fn answered(&self) -> Option<u64> {
        self.run(|s| s.counters().map(|c| c.syn_cookies).ok())
            .ok()
            .flatten()
    }

    fn set_params(&self, p: CookieParams) -> Result<(), String> {
        let set = self.run(move |s| match s.set_cookie_params(&p) {
            Ok(true) => Ok(()),
            Ok(false) => Err("the program is the grant broker's".to_string()),
            Err(e) => Err(e.to_string()),
        });
        set.map_err(|e| e.to_string()).and_then(|r| r)
    }

    fn set_port(&self, port: u16, on: bool) -> bool {
        matches!(self.run(move |s| s.set_syn_cookies(port, on)), Ok(Ok(true)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_name() -> String {
        std::thread::current().name().unwrap_or("").to_string()
    }

    #[test]
    fn jobs_run_on_the_steward_while_it_serves_and_here_otherwise() -> Result<(), Error> {
        let steward = Arc::new(Steward::default());
        let here = thread_name();
        assert_eq!(steward.run(thread_name)?, here, "before the cores start");

        let jobs = steward.open();
        let served = std::thread::Builder::new()
            .name("steward-test".into())
            .spawn(move || serve(jobs))
            .map_err(Error::Io)?;
        assert_eq!(steward.run(thread_name)?, "steward-test");
        // A job that panics answers with an error; the steward goes on.
        let panicked = steward.run(|| -> u32 { panic!("a map update went wrong") });
        assert!(panicked.is_err());
        assert_eq!(steward.run(|| 7)?, 7);

        steward.close();
        served
            .join()
            .map_err(|_| Error::Internal("the steward panicked".into()))?;
        assert_eq!(steward.run(thread_name)?, here, "after the cores end");
        Ok(())
    }

    #[test]
    fn a_change_runs_where_the_thread_can_make_it_and_the_thread_is_asked_once() -> Result<(), Error>
    {
        let steward = Arc::new(Steward::default());
        let jobs = steward.open();
        let served = std::thread::Builder::new()
            .name("steward-test".into())
            .spawn(move || serve(jobs))
            .map_err(Error::Io)?;
        // A thread whose own map calls work makes its changes itself, asked once.
        let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let on = |name: &str, works: bool| {
            let (steward, asked) = (steward.clone(), asked.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || -> Result<Vec<String>, Error> {
                    let probe = || {
                        asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        works
                    };
                    let first = steward.run_here_if(probe, thread_name)?;
                    let second = steward.run_here_if(probe, thread_name)?;
                    Ok(vec![first, second])
                })
                .map_err(Error::Io)?
                .join()
                .map_err(|_| Error::Internal("a test thread panicked".into()))?
        };
        assert_eq!(on("core-able", true)?, ["core-able", "core-able"]);
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 1);
        // One whose calls are refused hands them to the steward.
        assert_eq!(on("core-refused", false)?, ["steward-test", "steward-test"]);
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 2);
        steward.close();
        served
            .join()
            .map_err(|_| Error::Internal("the steward panicked".into()))?;
        Ok(())
    }
}
