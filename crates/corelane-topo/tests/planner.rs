//! The planner against machines this one is not: hwloc synthetic topologies and a recorded XML.

use corelane_topo::{Machine, Placement, Plan, Request, Sharing, plan};

/// Seed 000's box: two packages of four cores, L2 shared by pairs of cores, one memory node.
const SEED000: &str = "package:2 l2:2(size=4194304) l1d:2(size=32768) core:1 pu:1";
/// Four cores with two hardware threads each under one L3.
const SMT: &str = "package:1 l3:1(size=16777216) l2:4(size=1048576) l1d:1(size=49152) core:1 pu:2";
/// One core.
const SINGLE: &str = "package:1 core:1 pu:1";
/// Seed 001's 48-core, 4-node box with its NIC on node 2.
const MAGNY_COURS: &str = include_str!("topologies/magny-cours-48.xml");

fn request(m: &Machine, lanes: Option<usize>, nic: &str) -> Request {
    Request {
        lanes,
        max_lanes: None,
        allowed: m.cpus().iter().map(|c| c.os).collect(),
        nic: m.nic(nic, None),
    }
}

fn pairs(p: &Plan) -> Vec<(usize, usize)> {
    p.lanes
        .iter()
        .map(|l| (l.protocol_cpu, l.app_cpu))
        .collect()
}

fn magny_cours() -> Machine {
    Machine::from_xml(MAGNY_COURS, "magny-cours-48.xml").expect("the recorded topology loads")
}

#[test]
fn seed000_box_shared_cache_pairs_cores_under_one_l2() {
    let m = Machine::synthetic(SEED000)
        .expect("synthetic")
        .with_nic("eth0", 0);
    assert_eq!((m.packages(), m.cores(), m.cpus().len()), (2, 8, 8));
    let p = plan(&m, &Placement::SharedCache, &request(&m, Some(1), "eth0")).expect("plan");
    assert_eq!(pairs(&p), vec![(0, 1)]);
    assert_eq!(
        p.lanes[0].sharing,
        Sharing::Cache {
            level: 2,
            size: Some(4 << 20)
        }
    );
    let text = p.to_string();
    assert!(
        text.contains("protocol on CPU 0, application on CPU 1: share L2 (4 MiB)"),
        "{text}"
    );
    // Four lanes: every pair of L2 siblings, nothing across a package.
    let p = plan(&m, &Placement::SharedCache, &request(&m, Some(4), "eth0")).expect("plan");
    assert_eq!(pairs(&p), vec![(0, 1), (2, 3), (4, 5), (6, 7)]);
    assert!(
        p.lanes
            .iter()
            .all(|l| matches!(l.sharing, Sharing::Cache { level: 2, .. }))
    );
}

#[test]
fn seed000_box_spread_crosses_packages_and_same_core_uses_one_cpu() {
    let m = Machine::synthetic(SEED000)
        .expect("synthetic")
        .with_nic("eth0", 0);
    let p = plan(&m, &Placement::Spread, &request(&m, Some(1), "eth0")).expect("plan");
    let (pc, ac) = pairs(&p)[0];
    assert_eq!(pc, 0);
    let (cp, ca) = (m.cpu(pc).expect("cpu"), m.cpu(ac).expect("cpu"));
    assert_ne!(
        cp.package, ca.package,
        "spread keeps the application off the package"
    );
    assert_eq!(p.lanes[0].sharing, Sharing::Node);
    assert!(!p.lanes[0].sharing.shares_cache());

    let p = plan(&m, &Placement::SameCore, &request(&m, None, "eth0")).expect("plan");
    assert_eq!(p.lanes.len(), 8, "one lane per core by default");
    assert!(p.lanes.iter().all(|l| !l.split()));
    assert_eq!(
        p.lanes.iter().map(|l| l.queue).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    assert!(
        p.to_string()
            .contains("protocol and application on CPU 0 (same core")
    );
}

#[test]
fn smt_box_counts_siblings_as_sharing_l1_and_l2() {
    let m = Machine::synthetic(SMT).expect("synthetic");
    assert_eq!((m.cores(), m.cpus().len()), (4, 8));
    assert_eq!(m.sharing(0, 1), Sharing::SameCore);
    assert_eq!(
        m.sharing(0, 2),
        Sharing::Cache {
            level: 3,
            size: Some(16 << 20)
        }
    );
    // Same core: one lane per physical core, siblings left idle.
    let p = plan(&m, &Placement::SameCore, &request(&m, None, "veth0")).expect("plan");
    assert_eq!(p.protocol_cpus(), vec![0, 2, 4, 6]);
    // More lanes than cores: the siblings come last, and the plan says so.
    let p = plan(&m, &Placement::SameCore, &request(&m, Some(6), "veth0")).expect("plan");
    assert_eq!(p.protocol_cpus(), vec![0, 2, 4, 6, 1, 3]);
    assert!(p.to_string().contains("SMT siblings"), "{p}");
    // Shared cache: the sibling is the closest CPU.
    let p = plan(&m, &Placement::SharedCache, &request(&m, None, "veth0")).expect("plan");
    assert_eq!(pairs(&p), vec![(0, 1), (2, 3), (4, 5), (6, 7)]);
    assert!(p.lanes.iter().all(|l| l.sharing == Sharing::SameCore));
    assert!(
        p.to_string()
            .contains("SMT siblings of one core: share L1 and L2")
    );
    let e = plan(&m, &Placement::SharedCache, &request(&m, Some(5), "veth0"))
        .expect_err("five split lanes need ten CPUs");
    assert!(e.to_string().contains("fits only 4"), "{e}");
}

#[test]
fn smt_box_plans_only_on_allowed_cpus() {
    let m = Machine::synthetic(SMT).expect("synthetic");
    let mut r = request(&m, None, "veth0");
    r.allowed = vec![3, 5, 7];
    let p = plan(&m, &Placement::SameCore, &r).expect("plan");
    assert_eq!(p.protocol_cpus(), vec![3, 5, 7]);
    r.allowed = vec![4, 5, 6];
    let p = plan(&m, &Placement::SharedCache, &r).expect("plan");
    assert_eq!(pairs(&p), vec![(4, 5)]);
    let e = plan(
        &m,
        &Placement::Explicit {
            protocol: vec![0],
            application: vec![],
        },
        &r,
    )
    .expect_err("CPU 0 is not allowed");
    assert!(
        e.to_string()
            .contains("CPU 0 is not one this process may run on"),
        "{e}"
    );
}

#[test]
fn four_node_box_reads_distances_and_the_nics_node_from_xml() {
    let m = magny_cours();
    assert_eq!((m.packages(), m.cores(), m.nodes()), (4, 48, 4));
    assert_eq!(m.node_distance(0, 3), Some(22));
    assert_eq!(m.node_distance(2, 0), Some(16));
    // CPU i is on package i mod 4.
    assert!(m.cpus().iter().all(|c| c.package == c.os % 4));
    let nic = m.nic("eth2", None);
    assert_eq!(nic.node, Some(2));
    assert_eq!(nic.pci.as_deref(), Some("0000:40:00.0"));
    // Found by PCI address under another name too (the name in this namespace may differ).
    assert_eq!(m.nic("ens5f0", Some("0000:40:00.0")).node, Some(2));
    // A virtual device has no locality.
    let v = m.nic("veth0", None);
    assert_eq!(v.node, None);
    assert!(v.locality.contains("virtual device"));
}

#[test]
fn four_node_box_puts_lanes_on_the_nics_node_first() {
    let m = magny_cours();
    let p = plan(&m, &Placement::SameCore, &request(&m, Some(12), "eth2")).expect("plan");
    assert!(
        p.protocol_cpus().iter().all(|c| c % 4 == 2),
        "all twelve on package 2: {:?}",
        p.protocol_cpus()
    );
    assert!(p.lanes.iter().all(|l| l.nic_distance == Some(10)));
    // Twenty-four: the next twelve on the nearest nodes (distance 16), none on node 1 (22).
    let p = plan(&m, &Placement::SameCore, &request(&m, Some(24), "eth2")).expect("plan");
    assert!(p.lanes[12..].iter().all(|l| l.nic_distance == Some(16)));
    assert!(p.to_string().contains("not on the NIC's node 2"));
    // Shared cache: pairs under one six-core L3 of the NIC's node.
    let p = plan(&m, &Placement::SharedCache, &request(&m, Some(6), "eth2")).expect("plan");
    for l in &p.lanes {
        assert_eq!((l.protocol_cpu % 4, l.app_cpu % 4), (2, 2));
        assert!(
            matches!(l.sharing, Sharing::Cache { level: 3, .. }),
            "{l:?}"
        );
    }
    assert!(p.to_string().contains("share L3 (6 MiB)"), "{p}");
    // Spread: the application goes as far as the machine allows.
    let p = plan(&m, &Placement::Spread, &request(&m, Some(1), "eth2")).expect("plan");
    assert_eq!(p.lanes[0].protocol_cpu % 4, 2);
    assert_eq!(p.lanes[0].sharing, Sharing::Remote { distance: Some(22) });
}

#[test]
fn four_node_box_fewest_grows_one_core_at_a_time_near_the_nic() {
    let m = magny_cours();
    let fewest = Placement::Fewest {
        target_bits_per_sec: 10_000_000_000,
        per_core_bits_per_sec: 2_500_000_000,
    };
    let p = plan(&m, &fewest, &request(&m, None, "eth2")).expect("plan");
    assert_eq!(p.lanes.len(), 4);
    assert!(p.protocol_cpus().iter().all(|c| c % 4 == 2));
    assert!(p.to_string().contains("needs 4 core(s)"));
    let g = p.grow(&m).expect("room to grow");
    assert_eq!(g.lanes.len(), 5);
    assert_eq!(g.lanes[..4], p.lanes[..]);
    assert_eq!(g.lanes[4].protocol_cpu % 4, 2);
    assert_eq!(g.lanes[4].queue, 4);
}

#[test]
fn explicit_cpus_far_from_the_nic_are_explained() {
    let m = magny_cours();
    let p = plan(
        &m,
        &Placement::Explicit {
            protocol: vec![1, 2],
            application: vec![5, 6],
        },
        &request(&m, None, "eth2"),
    )
    .expect("plan");
    assert_eq!(pairs(&p), vec![(1, 5), (2, 6)]);
    assert_eq!(p.lanes[0].nic_distance, Some(22));
    assert!(
        p.to_string()
            .contains("protocol CPU(s) [1] are not on the NIC's node 2")
    );
    let e = plan(
        &m,
        &Placement::Explicit {
            protocol: vec![1, 1],
            application: vec![],
        },
        &request(&m, None, "eth2"),
    )
    .expect_err("one protocol CPU per lane");
    assert!(e.to_string().contains("two lanes"));
}

#[test]
fn single_core_box_has_one_lane_and_no_split() {
    let m = Machine::synthetic(SINGLE).expect("synthetic");
    let p = plan(&m, &Placement::SameCore, &request(&m, None, "veth0")).expect("plan");
    assert_eq!(pairs(&p), vec![(0, 0)]);
    assert!(p.grow(&m).is_none());
    let e = plan(&m, &Placement::SharedCache, &request(&m, None, "veth0"))
        .expect_err("a split lane needs two CPUs");
    assert!(e.to_string().contains("fits only 0"), "{e}");
    let p = plan(
        &m,
        &Placement::Fewest {
            target_bits_per_sec: 40_000_000_000,
            per_core_bits_per_sec: 2_500_000_000,
        },
        &request(&m, None, "veth0"),
    )
    .expect("plan");
    assert_eq!(p.lanes.len(), 1);
    assert!(p.to_string().contains("may not be reached"));
}

#[test]
fn this_machine_plans() {
    let m = Machine::this().expect("hwloc reads this machine");
    assert!(!m.cpus().is_empty());
    let p = plan(&m, &Placement::SameCore, &request(&m, Some(1), "lo")).expect("plan");
    assert_eq!(p.lanes.len(), 1);
}

#[test]
fn placements_parse() {
    assert_eq!(
        Placement::parse("same-core").expect("ok"),
        Placement::SameCore
    );
    assert_eq!(
        Placement::parse("shared-cache").expect("ok"),
        Placement::SharedCache
    );
    assert_eq!(Placement::parse("spread").expect("ok"), Placement::Spread);
    assert_eq!(
        Placement::parse("fewest:10:2.5").expect("ok"),
        Placement::Fewest {
            target_bits_per_sec: 10_000_000_000,
            per_core_bits_per_sec: 2_500_000_000
        }
    );
    assert_eq!(
        Placement::parse("0,2/1,3").expect("ok"),
        Placement::Explicit {
            protocol: vec![0, 2],
            application: vec![1, 3]
        }
    );
    for bad in ["nearest", "fewest", "fewest:x", "0,a"] {
        let e = Placement::parse(bad).expect_err(bad);
        assert!(e.to_string().contains("expected same-core"), "{e}");
    }
}

#[test]
fn bad_topologies_are_errors() {
    let e = Machine::synthetic("banana:3").expect_err("not a topology");
    assert!(e.to_string().contains("banana:3"));
    assert!(Machine::from_xml("<topology>", "broken").is_err());
}
