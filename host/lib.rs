//! nccl-rs: collective communication among GPUs, NCCL's job rebuilt in Rust, kernels included.
//!
//! ```no_run
//! use nccl::{Comm, DeviceBuffer, Op, Stream};
//! let comms = Comm::init_all(&[0, 1])?;
//! let streams = comms.iter().map(|c| Stream::new(c.device())).collect::<nccl::Result<Vec<_>>>()?;
//! let mut bufs = comms
//!     .iter()
//!     .map(|c| DeviceBuffer::from_slice(c.device(), &[1.0f32; 1024]))
//!     .collect::<nccl::Result<Vec<_>>>()?;
//! // One thread drives both ranks: their calls go out together, in a group.
//! nccl::group(|g| {
//!     for ((c, b), s) in comms.iter().zip(&mut bufs).zip(&streams) {
//!         g.all_reduce_in_place(c, b, Op::SUM, s)?;
//!     }
//!     Ok(())
//! })?;
//! assert_eq!(bufs[0].to_vec()?, vec![2.0f32; 1024]);
//! # Ok::<(), nccl::Error>(())
//! ```
//!
//! Thread safety: a [`Comm`] is `Send` but not `Sync`. NCCL's rule (its "Thread Safety"
//! page) is that one communicator must not be used by several threads at once, while any one
//! thread at a time may use it; `Send` without `Sync` is that rule, checked by the compiler.
//! Put a communicator in a `Mutex` to share it.
//!
//! ```compile_fail
//! fn shared<T: Sync>(_: &T) {}
//! fn f(comm: &nccl::Comm) { shared(comm) } // error: `Comm` is not `Sync`
//! ```
//!
//! Two threads cannot issue on one communicator:
//!
//! ```compile_fail
//! fn f(comm: nccl::Comm) {
//!     std::thread::scope(|s| {
//!         s.spawn(|| comm.rank()); // error: `&Comm` cannot be sent to another thread
//!         s.spawn(|| comm.rank());
//!     });
//! }
//! ```
//!
//! but a thread may own one (`Send`):
//!
//! ```
//! fn f(comm: nccl::Comm) -> std::thread::JoinHandle<usize> {
//!     std::thread::spawn(move || comm.rank())
//! }
//! ```
//!
//! Logging: the library emits through the `log` crate only; [`init_logging`] installs NCCL's
//! `NCCL_DEBUG` logger when the program has none.

// The network plugins' logger is a C variadic function (net/plugin/log.rs): that
// needs nightly, and build.rs sets `nccl_rs_variadic` when the compiler is one.
#![cfg_attr(nccl_rs_variadic, feature(c_variadic))]
// The API is documented; the internals (public only with the test-only `internals` feature)
// are not held to it.
#![cfg_attr(not(feature = "internals"), warn(missing_docs))]
// Internals that only this crate's tests call are dead code without the `internals` feature.
#![cfg_attr(not(feature = "internals"), allow(dead_code))]

// Modules that are internals are `pub(crate)`, and `pub` (unstable, undocumented) only with
// the `internals` feature, for this crate's own tests. Each is declared twice under `cfg`,
// not through a macro, so that rustfmt (which does not look inside macro calls) reaches them.

/// Declares one item (a function or method, a type, a constant) that is an internal: written
/// `internal! { /// docs \n fn name(..) { .. } }`, it is `pub(crate)`, and `pub` (hidden from the
/// docs) only with the `internals` feature, for this crate's own tests.
macro_rules! internal {
    // Attributes (docs included) are peeled one at a time: a repetition of them followed by
    // the item's tokens would be ambiguous to macro_rules.
    (@attrs [$($a:tt)*] #[$m:meta] $($rest:tt)*) => {
        $crate::internal!(@attrs [$($a)* #[$m]] $($rest)*);
    };
    (@attrs [$($a:tt)*] $($item:tt)*) => {
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        $($a)*
        pub $($item)*
        #[cfg(not(feature = "internals"))]
        $($a)*
        pub(crate) $($item)*
    };
    ($($t:tt)*) => {
        $crate::internal!(@attrs [] $($t)*);
    };
}
pub(crate) use internal;

mod api;
#[cfg(feature = "capi")]
pub mod capi;
pub(crate) mod clock;
pub mod cuda;
pub mod debug;
pub mod error;
pub(crate) mod plugin_log;
pub(crate) mod profiler;
pub(crate) mod proxy;
pub mod ras;
pub(crate) mod sockets;

#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod bootstrap;
#[cfg(not(feature = "internals"))]
pub(crate) mod bootstrap;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod comm;
#[cfg(not(feature = "internals"))]
pub(crate) mod comm;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod enqueue;
#[cfg(not(feature = "internals"))]
pub(crate) mod enqueue;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod env;
#[cfg(not(feature = "internals"))]
pub(crate) mod env;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod graph;
#[cfg(not(feature = "internals"))]
pub(crate) mod graph;
#[cfg(test)]
mod layering;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod net;
#[cfg(not(feature = "internals"))]
pub(crate) mod net;
#[cfg(test)]
mod test_aids;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod topo;
#[cfg(not(feature = "internals"))]
pub(crate) mod topo;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod transport;
#[cfg(not(feature = "internals"))]
pub(crate) mod transport;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod tune;
#[cfg(not(feature = "internals"))]
pub(crate) mod tune;

#[cfg(feature = "cudarc")]
pub use api::cudarc_nccl;
pub use api::{
    capture, group, Capture, CapturedGraph, DeviceBuffer, DeviceSlice, DeviceSliceMut, Element,
    Event, Group, IntoDeviceSlice, IntoDeviceSliceMut, Op, Registration, Stream, Window, F8E4M3,
    F8E5M2,
};
pub use bootstrap::{get_unique_id, UniqueId, UNIQUE_ID_BYTES};
pub use comm::dev_api::{DevCommRequirements, DeviceComm, DeviceWindow};
pub use comm::onesided::SignalWait;
pub use comm::register::RegHandle;
pub use comm::suspend::SUSPEND_MEM;
pub use comm::{
    AbortHandle, Comm, Config, GinType, PendingComm, Properties, ResolvedConfig,
    CTA_POLICY_DEFAULT, CTA_POLICY_EFFICIENCY, CTA_POLICY_ZERO, SHRINK_ABORT, SHRINK_DEFAULT,
    SPLIT_NOCOLOR,
};
pub use comm::{ReduceOp, Scalar};
pub use cuda::{Backend, DevBuffer, DevPtr, Device, Graph, Module, StreamHandle};
pub use error::{Error, NcclResult, Result};
pub use nccl_device::ops::RedOpKind;
pub use nccl_device::types::DataType;
pub use tune::{Algo, Choice as TuningChoice, Coll, Proto};

/// The newest NCCL release whose whole host API this library implements (`ncclGetVersion`:
/// major*10000 + minor*100 + patch); README.md lists what later releases added that it lacks.
pub const VERSION: i32 = 22907;
/// [`VERSION`] as text.
pub const VERSION_STRING: &str = "2.29.7";

/// The device code as PTX, one text per GPU architecture.
pub(crate) mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx_table.rs"));
}

/// Installs NCCL's logger (`NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`, `NCCL_DEBUG_FILE`, NCCL's line
/// format) as the process's `log` logger, unless the program already has one, which stays.
/// Returns whether NCCL's logger is the one in place. The library never calls it for Rust
/// programs; the C ABI library does, for C programs.
pub fn init_logging() -> bool {
    debug::install_logger()
}

/// `ncclGroupStart` (the raw layer's group): operations issued by this thread until the
/// matching [`group_end`] are launched together when it ends. Typed calls go through
/// [`group`] instead, which keeps their buffers borrowed; they refuse to run inside a group
/// opened here.
pub fn group_start() {
    enqueue::group::start()
}

/// How a group ended ([`group_end`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupStatus {
    /// Its operations were issued (or it was an inner level, which issues nothing).
    Complete,
    /// Its communicators are non-blocking: the operations are being issued in the background.
    /// Poll each communicator's [`Comm::async_state`] until it is `Success` (or call
    /// [`Comm::wait_group`]) before using it or its streams again.
    InProgress,
}

/// `ncclGroupEnd`. A group of non-blocking communicators (`Config::blocking(false)`) holding
/// operations is issued on a background thread: that is [`GroupStatus::InProgress`], not an
/// error.
pub fn group_end() -> Result<GroupStatus> {
    match enqueue::group::end() {
        Ok(()) => Ok(GroupStatus::Complete),
        Err(e) if e.code == NcclResult::InProgress => Ok(GroupStatus::InProgress),
        Err(e) => Err(e),
    }
}

/// `ncclGroupSimulateEnd`: ends the group without launching anything (its operations are
/// dropped, as NCCL does) and returns the model's time for it in µs; None when this only ends
/// an inner, nested group.
pub fn group_simulate_end() -> Result<Option<f64>> {
    enqueue::group::simulate_end()
}
