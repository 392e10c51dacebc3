//! Several AF_XDP queues of one interface served as one [`FrameIo`] by a single thread.
//!
//! A NIC (or a multi-queue veth) spreads flows over its receive queues, and an AF_XDP socket
//! only sees the queue it is bound to; serving every queue is what lets one core see every flow.

use std::collections::VecDeque;
use std::io;

use crate::io::{Frame, FrameIo};
use crate::ledger::FrameCounts;
use crate::socket::{XskFrame, XskQueue};

fn queues_pollfds(queues: &[XskQueue]) -> Vec<libc::pollfd> {
    queues
        .iter()
        .map(|q| libc::pollfd {
            fd: q.fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect()
}

/// A frame of a [`MultiQueue`]: the queue it belongs to and its frame there.
#[derive(Debug)]
pub struct MqFrame {
    queue: u16,
    frame: XskFrame,
}

impl MqFrame {
    /// Position of the queue (in the order the queues were given) this frame belongs to.
    pub fn queue(&self) -> usize {
        self.queue as usize
    }
}

impl Frame for MqFrame {
    fn index(&self) -> usize {
        self.frame.index()
    }
    fn len(&self) -> usize {
        self.frame.len()
    }
}

/// Every queue's socket, polled in turn. Transmit frames come from each queue in turn as they
/// run short, and go out on the queue whose UMEM holds them.
#[derive(Debug)]
pub struct MultiQueue {
    queues: Vec<XskQueue>,
    rx_next: usize,
    tx_next: usize,
    rx_tmp: VecDeque<XskFrame>,
    per_queue: Vec<Vec<XskFrame>>,
    pollfds: Vec<libc::pollfd>,
}

impl MultiQueue {
    /// Serves `queues` (at least one, at most 65,536) together.
    pub fn new(queues: Vec<XskQueue>) -> Self {
        assert!(!queues.is_empty() && queues.len() <= usize::from(u16::MAX) + 1);
        let n = queues.len();
        MultiQueue {
            rx_next: 0,
            tx_next: 0,
            rx_tmp: VecDeque::new(),
            per_queue: (0..n).map(|_| Vec::new()).collect(),
            pollfds: queues_pollfds(&queues),
            queues,
        }
    }

    /// The sockets.
    pub fn queues(&self) -> &[XskQueue] {
        &self.queues
    }

    /// Blocks until any queue has a frame or `timeout_ms` passes (-1: forever).
    pub fn wait(&mut self, timeout_ms: i32) -> io::Result<bool> {
        let fds = &mut self.pollfds;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs for the duration of the
        // call; poll only writes their `revents`.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(rc > 0)
    }

    /// Sorts `frames` by queue and hands each queue its share through `op`; sums what `op`
    /// returns.
    fn per_queue(
        &mut self,
        frames: &mut Vec<MqFrame>,
        mut op: impl FnMut(&mut XskQueue, &mut Vec<XskFrame>) -> io::Result<usize>,
    ) -> io::Result<usize> {
        for f in frames.drain(..) {
            self.per_queue[f.queue as usize].push(f.frame);
        }
        let mut total = 0;
        for (q, v) in self.queues.iter_mut().zip(&mut self.per_queue) {
            if !v.is_empty() {
                total += op(q, v)?;
            }
        }
        Ok(total)
    }
}

impl FrameIo for MultiQueue {
    type Frame = MqFrame;

    fn frame_capacity(&self) -> usize {
        self.queues
            .iter()
            .map(FrameIo::frame_capacity)
            .min()
            .unwrap_or(0)
    }

    fn bytes<'a>(&'a self, frame: &'a MqFrame) -> &'a [u8] {
        self.queues[frame.queue as usize].bytes(&frame.frame)
    }

    fn bytes_mut<'a>(&'a self, frame: &'a mut MqFrame, len: usize) -> &'a mut [u8] {
        self.queues[frame.queue as usize].bytes_mut(&mut frame.frame, len)
    }

    fn recv(&mut self, out: &mut VecDeque<MqFrame>, max: usize) -> usize {
        let n = self.queues.len();
        let mut got = 0;
        for k in 0..n {
            if got >= max {
                break;
            }
            let q = (self.rx_next + k) % n;
            let m = self.queues[q].recv(&mut self.rx_tmp, max - got);
            got += m;
            out.extend(self.rx_tmp.drain(..).map(|frame| MqFrame {
                queue: q as u16,
                frame,
            }));
        }
        // Start with the next queue next time, so a busy queue cannot starve the others.
        self.rx_next = (self.rx_next + 1) % n;
        got
    }

    fn release(&mut self, frames: &mut Vec<MqFrame>) {
        let _ = self.per_queue(frames, |q, v| {
            q.release(v);
            Ok(0)
        });
    }

    fn alloc(&mut self, out: &mut Vec<MqFrame>, n: usize) -> usize {
        let queues = self.queues.len();
        let mut got = 0;
        for k in 0..queues {
            if got >= n {
                break;
            }
            let q = (self.tx_next + k) % queues;
            let tmp = &mut self.per_queue[q];
            let m = self.queues[q].alloc(tmp, n - got);
            got += m;
            out.extend(tmp.drain(..).map(|frame| MqFrame {
                queue: q as u16,
                frame,
            }));
            if m > 0 {
                self.tx_next = q;
            }
        }
        got
    }

    fn free(&mut self, frames: &mut Vec<MqFrame>) {
        let _ = self.per_queue(frames, |q, v| {
            q.free(v);
            Ok(0)
        });
    }

    fn send(&mut self, frames: &mut Vec<MqFrame>) -> io::Result<usize> {
        self.per_queue(frames, |q, v| q.send(v))
    }

    fn complete(&mut self) -> io::Result<usize> {
        let mut n = 0;
        for q in &mut self.queues {
            n += q.complete()?;
        }
        Ok(n)
    }

    fn counts(&mut self) -> FrameCounts {
        let mut c = FrameCounts::default();
        for q in &mut self.queues {
            let k = q.counts();
            c.free += k.free;
            c.fill += k.fill;
            c.rx += k.rx;
            c.in_use += k.in_use;
            c.tx += k.tx;
            c.completion += k.completion;
            c.total += k.total;
        }
        c
    }
}
