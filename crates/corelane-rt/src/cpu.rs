//! What the runtime asks of the CPUs: which it may use, pinning, a thread's CPU time, and the
//! L2 size each core's batch is sized for.

#![allow(unsafe_code)] // Affinity and thread clocks are libc calls.

use std::time::Duration;

use crate::Error;

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; `set` is valid for writes of its size.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return vec![0];
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE and `set` is initialised.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Lets the calling thread run on `cpus` (an empty list changes nothing).
pub(crate) fn set_allowed(cpus: &[usize]) -> Result<(), Error> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE and `set` is initialised.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 is this thread; `set` is a valid set of its size, read by the call.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(Error::Os {
            what: format!("letting a thread run on CPUs {cpus:?}"),
            source: std::io::Error::last_os_error(),
        })
    }
}

pub(crate) fn pin(cpu: usize) -> Result<(), Error> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        Ok(())
    } else {
        Err(Error::Os {
            what: format!("pinning a thread to CPU {cpu}"),
            source: std::io::Error::other("the OS refused the affinity"),
        })
    }
}

/// CPU time the calling thread has used.
pub(crate) fn thread_cpu_time() -> Duration {
    // SAFETY: timespec is plain data; all-zero is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is valid for writes; the clock id is a constant the kernel knows.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The L2 cache size of `cpu` in bytes, from sysfs (None when it cannot be read).
pub fn l2_bytes(cpu: usize) -> Option<usize> {
    (0..8).find_map(|i| {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cache/index{i}");
        let level = std::fs::read_to_string(format!("{dir}/level")).ok()?;
        if level.trim() != "2" {
            return None;
        }
        parse_size(std::fs::read_to_string(format!("{dir}/size")).ok()?.trim())
    })
}

fn parse_size(s: &str) -> Option<usize> {
    let (n, mult) = if let Some(n) = s.strip_suffix('K') {
        (n, 1 << 10)
    } else if let Some(n) = s.strip_suffix('M') {
        (n, 1 << 20)
    } else {
        (s, 1)
    };
    n.parse::<usize>().ok().map(|n| n * mult)
}

/// Gives the allocator's free pages back to the system (glibc keeps freed memory that is not
/// at the top of a heap: after a load, the connection buffers freed in the middle stay resident
/// until this). A no-op elsewhere.
pub(crate) fn give_back_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes a byte count and touches only the allocator's own state, under
    // its locks; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("1024K"), Some(1 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("big"), None);
    }

    #[test]
    fn this_process_may_run_somewhere() {
        assert!(!allowed_cpus().is_empty());
    }
}
