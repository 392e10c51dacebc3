//! The device alone over an in-memory link: the MTU on the way out and in, frames dropped before
//! the protocol stage, arrival order, the capture tap.

use std::collections::VecDeque;

use corelane_frame::FrameIo;
use smoltcp::phy::Device;
use smoltcp::time::Instant;

use crate::device::{Tap, XdpDevice};
use corelane_frame::MemLink;

fn send(dev: &mut XdpDevice<corelane_frame::MemPort>, len: usize) {
    let tx = dev.transmit(Instant::ZERO).expect("a free frame");
    smoltcp::phy::TxToken::consume(tx, len, |b| b.fill(0));
}

#[test]
fn a_frame_longer_than_the_mtu_never_leaves() {
    let (a, mut b) = MemLink::default().pair();
    let mut dev = XdpDevice::new(a, 1500, 8);
    dev.set_strict(false);
    send(&mut dev, 1514);
    send(&mut dev, 1515);
    dev.flush().unwrap();
    let s = dev.stats();
    assert_eq!((s.tx_frames, s.tx_oversize), (1, 1));
    let mut rx = VecDeque::new();
    assert_eq!(b.recv(&mut rx, 8), 1, "only the frame that fits was sent");
    assert_eq!(b.bytes(&rx[0]).len(), 1514);
    b.release(&mut rx.drain(..).collect());
    // A strict device (every test's) calls it the bug it is.
    dev.set_strict(true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| send(&mut dev, 1515)));
    assert!(r.is_err());
}

#[test]
fn frames_longer_than_the_mtu_are_counted_on_arrival() {
    let (mut a, b) = MemLink::default().pair();
    let mut dev = XdpDevice::new(b, 1500, 8);
    assert!(a.inject(&[0u8; 1600]));
    assert!(a.inject(&[0u8; 1514]));
    dev.pull_batch();
    assert_eq!(dev.stats().rx_oversize, 1);
}

#[test]
fn bad_frames_are_dropped_before_the_protocol_stage() {
    let (mut a, b) = MemLink::default().pair();
    let mut dev = XdpDevice::new(b, 1500, 32);
    let good = crate::classify::tests::tcp_frame(false, b"ok");
    let mut bad = good.clone();
    let n = bad.len() - 1;
    bad[n] ^= 0xff;
    assert!(a.inject(&good));
    assert!(a.inject(&bad));
    assert!(a.inject(&good[..20]));
    assert_eq!(dev.pull_batch(), 3);
    let s = dev.stats();
    assert_eq!((s.rx_bad_checksum, s.rx_malformed), (1, 1));
    assert_eq!(dev.rx_pending(), 1);
    assert_eq!(
        dev.io_mut().counts().in_use,
        3,
        "dropped frames wait for the flush"
    );
    dev.drain().unwrap();
    let c = dev.io_mut().counts();
    assert_eq!(c.in_use, 0);
    assert_eq!(c.sum(), c.total);
}

#[test]
fn survivors_keep_arrival_order() {
    let (mut a, b) = MemLink::default().pair();
    let mut dev = XdpDevice::new(b, 1500, 64);
    for i in 0..10u8 {
        let mut f = crate::classify::tests::tcp_frame(false, &[i]);
        if i % 3 == 0 {
            let n = f.len() - 1;
            f[n] ^= 0x55; // corrupt every third
        }
        a.inject(&f);
    }
    dev.pull_batch();
    let mut seen = Vec::new();
    while let Some((rx, _tx)) = dev.receive(Instant::from_millis(0)) {
        smoltcp::phy::RxToken::consume(rx, |b: &[u8]| seen.push(b[b.len() - 1]));
    }
    assert_eq!(seen, vec![1, 2, 4, 5, 7, 8]);
}

/// A tap that keeps what it sees.
struct Seen(
    std::sync::Arc<std::sync::Mutex<Vec<(bool, usize, u64)>>>,
    u64,
);

impl Tap for Seen {
    fn clock(&mut self, unix_ns: u64) {
        self.1 = unix_ns;
    }
    fn frame(&mut self, outbound: bool, bytes: &[u8]) {
        if let Ok(mut v) = self.0.lock() {
            v.push((outbound, bytes.len(), self.1));
        }
    }
}

#[test]
fn a_tap_sees_every_frame_received_and_sent_while_set() -> std::io::Result<()> {
    let (mut a, b) = MemLink::default().pair();
    let mut dev = XdpDevice::new(b, 1500, 8);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    assert!(a.inject(&[0u8; 100]));
    dev.pull_batch();
    send(&mut dev, 60);
    dev.flush()?;
    dev.set_tap(Some(Box::new(Seen(seen.clone(), 0))));
    if let Some(t) = dev.tap_mut() {
        t.clock(7);
    }
    assert!(a.inject(&[0u8; 200]));
    assert!(a.inject(&[0u8; 300]));
    dev.pull_batch();
    // A frame handed over from another core was seen there: not again here.
    assert!(dev.inject(&[0u8; 64], 1));
    send(&mut dev, 70);
    send(&mut dev, 80);
    dev.flush()?;
    dev.set_tap(None);
    assert!(a.inject(&[0u8; 400]));
    dev.pull_batch();
    send(&mut dev, 90);
    dev.flush()?;
    let v = seen.lock().map(|v| v.clone()).unwrap_or_default();
    assert_eq!(
        v,
        [
            (false, 200, 7),
            (false, 300, 7),
            (true, 70, 7),
            (true, 80, 7)
        ]
    );
    Ok(())
}

#[test]
fn a_vlan_device_tags_every_frame_it_sends() {
    let (a, mut b) = MemLink::default().pair();
    let mut dev = XdpDevice::new(a, 1500, 8);
    dev.set_vlan(100);
    // An untagged full-size frame as the stack writes it: addresses, EtherType, payload.
    let frame: Vec<u8> = (0..1514u32).map(|i| (i % 251) as u8).collect();
    let tx = dev.transmit(Instant::ZERO).expect("a free frame");
    smoltcp::phy::TxToken::consume(tx, frame.len(), |buf| buf.copy_from_slice(&frame));
    dev.flush().unwrap();
    assert_eq!(
        dev.stats().tx_oversize,
        0,
        "the tag is not counted in the MTU"
    );
    let mut rx = VecDeque::new();
    assert_eq!(b.recv(&mut rx, 8), 1);
    let got = b.bytes(&rx[0]).to_vec();
    assert_eq!(got.len(), 1518);
    assert_eq!(&got[..12], &frame[..12], "addresses first");
    assert_eq!(&got[12..16], &[0x81, 0x00, 0, 100], "then the tag");
    assert_eq!(&got[16..], &frame[12..], "then the EtherType and the rest");
    b.release(&mut rx.drain(..).collect());
    // Untagged again once the VLAN is cleared.
    dev.set_vlan(0);
    send(&mut dev, 60);
    dev.flush().unwrap();
    assert_eq!(b.recv(&mut rx, 8), 1);
    assert_eq!(b.bytes(&rx[0]).len(), 60);
}

/// Every frame a tap is shown, with its direction (true: sent).
type Frames = std::sync::Arc<std::sync::Mutex<Vec<(bool, Vec<u8>)>>>;

/// A tap that keeps a copy of every frame in [`Frames`].
struct Bytes(Frames);

impl Tap for Bytes {
    fn clock(&mut self, _: u64) {}
    fn frame(&mut self, outbound: bool, bytes: &[u8]) {
        if let Ok(mut v) = self.0.lock() {
            v.push((outbound, bytes.to_vec()));
        }
    }
}

#[test]
fn a_qinq_device_puts_the_service_tag_outside_the_vlan_tag() -> std::io::Result<()> {
    let (mut a, b) = MemLink::default().pair();
    let mut dev = XdpDevice::new(b, 1500, 8);
    dev.set_vlans(200, 100);
    let seen = Frames::default();
    dev.set_tap(Some(Box::new(Bytes(seen.clone()))));
    let frame: Vec<u8> = (0..1514u32).map(|i| (i % 251) as u8).collect();
    let tx = dev.transmit(Instant::ZERO).expect("a free frame");
    smoltcp::phy::TxToken::consume(tx, frame.len(), |buf| buf.copy_from_slice(&frame));
    dev.flush()?;
    let mut rx = VecDeque::new();
    assert_eq!(a.recv(&mut rx, 8), 1);
    let got = a.bytes(&rx[0]).to_vec();
    a.release(&mut rx.drain(..).collect());
    let tags = [0x88, 0xa8, 0, 200, 0x81, 0x00, 0, 100];
    assert_eq!(got.len(), 1522);
    assert_eq!(&got[..12], &frame[..12], "addresses first");
    assert_eq!(&got[12..20], &tags, "then the service tag, then the VLAN's");
    assert_eq!(&got[20..], &frame[12..], "then the EtherType and the rest");
    // What arrives (the program took both tags off) is shown with both, as on the wire.
    let inbound: Vec<u8> = (0..100u8).collect();
    assert!(a.inject(&inbound));
    dev.pull_batch();
    let v = seen.lock().map(|v| v.clone()).unwrap_or_default();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0], (true, got));
    let (outbound, shown) = &v[1];
    assert!(!outbound);
    assert_eq!(&shown[12..20], &tags);
    assert_eq!(&shown[20..], &inbound[12..]);
    // The service tag alone, without a VLAN inside it.
    dev.set_vlans(200, 0);
    send(&mut dev, 60);
    dev.flush()?;
    assert_eq!(a.recv(&mut rx, 8), 1);
    assert_eq!(&a.bytes(&rx[0])[12..16], &[0x88, 0xa8, 0, 200]);
    Ok(())
}

/// A capture on a VLAN shows both directions tagged, as on the wire: the program took the tag
/// off what was received, the device puts it on what it sends.
#[test]
fn a_vlan_device_s_tap_sees_both_directions_tagged() -> std::io::Result<()> {
    let (mut a, b) = MemLink::default().pair();
    let mut dev = XdpDevice::new(b, 1500, 8);
    dev.set_vlan(100);
    let seen = Frames::default();
    dev.set_tap(Some(Box::new(Bytes(seen.clone()))));
    let inbound: Vec<u8> = (0..100u8).collect();
    assert!(a.inject(&inbound));
    dev.pull_batch();
    send(&mut dev, 60);
    dev.flush()?;
    let v = seen.lock().map(|v| v.clone()).unwrap_or_default();
    assert_eq!(v.len(), 2);
    let (out_in, got_in) = &v[0];
    assert!(!out_in);
    assert_eq!(got_in.len(), 104);
    assert_eq!(&got_in[..12], &inbound[..12]);
    assert_eq!(&got_in[12..16], &[0x81, 0x00, 0, 100]);
    assert_eq!(&got_in[16..], &inbound[12..]);
    let (out_out, got_out) = &v[1];
    assert!(out_out);
    assert_eq!(&got_out[12..16], &[0x81, 0x00, 0, 100]);
    Ok(())
}
