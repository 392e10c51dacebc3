//! The run directory forgets network namespaces that are gone: a runtime's start removes the
//! records (`net-COOKIE/IFNAME/owner`) of namespaces that no longer exist, since their
//! interfaces went with them and nothing will claim there again; it keeps those of live
//! namespaces (a dead owner's record there is the next claim's to undo), those a live process
//! holds, and those changed in the last minute. Before, they piled up (77 on one machine).
//!
//! One test in its own binary: it points `CORELANE_RUN_DIR` at a directory of its own.

mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use common::{net, serve_on};
use corelane_testnet::require_root;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The id of a fresh network namespace made by a thread that ends at once: the namespace is
/// gone when this returns.
fn gone_namespace() -> Result<String> {
    let id = std::thread::spawn(|| -> std::io::Result<String> {
        // SAFETY: unshare(2) with a constant flag; it changes this thread only, which ends.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        corelane_stat::netns_id()
    })
    .join()
    .map_err(|_| "the thread panicked")??;
    Ok(id)
}

/// A dead owner's record of `veth0` under `run/ns`, last changed `age` ago.
fn record(run: &Path, ns: &str, age: Duration) -> Result {
    let dir = run.join(ns).join("veth0");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("owner"), "pid 999999\nifindex 5\nlinger 999998\n")?;
    let then = SystemTime::now() - age;
    for p in [dir.join("owner"), dir.clone(), run.join(ns)] {
        std::fs::File::open(&p)?.set_modified(then)?;
    }
    Ok(())
}

#[test]
fn a_start_removes_the_records_of_namespaces_that_are_gone() -> Result {
    if !require_root("the run directory's old namespaces") {
        return Ok(());
    }
    let run = Path::new(env!("CARGO_TARGET_TMPDIR")).join("run-dir-gone");
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run)?;
    // SAFETY: the only test of this binary, before any thread reads the environment.
    unsafe { std::env::set_var("CORELANE_RUN_DIR", &run) };
    let hour = Duration::from_secs(3600);
    // Two namespaces gone; one of them changed a moment ago (a claim may be under way).
    let (gone, fresh) = (gone_namespace()?, gone_namespace()?);
    record(&run, &gone, hour)?;
    record(&run, &fresh, Duration::ZERO)?;
    // A namespace alive (a thread is in it) whose owner died: its record stays to be undone.
    let (tx, rx) = mpsc::channel::<()>();
    let (id_tx, id_rx) = mpsc::channel();
    let keeper = std::thread::spawn(move || {
        // SAFETY: unshare(2) with a constant flag; it changes this thread only.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0 {
            let _ = id_tx.send(corelane_stat::netns_id().ok());
        } else {
            let _ = id_tx.send(None);
        }
        let _ = rx.recv();
    });
    let alive = id_rx.recv()?.ok_or("unshare")?;
    record(&run, &alive, hour)?;
    // A runtime starts (it claims an interface in the run directory).
    let net = net(1);
    let served = serve_on(&net, |b| b.cores(1), |_| async {})?;
    served.stop.stop();
    served.thread.join()??;
    let left: Vec<String> = std::fs::read_dir(&run)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !run.join(&gone).exists(),
        "{gone} is gone but its record stayed: {left:?}"
    );
    assert!(
        run.join(&fresh).exists(),
        "{fresh} changed just now: {left:?}"
    );
    assert!(
        run.join(&alive).join("veth0/owner").exists(),
        "{alive} is alive: its dead owner's record is the next claim's: {left:?}"
    );
    drop(tx);
    keeper.join().map_err(|_| "the keeper panicked")?;
    let _ = std::fs::remove_dir_all(&run);
    Ok(())
}
