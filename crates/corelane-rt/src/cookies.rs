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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelane_stack::Stack;
use corelane_xsk::{CookieParams, Steering, monotonic_ns};

use crate::Builder;
use crate::lane::lock;
use crate::launch::Shared;

/// Below this many SYNs per second answered in the program, the flood is over.
pub(crate) const QUIET: u64 = 1000;
/// How often the program's count is looked at while cookies are on.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

impl Builder {
    /// Whether the XDP program may answer a flooded listener's SYNs with the stack's SYN
    /// cookies (see below). By default it does, except on veth in native mode: there the
    /// answer leaves through the peer's XDP receive path, which the kernel runs only when the
    /// peer has an XDP program or GRO on (`ethtool -K PEER gro on`); otherwise it would be
    /// dropped. `true` turns it on there too (for a peer set up so), `false` off everywhere.
    /// Not under a grant (the broker holds the program): the stack answers.
    ///
    /// While on for a port (from the first SYN its listener answered with a cookie, its SYN
    /// backlog full, until a second passes with fewer than 1000 SYNs answered), a flood costs
    /// the CPU it arrives on a few hundred nanoseconds per SYN and never reaches the AF_XDP
    /// ring, so real clients' SYNs are not lost with it. The program's count is
    /// [`XdpCounters::syn_cookies`](corelane_xsk::XdpCounters::syn_cookies).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// let rt = corelane::Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .xdp_syn_cookies(true)
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn xdp_syn_cookies(mut self, on: bool) -> Self {
        self.xdp_cookies = Some(on);
        self
    }
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
    /// As configured (`want`: the builder's choice, None for the default) for `steering`.
    pub(crate) fn new(want: Option<bool>, steering: &Steering) -> XdpCookies {
        let veth_native = steering.mode() == corelane_xsk::AttachedMode::Native
            && corelane_xsk::driver_info(steering.ifname()).is_ok_and(|d| d.driver == "veth");
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
        shared: &Arc<Shared>,
        stack: &Stack,
        epoch: Instant,
        now: Instant,
        ports: &mut Vec<u16>,
    ) {
        if !self.enabled.load(Ordering::Relaxed) {
            ports.clear();
            return;
        }
        let mut st = lock(&self.state);
        let cookies_counted = |shared: &Arc<Shared>| {
            shared
                .steer(|s| s.counters().map(|c| c.syn_cookies).ok())
                .ok()
                .flatten()
        };
        if !ports.is_empty() {
            if !st.params_set {
                let Some(t) = stack.syn_cookie_template() else {
                    return self.disable(ports, "the stack sends no SYN cookies");
                };
                let p = CookieParams {
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
                    pad: [0; 2],
                };
                let set = shared
                    .steer(move |s| steering_params(s, &p))
                    .map_err(|e| e.to_string())
                    .and_then(|r| r);
                match set {
                    Ok(()) => st.params_set = true,
                    Err(why) => return self.disable(ports, &why),
                }
                st.counted = cookies_counted(shared).unwrap_or(0);
            }
            for port in ports.drain(..) {
                if !st.ports.contains(&port)
                    && matches!(
                        shared.steer(move |s| s.set_syn_cookies(port, true)),
                        Ok(Ok(true))
                    )
                {
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
        let count = cookies_counted(shared).unwrap_or(st.counted);
        let rate = count.saturating_sub(st.counted) as f64 / waited.as_secs_f64();
        st.counted = count;
        st.checked = Some(now);
        if rate < QUIET as f64 {
            for port in st.ports.drain(..) {
                let _ = shared.steer(move |s| s.set_syn_cookies(port, false));
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

fn steering_params(steer: &mut Steering, p: &CookieParams) -> Result<(), String> {
    match steer.set_cookie_params(p) {
        Ok(true) => Ok(()),
        Ok(false) => Err("the program is the grant broker's".into()),
        Err(e) => Err(e.to_string()),
    }
}
