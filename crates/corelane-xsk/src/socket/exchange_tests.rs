//! Tests of `exchange.rs`.

use super::*;

#[test]
fn indices_pass_both_ways_in_order_between_two_mappings_running_at_once() {
    let old = Exchange::create(64).unwrap();
    let new = Exchange::join(old.file().try_clone_to_owned().unwrap(), 64).unwrap();
    assert_eq!(new.phase(), Phase::Offered);
    old.set_phase(Phase::Handed);
    assert_eq!(
        new.phase(),
        Phase::Handed,
        "one word, seen from both mappings"
    );
    const N: u32 = 200_000;
    // Each side sends 0..N and checks it receives 0..N, both at once on two threads, so
    // the rings' ordering is tried under real concurrency (a slot read before it is
    // written, or written before it is read, shows as a wrong number).
    let run = |mut x: Exchange| {
        move || {
            let (mut sent, mut got) = (0u32, 0u32);
            let mut buf = [0u32; 16];
            while sent < N || got < N {
                let batch: Vec<u32> = (sent..N.min(sent + 7)).collect();
                sent += x.out.push(&batch) as u32;
                let n = x.inbound.pop(&mut buf);
                for &v in &buf[..n] {
                    assert_eq!(v, got);
                    got += 1;
                }
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            x
        }
    };
    let a = std::thread::spawn(run(old));
    let b = std::thread::spawn(run(new));
    let old = a.join().unwrap();
    b.join().unwrap();
    old.set_phase(Phase::Left);
    assert_eq!(old.phase(), Phase::Left);
}
