//! QUIC through a simulated network, seeded, in virtual time and without root: a client and a
//! server of two cores, each core an endpoint's state (the driver's own, with the connection
//! IDs that name its core) over its own corelane stack (its UDP socket, its steering, the
//! runtime's handoff rings between the two cores), joined by a wire that delays, loses,
//! duplicates and reorders frames and spreads the client's datagrams over the server's cores
//! by a hash of their addresses and ports, as a NIC does.
//!
//! The seed picks the wire's impairments, the streams the client sends (each echoed by the
//! server), and whether the client moves to a new port mid-transfer (once or twice), as a
//! client behind a NAT that rebinds does: its datagrams may then land on the core that does
//! not hold the connection, which hands them over by the connection ID.
//!
//! Checked after every step: the connection lives on one server core only, and neither end
//! has lost it. At the end: every stream came back whole and in order, the connection ended
//! by the client's close, every handoff was taken, and every frame of every host is back.
//!
//! ```
//! let report = corelane_rt::quic::sim::run(7)?; // a failure names its seed
//! assert!(report.bytes > 0);
//! # Ok::<(), corelane_rt::quic::sim::Failure>(())
//! ```
//!
//! `cargo run --release -p corelane-bench --bin quic-sim -- --seeds 100000` sweeps; a failing
//! seed replays with `--seed N`. What a seed draws replays exactly; the TLS handshake's own
//! random values are each run's, which changes no size and no time.

mod app;
mod host;
mod wire;

use std::time::{Duration, Instant};

use corelane_stack::smoltcp::time::Instant as StackInstant;
use corelane_stack::{Alone, StackConfig};
use corelane_xsk::SplitMix64;

use super::cid::CoreCids;
use super::driver::State;
use super::state_machine;
use crate::clock::Clock;
use crate::peers::CorePeers;
use host::{Ep, Host, configs, pass, read, seed_bytes, server_addr};
use wire::{Impairments, To, Wire};

const MTU: usize = 1500;
const PORT: u16 = 4433;
/// Simulated time a run may take before it fails.
const LIMIT: Duration = Duration::from_secs(300);
/// Steps a run may take before it fails (a loop that never waits).
const MAX_STEPS: u64 = 2_000_000;
const SERVER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// What a run did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Report {
    /// Streams the client sent and got back.
    pub streams: usize,
    /// Bytes the client sent (each echoed back whole).
    pub bytes: u64,
    /// Times the client moved to a new port.
    pub migrations: usize,
    /// Datagrams a server core handed to the other by their connection ID.
    pub steered: u64,
    /// The server core that held the connection.
    pub home: usize,
    /// Frames the wire carried, lost, sent twice and held back.
    pub frames: u64,
    /// Frames lost.
    pub lost: u64,
    /// Frames duplicated.
    pub duplicated: u64,
    /// Frames held back behind later ones.
    pub reordered: u64,
    /// ECN-capable frames the wire marked CE (congestion experienced).
    pub ce_marked: u64,
    /// Congestion events both ends' senders saw (from losses, and from CE marks their peer
    /// read and reported).
    pub congestion_events: u64,
    /// The wire's impairments lost, reordered or duplicated nothing (only CE marks, if any).
    pub clean: bool,
    /// How the server saw the connection end (the client's close, or its idle timeout when
    /// every copy of the close was lost).
    pub server_end: String,
    /// Simulated time the run took.
    pub took: Duration,
}

/// A run that broke an invariant.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The seed that replays it.
    pub seed: u64,
    /// Simulated time into the run.
    pub at: Duration,
    /// What went wrong.
    pub why: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QUIC simulation, seed {} at {:?}: {} (replay: cargo run --release -p corelane-bench \
             --bin quic-sim -- --seed {})",
            self.seed, self.at, self.why, self.seed
        )
    }
}

impl std::error::Error for Failure {}

/// Runs seed `seed` to its end.
///
/// # Errors
/// The invariant the run broke, with its seed.
pub fn run(seed: u64) -> Result<Report, Failure> {
    let mut w = World::new(seed).map_err(|why| Failure {
        seed,
        at: Duration::ZERO,
        why,
    })?;
    w.run().map_err(|why| Failure {
        seed,
        at: w.elapsed(),
        why,
    })
}

struct World {
    clock: Clock,
    start: Instant,
    wire: Wire,
    client: Host,
    client_ep: Ep,
    app: app::Client,
    servers: Vec<(Host, Ep, CorePeers)>,
    echo: Vec<app::Server>,
    /// When the client moves to a new port: after this many bytes have come back.
    moves: Vec<u64>,
    migrations: usize,
    home: Option<usize>,
    /// How the server saw the connection end, once it did.
    server_end: Option<String>,
    /// The most congestion events each end's connection had counted (client, server).
    congestion: [u64; 2],
    buf: Vec<u8>,
}

impl World {
    fn new(seed: u64) -> Result<World, String> {
        let mut rng = SplitMix64(seed);
        let (server_config, client_config) = configs()?;
        let clock = Clock::virtual_clock();
        let start = clock.now();
        // The server's cores share the run's master key, as a runtime's do.
        let key = [rng.draw(), rng.draw()];
        let bells = (0..2)
            .map(|_| crate::handoff::Doorbell::new().map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        // The runtime's handoff rings, one each way: core 0's inbound is what core 1 sends.
        let (p01, c01) = crate::handoff::channel(256, 0);
        let (p10, c10) = crate::handoff::channel(256, 0);
        let mut rings = vec![(c10, vec![None, Some(p01)]), (c01, vec![Some(p10), None])];
        let mut servers = Vec::new();
        for core in 0..2 {
            let cfg = StackConfig {
                seed: Some(rng.draw()),
                key: Some(key),
                core,
                cores: 2,
                ..StackConfig::default()
            };
            let mut host = Host::new(SERVER_MAC, 1, cfg);
            let (inbound, outbound) = rings.remove(0);
            let peers = CorePeers::new(core, vec![inbound], outbound, bells.clone());
            let (sock, _) = host.stack.bind_udp(PORT).map_err(|e| e.to_string())?;
            host.stack
                .udp_steer_quic(sock, true)
                .map_err(|e| e.to_string())?;
            let steer = host.stack.quic_cid_steer();
            let cid_seed = rng.draw();
            let ep = state_machine(
                host.stack.quic_keys(),
                Some(server_config.clone()),
                move || CoreCids::with_nonces(steer, SplitMix64(cid_seed)),
                Some(seed_bytes(rng.draw())),
            );
            let ep = Ep {
                st: State::new(ep, clock.clone()),
                socks: vec![sock],
                timer: None,
            };
            servers.push((host, ep, peers));
        }
        let mut client = Host::new(
            CLIENT_MAC,
            2,
            StackConfig {
                seed: Some(rng.draw()),
                ..StackConfig::default()
            },
        );
        let (sock, _) = client.stack.bind_udp(0).map_err(|e| e.to_string())?;
        let steer = client.stack.quic_cid_steer();
        let cid_seed = rng.draw();
        let ep = state_machine(
            client.stack.quic_keys(),
            None,
            move || CoreCids::with_nonces(steer, SplitMix64(cid_seed)),
            Some(seed_bytes(rng.draw())),
        );
        let mut st = State::new(ep, clock.clone());
        let h = st
            .connect(client_config, server_addr(), "localhost")
            .map_err(|e| e.to_string())?;
        let streams = 1 + rng.below(3) as usize;
        let sizes: Vec<usize> = (0..streams)
            .map(|_| rng.below(96 * 1024) as usize)
            .collect();
        let app = app::Client::new(h, sizes, rng.draw() as u8);
        let total = app.bytes();
        let moves = match rng.below(4) {
            0 => Vec::new(),
            1 | 2 => vec![rng.below(total + 1)],
            _ => {
                let mut m = vec![rng.below(total + 1), rng.below(total + 1)];
                m.sort_unstable();
                m
            }
        };
        let imp = Impairments::draw(&mut rng);
        Ok(World {
            wire: Wire::new(imp, rng.draw()),
            clock,
            start,
            client,
            client_ep: Ep {
                st,
                socks: vec![sock],
                timer: None,
            },
            app,
            servers,
            echo: vec![app::Server::default(), app::Server::default()],
            moves,
            migrations: 0,
            home: None,
            server_end: None,
            congestion: [0; 2],
            buf: vec![0; 65536],
        })
    }

    fn elapsed(&self) -> Duration {
        self.clock.now() - self.start
    }

    fn stack_now(&self) -> StackInstant {
        StackInstant::from_micros(self.elapsed().as_micros() as i64)
    }

    fn run(&mut self) -> Result<Report, String> {
        let mut steps = 0u64;
        while !self.finished() {
            steps += 1;
            if steps > MAX_STEPS || self.elapsed() > LIMIT {
                return Err(format!(
                    "not done after {steps} steps and {:?}: {} of {} bytes back, client closed: {}",
                    self.elapsed(),
                    self.app.read_back(),
                    self.app.bytes(),
                    self.app.closed
                ));
            }
            if !self.step()? && !self.finished() {
                self.wait()?;
            }
        }
        self.end()
    }

    /// The client closed, and both ends have let the connection go.
    fn finished(&self) -> bool {
        self.app.closed
            && self.client_ep.st.conns.is_empty()
            && self.servers.iter().all(|(_, ep, _)| ep.st.conns.is_empty())
    }

    /// One step at the current time: the wire delivers, the stacks take frames in, the
    /// endpoints read, the applications act, the endpoints send, the stacks send, and the
    /// wire takes what they sent. True when anything moved.
    fn step(&mut self) -> Result<bool, String> {
        let now = self.clock.now();
        let at = self.elapsed();
        let snow = self.stack_now();
        let mut moved = false;
        while let Some((to, bytes)) = self.wire.due(at) {
            let port = match to {
                To::Client => &mut self.client.wire,
                To::Core(k) => &mut self.servers[k].0.wire,
            };
            // No room at the receiver: lost there, as a NIC drops it.
            let _ = port.inject(&bytes);
            moved = true;
        }
        moved |= self.turns(snow);
        // The endpoints read what came.
        moved |= read(&mut self.client, &mut self.client_ep, now, &mut self.buf);
        for (host, ep, _) in &mut self.servers {
            moved |= read(host, ep, now, &mut self.buf);
        }
        // The applications.
        self.app.run(&mut self.client_ep.st, now)?;
        for (k, (_, ep, _)) in self.servers.iter_mut().enumerate() {
            self.echo[k].run(&mut ep.st)?;
        }
        self.maybe_move()?;
        // The passes, and what they send.
        moved |= pass(&mut self.client, &mut self.client_ep, now);
        for (host, ep, _) in &mut self.servers {
            moved |= pass(host, ep, now);
        }
        moved |= self.turns(snow);
        let mut sent = std::collections::VecDeque::new();
        self.client.pipe.dev.io_mut().take_sent(&mut sent);
        for b in sent.drain(..) {
            self.wire.send(at, true, b);
            moved = true;
        }
        for (host, _, _) in &mut self.servers {
            host.pipe.dev.io_mut().take_sent(&mut sent);
        }
        for b in sent.drain(..) {
            self.wire.send(at, false, b);
            moved = true;
        }
        self.check()?;
        Ok(moved)
    }

    fn turns(&mut self, now: StackInstant) -> bool {
        let mut moved = self.client.turn(now, &mut Alone);
        for (host, _, peers) in &mut self.servers {
            moved |= host.turn(now, peers);
        }
        moved
    }

    /// The client moves to a new port once the echoes have come back this far.
    fn maybe_move(&mut self) -> Result<(), String> {
        let connected = self
            .client_ep
            .st
            .conns
            .get(&self.app.h)
            .is_some_and(|c| c.connected);
        if !connected || self.app.closed {
            return Ok(());
        }
        if self
            .moves
            .first()
            .is_some_and(|&m| self.app.read_back() >= m)
        {
            self.moves.remove(0);
            let (sock, _) = self.client.stack.bind_udp(0).map_err(|e| e.to_string())?;
            self.client_ep.socks.push(sock);
            self.migrations += 1;
        }
        Ok(())
    }

    /// Nothing moved: the clock goes to the next thing due.
    fn wait(&mut self) -> Result<(), String> {
        let at = self.elapsed();
        let mut next: Vec<Duration> = self.wire.next().into_iter().collect();
        for ep in std::iter::once(&self.client_ep).chain(self.servers.iter().map(|s| &s.1)) {
            if let Some(t) = ep.timer {
                next.push(t.saturating_duration_since(self.start));
            }
        }
        // What each host's core would sleep until, idle (the driver's nap reads the same).
        for host in
            std::iter::once(&mut self.client).chain(self.servers.iter_mut().map(|s| &mut s.0))
        {
            if let Some(t) = host.stack.sleep_deadline() {
                next.push(Duration::from_micros(t.total_micros().max(0) as u64));
            }
        }
        let Some(t) = next.into_iter().min() else {
            return Err(format!(
                "nothing is due and the run is not done: the client holds {} connections \
                 (closed: {}, {} of {} bytes back), the cores {:?}",
                self.client_ep.st.conns.len(),
                self.app.closed,
                self.app.read_back(),
                self.app.bytes(),
                self.servers
                    .iter()
                    .map(|s| s.1.st.conns.len())
                    .collect::<Vec<_>>()
            ));
        };
        let step = t.saturating_sub(at).max(Duration::from_micros(1));
        self.clock.advance(step);
        Ok(())
    }

    fn congestion_events(&self) -> u64 {
        self.congestion.iter().sum()
    }

    /// The invariants after every step.
    fn check(&mut self) -> Result<(), String> {
        let ends = std::iter::once(&self.client_ep).chain(self.servers.iter().map(|s| &s.1));
        for (i, ep) in ends.enumerate() {
            if ep.st.timers_held() > ep.st.conns.len() {
                return Err(format!(
                    "an endpoint holds {} timers for {} connections",
                    ep.st.timers_held(),
                    ep.st.conns.len()
                ));
            }
            for c in ep.st.conns.values() {
                let seen = c.c.stats().path.congestion_events;
                let k = usize::from(i > 0);
                self.congestion[k] = self.congestion[k].max(seen);
            }
        }
        let holding: Vec<usize> = (0..2)
            .filter(|&k| !self.servers[k].1.st.conns.is_empty())
            .collect();
        match (holding.as_slice(), self.home) {
            ([], _) => {}
            ([k], None) => self.home = Some(*k),
            ([k], Some(h)) if *k == h => {}
            _ => {
                return Err(format!(
                    "the connection is held by cores {holding:?} (it began on {:?})",
                    self.home
                ));
            }
        }
        let client = &self.client_ep.st;
        let lost = client.conns.get(&self.app.h).and_then(|c| c.lost.clone());
        let lost = lost.or_else(|| {
            client
                .ended
                .iter()
                .find(|e| e.0 == self.app.h)
                .map(|e| e.1.clone())
        });
        if let Some(lost) = lost
            && !self.app.closed
        {
            return Err(format!("the client lost its connection: {lost}"));
        }
        if let Some(h) = self.home {
            let st = &self.servers[h].1.st;
            let lost = st.conns.values().find_map(|c| c.lost.clone());
            if let Some(lost) = lost.or_else(|| st.ended.first().map(|e| e.1.clone())) {
                if !self.app.closed {
                    return Err(format!("the server lost the connection: {lost}"));
                }
                self.server_end.get_or_insert_with(|| lost.to_string());
            }
        }
        for k in (0..2).filter(|&k| Some(k) != self.home) {
            if let Some((_, why)) = self.servers[k].1.st.ended.first() {
                return Err(format!(
                    "core {k}, which holds no connection, ended one: {why}"
                ));
            }
        }
        Ok(())
    }

    /// The end: every stream back, every handoff taken, every frame of every host back.
    fn end(&mut self) -> Result<Report, String> {
        if !self.app.all_back() {
            return Err("the client closed before every echo was back".into());
        }
        let snow = self.stack_now();
        let mut steered = 0;
        for (k, (host, _, _)) in self.servers.iter_mut().enumerate() {
            let s = host.stack.stats();
            if s.handoff_dropped != 0 {
                return Err(format!("core {k} dropped {} handoffs", s.handoff_dropped));
            }
            steered += s.udp.steered;
        }
        if self.migrations == 0 && steered != 0 {
            return Err(format!("{steered} datagrams steered with no move"));
        }
        for (name, host) in std::iter::once(("client", &mut self.client))
            .chain(self.servers.iter_mut().map(|s| ("a server core", &mut s.0)))
        {
            let counts = host
                .stack
                .shutdown(snow, &mut host.pipe.dev)
                .map_err(|e| e.to_string())?;
            if counts.in_use != 0 {
                return Err(format!("{name} holds {} frames at the end", counts.in_use));
            }
        }
        let w = self.wire.stats;
        Ok(Report {
            streams: self.app.streams(),
            bytes: self.app.bytes(),
            migrations: self.migrations,
            steered,
            home: self.home.unwrap_or(0),
            frames: w.frames,
            lost: w.lost,
            duplicated: w.duplicated,
            reordered: w.reordered,
            ce_marked: w.ce_marked,
            congestion_events: self.congestion_events(),
            clean: w.lost + w.reordered + w.duplicated == 0,
            server_end: self.server_end.clone().unwrap_or_default(),
            took: self.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests;
