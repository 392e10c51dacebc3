//! Placement on the real runtime: a split lane runs the application on its own pinned CPU,
//! queues are raised to the cores asked for and restored, and the `topology` example explains.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use corelane::net::TcpListener;
use corelane::{Placement, Runtime};
use corelane_testnet::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn this_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).expect("sched_getcpu")
}

#[test]
fn runtime_placement_shared_cache_runs_the_application_on_its_own_cpu() {
    if !require_root("runtime_placement_split") {
        return;
    }
    assert!(
        corelane::allowed_cpus().len() >= 2,
        "a split lane needs two CPUs; this process may use {:?}",
        corelane::allowed_cpus()
    );
    let net = net(1);
    let ifname = net.server_if().to_string();
    // Where the application's tasks ran, and what they saw.
    let app_cpus = Arc::new(std::sync::Mutex::new(Vec::new()));
    let served = Arc::new(AtomicUsize::new(0));
    let (cpus, srv) = (app_cpus.clone(), served.clone());
    let server = net
        .server_ns()
        .spawn(move || {
            let rt = Runtime::builder(&ifname)
                .addr("10.77.0.3/24")
                .placement(Placement::SharedCache)
                .build()
                .expect("runtime");
            let plan = rt.plan().clone();
            let report = rt
                .run(move |core| {
                    let (cpus, srv) = (cpus.clone(), srv.clone());
                    async move {
                        cpus.lock()
                            .unwrap()
                            .push((core.cpu, core.app_cpu, this_cpu()));
                        let l = TcpListener::bind(7).await.expect("port 7");
                        for _ in 0..20 {
                            let (mut s, _) = l.accept().await.expect("accept");
                            cpus.lock()
                                .unwrap()
                                .push((core.cpu, core.app_cpu, this_cpu()));
                            let mut buf = vec![0; 8192];
                            while let Ok(n @ 1..) = s.read(&mut buf).await {
                                s.write_all(&buf[..n]).await.expect("write");
                            }
                            srv.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
                .expect("run");
            (plan, report)
        })
        .expect("server thread");
    for i in 0..20 {
        assert_echoes(
            &net,
            format!("{SERVER_V4}:7").parse().unwrap(),
            64 * 1024,
            i,
        );
    }
    let (plan, report) = server.join().expect("server");
    assert_eq!(served.load(Ordering::SeqCst), 20);
    assert_eq!(plan.lanes.len(), 1);
    let lane = &plan.lanes[0];
    assert!(lane.split(), "shared-cache splits the lane: {plan}");
    assert!(plan.to_string().contains(&format!(
        "protocol on CPU {}, application on CPU {}",
        lane.protocol_cpu, lane.app_cpu
    )));
    let seen = app_cpus.lock().unwrap().clone();
    assert_eq!(seen.len(), 21);
    for (cpu, app_cpu, ran_on) in seen {
        assert_eq!((cpu, app_cpu), (lane.protocol_cpu, lane.app_cpu));
        assert_eq!(
            ran_on, lane.app_cpu,
            "the application ran off its pinned CPU"
        );
    }
    let c = &report.cores[0];
    assert_eq!(
        (c.stats.cpu, c.stats.app_cpu),
        (lane.protocol_cpu, lane.app_cpu)
    );
    assert!(c.stats.stack.established >= 20);
    assert!(!c.stats.app_cpu_time.is_zero() && !c.stats.cpu_time.is_zero());
    assert!(report.frames_balanced(), "{:?}", report.frames());
}

#[test]
fn runtime_placement_raises_queues_for_the_cores_and_restores_them() {
    if !require_root("runtime_placement_queues") {
        return;
    }
    assert!(corelane::allowed_cpus().len() >= 2);
    let net = net(2);
    net.server_ns()
        .exec("ethtool", &["-L", net.server_if(), "rx", "1", "tx", "1"])
        .expect("ethtool -L");
    assert_eq!(rx_queues(&net).expect("ethtool -l"), 1);
    let ifname = net.server_if().to_string();
    let (go, flag) = tokio::sync::watch::channel(false);
    let (to_test, from_server) = std::sync::mpsc::channel::<String>();
    let server = net
        .server_ns()
        .spawn(move || {
            let before = corelane::allowed_cpus();
            let rt = Runtime::builder(&ifname)
                .addr("10.77.0.3/24")
                .cores(2)
                .build()
                .expect("runtime");
            // `build` opened each lane's socket on that lane's CPU, and let the building
            // thread go where it was allowed before.
            assert_eq!(
                corelane::allowed_cpus(),
                before,
                "the building thread stayed pinned"
            );
            to_test.send(rt.plan().to_string()).unwrap();
            rt.run(|_core| {
                let mut flag = flag.clone();
                async move {
                    let _l = TcpListener::bind(7).await.expect("port 7");
                    let _ = flag.wait_for(|go| *go).await;
                }
            })
            .expect("run")
        })
        .expect("server thread");
    let plan = from_server.recv().expect("plan");
    assert!(
        plan.contains("had 1 receive queue(s): raised to 2"),
        "{plan}"
    );
    assert_eq!(
        rx_queues(&net).expect("ethtool -l"),
        2,
        "raised while running"
    );
    go.send_replace(true);
    let report = server.join().expect("server");
    assert_eq!(report.cores.len(), 2);
    assert_eq!(
        rx_queues(&net).expect("ethtool -l"),
        1,
        "restored after the run"
    );
}

#[test]
fn runtime_placement_topology_example_names_cores_and_shared_cache() {
    let out = std::process::Command::new(example_bin("topology"))
        .args(["--placement", "shared-cache"])
        .output()
        .expect("topology runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("machine: this machine:"), "{text}");
    assert!(text.contains("placement shared-cache: 1 lane(s)"), "{text}");
    let lane = text
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with("lane 0: queue 0 -> protocol on CPU")
        })
        .unwrap_or_else(|| panic!("no lane line:\n{text}"));
    assert!(
        lane.contains("share L") || lane.contains("SMT siblings"),
        "the lane names what its CPUs share: {lane}"
    );
    // A described machine: seed 000's box pairs cores under one L2.
    let out = std::process::Command::new(example_bin("topology"))
        .args([
            "--synthetic",
            "package:2 l2:2(size=4194304) core:2 pu:1",
            "--placement",
            "shared-cache",
            "--cores",
            "2",
        ])
        .output()
        .expect("topology runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "lane 1: queue 1 -> protocol on CPU 2, application on CPU 3: share L2 (4 MiB)"
        ),
        "{text}"
    );
    let out = std::process::Command::new(example_bin("topology"))
        .args(["--placement", "nearest"])
        .output()
        .expect("topology runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected same-core"));
}
