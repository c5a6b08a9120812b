//! The facade on host threads: the CPU simulator. A CTA is a group of OS threads started by
//! [`run_cta`]; each thread knows its indices through a thread-local context. Barriers block on
//! a condition variable, spin loops yield, memory-model operations map onto Rust atomics with
//! the same ordering, so a missing fence or a wrong flag breaks here as it breaks on a GPU.

use super::Pack16;
use core::sync::atomic::{fence, AtomicU64, Ordering};
use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex};
use std::vec::Vec;

/// Lanes per simulated warp (warp operations span `min(WARP, block_dim)` threads).
pub const WARP: u32 = 32;
const NAMED_BARRIERS: usize = 16;

#[derive(Default)]
struct BarrierState {
    arrived: u32,
    generation: u64,
    /// `sync_threads_or`: the OR of this generation's arrivals so far, and of the last two
    /// generations by parity (a waiter reads its own before the CTA can end the next one,
    /// which needs its arrival).
    or: bool,
    ors: [bool; 2],
    /// A thread of the CTA panicked: no one will arrive any more.
    poisoned: bool,
}

/// What the threads waiting at a barrier of a CTA whose thread panicked panic with (the first
/// panic's message is the one [`run_cta`] re-raises).
const POISONED: &str = "nccl-device sim: another thread of this CTA panicked";

/// A reusable barrier for a thread count given at each arrival (as `bar.sync id, n`).
#[derive(Default)]
struct Barrier {
    state: Mutex<BarrierState>,
    cv: Condvar,
}

impl Barrier {
    fn wait(&self, count: u32) {
        self.wait_or(count, false);
    }

    /// [`Barrier::wait`], returning whether `pred` held in some arrival of this generation.
    fn wait_or(&self, count: u32, pred: bool) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.poisoned {
            drop(s);
            panic!("{POISONED}");
        }
        let gen = s.generation;
        s.or |= pred;
        s.arrived += 1;
        if s.arrived >= count {
            s.arrived = 0;
            s.ors[(gen % 2) as usize] = s.or;
            s.or = false;
            s.generation += 1;
            self.cv.notify_all();
            return s.ors[(gen % 2) as usize];
        }
        while s.generation == gen {
            if s.poisoned {
                drop(s);
                panic!("{POISONED}");
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.ors[(gen % 2) as usize]
    }

    /// Releases every waiter, for good, with a panic.
    fn poison(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .poisoned = true;
        self.cv.notify_all();
    }
}

/// What the threads of one CTA share.
struct Cta {
    barriers: [Barrier; NAMED_BARRIERS],
    /// One exchange row per warp for shuffles and votes.
    warp_slots: Vec<Mutex<Vec<u32>>>,
    warp_barriers: Vec<Barrier>,
}

#[derive(Clone)]
struct Ctx {
    tid: u32,
    bid: u32,
    bdim: u32,
    gdim: u32,
    cta: Arc<Cta>,
}

std::thread_local! {
    static CTX: RefCell<Option<Ctx>> = const { RefCell::new(None) };
}

fn with_ctx<R>(f: impl FnOnce(&Ctx) -> R) -> R {
    CTX.with(|c| match c.borrow().as_ref() {
        Some(ctx) => f(ctx),
        None => panic!("nccl-device: a kernel facade call outside a simulated CTA"),
    })
}

/// Runs `body` as CTA `block` of a grid of `grid` CTAs with `threads` threads, returning when
/// every thread has finished. A panic in any thread is re-raised here.
pub fn run_cta(block: u32, grid: u32, threads: u32, body: &(dyn Fn() + Sync)) {
    let warps = threads.div_ceil(WARP) as usize;
    let cta = Arc::new(Cta {
        barriers: Default::default(),
        warp_slots: (0..warps)
            .map(|_| Mutex::new(std::vec![0; WARP as usize]))
            .collect(),
        warp_barriers: (0..warps).map(|_| Barrier::default()).collect(),
    });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|tid| {
                let ctx = Ctx {
                    tid,
                    bid: block,
                    bdim: threads,
                    gdim: grid,
                    cta: cta.clone(),
                };
                std::thread::Builder::new()
                    .name(std::format!("sim-cta{block}-t{tid}"))
                    .stack_size(256 * 1024)
                    .spawn_scoped(s, move || {
                        let cta = ctx.cta.clone();
                        CTX.with(|c| *c.borrow_mut() = Some(ctx));
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
                        CTX.with(|c| *c.borrow_mut() = None);
                        if let Err(p) = r {
                            // The others would wait at the CTA's barriers for ever.
                            cta.barriers.iter().for_each(Barrier::poison);
                            cta.warp_barriers.iter().for_each(Barrier::poison);
                            std::panic::resume_unwind(p);
                        }
                    })
                    .expect("nccl-device sim: cannot start a CTA thread")
            })
            .collect();
        // Every thread joined; the first panic that is not a released waiter's is re-raised.
        let mut first = None;
        for h in handles {
            if let Err(p) = h.join() {
                let waiter =
                    p.downcast_ref::<std::string::String>().map(|m| m.as_str()) == Some(POISONED);
                if first.is_none() || (!waiter && first.as_ref().is_some_and(|f: &(bool, _)| f.0)) {
                    first = Some((waiter, p));
                }
            }
        }
        if let Some((_, p)) = first {
            std::panic::resume_unwind(p);
        }
    });
}

pub fn thread_idx() -> u32 {
    with_ctx(|c| c.tid)
}
pub fn block_idx() -> u32 {
    with_ctx(|c| c.bid)
}
pub fn block_dim() -> u32 {
    with_ctx(|c| c.bdim)
}
pub fn grid_dim() -> u32 {
    with_ctx(|c| c.gdim)
}

/// Nanoseconds of the host's monotonic clock (the simulator's `%globaltimer`).
pub fn globaltimer() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
        + 1
}

pub fn sync_threads() {
    with_ctx(|c| c.cta.barriers[0].wait(c.bdim))
}

pub fn sync_threads_or(pred: bool) -> bool {
    with_ctx(|c| c.cta.barriers[0].wait_or(c.bdim, pred))
}

pub fn barrier_named(id: u32, nthreads: u32) {
    with_ctx(|c| c.cta.barriers[id as usize % NAMED_BARRIERS].wait(nthreads))
}

pub unsafe fn ld_acquire_sys(p: *const u64) -> u64 {
    // SAFETY: the caller passes a valid, 8-byte aligned counter shared among threads.
    (*(p as *const AtomicU64)).load(Ordering::Acquire)
}

pub unsafe fn st_release_sys(p: *mut u64, v: u64) {
    // SAFETY: as ld_acquire_sys.
    (*(p as *const AtomicU64)).store(v, Ordering::Release)
}

pub unsafe fn atomic_add_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: as ld_acquire_sys.
    (*(p as *const AtomicU64)).fetch_add(v, Ordering::AcqRel)
}

pub unsafe fn red_add_release_sys(p: *mut u64, v: u64) {
    // SAFETY: as ld_acquire_sys.
    (*(p as *const AtomicU64)).fetch_add(v, Ordering::Release);
}

pub unsafe fn ld_volatile(p: *const u64) -> u64 {
    // SAFETY: as ld_acquire_sys; relaxed is what a volatile load promises.
    (*(p as *const AtomicU64)).load(Ordering::Relaxed)
}

pub unsafe fn st_volatile(p: *mut u64, v: u64) {
    // SAFETY: as ld_acquire_sys.
    (*(p as *const AtomicU64)).store(v, Ordering::Relaxed)
}

pub fn fence_sys() {
    fence(Ordering::SeqCst)
}

pub fn fence_gpu() {
    fence(Ordering::SeqCst)
}

pub unsafe fn ld_pack(p: *const Pack16) -> Pack16 {
    // SAFETY: the caller passes a valid, 16-byte aligned address.
    core::ptr::read_volatile(p)
}

/// LL's line load. Each 8-byte half (`{data, flag}`) is read as one atomic load, as a GPU's
/// 16-byte load guarantees at least: a plain volatile read of the pack may be split into 4-byte
/// moves (it was, in unoptimized builds), and a poll could then see a new flag beside old data.
pub unsafe fn ld_volatile_pack(p: *const Pack16) -> Pack16 {
    // SAFETY: as ld_pack; the halves are 8-byte aligned.
    let h = p as *const AtomicU64;
    let (lo, hi) = (
        (*h).load(Ordering::Acquire),
        (*h.add(1)).load(Ordering::Acquire),
    );
    Pack16([lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32])
}

pub unsafe fn st_pack(p: *mut Pack16, v: Pack16) {
    // SAFETY: as ld_pack.
    core::ptr::write_volatile(p, v)
}

/// LL's line store: each 8-byte half as one atomic store (see [`ld_volatile_pack`]), released
/// so that a reader that sees its flag also sees what this thread wrote before.
pub unsafe fn st_volatile_pack(p: *mut Pack16, v: Pack16) {
    // SAFETY: as st_pack; the halves are 8-byte aligned.
    let h = p as *const AtomicU64;
    let [a, b, c, d] = v.0.map(u64::from);
    (*h).store(a | (b << 32), Ordering::Release);
    (*h.add(1)).store(c | (d << 32), Ordering::Release);
}

pub fn spin_pause() {
    std::thread::yield_now()
}

/// Runs a warp-wide exchange: every lane of this thread's warp publishes `v`, then `pick`
/// reads the row. Lanes outside `mask` must not call it (as on the GPU).
fn warp_exchange<R>(mask: u32, v: u32, pick: impl FnOnce(&[u32], u32) -> R) -> R {
    with_ctx(|c| {
        let warp = (c.tid / WARP) as usize;
        let lane = c.tid % WARP;
        let lanes = mask.count_ones();
        c.cta.warp_slots[warp]
            .lock()
            .unwrap_or_else(|p| p.into_inner())[lane as usize] = v;
        c.cta.warp_barriers[warp].wait(lanes);
        let r = {
            let row = c.cta.warp_slots[warp]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            pick(&row, lane)
        };
        // Nobody may overwrite the row before every lane has read it.
        c.cta.warp_barriers[warp].wait(lanes);
        r
    })
}

/// LL128 lines are whole on NVLink. Here a lock per line (striped by address) makes them so:
/// writers and readers of a line take it, and a line's flag is published only once all 8 of
/// its parts are written (the flag's part holds it back until then), so a reader that sees
/// the flag sees the whole line, whatever order the lanes wrote in.
type Pending = std::vec::Vec<(usize, u32, [u32; 2])>;

/// The lock of the line at `line`, with its stripe's table: per line address, the parts
/// written since its flag was last published, and that flag.
fn lines(line: *const Pack16) -> std::sync::MutexGuard<'static, Pending> {
    static LOCKS: [Mutex<Pending>; 64] = [const { Mutex::new(Pending::new()) }; 64];
    LOCKS[(line as usize >> 7) % 64]
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// See the GPU version: part `part` of the line at `line` once its flag equals `flag`, spinning
/// a while before saying None (so the warp meets rarely while a line is on its way).
pub unsafe fn ll128_load(line: *const Pack16, part: usize, flag: u64) -> Option<Pack16> {
    if line.is_null() {
        return Some(Pack16::default());
    }
    for _ in 0..4096 {
        let _l = lines(line);
        // The flag first: it is published after the rest of the line and stays until the
        // slot is released, so once it matches the whole line can be read (also from another
        // process, whose writer holds another process's lock).
        // SAFETY: the caller passes a 128-byte line of a FIFO.
        let last = core::ptr::read_volatile(line.add(7));
        if (last.0[2] as u64) | ((last.0[3] as u64) << 32) == flag {
            fence(Ordering::Acquire);
            // SAFETY: as above.
            return Some(core::ptr::read_volatile(line.add(part)));
        }
        drop(_l);
        std::thread::yield_now();
    }
    None
}

/// See the GPU version. Each lane writes its part under the line's lock; the flag words of part
/// 7 wait in the lock's table until the line's eighth part is in, then go in with it.
pub unsafe fn ll128_store(line: *mut Pack16, part: usize, v: Pack16) {
    if line.is_null() {
        return;
    }
    let mut l = lines(line);
    let at = match l.iter().position(|e| e.0 == line as usize) {
        Some(i) => i,
        None => {
            l.push((line as usize, 0, [0, 0]));
            l.len() - 1
        }
    };
    let mut mine = v;
    if part == 7 {
        l[at].2 = [v.0[2], v.0[3]];
        // SAFETY: as in ll128_load; the old flag stays until the line is complete.
        let old = core::ptr::read_volatile(line.add(7));
        mine.0[2] = old.0[2];
        mine.0[3] = old.0[3];
    }
    l[at].1 += 1;
    let (complete, flag) = (l[at].1 == 8, l[at].2);
    if complete {
        l.swap_remove(at);
    }
    // SAFETY: as in ll128_load.
    core::ptr::write_volatile(line.add(part), mine);
    if complete {
        fence(Ordering::Release);
        let last = line.add(7);
        let mut p = core::ptr::read_volatile(last);
        p.0[2] = flag[0];
        p.0[3] = flag[1];
        core::ptr::write_volatile(last, p);
    }
}

pub fn shfl_sync(mask: u32, v: u32, src: u32) -> u32 {
    warp_exchange(mask, v, |row, _| row[(src % WARP) as usize])
}

pub fn vote_any(mask: u32, p: bool) -> bool {
    warp_exchange(mask, p as u32, |row, _| {
        (0..WARP).any(|l| mask & (1 << l) != 0 && row[l as usize] != 0)
    })
}

pub fn vote_all(mask: u32, p: bool) -> bool {
    warp_exchange(mask, p as u32, |row, _| {
        (0..WARP).all(|l| mask & (1 << l) == 0 || row[l as usize] != 0)
    })
}

/// See the GPU version: here plain indexing.
///
/// # Safety
/// `i` < `args.nitems`.
pub unsafe fn p2p_param_item(args: &crate::abi::P2pArgs, i: usize) -> crate::abi::P2pItem {
    args.items[i]
}

pub fn trap() -> ! {
    panic!("nccl-device: kernel trap")
}

/// One mapping of a multicast object: `len` bytes at `base` (an address range reserved for it
/// and never touched directly) stand for the same offsets in each member's buffer.
struct McWindow {
    base: u64,
    len: u64,
    members: Vec<u64>,
}

fn mc_windows() -> &'static std::sync::RwLock<Vec<McWindow>> {
    static W: std::sync::RwLock<Vec<McWindow>> = std::sync::RwLock::new(Vec::new());
    &W
}

/// The simulator backend maps a multicast object at `base` (`len` bytes) over `members` (the
/// buffers bound to it, one per member GPU); called again as members bind.
pub fn mc_set_window(base: u64, len: u64, members: Vec<u64>) {
    let mut w = mc_windows().write().unwrap_or_else(|p| p.into_inner());
    w.retain(|x| x.base != base);
    w.push(McWindow { base, len, members });
}

/// The mapping at `base` is gone.
pub fn mc_remove_window(base: u64) {
    let mut w = mc_windows().write().unwrap_or_else(|p| p.into_inner());
    w.retain(|x| x.base != base);
}

/// Runs `f` on the member addresses `bytes` bytes at multicast address `p` stand for: a
/// multicast access outside any mapping, or one whose members are not all bound, traps (a GPU
/// faults).
fn with_members<R>(p: u64, bytes: u64, f: impl FnOnce(&mut dyn Iterator<Item = u64>) -> R) -> R {
    let w = mc_windows().read().unwrap_or_else(|p| p.into_inner());
    let Some(win) = w
        .iter()
        .find(|x| p >= x.base && p + bytes <= x.base + x.len)
    else {
        drop(w);
        panic!("nccl-device sim: multimem access at {p:#x} outside every multicast mapping");
    };
    let off = p - win.base;
    if win.members.is_empty() {
        drop(w);
        panic!("nccl-device sim: multimem access at {p:#x}: no memory bound");
    }
    let mut it = win.members.iter().map(|m| m + off);
    f(&mut it)
}

/// See the GPU version: reads the pack from every member in turn and reduces lane by lane.
pub unsafe fn multimem_ld_reduce<T: crate::types::Elem>(
    op: super::McOp,
    p: *const Pack16,
) -> Pack16 {
    use super::McOp;
    if super::multimem_op(
        T::DTYPE,
        match op {
            McOp::Add => crate::ops::RedOpKind::Sum,
            McOp::Min => crate::ops::RedOpKind::Min,
            McOp::Max => crate::ops::RedOpKind::Max,
        },
    )
    .is_none()
    {
        trap();
    }
    MULTIMEM_LOADS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    with_members(p as u64, 16, |members| {
        let mut acc: Option<Pack16> = None;
        for m in members {
            // SAFETY: a bound member's buffer covers the window (the backend checked the
            // binding's size); the pack lies inside it.
            let v = core::ptr::read_volatile(m as *const Pack16);
            acc = Some(match acc {
                None => v,
                Some(a) => crate::ops::map2::<T>(a, v, |x, y| match op {
                    McOp::Add => x.add(y),
                    McOp::Min => x.lesser(y),
                    McOp::Max => x.greater(y),
                }),
            });
        }
        acc.unwrap_or_default()
    })
}

/// Packs `multimem_ld_reduce` reduced in this process (the tests see which path a call took).
static MULTIMEM_LOADS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// How many packs [`multimem_ld_reduce`] has reduced in this process.
pub fn multimem_loads() -> u64 {
    MULTIMEM_LOADS.load(core::sync::atomic::Ordering::Relaxed)
}

/// Packs `multimem_st` wrote in this process (the tests see which path a call took).
static MULTIMEM_STORES: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// How many packs [`multimem_st`] has written in this process.
pub fn multimem_stores() -> u64 {
    MULTIMEM_STORES.load(core::sync::atomic::Ordering::Relaxed)
}

/// See the GPU version: writes the pack to every member.
pub unsafe fn multimem_st(p: *mut Pack16, v: Pack16) {
    MULTIMEM_STORES.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    with_members(p as u64, 16, |members| {
        for m in members {
            // SAFETY: as in multimem_ld_reduce.
            core::ptr::write_volatile(m as *mut Pack16, v);
        }
    })
}

/// See the GPU version: a release add on every member's counter.
pub unsafe fn multimem_red_add_u64(p: *mut u64, v: u64) {
    with_members(p as u64, 8, |members| {
        for m in members {
            // SAFETY: as in multimem_ld_reduce; the counter is 8-byte aligned.
            (*(m as *const AtomicU64)).fetch_add(v, Ordering::Release);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicU32;

    #[test]
    fn indices_barriers_and_warp_ops() {
        let hits = AtomicU32::new(0);
        let sums = Mutex::new(std::vec::Vec::new());
        let body = || {
            let t = thread_idx();
            assert_eq!(block_dim(), 40);
            assert_eq!(grid_dim(), 3);
            hits.fetch_add(1, Ordering::SeqCst);
            sync_threads();
            // Everyone arrived before anyone passed the barrier.
            assert_eq!(hits.load(Ordering::SeqCst) % 40, 0);
            // A named barrier for the first warp only.
            if t < 32 {
                barrier_named(1, 32);
                let mask = u32::MAX;
                assert_eq!(shfl_sync(mask, t * 10, 5), 50);
                assert!(vote_any(mask, t == 31));
                assert!(!vote_all(mask, t != 7));
                assert!(vote_all(mask, t < 32));
            }
            sync_threads();
            lock_push(&sums, (block_idx(), t));
        };
        for b in 0..3 {
            hits.store(0, Ordering::SeqCst);
            run_cta(b, 3, 40, &body);
        }
        assert_eq!(sums.lock().unwrap().len(), 120);
    }

    fn lock_push(m: &Mutex<std::vec::Vec<(u32, u32)>>, v: (u32, u32)) {
        m.lock().unwrap().push(v);
    }

    #[test]
    fn release_acquire_publishes_data() {
        let data = std::boxed::Box::new([0u64; 64]);
        let flag = std::boxed::Box::new(0u64);
        let (dp, fp) = (data.as_ptr() as u64, &*flag as *const u64 as u64);
        let body = move || unsafe {
            if thread_idx() == 0 {
                for i in 0..64 {
                    *(dp as *mut u64).add(i) = i as u64 + 1;
                }
                st_release_sys(fp as *mut u64, 1);
            } else {
                while ld_acquire_sys(fp as *const u64) == 0 {
                    spin_pause();
                }
                for i in 0..64 {
                    assert_eq!(*(dp as *const u64).add(i), i as u64 + 1);
                }
            }
        };
        run_cta(0, 1, 2, &body);
    }

    /// LL's guarantee: a reader that sees a half's flag sees that half's data with it. The
    /// writer rewrites one line with `{i, i, i, i}` as fast as it can; every line the reader
    /// polls must hold equal words in each half.
    #[test]
    fn ll_line_halves_are_never_torn() {
        let line = std::boxed::Box::new(Pack16::default());
        let lp = &*line as *const Pack16 as u64;
        const LAST: u32 = 200_000;
        let body = move || unsafe {
            let p = lp as *mut Pack16;
            if thread_idx() == 0 {
                for i in 1..=LAST {
                    st_volatile_pack(p, Pack16([i, i, i, i]));
                }
            } else {
                loop {
                    let v = ld_volatile_pack(p);
                    assert!(v.0[0] == v.0[1] && v.0[2] == v.0[3], "torn line {:?}", v.0);
                    if v.0[1] == LAST && v.0[3] == LAST {
                        break;
                    }
                }
            }
        };
        run_cta(0, 1, 2, &body);
    }

    /// A multicast window over three members: ld_reduce reduces the three packs lane by lane,
    /// st and red reach all three, an access outside every window traps.
    #[test]
    fn multicast_windows_reach_every_member() {
        use crate::arch::McOp;
        let mut members = [[0u64; 4]; 3];
        for (m, mem) in members.iter_mut().enumerate() {
            let f = [1.5f32 * (m as f32 + 1.0), -2.0, m as f32, 8.0];
            let p = mem.as_mut_ptr() as *mut f32;
            for (i, v) in f.iter().enumerate() {
                unsafe { p.add(i).write(*v) };
            }
        }
        let window = std::vec![0u8; 32];
        let base = window.as_ptr() as u64;
        let addrs = members.iter().map(|m| m.as_ptr() as u64).collect();
        mc_set_window(base, 32, addrs);
        unsafe {
            let sum = multimem_ld_reduce::<f32>(McOp::Add, base as *const Pack16);
            let got: [f32; 4] = core::mem::transmute(sum.0);
            assert_eq!(got, [9.0, -6.0, 3.0, 24.0]);
            multimem_st(base as *mut Pack16, Pack16([7, 8, 9, 10]));
            multimem_red_add_u64((base + 16) as *mut u64, 5);
        }
        for m in &members {
            let p = m.as_ptr() as *const u32;
            assert_eq!(
                unsafe { [*p, *p.add(1), *p.add(2), *p.add(3)] },
                [7, 8, 9, 10]
            );
            assert_eq!(m[2], 5);
        }
        // Outside every window is a fault.
        let r = std::panic::catch_unwind(|| unsafe {
            multimem_st((base + 32) as *mut Pack16, Pack16::default())
        });
        assert!(r.is_err());
        let r = std::panic::catch_unwind(|| unsafe {
            multimem_ld_reduce::<i8>(McOp::Add, base as *const Pack16)
        });
        assert!(r.is_err(), "int8 has no multimem.ld_reduce");
        mc_remove_window(base);
    }

    #[test]
    fn a_trap_reaches_the_launcher() {
        let r = std::panic::catch_unwind(|| {
            run_cta(0, 1, 2, &|| {
                if thread_idx() == 1 {
                    trap();
                }
            })
        });
        assert!(r.is_err());
    }
}
