//! The runtime's error type.

use std::io;

use corelane_stack::StackError;

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the AF_XDP layer: privileges, interface, XDP mode, socket binding.
    #[error(transparent)]
    Xsk(#[from] corelane_xsk::Error),
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
    /// I/O.
    #[error(transparent)]
    Io(#[from] io::Error),
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
