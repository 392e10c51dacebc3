//! Locks that outlive a panic: a thread that panicked while holding one (a core's future, a
//! job on the privileged thread) leaves the data as it was, and the runtime goes on with it.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data over from a holder that panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
