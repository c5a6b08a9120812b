//! Shared by every test binary (`tests/<area>/main.rs` includes it as `mod common`): the
//! collective checks (`check`: exact inputs, poisoned outputs with a poisoned tail, a host
//! reference computed with the device crate's own element arithmetic), point-to-point checks
//! (`p2p`), the one child-process supervisor (`procs`), visible skips (`skip`), the C plugins
//! tests compile (`plugins`), and the small helpers below.
#![allow(dead_code)]

#[cfg(feature = "internals")]
use nccl::{Comm, StreamHandle};

pub mod plugins;
pub mod procs;
pub mod skip;

// What drives devices needs the test-only `internals` feature (streams, raw copies, the
// tuner); a binary built without it (`capi`) has the supervisor, the skips and the plugins.
#[cfg(feature = "internals")]
pub mod check;
#[cfg(feature = "internals")]
pub mod faults;
#[cfg(feature = "internals")]
pub mod graphs;
#[cfg(feature = "internals")]
pub mod netns;
#[cfg(feature = "internals")]
pub mod onesided;
#[cfg(feature = "internals")]
pub mod p2p;
#[cfg(feature = "internals")]
pub mod register;
#[cfg(feature = "internals")]
pub mod suspend;
#[cfg(feature = "internals")]
pub mod windows;

#[cfg(feature = "internals")]
#[allow(unused_imports)]
pub use check::*;
#[cfg(feature = "internals")]
#[allow(unused_imports)]
pub use p2p::*;

/// A small deterministic generator (xorshift*), so failures reproduce from the seed.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub fn to_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain element types without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub fn from_bytes<T: Copy>(b: &[u8]) -> Vec<T> {
    let n = b.len() / std::mem::size_of::<T>();
    // SAFETY: reads n elements of plain data from b (unaligned reads).
    (0..n)
        .map(|i| unsafe { std::ptr::read_unaligned((b.as_ptr() as *const T).add(i)) })
        .collect()
}

/// Chooses the simulator for this process (every simulator test calls it first).
pub fn sim() {
    nccl::cuda::set_backend(nccl::Backend::Sim).expect("choose the simulator");
}

/// Every rank of `n` on simulated GPUs 0..n of this process (`ncclCommInitAll`: its bootstrap
/// is on loopback), with a stream each.
#[cfg(feature = "internals")]
pub fn sim_ranks(n: usize) -> Ranks {
    Ranks::new(sim_comms(n))
}

/// Every rank of `n` on simulated GPUs 0..n of this process, without streams.
#[cfg(feature = "internals")]
pub fn sim_comms(n: usize) -> Vec<Comm> {
    sim();
    Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).expect("init_all on the simulator")
}

/// A simulated device of this process.
pub fn sim_dev(i: usize) -> nccl::Device {
    sim();
    nccl::Device::open(i as i32).expect("open a simulated device")
}

/// A unique id whose root listens on loopback: tests never bootstrap on the machine's own
/// interfaces (`nccl::get_unique_id` picks the first one that is up, as NCCL does).
#[cfg(feature = "internals")]
pub fn loopback_id() -> nccl::UniqueId {
    nccl::bootstrap::new_local_root_id().expect("a loopback unique id")
}

/// The environment of a test that must bootstrap through ids the library makes itself (a
/// split's or a shrink's root, `NCCL_COMM_ID`): loopback only. Such tests run `isolated`.
pub const LOOPBACK: (&str, &str) = ("NCCL_SOCKET_IFNAME", "lo");

/// How the test drives the ranks of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drive {
    /// One thread launches on every communicator in turn.
    OneThread,
    /// A thread per communicator.
    ThreadPerRank,
    /// One thread, every launch inside ncclGroupStart/End.
    Group,
}

/// A communicator lent to the one thread that issues on it, in the thread-per-rank drives.
#[cfg(feature = "internals")]
#[derive(Clone, Copy)]
pub struct OnItsThread<'a>(pub &'a Comm);

// SAFETY: every field of a `Comm` is thread-safe; `Comm` withholds `Sync` only so that two
// threads never issue on it at once. The drives that lend communicators give each rank's to
// exactly one thread at a time (its rank thread, or this one before and after them).
#[cfg(feature = "internals")]
unsafe impl Send for OnItsThread<'_> {}
// SAFETY: as for `Send`.
#[cfg(feature = "internals")]
unsafe impl Sync for OnItsThread<'_> {}

#[cfg(feature = "internals")]
impl std::ops::Deref for OnItsThread<'_> {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        self.0
    }
}

/// The communicators, to be lent one per thread (see [`OnItsThread`]).
#[cfg(feature = "internals")]
pub fn lend(comms: &[Comm]) -> Vec<OnItsThread<'_>> {
    comms.iter().map(OnItsThread).collect()
}

/// Communicators with a stream each (tests running side by side must not share the default
/// stream: two collectives queued in different orders on two devices would wait on each other).
#[cfg(feature = "internals")]
pub struct Ranks {
    pub comms: Vec<Comm>,
    pub streams: Vec<StreamHandle>,
}

#[cfg(feature = "internals")]
impl Ranks {
    /// With a non-blocking stream each.
    pub fn new(comms: Vec<Comm>) -> Ranks {
        Ranks::with_streams(comms, |d| d.stream_create())
    }

    /// With a blocking stream each (ordered with the legacy default stream, as
    /// `cudaStreamCreate` makes them).
    pub fn blocking(comms: Vec<Comm>) -> Ranks {
        Ranks::with_streams(comms, |d| d.stream_create_blocking())
    }

    fn with_streams(
        comms: Vec<Comm>,
        create: impl Fn(&nccl::Device) -> nccl::Result<StreamHandle>,
    ) -> Ranks {
        let streams = comms
            .iter()
            .map(|c| create(c.device()).expect("create a stream"))
            .collect();
        Ranks { comms, streams }
    }
}

#[cfg(feature = "internals")]
impl Drop for Ranks {
    fn drop(&mut self) {
        for (c, s) in self.comms.iter().zip(&self.streams) {
            let _ = c.device().stream_destroy(*s);
        }
    }
}

/// The element types of the matrices: all of them, or those NCCL_RS_TEST_TYPES names by their
/// NCCL names (e.g. `float,int8`), for slow runs such as compute-sanitizer's, which cannot afford
/// every kernel family. A name that is no type is an error; each type left out is a skip.
pub fn matrix_types() -> Vec<nccl::DataType> {
    use nccl::DataType;
    let Ok(list) = std::env::var("NCCL_RS_TEST_TYPES") else {
        return DataType::ALL.to_vec();
    };
    let picked: Vec<DataType> = list
        .split(',')
        .map(|s| {
            let s = s.trim();
            DataType::ALL
                .into_iter()
                .find(|t| t.name() == s)
                .unwrap_or_else(|| panic!("NCCL_RS_TEST_TYPES: no type named {s:?}"))
        })
        .collect();
    for t in DataType::ALL.into_iter().filter(|t| !picked.contains(t)) {
        skip::record(
            &format!("NCCL_RS_TEST_TYPES={list}"),
            &format!("the matrix's {} checks", t.name()),
        );
    }
    picked
}

/// The counts of the matrices: `counts`, or with NCCL_RS_TEST_MAX_COUNT=M each count above M
/// replaced by M (duplicates dropped), for slow runs; each count cut is a skip.
pub fn matrix_counts(counts: &[usize]) -> Vec<usize> {
    let Ok(max) = std::env::var("NCCL_RS_TEST_MAX_COUNT") else {
        return counts.to_vec();
    };
    let max: usize = max.trim().parse().expect("NCCL_RS_TEST_MAX_COUNT: a count");
    let mut out: Vec<usize> = Vec::new();
    for &c in counts {
        if c > max {
            skip::record(
                &format!("NCCL_RS_TEST_MAX_COUNT={max}"),
                &format!("count {c} (run at {max})"),
            );
        }
        let c = c.min(max);
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Lets this process hold at least `n` descriptors (tests that open thousands of
/// connections), raising the soft limit, and the hard one where it is lower (as root).
pub fn allow_descriptors(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid rlimit structure.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= n {
            return;
        }
        lim.rlim_cur = n;
        lim.rlim_max = lim.rlim_max.max(n);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}
