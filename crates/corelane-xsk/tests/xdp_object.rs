//! The committed XDP object matches its source, and its maps and program are what the loader
//! expects.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn xdp_committed_object_is_rebuilt_identically_from_source() {
    let have_clang = Command::new("clang").arg("--version").output().is_ok();
    if !have_clang {
        let msg = "xdp_object: clang is not installed (apt-get install clang llvm libbpf-dev)";
        if std::env::var_os("CI").is_some() {
            panic!("{msg}; CI must check the committed object");
        }
        eprintln!("\n*** SKIPPED {msg} ***\n");
        return;
    }
    let out = std::env::temp_dir().join(format!("corelane-xdp-{}.o", std::process::id()));
    let status = Command::new("bash")
        .arg(repo().join("crates/corelane-xsk/xdp/build.sh"))
        .arg(&out)
        .status()
        .expect("run crates/corelane-xsk/xdp/build.sh");
    assert!(status.success(), "crates/corelane-xsk/xdp/build.sh failed");
    let rebuilt = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(
        rebuilt == corelane_xsk::XDP_OBJECT,
        "crates/corelane-xsk/xdp/corelane.bpf.o is stale: run crates/corelane-xsk/xdp/build.sh and commit the object"
    );
}

#[test]
fn xdp_object_has_the_program_and_maps_the_loader_takes() {
    let obj = aya_obj::Object::parse(corelane_xsk::XDP_OBJECT).expect("the object parses");
    assert!(
        obj.programs.contains_key(corelane_xsk::PROGRAM),
        "program {} missing; it has {:?}",
        corelane_xsk::PROGRAM,
        obj.programs.keys().collect::<Vec<_>>()
    );
    for (name, entries) in corelane_xsk::MAPS {
        let map = obj
            .maps
            .get(name)
            .unwrap_or_else(|| panic!("map {name} missing from the XDP object"));
        assert_eq!(
            map.max_entries(),
            entries,
            "map {name}: the C program and corelane-xsk disagree on its size"
        );
    }
    // Keys and values as the loader reads them.
    let size = |name: &str| {
        let m = &obj.maps[name];
        (m.key_size(), m.value_size())
    };
    assert_eq!(size("owned_v4"), (4, 1));
    assert_eq!(size("owned_v6"), (16, 1));
    assert_eq!(size("stats"), (4, 8));
    assert_eq!(size("xsks"), (4, 4));
    // struct upgrade_cfg, and struct flow_key -> generation (steering/upgrade.rs `flow_key`).
    assert_eq!(size("upgrade"), (4, 8));
    assert_eq!(size("old_flows"), (20, 4));
    assert_eq!(
        size("cookie_cfg"),
        (4, std::mem::size_of::<corelane_xsk::CookieParams>() as u32),
        "struct cookie_cfg and CookieParams differ"
    );
    assert_eq!(
        obj.maps.len(),
        corelane_xsk::MAPS.len(),
        "a map the loader does not know"
    );
}
