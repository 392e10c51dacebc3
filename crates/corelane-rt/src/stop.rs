//! Stopping a running runtime: a handle for any thread, and Ctrl-C / SIGTERM.

use std::sync::{Arc, Mutex, Weak};

use crate::launch::Shared;

static CTRL_C: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
static CTRL_C_INSTALLED: std::sync::Once = std::sync::Once::new();

pub(crate) fn stop_on_ctrl_c(shared: &Arc<Shared>) {
    CTRL_C
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Arc::downgrade(shared));
    CTRL_C_INSTALLED.call_once(|| {
        let r = ctrlc::set_handler(|| {
            for s in CTRL_C.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                if let Some(s) = s.upgrade() {
                    s.stop_all();
                }
            }
        });
        if let Err(e) = r {
            log::warn!("Ctrl-C will not stop the runtime: {e} (use StopHandle instead)");
        }
    });
}

/// Stops a running [`Runtime`](crate::Runtime) from any thread: every core resets its connections and ends.
#[derive(Clone)]
pub struct StopHandle(pub(crate) Arc<Shared>);

impl std::fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopHandle").finish_non_exhaustive()
    }
}

impl StopHandle {
    /// Asks every core to stop.
    pub fn stop(&self) {
        self.0.stop_all();
    }
}
