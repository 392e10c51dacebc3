//! A core's executor, and how the driver runs on it.

use std::future::Future;

use tokio::runtime::{LocalOptions, LocalRuntime};

/// A core's executor: tokio's current-thread scheduler as a [`LocalRuntime`], which runs
/// `spawn_local` tasks itself. A task woken while the thread is parked in the executor (by the
/// I/O driver: the core's queue, its doorbell; or by a timer) goes straight onto the run queue.
/// A `LocalSet`'s task woken there (outside the set's own poll) went onto the set's shared
/// queue under a mutex and woke the `block_on` future, an eventfd write and one more
/// `epoll_wait` before it ran: every sleeping core's wake-up paid it.
pub(crate) fn executor() -> std::io::Result<LocalRuntime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build_local(LocalOptions::default())
}

/// Runs `fut` as a task of `exec` until it ends, for the same reason (the future `block_on`
/// polls is woken through the eventfd); a panic in it goes on unwinding here.
pub(crate) fn run_task<T: 'static>(
    exec: &LocalRuntime,
    fut: impl Future<Output = T> + 'static,
) -> T {
    match exec.block_on(exec.spawn_local(fut)) {
        Ok(v) => v,
        Err(e) => match e.try_into_panic() {
            Ok(p) => std::panic::resume_unwind(p),
            Err(e) => panic!("the core's driver was cancelled: {e}"),
        },
    }
}
