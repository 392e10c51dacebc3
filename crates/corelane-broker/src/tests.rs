//! The grant's parsing and bounds.

use super::*;

#[test]
fn ports_parse_singles_lists_and_ranges() -> Result<(), String> {
    let r = parse_ports(&["7", "8000-8002,9"])?;
    assert_eq!(r, vec![7..=7, 8000..=8002, 9..=9]);
    for bad in ["0", "9-8", "x", "70000", "1-"] {
        match parse_ports(&[bad]) {
            Ok(r) => return Err(format!("`{bad}` parsed as {r:?}")),
            Err(e) => assert!(e.contains(bad), "{e}"),
        }
    }
    Ok(())
}

#[test]
fn the_grant_allows_only_its_ports_and_names_them() -> Result<(), String> {
    let g = Grant::parse("veth0", &["10.0.0.1"], &["7", "49152-65535"], &[], &[0])?;
    assert!(g.allows_port(Proto::Tcp, 7));
    assert!(g.allows_port(Proto::Tcp, 50000));
    assert!(!g.allows_port(Proto::Tcp, 8));
    assert!(!g.allows_port(Proto::Udp, 7));
    assert_eq!(
        g.summary(),
        "addresses 10.0.0.1; tcp 7, 49152-65535; udp none; uid 0; queues as they are"
    );
    assert!(Grant::parse("veth0", &["10.0.0.300"], &[], &[], &[0]).is_err());
    Ok(())
}

#[test]
fn the_grant_bounds_the_queue_count_a_server_may_set() -> Result<(), String> {
    let mut g = Grant::parse("veth0", &["10.0.0.1"], &["7"], &[], &[0])?;
    // By default no change: asking for what is there is fine, anything else is refused
    // with the option that allows it.
    assert!(g.allows_channels(2, 2).is_ok());
    let e = g
        .allows_channels(2, 64)
        .err()
        .ok_or("a change was allowed")?;
    assert!(e.contains("--channels"), "{e}");
    g.channels = 4;
    assert!(g.allows_channels(2, 4).is_ok());
    assert!(g.allows_channels(2, 1).is_ok());
    assert!(g.allows_channels(2, 5).is_err());
    assert!(g.allows_channels(2, 0).is_err());
    assert!(g.summary().ends_with("queues up to 4"), "{}", g.summary());
    Ok(())
}
