//! The AF_XDP host: [`XskQueue`]'s side of [`UpgradeQueue`] and [`Queue`] (over the kernel's
//! sockets or, with the `sim` feature, the in-memory kernel's), the other process of an
//! upgrade by its pidfd ([`Pidfd`]), and the upgrade's unix-socket sides: the old process's
//! listener and its [`Talk`](super::Talk) (`handover.rs`), the new process's joining
//! (`join.rs`).

use std::os::fd::{OwnedFd, RawFd};

use corelane_xsk::XskQueue;

pub(crate) mod handover;
pub(crate) mod join;

use super::{CallOff, Partner, Queue, UpgradeOffer, UpgradePhase, UpgradeQueue};
use crate::Error;

impl UpgradeQueue for XskQueue {
    fn upgrade_phase(&self) -> Option<UpgradePhase> {
        XskQueue::upgrade_phase(self)
    }

    fn offer_upgrade(&mut self) -> Result<UpgradeOffer, Error> {
        XskQueue::offer_upgrade(self).map_err(Error::from)
    }

    fn call_off_upgrade(&mut self, partner_gone: bool) -> Result<CallOff, Error> {
        XskQueue::call_off_upgrade(self, partner_gone).map_err(Error::from)
    }

    fn stand_down(&mut self) {
        XskQueue::stand_down(self);
    }

    fn upgrade_called_off(&self) -> bool {
        XskQueue::upgrade_called_off(self)
    }

    fn leave_upgrade(&mut self) -> Result<bool, Error> {
        XskQueue::leave_upgrade(self).map_err(Error::from)
    }

    fn outlive_partner(&mut self) -> Result<usize, Error> {
        XskQueue::outlive_partner(self).map_err(Error::from)
    }
}

impl Queue for XskQueue {
    fn wake_fd(&self) -> Option<RawFd> {
        // The in-memory kernel's rings are a memory file: nothing to sleep on.
        #[cfg(any(test, feature = "sim"))]
        if self.in_memory() {
            return None;
        }
        Some(self.fd())
    }

    fn want_rx_stamp(&mut self, not_before_ns: u64) {
        XskQueue::want_rx_stamp(self, not_before_ns);
    }

    fn take_rx_stamp(&mut self) -> Option<u64> {
        XskQueue::take_rx_stamp(self)
    }

    fn tx_in_flight(&self) -> bool {
        XskQueue::tx_in_flight(self)
    }
}

/// The other process of an upgrade, by its pidfd (readable once it has ended), with its pid
/// (for messages).
#[derive(Debug)]
pub(crate) struct Pidfd {
    pub(crate) pid: u32,
    pub(crate) fd: OwnedFd,
}

impl Partner for Pidfd {
    fn ended(&self) -> bool {
        corelane_xsk::grant::process_ended(&self.fd)
    }

    fn kill(&self) -> Result<u32, String> {
        corelane_xsk::grant::kill_process(&self.fd)
            .map(|()| self.pid)
            .map_err(|e| format!("process {} cannot be ended: {e}", self.pid))
    }
}
