//! Sealed files and their pointers.

use super::*;
use crate::trust::open_file;
use std::os::unix::fs::FileExt;

fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("corelane-sealed-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_sealed_file_can_be_written_but_never_resized() {
    let f = sealed_file("stats", 8192).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 8192);
    f.write_all_at(&[7; 16], 100).unwrap();
    // The size it has is accepted again (a server's `set_len` to its layout's size).
    f.set_len(8192).unwrap();
    let grow = f.set_len(1 << 30).unwrap_err();
    assert_eq!(grow.raw_os_error(), Some(libc::EPERM), "{grow}");
    let shrink = f.set_len(0).unwrap_err();
    assert_eq!(shrink.raw_os_error(), Some(libc::EPERM), "{shrink}");
    // Writing past the end would grow it: refused too.
    assert!(f.write_all_at(&[1; 4096], 8192).is_err());
    assert_eq!(f.metadata().unwrap().len(), 8192);
}

#[test]
fn a_size_past_the_cap_or_zero_is_refused_naming_the_cap() {
    for bytes in [0, SEALED_MAX_BYTES + 1, u64::MAX] {
        let e = sealed_file("capture", bytes).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains(&SEALED_MAX_BYTES.to_string()), "{e}");
    }
}

#[test]
fn a_pointer_leads_to_the_sealed_file_and_a_reader_maps_it() {
    let d = dir("follow");
    let f = sealed_file("stats", 4096).unwrap();
    f.write_all_at(b"corelane", 0).unwrap();
    let path = d.join("stats");
    write_pointer(&path, &f, 0o644).unwrap();
    let opened = follow(open_file(&path, false, None).unwrap(), &path, false).unwrap();
    let mut word = [0u8; 8];
    opened.read_exact_at(&mut word, 0).unwrap();
    assert_eq!(&word, b"corelane");
    // A plain file is itself.
    let plain = d.join("plain");
    std::fs::write(&plain, vec![0u8; 4096]).unwrap();
    let same = follow(open_file(&plain, false, None).unwrap(), &plain, false).unwrap();
    assert_eq!(same.metadata().unwrap().len(), 4096);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_pointer_to_another_file_or_an_unsealed_one_is_refused() {
    let d = dir("refuse");
    // Names a descriptor of this process that is not the file named (its broker is gone and
    // the number reused).
    let f = sealed_file("stats", 4096).unwrap();
    let other = std::fs::File::open("/proc/self/status").unwrap();
    let m = f.metadata().unwrap();
    let path = d.join("stats");
    std::fs::write(
        &path,
        format!(
            "corelane-sealed {} {} {} {}\n",
            std::process::id(),
            other.as_raw_fd(),
            m.dev(),
            m.ino()
        ),
    )
    .unwrap();
    let e = follow(open_file(&path, false, None).unwrap(), &path, false).unwrap_err();
    assert!(
        e.to_string().contains("not the file the pointer names"),
        "{e}"
    );
    // A file of this process that is not sealed: a pointer cannot make a reader map any
    // descriptor a process holds.
    let unsealed = std::fs::File::open(&path).unwrap();
    write_pointer(&d.join("capture"), &unsealed, 0o600).unwrap();
    let cap = d.join("capture");
    let e = follow(open_file(&cap, false, None).unwrap(), &cap, false).unwrap_err();
    assert!(e.to_string().contains("not sealed"), "{e}");
    // Malformed.
    std::fs::write(&path, "corelane-sealed 1 x 2 3\n").unwrap();
    let e = follow(open_file(&path, false, None).unwrap(), &path, false).unwrap_err();
    assert!(e.to_string().contains("malformed"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_pointer_owned_by_another_user_than_its_process_is_refused() {
    // SAFETY: geteuid(2) cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // Giving a file away needs root; CI runs this as root.
        assert!(
            std::env::var_os("CORELANE_STRICT").is_none(),
            "needs root under CORELANE_STRICT"
        );
        return;
    }
    let d = dir("owner");
    let f = sealed_file("stats", 4096).unwrap();
    let path = d.join("stats");
    write_pointer(&path, &f, 0o644).unwrap();
    // A user wrote it, naming root's process: it could point root at any of root's files.
    std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
    let e = follow(open_file(&path, false, None).unwrap(), &path, false).unwrap_err();
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A pointer naming a FIFO a process holds (for reading, with no writer): root's reader copies
/// the descriptor and refuses it at once, where it opened `/proc/PID/fd/N` anew and waited for
/// a writer for ever.
#[test]
fn a_pointer_to_a_fifo_is_refused_without_waiting_on_it() {
    let d = dir("fifo");
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let m = held.metadata().unwrap();
    let path = d.join("stats");
    std::fs::write(
        &path,
        format!(
            "corelane-sealed {} {} {} {}\n",
            std::process::id(),
            held.as_raw_fd(),
            m.dev(),
            m.ino()
        ),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let r = follow(open_file(&p, false, None).unwrap(), &p, false).map(drop);
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the reader waited on the FIFO");
    let e = got.expect_err("a FIFO taken for a sealed file");
    assert!(e.contains("not the file the pointer names"), "{e}");
    drop(held);
    let _ = std::fs::remove_dir_all(&d);
}
