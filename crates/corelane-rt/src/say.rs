//! What the runtime logs reaches someone, subscriber or not.
//!
//! corelane reports through `tracing`. An application that installed no subscriber would lose
//! every warning and error (a core that failed, a fallback to generic XDP, a refused upgrade),
//! and a library user does not know to install one. So the threads of a run (its cores, the
//! application threads, the privileged thread) carry the subscriber of the thread that built
//! or ran it, its own scoped one included (tracing's `has_been_set` cannot tell a global one
//! from a scoped one), and where that is none, a plain writer of corelane's warnings and
//! errors to stderr, one line each. `CORELANE_LOG=off` silences it,
//! `info` or `debug` says more.

use std::fmt::Write as _;
use std::io::Write as _;

use tracing::dispatcher::{DefaultGuard, Dispatch};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The dispatcher for the threads of a run: the calling thread's (a global one, or its own
/// scoped one), or the stderr writer when that is none (or None: `CORELANE_LOG=off`).
pub(crate) fn dispatch() -> Option<Dispatch> {
    let current = tracing::dispatcher::get_default(Dispatch::clone);
    if !current.is::<tracing::subscriber::NoSubscriber>() {
        return Some(current);
    }
    let level = match std::env::var("CORELANE_LOG").ok().as_deref() {
        Some("off") => return None,
        Some("info") => Level::INFO,
        Some("debug") => Level::DEBUG,
        Some("trace") => Level::TRACE,
        _ => Level::WARN,
    };
    Some(Dispatch::new(StderrLines { level }))
}

/// Makes `d` this thread's default until the guard drops.
pub(crate) fn enter(d: &Option<Dispatch>) -> Option<DefaultGuard> {
    d.as_ref().map(tracing::dispatcher::set_default)
}

/// corelane's events at `level` or above, as `corelane WARN [thread]: message key=value`.
struct StderrLines {
    level: Level,
}

struct Line(String);

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for StderrLines {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() <= self.level && m.target().starts_with("corelane")
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::from_level(self.level))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, e: &Event<'_>) {
        let mut line = Line(String::new());
        e.record(&mut line);
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("corelane");
        // One write per line: lines of two cores do not interleave.
        let text = format!("corelane {} [{name}]: {}\n", e.metadata().level(), line.0);
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_subscriber_the_run_s_threads_get_the_stderr_writer() {
        let Some(d) = dispatch() else {
            panic!("no dispatcher for a run's threads")
        };
        assert!(d.is::<StderrLines>());
        // An application's own (here a scoped one) is carried instead.
        let mine = Dispatch::new(StderrLines {
            level: Level::ERROR,
        });
        tracing::dispatcher::with_default(&mine, || {
            let carried = dispatch();
            let Some(s) = carried
                .as_ref()
                .and_then(|c| c.downcast_ref::<StderrLines>())
            else {
                panic!("the application's dispatcher was not carried")
            };
            assert_eq!(s.level, Level::ERROR, "the application's, not a new one");
        });
    }

    #[test]
    fn only_corelane_s_events_at_the_level_pass() {
        let s = StderrLines { level: Level::WARN };
        let d = Dispatch::new(s);
        tracing::dispatcher::with_default(&d, || {
            assert!(tracing::enabled!(target: "corelane_rt::x", Level::WARN));
            assert!(tracing::enabled!(target: "corelane_rt::x", Level::ERROR));
            assert!(!tracing::enabled!(target: "corelane_rt::x", Level::INFO));
            assert!(!tracing::enabled!(target: "hyper::proto", Level::ERROR));
        });
    }
}
