//! The runtime's error type.

use std::io;

use corelane_stack::StackError;

/// Errors of the runtime. `Debug` prints what `Display` does, then each underlying cause, so a
/// `main() -> Result<(), corelane::Error>` that fails prints a sentence, not a structure dump.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the AF_XDP layer: privileges, interface, XDP mode, socket binding.
    #[error(transparent)]
    Xsk(#[from] crate::host::data::XskError),
    /// From the protocol stage.
    #[error(transparent)]
    Stack(#[from] StackError),
    /// Bad configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The machine could not be read, or the placement does not fit it.
    #[error(transparent)]
    Topology(#[from] corelane_topo::Error),
    /// A core failed to start.
    #[error("core {core} (CPU {cpu}, queue {queue}): {source}")]
    Core {
        /// Core index.
        core: usize,
        /// CPU.
        cpu: usize,
        /// Queue.
        queue: u32,
        /// What failed.
        source: Box<Error>,
    },
    /// The application's task on a core panicked; the core was shut down cleanly.
    #[error("the task on core {core} panicked: {message}")]
    Panicked {
        /// Core index.
        core: usize,
        /// The panic message.
        message: String,
    },
    /// The future of a core returned an error (under
    /// [`Runtime::try_run`](crate::Runtime::try_run)); the run was stopped.
    #[error("the future on core {core} failed: {message}")]
    Failed {
        /// Core index.
        core: usize,
        /// The error, as it displays.
        message: String,
    },
    /// The runtime has ended (or its privileged thread has): what was asked of it can no
    /// longer be done.
    #[error("the runtime has ended: {0}")]
    Ended(String),
    /// A thread of the runtime failed where it cannot go on (a core's thread or its driver
    /// task panicked); a bug in corelane, to be reported with the log.
    #[error("runtime failure: {0}")]
    Internal(String),
    /// The OS refused a call the runtime needs (dropping capabilities, CPU affinity, binding
    /// the metrics endpoint, a lab's memory); what was being done is said, then the OS's
    /// error.
    #[error("{what}: {source}")]
    Os {
        /// What the runtime was doing.
        what: String,
        /// The OS's error.
        source: io::Error,
    },
    /// An upgrade could not be made: the old process kept (or takes back) its queues and
    /// serves on; what failed is said.
    #[error("upgrade: {0}")]
    Upgrade(String),
    /// I/O.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let top = self.to_string();
        f.write_str(&top)?;
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let text = c.to_string();
            if !top.contains(&text) {
                write!(f, "\n  caused by: {text}")?;
            }
            cause = c.source();
        }
        Ok(())
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Xsk(x) => x.into(),
            Error::Io(io) => io,
            Error::Stack(s) => s.into(),
            other => io::Error::other(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_reads_as_a_sentence_with_its_causes() {
        let e = Error::Core {
            core: 1,
            cpu: 3,
            queue: 1,
            source: Box::new(Error::Io(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "binding the socket",
            ))),
        };
        let debug = format!("{e:?}");
        assert!(
            debug.starts_with("core 1 (CPU 3, queue 1): binding the socket"),
            "{debug}"
        );
        assert!(!debug.contains("Core {"), "{debug}");
        let plain = format!("{:?}", Error::Config("no address".into()));
        assert_eq!(plain, "invalid configuration: no address");
        // An OS refusal reads as what was being done, then the OS's words; a caller can
        // branch on the kind.
        let os = Error::Os {
            what: "pinning a thread to CPU 7".into(),
            source: io::Error::from_raw_os_error(libc::EINVAL),
        };
        assert_eq!(
            os.to_string(),
            format!(
                "pinning a thread to CPU 7: {}",
                io::Error::from_raw_os_error(libc::EINVAL)
            )
        );
        assert!(!os.to_string().contains("invalid configuration"));
        assert_eq!(io::Error::from(os).kind(), io::ErrorKind::Other);
    }
}
