//! SYN cookies in the XDP program while a listener is flooded.
//!
//! A core's stack answers SYNs past a listener's SYN backlog with cookies itself, but the
//! flood still crosses the AF_XDP ring: past what one core can answer the ring overflows and
//! real clients' SYNs are lost with the flood's (a lost SYN costs its client a second). So the
//! first cookie a listener sends turns on the program's own answer for that port: it turns
//! each bare SYN into the SYN-ACK the stack would have sent, on the CPU the SYN arrived on, and
//! only the final ACKs (real clients) reach the stack, which opens them from the cookie. Once a
//! second passes with fewer than [`QUIET`] SYNs answered in the program, its ports go back to
//! the stack.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::host::{CookieParams, Steering, monotonic_ns};
use corelane_stack::Stack;

use crate::lock::lock;

/// Below this many SYNs per second answered in the program, the flood is over.
pub(crate) const QUIET: u64 = 1000;
/// How often the program's count is looked at while cookies are on.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What the switch needs of the XDP program, with the runtime's privileges.
pub(crate) trait CookieProgram {
    /// SYNs the program has answered with cookies so far (None: the count cannot be read).
    fn answered(&self) -> Option<u64>;
    /// Gives the program the stack's cookie secret and options.
    fn set_params(&self, p: CookieParams) -> Result<(), String>;
    /// Turns the program's answer for `port` on or off; true when the change took.
    fn set_port(&self, port: u16, on: bool) -> bool;
}

/// The runtime's side of it, shared by the cores.
#[derive(Debug, Default)]
pub(crate) struct XdpCookies {
    enabled: AtomicBool,
    /// Some port has the program's cookies on.
    active: AtomicBool,
    state: Mutex<State>,
    /// When each listener port last had cookies sent (by any core's stack or the program), in
    /// the stacks' time: each core's stack checks cookie ACKs only for these, and only for
    /// two minutes after (the ACK may arrive on another core than the SYN).
    sent: Mutex<Vec<(u16, corelane_stack::smoltcp::time::Instant)>>,
    /// Bumped on every change of `sent`, so a core looks at it only when it changed.
    sent_generation: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    params_set: bool,
    ports: Vec<u16>,
    counted: u64,
    checked: Option<Instant>,
}

impl XdpCookies {
    /// As configured (`want`: the builder's choice, None for the default) for `steering`;
    /// `veth_native`: the program runs in native mode on a veth, where it is off by default.
    pub(crate) fn new(want: Option<bool>, steering: &Steering, veth_native: bool) -> XdpCookies {
        let on = want.unwrap_or(!veth_native) && !steering.is_granted();
        XdpCookies {
            enabled: AtomicBool::new(on),
            ..XdpCookies::default()
        }
    }

    /// Cookies were sent for `ports` at `now` (the stacks' time), by a core's stack or by the
    /// program on their behalf.
    pub(crate) fn note_sent(&self, ports: &[u16], now: corelane_stack::smoltcp::time::Instant) {
        let mut sent = lock(&self.sent);
        for &p in ports {
            match sent.iter_mut().find(|(q, _)| *q == p) {
                Some(e) => e.1 = now,
                None => sent.push((p, now)),
            }
        }
        self.sent_generation.fetch_add(1, Ordering::Release);
    }

    /// Tells `stack` of the cookies sent since this core last looked (`seen`: the generation
    /// it saw then).
    pub(crate) fn share_sent(&self, seen: &mut u64, stack: &mut Stack) {
        let g = self.sent_generation.load(Ordering::Acquire);
        if g == *seen {
            return;
        }
        *seen = g;
        for &(port, at) in lock(&self.sent).iter() {
            stack.cookies_sent_for(port, at);
        }
    }

    /// The ports the program answers SYNs for now.
    pub(crate) fn program_ports(&self) -> Vec<u16> {
        lock(&self.state).ports.clone()
    }

    /// True while some port has the program's cookies on.
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Turns the program's cookies on for `ports` (listeners that answered SYNs with cookies),
    /// and off for every port once the flood has passed. `epoch` is the stack's time zero.
    pub(crate) fn update(
        &self,
        program: &impl CookieProgram,
        stack: &Stack,
        epoch: Instant,
        now: Instant,
        ports: &mut Vec<u16>,
    ) {
        self.update_with(program, || params(stack, epoch), now, ports);
    }

    /// [`update`](XdpCookies::update) with the program's parameters from `params` (None: the
    /// stack sends no cookies).
    fn update_with(
        &self,
        program: &impl CookieProgram,
        params: impl FnOnce() -> Option<CookieParams>,
        now: Instant,
        ports: &mut Vec<u16>,
    ) {
        if !self.enabled.load(Ordering::Relaxed) {
            ports.clear();
            return;
        }
        let mut st = lock(&self.state);
        if !ports.is_empty() {
            if !st.params_set {
                let Some(p) = params() else {
                    return self.disable(ports, "the stack sends no SYN cookies");
                };
                match program.set_params(p) {
                    Ok(()) => st.params_set = true,
                    Err(why) => return self.disable(ports, &why),
                }
                st.counted = program.answered().unwrap_or(0);
            }
            for port in ports.drain(..) {
                if !st.ports.contains(&port) && program.set_port(port, true) {
                    tracing::info!(
                        "port {port}: its SYN backlog is full: the XDP program answers its SYNs \
                         with cookies while the flood lasts"
                    );
                    st.ports.push(port);
                }
            }
            if !st.ports.is_empty() && !self.active() {
                st.checked = Some(now);
                self.active.store(true, Ordering::Relaxed);
            }
            return;
        }
        let Some(checked) = st.checked else { return };
        let waited = now.saturating_duration_since(checked);
        if waited < CHECK_EVERY {
            return;
        }
        let count = program.answered().unwrap_or(st.counted);
        let rate = count.saturating_sub(st.counted) as f64 / waited.as_secs_f64();
        st.counted = count;
        st.checked = Some(now);
        if rate < QUIET as f64 {
            for port in st.ports.drain(..) {
                program.set_port(port, false);
                tracing::info!("port {port}: the SYN flood is over: its SYNs go to the stack");
            }
            st.checked = None;
            self.active.store(false, Ordering::Relaxed);
        }
    }

    fn disable(&self, ports: &mut Vec<u16>, why: &str) {
        ports.clear();
        self.enabled.store(false, Ordering::Relaxed);
        tracing::warn!("SYN cookies stay in the stack, not the XDP program: {why}");
    }
}

/// The program's parameters from `stack`'s cookie template (None: it sends no cookies);
/// `epoch` is the stack's time zero.
fn params(stack: &Stack, epoch: Instant) -> Option<CookieParams> {
    let t = stack.syn_cookie_template()?;
    Some(CookieParams {
        k0: t.key.0,
        k1: t.key.1,
        epoch_ns: monotonic_ns(epoch),
        mss: t.mss,
        window: t.window,
        wscale: t.wscale,
        timestamps: u8::from(t.timestamps),
        sack: u8::from(t.sack),
        ttl: t.ttl,
        ts_k0: t.ts_key.0,
        ts_k1: t.ts_key.1,
        mac: t.mac,
        mss6: t.mss6,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// The program, faked: what it was told, and a count of answered SYNs the test moves.
    #[derive(Default)]
    struct Fake {
        params: RefCell<u32>,
        on: RefCell<Vec<u16>>,
        answered: RefCell<u64>,
    }

    impl CookieProgram for Fake {
        fn answered(&self) -> Option<u64> {
            Some(*self.answered.borrow())
        }
        fn set_params(&self, _: CookieParams) -> Result<(), String> {
            *self.params.borrow_mut() += 1;
            Ok(())
        }
        fn set_port(&self, port: u16, on: bool) -> bool {
            let mut ports = self.on.borrow_mut();
            ports.retain(|p| *p != port);
            if on {
                ports.push(port);
            }
            true
        }
    }

    fn switch() -> XdpCookies {
        XdpCookies {
            enabled: AtomicBool::new(true),
            ..XdpCookies::default()
        }
    }

    fn some_params() -> Option<CookieParams> {
        Some(CookieParams::default())
    }

    #[test]
    fn a_flood_turns_the_program_on_until_a_quiet_second() {
        let (c, p, t0) = (switch(), Fake::default(), Instant::now());
        c.update_with(&p, some_params, t0, &mut vec![80]);
        assert_eq!(*p.on.borrow(), [80]);
        assert!(c.active());
        c.update_with(&p, some_params, t0, &mut vec![80, 443]);
        assert_eq!(*p.on.borrow(), [80, 443]);
        assert_eq!(*p.params.borrow(), 1, "the secret is given once");

        // Still flooded a second later: 5,000 SYNs answered in the program.
        *p.answered.borrow_mut() += 5_000;
        c.update_with(&p, some_params, t0 + CHECK_EVERY / 2, &mut Vec::new());
        c.update_with(&p, some_params, t0 + CHECK_EVERY, &mut Vec::new());
        assert_eq!(p.on.borrow().len(), 2, "the flood goes on");

        // Then a quiet second: fewer than QUIET.
        *p.answered.borrow_mut() += QUIET / 2;
        c.update_with(&p, some_params, t0 + 2 * CHECK_EVERY, &mut Vec::new());
        assert!(p.on.borrow().is_empty(), "every port back to the stack");
        assert!(!c.active());
    }

    #[test]
    fn no_template_or_a_refusal_keeps_cookies_in_the_stack() {
        let (c, p, t0) = (switch(), Fake::default(), Instant::now());
        let mut ports = vec![80];
        c.update_with(&p, || None, t0, &mut ports);
        assert!(ports.is_empty() && p.on.borrow().is_empty());
        c.update_with(&p, some_params, t0, &mut vec![80]);
        assert!(p.on.borrow().is_empty(), "disabled for the run");

        struct Refuses;
        impl CookieProgram for Refuses {
            fn answered(&self) -> Option<u64> {
                None
            }
            fn set_params(&self, _: CookieParams) -> Result<(), String> {
                Err("the program is the grant broker's".into())
            }
            fn set_port(&self, _: u16, _: bool) -> bool {
                panic!("no port is turned on without the secret")
            }
        }
        let c = switch();
        c.update_with(&Refuses, some_params, t0, &mut vec![80]);
        assert!(!c.active());
    }
}
