//! The program in memory: the maps [`Steering`] writes (owned addresses and ports, the sockets
//! of each generation, the upgrade's split and the connections an old generation keeps), held
//! in this process, and the steering decision `crates/corelane-xsk/xdp/corelane.bpf.c` makes from them
//! ([`MemProgram::receive`]), so that what the runtime writes to the program (a port bound, an
//! upgrade's switch, a kept connection) decides where a simulation's frames go, as the real
//! program's maps decide it on a device.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};

use corelane_frame::Proto;

use super::mem_model::{Owned, Steer};
use super::{Program, Steering, SteeringShare, XdpCounters};
use crate::error::Error;
use crate::program::AttachedMode;
use crate::socket::sim::SimKernel;

/// The in-memory program's maps, shared by every [`Steering`] made over it (the old and the
/// new process of an upgrade steer with the same program) and by the simulation that asks it
/// where a frame goes. Cheap to clone: the clones are the same program.
#[derive(Debug, Clone, Default)]
pub struct MemProgram {
    maps: Arc<Mutex<Maps>>,
}

#[derive(Debug, Default)]
struct Maps {
    /// Owned addresses -> shared with the kernel.
    owned: HashMap<IpAddr, bool>,
    tcp_ports: HashSet<u16>,
    udp_ports: HashSet<u16>,
    /// (generation, queue) -> the socket's descriptor.
    xsks: HashMap<(u32, u32), RawFd>,
    /// The generation that gets the frames, and whether the split is on.
    upgrade: (u32, bool),
    /// (peer, local port) -> the generation that keeps the connection.
    old_flows: HashMap<(SocketAddr, u16), u32>,
    /// Each queue's in-memory kernel.
    queues: HashMap<u32, SimKernel>,
    /// What ARP frames to a shared address said of their senders (the `neighbours` map).
    neighbours: HashMap<IpAddr, [u8; 6]>,
    /// TCP ports whose bare SYNs the program answers with cookies, and the interface's
    /// hardware address (the program answers only frames sent to it).
    cookie_ports: HashSet<u16>,
    mac: Option<[u8; 6]>,
    counters: XdpCounters,
}

/// What the program did with a frame ([`MemProgram::receive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Redirected to generation `.0`'s socket, which took it.
    Steered(u32),
    /// Redirected, but the socket dropped it (no fill-ring entry, its RX ring full) or the
    /// generation has no socket on the queue.
    Dropped,
    /// Not this program's: given to the kernel (a simulation's kernel answers nothing).
    Passed,
}

impl MemProgram {
    /// A program with empty maps.
    pub fn new() -> MemProgram {
        MemProgram::default()
    }

    fn maps(&self) -> MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A [`Steering`] over these maps, as [`Steering::attach`] gives one over a device's.
    pub fn steering(&self, ifname: &str) -> Steering {
        Steering::over(ifname, AttachedMode::Generic, None, Box::new(self.clone()))
    }

    /// Frames arriving on `queue` are received by `kernel`'s sockets.
    pub fn add_queue(&self, queue: u32, kernel: SimKernel) {
        self.maps().queues.insert(queue, kernel);
    }

    /// The generation that gets frames now, and whether the split is on.
    pub fn upgrade(&self) -> (u32, bool) {
        self.maps().upgrade
    }

    /// The interface's hardware address, in the program's `iface` entry: the program answers
    /// only frames sent to it (its SYN cookies here).
    pub fn set_mac(&self, mac: [u8; 6]) {
        self.maps().mac = Some(mac);
    }

    /// Has the program answer bare SYNs to TCP `port` with cookies (the `tcp_ports` entry's
    /// cookie bit), or stop. Such SYNs are then not steered.
    pub fn set_cookie_port(&self, port: u16, on: bool) {
        let mut m = self.maps();
        if on {
            m.cookie_ports.insert(port);
        } else {
            m.cookie_ports.remove(&port);
        }
    }

    /// How many connections the program keeps for an old generation.
    pub fn kept_flows(&self) -> usize {
        self.maps().old_flows.len()
    }

    /// Where the program sends `frame` arriving on `queue`, as the XDP program decides: ARP
    /// for an owned IPv4 address, and TCP or UDP to an owned address and port, go to the
    /// current generation's socket, except a kept connection's TCP segments while the split
    /// is on; everything else is passed.
    pub fn receive(&self, queue: u32, frame: &[u8]) -> Verdict {
        let mut m = self.maps();
        m.note_neighbour(frame);
        let Some(generation) = m.decide(frame) else {
            m.counters.passed += 1;
            return Verdict::Passed;
        };
        let fd = m.xsks.get(&(generation, queue)).copied();
        let kernel = m.queues.get(&queue).cloned();
        let took = match (fd, kernel) {
            (Some(fd), Some(k)) => k.deliver_to_fd(fd, frame),
            _ => false,
        };
        if took {
            m.counters.steered += 1;
            Verdict::Steered(generation)
        } else {
            m.counters.no_socket += 1;
            Verdict::Dropped
        }
    }
}

const ETH: usize = 14;

impl Maps {
    /// Notes what an ARP reply to a shared address says of its sender, as the program does (a
    /// request, from any source, is not noted).
    fn note_neighbour(&mut self, f: &[u8]) {
        let (Some(kind), Some(arp)) = (f.get(12..14), f.get(ETH..ETH + 28)) else {
            return;
        };
        let target = IpAddr::V4(Ipv4Addr::new(arp[24], arp[25], arp[26], arp[27]));
        if kind != [0x08, 0x06] || arp[6..8] != [0, 2] || self.owned.get(&target) != Some(&true) {
            return;
        }
        let mac: [u8; 6] = [arp[8], arp[9], arp[10], arp[11], arp[12], arp[13]];
        if mac[0] & 1 == 0 && mac != [0; 6] {
            let sender = IpAddr::V4(Ipv4Addr::new(arp[14], arp[15], arp[16], arp[17]));
            self.neighbours.insert(sender, mac);
        }
    }

    /// The generation whose socket gets `frame`, or None (passed): the program's decision
    /// (`mem_model.rs`), and for a kept connection during an upgrade's split, its generation.
    fn decide(&self, f: &[u8]) -> Option<u32> {
        let current = self.upgrade.0;
        match super::mem_model::steer(self, f) {
            Steer::No => None,
            Steer::Yes => Some(current),
            Steer::Flow(peer, port) => match self.old_flows.get(&(peer, port)) {
                Some(&g) if self.upgrade.1 => Some(g),
                _ => Some(current),
            },
        }
    }
}

impl Owned for Maps {
    fn addr(&self, ip: IpAddr) -> Option<bool> {
        self.owned.get(&ip).copied()
    }

    fn tcp(&self, port: u16) -> bool {
        self.tcp_ports.contains(&port)
    }

    fn udp(&self, port: u16) -> bool {
        self.udp_ports.contains(&port)
    }

    fn cookies(&self, port: u16) -> bool {
        self.cookie_ports.contains(&port)
    }

    fn mac(&self) -> Option<[u8; 6]> {
        self.mac
    }
}

impl MemProgram {
    #[cfg(test)]
    fn own_addr(&self, addr: IpAddr, on: bool) {
        self.own_addr_as(addr, on, false);
    }

    fn own_addr_as(&self, addr: IpAddr, on: bool, shared: bool) {
        let mut m = self.maps();
        if on {
            m.owned.insert(addr, shared);
        } else {
            m.owned.remove(&addr);
        }
    }

    fn ports(&self, proto: Proto, port: u16, on: bool) {
        let mut m = self.maps();
        let set = match proto {
            Proto::Tcp => &mut m.tcp_ports,
            Proto::Udp => &mut m.udp_ports,
        };
        if on {
            set.insert(port);
        } else {
            set.remove(&port);
        }
    }
}

impl Program for MemProgram {
    fn own_addr(&mut self, addr: IpAddr, shared: bool) -> Result<(), Error> {
        self.own_addr_as(addr, true, shared);
        Ok(())
    }

    fn disown_addr(&mut self, addr: IpAddr) -> Result<(), Error> {
        self.own_addr_as(addr, false, false);
        Ok(())
    }

    fn set_port(&mut self, proto: Proto, port: u16, on: bool) -> Result<(), Error> {
        self.ports(proto, port, on);
        Ok(())
    }

    fn register_in(&mut self, generation: u32, queue: u32, fd: RawFd) -> Result<(), Error> {
        self.maps().xsks.insert((generation, queue), fd);
        Ok(())
    }

    fn set_upgrade(&mut self, current: u32, split: bool) -> Result<(), Error> {
        self.maps().upgrade = (current, split);
        Ok(())
    }

    fn upgrade_state(&mut self) -> Result<(u32, bool), Error> {
        Ok(self.upgrade())
    }

    fn keep_flow(&mut self, peer: SocketAddr, port: u16, generation: u32) -> Result<(), Error> {
        let mut m = self.maps();
        if m.old_flows.len() >= super::MAX_OLD_FLOWS as usize {
            return Err(Error::Config(format!(
                "old_flows: full ({} connections)",
                super::MAX_OLD_FLOWS
            )));
        }
        m.old_flows.insert((peer, port), generation);
        Ok(())
    }

    fn forget_flow(&mut self, peer: SocketAddr, port: u16) -> Result<(), Error> {
        self.maps().old_flows.remove(&(peer, port));
        Ok(())
    }

    fn clear_flows(&mut self) -> Result<usize, Error> {
        let mut m = self.maps();
        let n = m.old_flows.len();
        m.old_flows.clear();
        Ok(n)
    }

    fn counters(&self) -> Result<XdpCounters, Error> {
        Ok(self.maps().counters)
    }

    fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        self.maps().neighbours.get(&ip).copied()
    }

    /// The old and the new process of an upgrade steer with the same in-memory program.
    fn share(&mut self, _mode: AttachedMode) -> Result<SteeringShare, Error> {
        Err(Error::Config(
            "sharing the program needs a device's program, not the in-memory one".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame of `kind` carrying `body`.
    fn eth(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&kind.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    /// An IPv4 packet from 10.0.0.2 to `dst` of `proto` carrying `l4`.
    fn ip4(dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 2];
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(l4);
        eth(0x0800, &ip)
    }

    fn ports(src: u16, dst: u16) -> Vec<u8> {
        let mut p = src.to_be_bytes().to_vec();
        p.extend_from_slice(&dst.to_be_bytes());
        p.extend_from_slice(&[0; 16]);
        p
    }

    fn arp_for(target: [u8; 4]) -> Vec<u8> {
        let mut a = vec![
            0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 2, 10, 0, 0, 2, 0, 0, 0, 0, 0, 0,
        ];
        a.extend_from_slice(&target);
        eth(0x0806, &a)
    }

    /// An ARP reply from 10.0.0.2 at 02:00:00:00:00:02 to `target`.
    fn arp_reply_for(target: [u8; 4]) -> Vec<u8> {
        let mut f = arp_for(target);
        f[ETH + 7] = 2;
        f
    }

    #[test]
    fn a_shared_address_is_corelane_s_only_for_its_ports_and_the_errors_about_them() {
        let p = MemProgram::new();
        let (own, shared) = ([10, 0, 0, 3], [10, 0, 0, 1]);
        p.own_addr(IpAddr::from(own), true);
        p.own_addr_as(IpAddr::from(shared), true, true);
        p.ports(Proto::Tcp, 80, true);
        p.ports(Proto::Udp, 53, true);
        // No socket here: what the program would steer comes back Dropped, the rest Passed.
        let verdict = |f: &[u8]| p.receive(0, f);
        assert_eq!(
            verdict(&arp_for(own)),
            Verdict::Dropped,
            "ARP for an owned address"
        );
        assert_eq!(
            verdict(&arp_for(shared)),
            Verdict::Passed,
            "the kernel's ARP"
        );
        assert_eq!(verdict(&ip4(shared, 6, &ports(5000, 80))), Verdict::Dropped);
        assert_eq!(
            verdict(&ip4(shared, 17, &ports(5000, 53))),
            Verdict::Dropped
        );
        assert_eq!(
            verdict(&ip4(shared, 6, &ports(5000, 22))),
            Verdict::Passed,
            "ssh"
        );
        // ICMP: an error quoting a segment from corelane's port is corelane's; ping and errors
        // about the kernel's flows are the kernel's.
        let error_about = |sport: u16| {
            let mut icmp = vec![3, 4, 0, 0, 0, 0, 0, 0];
            icmp.extend_from_slice(&ip4([10, 0, 0, 2], 6, &ports(sport, 443))[14..]);
            ip4(shared, 1, &icmp)
        };
        assert_eq!(verdict(&error_about(80)), Verdict::Dropped);
        assert_eq!(verdict(&error_about(22)), Verdict::Passed);
        let ping = ip4(shared, 1, &[8, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0]);
        assert_eq!(verdict(&ping), Verdict::Passed);
        assert_eq!(
            verdict(&ip4(own, 1, &[8, 0, 0, 0, 0, 1, 0, 1])),
            Verdict::Dropped
        );
    }

    #[test]
    fn a_steering_over_the_program_learns_a_shared_address_s_neighbours_from_the_kernel_s_arp() {
        let p = MemProgram::new();
        let mut steering = p.steering("sim0");
        let (own, shared) = ([10, 0, 0, 3], [10, 0, 0, 1]);
        steering.own_addr(IpAddr::from(own)).unwrap();
        assert!(!steering.has_shared());
        steering.own_shared_addr(IpAddr::from(shared)).unwrap();
        assert!(steering.has_shared() && steering.is_shared(IpAddr::from(shared)));
        let peer = IpAddr::from([10, 0, 0, 2]);
        assert_eq!(steering.shared_neighbour(peer), None);
        // ARP to the owned address is the stack's, and noted nowhere; to the shared address it
        // is the kernel's, and what a reply says of its sender is noted. A request (anyone can
        // send one, from any source) is not.
        assert_eq!(p.receive(0, &arp_reply_for(own)), Verdict::Dropped);
        assert_eq!(steering.shared_neighbour(peer), None);
        assert_eq!(p.receive(0, &arp_for(shared)), Verdict::Passed);
        assert_eq!(
            steering.shared_neighbour(peer),
            None,
            "a request is not noted"
        );
        assert_eq!(p.receive(0, &arp_reply_for(shared)), Verdict::Passed);
        assert_eq!(steering.shared_neighbour(peer), Some([2, 0, 0, 0, 0, 2]));
        // A sender claiming a group address is not noted.
        let mut group = arp_reply_for(shared);
        group[14 + 8] = 1;
        group[14 + 17] = 9;
        p.receive(0, &group);
        assert_eq!(steering.shared_neighbour(IpAddr::from([10, 0, 0, 9])), None);
    }
}
