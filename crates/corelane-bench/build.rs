//! Builds the C epoll server the comparison program runs as a peer (`c/epoll_server.c`) into
//! an executable in OUT_DIR, with the C compiler the `cc` crate finds.

use std::path::PathBuf;

fn main() {
    let src = "c/epoll_server.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let exe = out.join("epoll_server");
    let compiler = cc::Build::new().opt_level(2).get_compiler();
    let status = compiler
        .to_command()
        .args(["-O2", "-Wall", "-Wextra", "-pthread", "-o"])
        .arg(&exe)
        .arg(src)
        .status()
        .expect("running the C compiler");
    assert!(status.success(), "compiling {src} failed");
}
