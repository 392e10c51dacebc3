//! The AF_XDP queue as the runtime's host queue: [`XskQueue`]'s side of [`UpgradeQueue`] and
//! [`Queue`], over the kernel's sockets or (with the `sim` feature) the in-memory kernel's.

use std::os::fd::RawFd;

use corelane_xsk::XskQueue;

use super::{CallOff, Queue, UpgradeOffer, UpgradePhase, UpgradeQueue};
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
