//! Machine topology and placement for corelane.
//!
//! [`Machine`] reads the machine with hwloc (the system libhwloc): packages, cores, hardware
//! threads, the caches each pair of CPUs shares, NUMA nodes and their distances, and where a
//! network device sits. [`plan`] turns a [`Placement`] policy into [`Lane`]s: for each
//! interface queue, the CPU that runs the protocol and the CPU that runs the application. CPUs
//! NUMA-local to the NIC come first; SMT siblings count as sharing L1 and L2. A [`Plan`]
//! prints as an explanation: who runs where, what they share, how far the NIC is, and why.
//!
//! ```
//! use corelane_topo::{Machine, Placement, Request, plan};
//! // Seed 000's machine: two packages, four cores each, L2 shared by pairs.
//! let m = Machine::synthetic("package:2 l2:2 core:2 pu:1")?.with_nic("eth0", 0);
//! let req = Request {
//!     lanes: Some(1),
//!     max_lanes: None,
//!     allowed: (0..8).collect(),
//!     nic: m.nic("eth0", None),
//! };
//! let p = plan(&m, &Placement::SharedCache, &req)?;
//! assert_eq!((p.lanes[0].protocol_cpu, p.lanes[0].app_cpu), (0, 1));
//! println!("{p}");
//! # Ok::<(), corelane_topo::Error>(())
//! ```

#![forbid(unsafe_code)]

mod machine;
mod plan;

pub use machine::{Cache, Cpu, Machine, Nic, Sharing};
pub use plan::{DEFAULT_PER_CORE_BITS, Lane, Placement, Plan, Request, plan};

/// Errors of topology discovery and planning.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// hwloc could not read or build the topology.
    #[error("hwloc: {0}")]
    Hwloc(String),
    /// The policy cannot be planned on these CPUs.
    #[error("placement: {0}")]
    Plan(String),
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let kind = match e {
            Error::Plan(_) => std::io::ErrorKind::InvalidInput,
            Error::Hwloc(_) => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}
