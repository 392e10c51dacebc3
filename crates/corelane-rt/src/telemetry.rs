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

    /// Logs `message` (and, when the application's logging would not show a warning, prints
    /// it to stderr) and keeps it for the run's report, unless the same was said before.
    pub(crate) fn warn_once(&self, message: String) {
        let mut w = lock(&self.warnings);
        if !w.contains(&message) {
            tracing::warn!("{message}");
            // These warnings mean that nothing will work (bad checksums from every peer, a
            // queue nobody serves): with no subscriber, or one that shows errors only, the
            // operator must still see them.
            if !warnings_logged() {
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

/// Whether a warning logged here reaches the application's log: a subscriber is installed
/// and its level lets warnings through.
fn warnings_logged() -> bool {
    tracing::enabled!(tracing::Level::WARN)
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

    /// A subscriber that shows events up to `0` (ERROR shows least).
    struct UpTo(tracing::Level);

    impl tracing::Subscriber for UpTo {
        fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
            *m.level() <= self.0
        }
        fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
            Some(tracing::level_filters::LevelFilter::from_level(self.0))
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn a_warning_goes_to_stderr_too_when_the_log_level_would_hide_it() {
        // An application that shows errors only (where a hanging server printed nothing).
        tracing::subscriber::with_default(UpTo(tracing::Level::ERROR), || {
            assert!(!warnings_logged(), "hidden by the level: printed to stderr");
        });
        tracing::subscriber::with_default(UpTo(tracing::Level::INFO), || {
            assert!(warnings_logged(), "logged: not printed twice");
        });
    }
}
