//! The device API: what a kernel of the user's own crate needs to communicate by itself, with
//! the peers of its node that map each other's memory (the LSA team: load/store accessible).
//!
//! The host makes a [`DevComm`] (`nccl::Comm::dev_comm`) and a [`Window`] for each registered
//! window (`nccl::Comm::dev_window`); both are plain values the kernel takes in its argument.
//! Inside the kernel:
//! - [`DevComm::lsa_ptr`] is where byte `offset` of an LSA peer's part of a window lies, as this
//!   GPU addresses it: ordinary loads and stores reach the peer's memory;
//! - [`DevComm::lsa_barrier`] is a barrier of one CTA index across the team: every rank's CTA
//!   `index` waits until every rank's CTA `index` arrived. It watches the communicator's abort
//!   flag, so an aborted job does not spin for ever;
//! - [`fence_system`] orders this thread's writes before its later ones for every observer
//!   (other GPUs, the host);
//! - [`DevComm::multimem_ptr`] is where byte `offset` of every LSA rank's part of a window lies
//!   at once, where the window has a multicast object (NVLS: the communicator's NVLS is on and
//!   the window is symmetric): [`multimem_ld_reduce`] there returns the reduction of every
//!   rank's 16 bytes, [`multimem_st`] writes every rank's.
//!
//! # Memory model
//!
//! A barrier orders: every write a thread of the CTA made before [`LsaBarrier::sync`] (to its
//! own memory or a peer's) is visible to every thread of every rank's same CTA index after
//! that rank's `sync` returned. Nothing else is ordered across ranks: two writes of one thread
//! to a peer's memory with no barrier between may be seen in either order there, unless a
//! [`fence_system`] separates them and the reader reads them in the reverse order.
//!
//! The same code runs on GPUs (compiled to PTX) and on the CPU simulator, where each thread of
//! a CTA is a host thread; the simulator checks `lsa_ptr`'s peer and offset (against this
//! rank's part of the window) and a barrier's index, and fails the stream with the message.
//!
//! # Kernels of your own crate
//!
//! [`kernel!`](crate::kernel) declares a kernel: on `nvptx64` a PTX entry point, on the host a
//! [`Kernel`] value that `nccl::Module::launch` runs on a GPU (by its entry's name, from the
//! PTX `nccl-kernel-build` compiled in your build script) or on the simulator (by calling the
//! function). Only your crate is compiled to PTX: what it calls of this crate is inlined into
//! it (every function of this module is `#[inline]`), and a build that would call a function
//! of another crate fails, naming it.

use crate::arch;

mod gin;
mod ll;
mod misuse;
/// NVLink SHARP through a window's multicast address ([`DevComm::multimem_ptr`]): the reduction
/// of every rank's 16 bytes in the switch (`multimem.ld_reduce`, the reductions
/// [`multimem_op`] names for a type), a store to every rank's (`multimem.st`). On the simulator
/// they read and write every member's memory.
pub use crate::arch::{multimem_ld_reduce, multimem_op, multimem_st, McOp, Pack16};
pub use gin::{Target, MAX_COUNTERS, MAX_SIGNALS};
pub use ll::LlA2a;
pub use misuse::{Misuse, FAULT_WORDS};

/// The most CTA indices a communicator's barriers serve (`DevComm::lsa_barrier`'s `index`).
pub const MAX_BARRIERS: u32 = 64;

/// Words of one rank's barrier area per CTA index: a slot per LSA rank, then this rank's own
/// count of the barriers it passed, the last one's outcome, and the last put's outcome (a
/// word of its own: a CTA's put and another CTA's barrier of the same index may overlap).
const fn barrier_words(lsa_size: u32) -> usize {
    lsa_size as usize + 3
}

/// Word index, in a rank's area, of its signal words: `[MAX_SIGNALS][nranks]`, each the
/// signals of one id one source rank raised here. Then the counters (`[MAX_COUNTERS]`, puts to
/// LSA peers), then the GIN queue's ticket word.
const fn signals_at(lsa_size: u32) -> usize {
    barrier_words(lsa_size) * MAX_BARRIERS as usize
}
const fn counters_at(lsa_size: u32, nranks: u32) -> usize {
    signals_at(lsa_size) + (MAX_SIGNALS * nranks) as usize
}
const fn head_at(lsa_size: u32, nranks: u32) -> usize {
    counters_at(lsa_size, nranks) + MAX_COUNTERS as usize
}

/// Word index, in a rank's area, of its LL sessions' epoch counts (`[ll_blocks]`, after the
/// GIN ticket word); their lines start at the next 16-byte boundary after them.
const fn ll_epochs_at(lsa_size: u32, nranks: u32) -> usize {
    head_at(lsa_size, nranks) + 1
}
const fn ll_lines_at(lsa_size: u32, nranks: u32, ll_blocks: u32) -> usize {
    (ll_epochs_at(lsa_size, nranks) + ll_blocks as usize).next_multiple_of(2)
}

/// Byte offset, in a rank's area, of its signal words (where the network's side writes the
/// signals of ranks outside the LSA team).
pub const fn signals_offset(lsa_size: u32) -> usize {
    8 * signals_at(lsa_size)
}

/// Bytes of one rank's area (barriers, signals, counters, LL sessions) of a device
/// communicator `c` (its sizes and LL requirements set; its addresses not needed): what the
/// host allocates, zeroed, and maps across the team.
pub const fn area_bytes(c: &DevComm) -> usize {
    8 * ll_lines_at(c.lsa_size, c.nranks, c.ll_blocks) + ll::lines_bytes(c)
}

/// A registered window as a kernel addresses it: the base of every LSA rank's part.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Device address of `[u64; lsa_size]`: each LSA rank's part of the window, as this GPU
    /// maps it.
    pub bases: u64,
    /// Bytes of this rank's part.
    pub bytes: u64,
    /// The window's handle (the same on every rank), for puts through the network.
    pub handle: u64,
    /// Where the window's multicast object is mapped here (0: the window has none).
    pub multimem: u64,
}

/// A communicator as a kernel sees it (`ncclDevComm`): made on the host, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevComm {
    /// This rank and the communicator's size.
    pub rank: u32,
    pub nranks: u32,
    /// This rank's place in the LSA team, and the team's size.
    pub lsa_rank: u32,
    pub lsa_size: u32,
    /// Device address of `[u32; lsa_size]`: the communicator rank of each LSA rank.
    pub lsa_ranks: u64,
    /// Device address of `[u64; lsa_size]`: each LSA rank's barrier area, as mapped here.
    pub barriers: u64,
    /// The communicator's abort flag (device-readable; non-zero once aborted).
    pub abort: u64,
    /// Device address of the GIN queue (`crate::abi::gin::GinQueue`, host-mapped) that
    /// carries puts and signals to ranks outside the LSA team; 0 where there is none.
    pub gin: u64,
    /// LL sessions ([`DevComm::ll_a2a`]): how many blocks, and the lines each rank may send
    /// each peer per block and epoch.
    pub ll_blocks: u32,
    pub ll_slots: u32,
    /// Device address of the fault record (`[u64; FAULT_WORDS]`, host-mapped) where a kernel
    /// that passed a bad id or index says so before it traps ([`Misuse`]); 0: none.
    pub fault: u64,
}

/// The communicator was aborted while a call waited: the kernel should return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aborted;

/// `__threadfence_system()`: this thread's earlier writes are ordered before its later ones
/// for every observer, other GPUs and the host included.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn fence_system() {
    arch::fence_sys()
}

impl DevComm {
    /// Where byte `offset` of LSA rank `lsa_peer`'s part of `window` lies, as this GPU
    /// addresses it.
    ///
    /// # Safety
    /// `window` and `self` came from the host for this communicator and are still registered;
    /// `lsa_peer < lsa_size`; the caller keeps its accesses inside the peer's part.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn lsa_ptr(&self, window: &Window, offset: usize, lsa_peer: u32) -> *mut u8 {
        if lsa_peer >= self.lsa_size {
            self.misuse(Misuse::LsaPeer, lsa_peer as u64, self.lsa_size as u64);
        }
        // The simulator checks the offset against this rank's part (symmetric windows: every
        // rank's is as large); a GPU does not spend the compare.
        #[cfg(not(target_arch = "nvptx64"))]
        if offset as u64 >= window.bytes {
            panic!(
                "device API: offset {offset} is past the window's {} bytes",
                window.bytes
            );
        }
        let base = *(window.bases as *const u64).add(lsa_peer as usize);
        (base + offset as u64) as *mut u8
    }

    /// Byte `offset` of this rank's own part of `window`.
    ///
    /// # Safety
    /// As [`DevComm::lsa_ptr`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn local_ptr(&self, window: &Window, offset: usize) -> *mut u8 {
        self.lsa_ptr(window, offset, self.lsa_rank)
    }

    /// Byte `offset` of `window` on every LSA rank at once: its multicast address, for
    /// [`multimem_ld_reduce`] and [`multimem_st`] (16-byte aligned). A window without a
    /// multicast object stops the kernel ([`Misuse::NoMultimem`]).
    ///
    /// # Safety
    /// As [`DevComm::lsa_ptr`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn multimem_ptr(&self, window: &Window, offset: usize) -> *mut u8 {
        if window.multimem == 0 {
            self.misuse(Misuse::NoMultimem, offset as u64, 0);
        }
        #[cfg(not(target_arch = "nvptx64"))]
        if offset as u64 >= window.bytes {
            panic!(
                "device API: offset {offset} is past the window's {} bytes",
                window.bytes
            );
        }
        (window.multimem + offset as u64) as *mut u8
    }

    /// The communicator rank of LSA rank `lsa_peer`.
    ///
    /// # Safety
    /// `self` came from the host and `lsa_peer < lsa_size`.
    #[inline]
    pub unsafe fn lsa_to_rank(&self, lsa_peer: u32) -> u32 {
        if lsa_peer >= self.lsa_size {
            self.misuse(Misuse::LsaPeer, lsa_peer as u64, self.lsa_size as u64);
        }
        *(self.lsa_ranks as *const u32).add(lsa_peer as usize)
    }

    /// Whether the communicator was aborted.
    ///
    /// # Safety
    /// `self` came from the host and the communicator lives.
    #[inline]
    pub unsafe fn aborted(&self) -> bool {
        self.abort != 0 && arch::ld_volatile(self.abort as *const u64) != 0
    }

    /// The team barrier of CTA index `index` (`< MAX_BARRIERS`): every rank's CTA `index`
    /// must use it in the same sequence.
    ///
    /// # Safety
    /// `self` came from the host and the communicator lives.
    #[inline]
    pub unsafe fn lsa_barrier(&self, index: u32) -> LsaBarrier<'_> {
        if index >= MAX_BARRIERS {
            self.misuse(Misuse::BarrierIndex, index as u64, MAX_BARRIERS as u64);
        }
        LsaBarrier {
            comm: self,
            index,
            rounds: core::cell::Cell::new(0),
            aborted: core::cell::Cell::new(false),
        }
    }

    /// Word `w` of LSA rank `lsa_peer`'s area, as mapped here.
    #[inline]
    unsafe fn area_word(&self, lsa_peer: u32, w: usize) -> *mut u64 {
        let area = *(self.barriers as *const u64).add(lsa_peer as usize) as *mut u64;
        area.add(w)
    }

    /// Word `w` of CTA index `index`'s part of LSA rank `lsa_peer`'s barrier area.
    #[inline]
    unsafe fn barrier_word(&self, lsa_peer: u32, index: u32, w: usize) -> *mut u64 {
        self.area_word(lsa_peer, index as usize * barrier_words(self.lsa_size) + w)
    }

    /// This rank's word for CTA index `index`'s last put's outcome.
    #[inline]
    unsafe fn put_outcome_word(&self, index: u32) -> *mut u64 {
        if index >= MAX_BARRIERS {
            self.misuse(Misuse::BarrierIndex, index as u64, MAX_BARRIERS as u64);
        }
        self.barrier_word(self.lsa_rank, index, self.lsa_size as usize + 2)
    }

    #[inline]
    fn signals_at(&self) -> usize {
        signals_at(self.lsa_size)
    }
    #[inline]
    fn counters_at(&self) -> usize {
        counters_at(self.lsa_size, self.nranks)
    }
    /// This rank's GIN ticket word (device memory: kernels take tickets with atomics).
    #[inline]
    unsafe fn head_word(&self) -> *mut u64 {
        self.area_word(self.lsa_rank, head_at(self.lsa_size, self.nranks))
    }
}

/// A barrier of one CTA index across the LSA team ([`DevComm::lsa_barrier`]).
pub struct LsaBarrier<'a> {
    comm: &'a DevComm,
    index: u32,
    /// The rounds this CTA's barrier of this index completed (0: not read yet; read from
    /// memory at the first sync, kept here after, so a later sync waits on no load of it).
    rounds: core::cell::Cell<u64>,
    /// A sync saw the abort: every later one returns `Err` at once.
    aborted: core::cell::Cell<bool>,
}

impl LsaBarrier<'_> {
    /// Every thread of the CTA calls it: returns once every LSA rank's CTA of this index
    /// called it as often (Ok), or the communicator was aborted meanwhile (Err, in every thread
    /// alike). Orders memory as the module says.
    ///
    /// # Safety
    /// As [`DevComm::lsa_barrier`]; every thread of the CTA calls it, none other. A CTA holds
    /// one barrier of an index at a time (make it once per kernel, sync it as often as needed).
    #[inline]
    pub unsafe fn sync(&self) -> Result<(), Aborted> {
        let c = self.comm;
        let (n, me, i) = (c.lsa_size, c.lsa_rank, self.index);
        let (count, outcome) = (n as usize, n as usize + 1);
        if self.aborted.get() {
            return Err(Aborted); // every thread alike: each set it from the same reduction
        }
        arch::sync_threads();
        let mine = c.barrier_word(me, i, count);
        if self.rounds.get() == 0 {
            // Every thread reads the count before thread 0 moves it on, after the next sync.
            self.rounds.set(arch::ld_volatile(mine));
        }
        let round = self.rounds.get() + 1;
        // Thread `p` tells LSA rank `p` and waits for it: the team's stores and waits run in
        // parallel rather than one after another.
        let mut p = arch::thread_idx();
        let mut aborted = false;
        while p < n {
            // The CTA's writes (ordered before this thread's by the CTA barrier) first.
            arch::fence_sys();
            arch::st_release_sys(c.barrier_word(p, i, me as usize), round);
            let slot = c.barrier_word(me, i, p as usize);
            crate::coll::spin_until(c.abort as *const u64, &mut aborted, || {
                arch::ld_acquire_sys(slot) >= round
            });
            p += arch::block_dim();
        }
        // Whether some thread saw the abort, in the barrier itself: no load after it.
        let aborted = arch::sync_threads_or(aborted);
        self.rounds.set(round);
        self.aborted.set(aborted);
        if arch::thread_idx() == 0 {
            arch::st_volatile(mine, round);
            if aborted {
                // Never cleared: the last barrier's outcome, for a fault report.
                arch::st_volatile(c.barrier_word(me, i, outcome), 1);
            }
        }
        match aborted {
            false => Ok(()),
            true => Err(Aborted),
        }
    }
}

/// A kernel of the user's crate, as the host launches it (`nccl::Module::launch`): the name of
/// its PTX entry point (for a GPU) and the function itself (for the simulator, which calls it
/// on every thread of every CTA). Made by [`kernel!`](crate::kernel), never by hand: the two
/// must be the same kernel.
pub struct Kernel<A> {
    name: &'static str,
    body: unsafe fn(&A),
}

impl<A> Kernel<A> {
    #[doc(hidden)]
    pub const fn new(name: &'static str, body: unsafe fn(&A)) -> Self {
        Kernel { name, body }
    }
    /// The PTX entry point's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
    /// The function every thread runs (what the simulator calls).
    pub const fn body(&self) -> unsafe fn(&A) {
        self.body
    }
}

impl<A> Clone for Kernel<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Kernel<A> {}

/// Declares a kernel of the user's crate: `kernel!(pub ALL_REDUCE = one_shot_all_reduce(Args));`
/// with `unsafe fn one_shot_all_reduce(args: &Args)` (every thread of every CTA runs it;
/// `Args: Copy`, `#[repr(C)]`, passed by value as the kernel's one parameter).
///
/// Compiled for `nvptx64` it is a PTX entry point named after the function (the crate needs
/// `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]`); for the host it is the
/// constant `ALL_REDUCE`, a [`Kernel<Args>`](crate::api::Kernel) for `nccl::Module::launch`.
#[macro_export]
macro_rules! kernel {
    ($(#[$meta:meta])* $vis:vis $handle:ident = $func:ident($args:ty);) => {
        #[cfg(target_arch = "nvptx64")]
        const _: () = {
            #[export_name = stringify!($func)]
            unsafe extern "ptx-kernel" fn entry(args: $args) {
                $func(&args)
            }
        };
        $(#[$meta])*
        #[cfg(not(target_arch = "nvptx64"))]
        $vis const $handle: $crate::api::Kernel<$args> =
            $crate::api::Kernel::new(stringify!($func), $func);
    };
}
