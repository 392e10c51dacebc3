//! Namespaces and veth pairs disappear on drop, also when the test panics.

use std::process::Command;

use corelane_testnet::{VethPair, require_root};

fn namespaces() -> String {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn testnet_pair_is_removed_on_drop_and_on_panic() {
    if !require_root("testnet_pair_is_removed_on_drop_and_on_panic") {
        return;
    }
    let net = VethPair::builder()
        .queues(2)
        .server_addr("10.88.0.1/24")
        .client_addr("10.88.0.2/24")
        .build()
        .unwrap();
    let (s, c) = (
        net.server_ns().name().to_string(),
        net.client_ns().name().to_string(),
    );
    assert!(namespaces().contains(&s) && namespaces().contains(&c));
    let link = net.server_link().unwrap();
    assert!(link.contains(net.server_if()), "{link}");
    // Two queues each way, as asked.
    let queues_dir = format!("/sys/class/net/{}/queues", net.server_if());
    let q = net.server_ns().exec("ls", &[&queues_dir]).unwrap();
    assert!(q.contains("rx-1") && !q.contains("rx-2"), "{q}");
    // TX checksum offload is off on the kernel (client) side.
    let k = net
        .client_ns()
        .exec("ethtool", &["-k", net.client_if()])
        .unwrap();
    assert!(k.contains("tx-checksumming: off"), "{k}");
    // The kernel ends reach each other.
    let ping = net
        .client_ns()
        .exec("ping", &["-c", "1", "-W", "2", "10.88.0.1"])
        .unwrap();
    assert!(ping.contains("1 received"), "{ping}");
    drop(net);
    assert!(!namespaces().contains(&s) && !namespaces().contains(&c));

    let names = std::thread::spawn(|| {
        let net = VethPair::builder().build().unwrap();
        let names = (
            net.server_ns().name().to_string(),
            net.client_ns().name().to_string(),
        );
        std::panic::panic_any(names);
    })
    .join()
    .unwrap_err();
    let (s, c) = names.downcast_ref::<(String, String)>().unwrap().clone();
    let now = namespaces();
    assert!(
        !now.contains(&s) && !now.contains(&c),
        "left behind after a panic: {now}"
    );
}
