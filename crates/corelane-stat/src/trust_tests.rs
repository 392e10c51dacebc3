//! Tests of `trust.rs`.

use super::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("corelane-trust-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn owners_and_modes_are_judged_as_the_rules_say() {
    assert!(safe_owner_and_mode(0, 0o40755, 1000).is_ok());
    assert!(safe_owner_and_mode(1000, 0o40700, 1000).is_ok());
    // /tmp: root's, sticky, world-writable.
    assert!(safe_owner_and_mode(0, 0o41777, 1000).is_ok());
    // Another user's directory, even a private one.
    assert!(safe_owner_and_mode(1001, 0o40700, 1000).is_err());
    // A user's directory as root sees it.
    assert!(safe_owner_and_mode(1000, 0o40755, 0).is_err());
    // Group- or world-writable without the sticky bit, or sticky but not root's.
    assert!(safe_owner_and_mode(0, 0o40775, 0).is_err());
    assert!(safe_owner_and_mode(0, 0o40757, 0).is_err());
    assert!(safe_owner_and_mode(1000, 0o41777, 1000).is_err());
}

#[test]
fn a_directory_of_this_user_is_trusted_and_one_made_writable_by_others_is_not() {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch("mode");
    make_dir(&d.join("a/b")).unwrap();
    check_dir(&d.join("a/b")).unwrap();
    std::fs::set_permissions(d.join("a"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = check_dir(&d.join("a/b")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("writable by others"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_directory_reached_through_a_link_is_checked_where_it_leads() {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch("link");
    make_dir(&d.join("real")).unwrap();
    std::os::unix::fs::symlink(d.join("real"), d.join("via")).unwrap();
    check_dir(&d.join("via")).unwrap();
    std::fs::set_permissions(d.join("real"), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(check_dir(&d.join("via")).is_err());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_link_or_a_second_name_in_place_of_a_file_is_refused() {
    let d = scratch("file");
    make_dir(&d).unwrap();
    let target = d.join("target");
    std::fs::write(&target, b"precious").unwrap();
    std::os::unix::fs::symlink(&target, d.join("owner")).unwrap();
    let e = open_file(&d.join("owner"), true, Some(0o644)).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    std::fs::hard_link(&target, d.join("hard")).unwrap();
    let e = open_file(&d.join("hard"), true, None).unwrap_err();
    assert!(e.to_string().contains("hard link"), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    // A directory, a fifo: not regular files (the fifo's open does not block).
    assert!(open_file(&d, false, None).is_err());
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(open_file(&fifo, false, None).is_err());
    // A fresh file is made and opened.
    open_file(&d.join("fresh"), true, Some(0o600)).unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}
