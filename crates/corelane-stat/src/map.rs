//! A file mapped shared, seen as words every process may load and store atomically.
//!
//! The file's writer may shrink it under a reader (a granted server's user holds a writable
//! descriptor to the stats file root's `corelane-stat` maps): a load past the new end would
//! raise SIGBUS and end the reader. A SIGBUS handler, installed with the first mapping, puts
//! zero pages over the rest of a mapping it hits, notes it ([`Mapping::shrunk`]), and lets the
//! load go on; a SIGBUS anywhere else goes to the handler that was there before (by default,
//! the end of the process).

#![allow(unsafe_code)] // mmap(2): the one place this crate needs it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Mappings a SIGBUS may hit, watched at once (more are mapped unwatched).
const SLOTS: usize = 64;
const PAGE: usize = 4096;
/// Each watched mapping's start (0: a free slot) and length, and whether it shrank.
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static SHRUNK: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
static INSTALL: Once = Once::new();
/// The SIGBUS handler before ours, for the faults that are not a shrunk file's.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// SIGBUS: on a watched mapping, zero pages over the rest of it; elsewhere, the previous
/// handler's business. Only atomics and system calls here.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; a SIGBUS one carries
    // the faulting address and why.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    for i in (0..SLOTS).filter(|_| is_past_the_end(code)) {
        let start = STARTS[i].load(Ordering::Acquire);
        let len = LENS[i].load(Ordering::Acquire);
        if start != 0 && addr >= start && addr < start + len {
            let page = addr & !(PAGE - 1);
            let end = (start + len).next_multiple_of(PAGE);
            // SAFETY: replaces pages of our own mapping (from the faulting page to its end)
            // with private zero pages at the same addresses; the mapping stays ours and is
            // unmapped whole in Drop. mmap is a plain system call, safe in a handler.
            let put = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    end - page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            // Not put there (out of memory): returning would fault again at once, for ever.
            if put == page as *mut libc::c_void {
                SHRUNK[i].store(true, Ordering::Release);
                return;
            }
            break;
        }
    }
    match PREVIOUS.get() {
        Some(prev) if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN => {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO: this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain handler: this signature.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: back to the default action, then the signal again: the process ends as
            // it would have without this handler.
            unsafe {
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
                libc::raise(libc::SIGBUS);
            }
        }
    }
}

/// Whether a SIGBUS of code `code` is an access past the end of a mapped file (`BUS_ADRERR`), the
/// one a shrunk file raises; a hardware memory error (`BUS_MCEERR_AR`, `BUS_MCEERR_AO`) or a
/// misaligned access is never taken for one, and goes to the handler before this one.
fn is_past_the_end(code: libc::c_int) -> bool {
    code == libc::BUS_ADRERR
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sigaction with a zeroed struct filled in here; the old action is kept for
        // faults that are not ours.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            // SA_ONSTACK: on a thread with an alternate signal stack (Rust gives each one for
            // its stack-overflow report), the handler runs there.
            new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &new, &mut old) == 0 {
                let _ = PREVIOUS.set(old);
            }
        }
    });
}

/// Watches `len` bytes at `start`; the slot, or None when every slot is taken.
fn watch(start: usize, len: usize) -> Option<usize> {
    install();
    (0..SLOTS).find(|&i| {
        if STARTS[i].load(Ordering::Acquire) != 0 {
            return false;
        }
        LENS[i].store(len, Ordering::Release);
        SHRUNK[i].store(false, Ordering::Release);
        STARTS[i]
            .compare_exchange(0, start, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    })
}

/// A shared mapping of a whole file, as `AtomicU64` words.
///
/// Every access goes through atomics, so another process writing the same file at the same time
/// is no data race; any bit pattern is a valid `u64`, and the mapping is page-aligned.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut AtomicU64,
    words: usize,
    writable: bool,
    /// Its slot among the mappings the SIGBUS handler watches.
    slot: Option<usize>,
}

// SAFETY: the mapping is only reached through `&[AtomicU64]`, which is Sync; the pointer is
// owned and unmapped once, in Drop.
unsafe impl Send for Mapping {}
// SAFETY: as above: shared access is atomic.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Sizes and maps `file`, opened for reading and writing by whoever made it.
    ///
    /// # Errors
    /// The file cannot be sized or mapped.
    pub(crate) fn create_in(file: &File, words: usize) -> io::Result<Mapping> {
        file.set_len((words * 8) as u64)?;
        Mapping::map(file, words, true)
    }

    /// Maps an existing file: read-write when this user may write it, read-only otherwise.
    ///
    /// # Errors
    /// The file cannot be opened or mapped, or is smaller than one page.
    pub(crate) fn open(path: &Path) -> io::Result<Mapping> {
        // Never through a link, and only a regular file with one name: the file is in a
        // directory its runtime's user may write, and root reads it (`trust.rs`).
        let (file, writable) = match crate::trust::open_file(path, true, None) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_some() => {
                (crate::trust::open_file(path, false, None)?, false)
            }
            Err(e) => return Err(e),
        };
        // A broker's pointer leads to the sealed file it made (`sealed.rs`).
        let file = crate::sealed::follow(file, path, writable)?;
        let len = file.metadata()?.len();
        if len < 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: {len} bytes, too short for a stats file",
                    path.display()
                ),
            ));
        }
        Mapping::map(&file, (len / 8) as usize, writable)
    }

    fn map(file: &File, words: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of an open file of at least `words * 8` bytes; the
        // kernel picks the address. The result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                words * 8,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: p.cast(),
            words,
            writable,
            slot: watch(p as usize, words * 8),
        })
    }

    /// The words. Stores through a read-only mapping would fault: only the writing side (and
    /// a reader that found the file writable) stores, and [`writable`](Self::writable) says.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is a live, page-aligned mapping of `words` u64s, valid until Drop;
        // AtomicU64 has the size and alignment of u64, and shared mutation through it is
        // atomic.
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }

    /// Whether this mapping may be stored to.
    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// Whether the file shrank under this mapping: the words past its new end read zero from
    /// then on (and stores to them reach no one).
    pub(crate) fn shrunk(&self) -> bool {
        self.slot.is_some_and(|i| SHRUNK[i].load(Ordering::Acquire))
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            STARTS[i].store(0, Ordering::Release);
        }
        // SAFETY: the mapping made in `map`, unmapped once; no slice outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.words * 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_truncated_under_its_reader_reads_zero_instead_of_ending_it() -> io::Result<()> {
        let dir = std::env::temp_dir().join(format!("corelane-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("stats");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let writer = Mapping::create_in(&file, 4096)?;
        writer.words()[10].store(5, Ordering::Relaxed);
        writer.words()[3000].store(7, Ordering::Relaxed);
        let reader = Mapping::open(&path)?;
        assert_eq!(reader.words()[3000].load(Ordering::Relaxed), 7);
        assert!(!reader.shrunk());
        // The writer's user shrinks it to one page: the words past it are gone.
        file.set_len(4096)?;
        assert_eq!(
            reader.words()[10].load(Ordering::Relaxed),
            5,
            "the first page stays"
        );
        assert_eq!(
            reader.words()[3000].load(Ordering::Relaxed),
            0,
            "read, not a SIGBUS"
        );
        assert!(reader.shrunk(), "and the reader knows");
        drop(reader);
        drop(writer);
        std::fs::remove_dir_all(&dir)
    }
}

#[cfg(test)]
#[test]
fn only_an_access_past_a_file_s_end_is_taken_for_a_shrunk_file() {
    assert!(is_past_the_end(libc::BUS_ADRERR));
    for other in [
        libc::BUS_MCEERR_AR,
        libc::BUS_MCEERR_AO,
        libc::BUS_ADRALN,
        libc::BUS_OBJERR,
    ] {
        assert!(!is_past_the_end(other), "{other}");
    }
}
