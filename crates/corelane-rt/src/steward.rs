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
//! thread (the one that built the runtime, which kept the capabilities).

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};

use corelane_xsk::{CookieParams, Steering};

use crate::Error;
use crate::cookies::CookieProgram;
use crate::lock::lock;

type Job = Box<dyn FnOnce() + Send>;

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
        done_rx.recv().map_err(|_| {
            Error::Config("the runtime's privileged thread ended during a change".into())
        })
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
}

impl Steer {
    pub(crate) fn new(steering: Steering) -> Arc<Steer> {
        Arc::new(Steer {
            steering: Mutex::new(steering),
            steward: Steward::default(),
        })
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
        self.steward.run(move || f(&mut lock(&this.steering)))
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
            .map_err(|_| Error::Config("the steward panicked".into()))?;
        assert_eq!(steward.run(thread_name)?, here, "after the cores end");
        Ok(())
    }
}
