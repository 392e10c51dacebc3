//! Raising or lowering an interface's receive queues for a run, and putting them back afterwards.

use std::sync::Arc;

use corelane_topo::Plan;
use corelane_xsk::Channels;

/// Receive queues the interface must have for the plan: one past the highest lane queue.
pub(crate) fn queues_needed(plan: &Plan) -> u32 {
    plan.lanes.iter().map(|l| l.queue + 1).max().unwrap_or(1)
}

/// Puts an interface's queues back as they were when the runtime ends; the claim records the
/// old count meanwhile, so a process that dies has it put back by the next runtime.
pub(crate) struct RestoreQueues {
    pub(crate) ifname: String,
    pub(crate) old: std::sync::Mutex<Option<Channels>>,
    pub(crate) claim: Option<Arc<corelane_xsk::Claim>>,
}

impl RestoreQueues {
    pub(crate) fn new(
        ifname: &str,
        old: Option<Channels>,
        claim: Option<Arc<corelane_xsk::Claim>>,
    ) -> Self {
        if let (Some(_), Some(c)) = (old, &claim) {
            c.note_channels(old);
        }
        RestoreQueues {
            ifname: ifname.to_string(),
            old: std::sync::Mutex::new(old),
            claim,
        }
    }

    /// The queues to put back at the end (None: nothing changed).
    pub(crate) fn channels(&self) -> Option<Channels> {
        *crate::lock::lock(&self.old)
    }

    /// The new process of an upgrade puts the queues back when it ends: not this one.
    pub(crate) fn hand_on(&self) {
        crate::lock::lock(&self.old).take();
    }
}

impl Drop for RestoreQueues {
    fn drop(&mut self) {
        let Some(old) = crate::lock::lock(&self.old).take() else {
            return;
        };
        // The driver refuses fewer queues while the XDP program is attached; its link can
        // outlive our close for a moment (a child process forked by another thread holds the
        // descriptor until it execs), so a refusal is retried for up to a second.
        match corelane_xsk::set_channels_retrying(&self.ifname, old) {
            Ok(()) => {
                if let Some(c) = &self.claim {
                    c.note_channels(None);
                }
            }
            Err(e) => tracing::warn!("{}: restoring its queues failed: {e}", self.ifname),
        }
    }
}
