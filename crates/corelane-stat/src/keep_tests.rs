//! The restart key in its directory: made once, agreed on, refused when unsafe.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::{RESTART_KEY_FILE, restart_key};

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("corelane-keep-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).expect("scratch dir");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).expect("mode");
    d
}

#[test]
fn the_key_is_made_once_and_read_back_by_every_later_caller() {
    let d = scratch("once");
    let a = restart_key(&d).expect("made");
    let b = restart_key(&d).expect("read back");
    assert_eq!(a, b);
    assert_ne!(a, [0, 0]);
    let m = std::fs::metadata(d.join(RESTART_KEY_FILE)).expect("file");
    assert_eq!(m.mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::read_dir(&d).expect("dir").count(),
        1,
        "no temporary left"
    );
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let d = d.clone();
            std::thread::spawn(move || restart_key(&d).expect("concurrent"))
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().expect("thread"), a);
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn many_first_callers_at_once_agree_on_one_key() {
    let d = scratch("race");
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let d = d.clone();
            std::thread::spawn(move || restart_key(&d).expect("concurrent"))
        })
        .collect();
    let keys: Vec<_> = threads.into_iter().map(|t| t.join().expect("t")).collect();
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:x?}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_key_others_can_read_a_short_one_or_a_link_is_refused() {
    let d = scratch("refused");
    let path = d.join(RESTART_KEY_FILE);
    std::fs::write(&path, [7u8; 16]).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("mode");
    let e = restart_key(&d).expect_err("readable by others");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("mode");
    assert_eq!(
        restart_key(&d).expect("now private"),
        [u64::from_le_bytes([7; 8]); 2]
    );
    std::fs::write(&path, [7u8; 15]).expect("short");
    let e = restart_key(&d).expect_err("short");
    assert!(e.to_string().contains("15 bytes"), "{e}");
    std::fs::remove_file(&path).expect("rm");
    std::os::unix::fs::symlink("/etc/passwd", &path).expect("link");
    let e = restart_key(&d).expect_err("a link");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
