//! A file mapped shared, seen as words every process may load and store atomically.

#![allow(unsafe_code)] // mmap(2): the one place this crate needs it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::AtomicU64;

/// A shared mapping of a whole file, as `AtomicU64` words.
///
/// Every access goes through atomics, so another process writing the same file at the same time
/// is no data race; any bit pattern is a valid `u64`, and the mapping is page-aligned.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut AtomicU64,
    words: usize,
    writable: bool,
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
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no slice outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.words * 8) };
    }
}
