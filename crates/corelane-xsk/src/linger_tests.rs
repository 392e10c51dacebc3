//! Tests of `linger.rs`.

use super::*;

#[test]
fn an_xdp_links_fdinfo_names_its_interface() {
    let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2075\nlink_type:\txdp\n\
                link_id:\t9\nprog_tag:\tb0e0f5d2b0c1a3e4\nprog_id:\t40\nifindex:\t7\n";
    assert!(link_on(info, 7));
    assert!(!link_on(info, 8));
    assert!(!link_on(&info.replace("xdp", "tracing"), 7));
    assert!(!link_on("", 7));
}

#[test]
fn a_process_named_like_a_keeper_without_the_interfaces_link_is_left_alone() {
    // A process that took a keeper's name (or a reused pid): nothing links it to the
    // interface, so it lives on.
    let mut child = std::process::Command::new("bash")
        .args(["-c", &format!("exec -a {KEEPER_NAME} sleep 30")])
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .starts_with(KEEPER_NAME.as_bytes())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the impostor did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!end_keeper(pid, 1), "a process without the link was killed");
    assert!(child.try_wait().unwrap().is_none(), "it lives on");
    child.kill().unwrap();
    child.wait().unwrap();
}
