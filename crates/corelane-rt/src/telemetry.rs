//! What a run tells its operator besides its report: the live statistics' writer, the
//! Prometheus endpoint, and warnings said once each.

use std::sync::Mutex;

use crate::lock::lock;

/// The run's telemetry, owned by the control plane and removed with the runtime.
#[derive(Default)]
pub(crate) struct Telemetry {
    /// Conditions an operator must hear of even without a log subscriber, once each: kept for
    /// the run's report.
    warnings: Mutex<Vec<String>>,
    /// The live statistics' writer.
    pub(crate) publisher: Option<corelane_stat::Publisher>,
    /// The Prometheus endpoint's thread, stopped with the runtime.
    _metrics: Option<crate::metrics::Metrics>,
}

impl Telemetry {
    pub(crate) fn new(
        publisher: Option<corelane_stat::Publisher>,
        metrics: Option<crate::metrics::Metrics>,
    ) -> Telemetry {
        Telemetry {
            warnings: Mutex::new(Vec::new()),
            publisher,
            _metrics: metrics,
        }
    }

    /// Logs `message` (and, when no tracing subscriber was ever installed, prints it to
    /// stderr) and keeps it for the run's report, unless the same was said before.
    pub(crate) fn warn_once(&self, message: String) {
        let mut w = lock(&self.warnings);
        if !w.contains(&message) {
            tracing::warn!("{message}");
            // With no subscriber installed the warning would go nowhere: a user who did not
            // set up logging still sees it.
            if !tracing::dispatcher::has_been_set() {
                eprintln!("corelane: warning: {message}");
            }
            w.push(message);
        }
    }

    /// The warnings said so far, in order.
    pub(crate) fn warnings(&self) -> Vec<String> {
        lock(&self.warnings).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_kept_once() {
        let t = Telemetry::default();
        t.warn_once("queue 3 unserved".into());
        t.warn_once("queue 3 unserved".into());
        t.warn_once("checksums off".into());
        assert_eq!(t.warnings(), ["queue 3 unserved", "checksums off"]);
    }
}
