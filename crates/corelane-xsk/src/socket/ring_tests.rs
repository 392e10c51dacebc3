//! Tests of `ring.rs`.

use super::*;

/// A ring laid out as the kernel lays one out, in a memory file, with a producer and a
/// consumer mapped over it as two processes would map one ring.
fn ring_pair(size: u32) -> (Region, Producer<u64>, Consumer<u64>) {
    let off = RingOffsets {
        producer: 0,
        consumer: 64,
        flags: 128,
        desc: 192,
    };
    let len = 192 + size as usize * 8;
    let region = Region::new(len).unwrap();
    let p = Producer::map(region.file(), off, 0, size).unwrap();
    let c = Consumer::map(region.file(), off, 0, size).unwrap();
    (region, p, c)
}

#[test]
fn entries_go_through_in_order_and_the_indices_wrap() {
    let (_r, mut p, mut c) = ring_pair(8);
    assert_eq!(p.free(1), 8);
    assert_eq!(c.ready(1), 0);
    let mut out = [0u64; 8];
    let mut next = 0u64;
    let mut seen = 0u64;
    // Far enough to wrap the slots many times.
    for round in 0..100u64 {
        let batch: Vec<u64> = (0..(round % 7 + 1)).map(|k| next + k).collect();
        let n = p.push(&batch);
        next += n as u64;
        let got = c.pop(&mut out[..(round as usize % 5) + 1]);
        for &v in &out[..got] {
            assert_eq!(v, seen, "in order");
            seen += 1;
        }
    }
    while c.pop(&mut out) > 0 {}
    assert_eq!(p.free_exact(), 8, "every slot back once all is read");
}

#[test]
fn a_full_ring_takes_nothing_more() {
    let (_r, mut p, mut c) = ring_pair(4);
    assert_eq!(p.push(&[1, 2, 3, 4, 5, 6]), 4);
    assert_eq!(p.push(&[7]), 0);
    let mut out = [0u64; 2];
    assert_eq!(c.pop(&mut out), 2);
    assert_eq!(out, [1, 2]);
    assert_eq!(p.push(&[7, 8, 9]), 2);
    let mut all = [0u64; 8];
    assert_eq!(c.pop(&mut all), 4);
    assert_eq!(&all[..4], &[3, 4, 7, 8]);
}

#[test]
fn a_side_mapped_later_starts_where_the_indices_stand() {
    let (r, mut p, mut c) = ring_pair(8);
    p.push(&[1, 2, 3]);
    let mut one = [0u64; 1];
    c.pop(&mut one);
    // A second producer takes the ring over (the first stops): it must neither overwrite
    // the two entries still unread nor republish old slots.
    let off = RingOffsets {
        producer: 0,
        consumer: 64,
        flags: 128,
        desc: 192,
    };
    let mut p2 = Producer::<u64>::map(r.file(), off, 0, 8).unwrap();
    assert_eq!(p2.free_exact(), 6);
    p2.push(&[4]);
    let mut out = [0u64; 8];
    assert_eq!(c.pop(&mut out), 3);
    assert_eq!(&out[..3], &[2, 3, 4]);
}

#[test]
fn a_region_is_cut_at_its_end() {
    let r = Region::new(4096).unwrap();
    // SAFETY: nothing else refers to the region.
    unsafe {
        r.bytes_mut(4000, 200).fill(7);
        assert_eq!(r.bytes(4000, 200).len(), 96);
        assert_eq!(r.bytes(u64::MAX, 10).len(), 0);
        assert!(r.bytes(4000, 96).iter().all(|&b| b == 7));
    }
    // Mapped again from its file, as another process would: the same bytes.
    let dup = r.file().try_clone_to_owned().unwrap();
    let again = Region::map(dup, 4096).unwrap();
    // SAFETY: as above.
    assert!(unsafe { again.bytes(4000, 96) }.iter().all(|&b| b == 7));
}

#[test]
fn a_side_taken_back_from_a_producer_that_stopped_sees_what_it_left() {
    let (r, mut p, mut c) = ring_pair(8);
    p.push(&[1, 2]);
    let off = RingOffsets {
        producer: 0,
        consumer: 64,
        flags: 128,
        desc: 192,
    };
    // Another producer takes the ring, publishes, then stops.
    let mut other = Producer::<u64>::map(r.file(), off, 0, 8).unwrap();
    other.push(&[3, 4, 5]);
    let mut one = [0u64; 1];
    c.pop(&mut one);
    drop(other);
    // The first one takes it back: the four entries still published, in order, and no slot
    // of theirs is written over.
    assert_eq!(p.take_over(), vec![2, 3, 4, 5]);
    assert_eq!(p.free_exact(), 4);
    p.push(&[6]);
    let mut out = [0u64; 8];
    assert_eq!(c.pop(&mut out), 5);
    assert_eq!(&out[..5], &[2, 3, 4, 5, 6]);
    // A consumer taken back starts where the other stopped.
    let mut c2 = Consumer::<u64>::map(r.file(), off, 0, 8).unwrap();
    p.push(&[7]);
    assert_eq!(c2.pop(&mut out), 1);
    c.take_over();
    p.push(&[8]);
    assert_eq!(c.pop(&mut out), 1);
    assert_eq!(out[0], 8);
}

#[test]
fn a_memory_file_is_sealed_and_one_unsealed_or_short_is_not_mapped() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let r = Region::new(8192).unwrap();
    // The other process cannot resize it under this one's mapping.
    let f = std::fs::File::from(r.file().try_clone_to_owned().unwrap());
    assert_eq!(
        f.set_len(4096).unwrap_err().raw_os_error(),
        Some(libc::EPERM),
        "shrinking a sealed file"
    );
    assert!(f.set_len(1 << 20).is_err(), "growing a sealed file");
    // Passed on, it maps; asked for more than it holds, it does not.
    Region::map(r.file().try_clone_to_owned().unwrap(), 8192).unwrap();
    let e = Region::map(r.file().try_clone_to_owned().unwrap(), 16384).unwrap_err();
    assert!(e.to_string().contains("8192 bytes"), "{e}");
    // A memory file anyone could shrink is refused.
    // SAFETY: a constant NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: just returned by memfd_create, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a valid descriptor and a length.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 8192) }, 0);
    let e = Region::map(fd, 8192).unwrap_err();
    assert!(e.to_string().contains("not sealed"), "{e}");
}
