//! The facade on NVIDIA GPUs: special registers, barriers, memory-model loads/stores and fences
//! written as inline PTX.

use super::Pack16;
use crate::abi::{P2pArgs, P2pItem};
use core::arch::asm;
use core::arch::nvptx;

#[inline(always)]
pub fn thread_idx() -> u32 {
    // SAFETY: reading a special register has no side effects.
    unsafe { nvptx::_thread_idx_x() as u32 }
}
#[inline(always)]
pub fn block_idx() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_x() as u32 }
}
#[inline(always)]
pub fn block_dim() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_dim_x() as u32 }
}
#[inline(always)]
pub fn grid_dim() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// The GPU's global nanosecond timer (`%globaltimer`; it ticks in steps of up to a
/// microsecond on some GPUs). For the kernel-stamps lab only.
#[inline(always)]
pub fn globaltimer() -> u64 {
    let t: u64;
    // SAFETY: reading a special register has no side effects.
    unsafe { asm!("mov.u64 {}, %globaltimer;", out(reg64) t, options(nostack)) };
    t
}

/// `__syncthreads()`: every thread of the CTA waits here.
///
/// `barrier.sync` without `.aligned` (PTX 6.0, sm_70): threads may reach it from divergent
/// paths, as they do after thread 0 alone spun on a counter. `bar.sync` is the `.aligned`
/// form, which counts a whole warp as arrived when some of its lanes do; a lane still spinning
/// then lags one barrier behind its CTA (2 processes as 2 nodes on one H100: LL and LL128 steps
/// over the network hung so, the receiving thread 0 never releasing its slot).
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a CTA-wide barrier; every thread of the CTA reaches it.
    unsafe { asm!("barrier.sync 0;", options(nostack)) }
}

/// `__syncthreads_or(pred)`: [`sync_threads`], returning whether `pred` held in some thread
/// of the CTA (`barrier.red.or.pred`, not `.aligned`, as `sync_threads`).
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let out: u32;
    // SAFETY: a CTA-wide barrier with a reduction; every thread of the CTA reaches it.
    unsafe {
        asm!(
            "{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; barrier.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
            x = in(reg32) pred as u32,
            r = out(reg32) out,
            options(nostack)
        )
    }
    out != 0
}

/// A named barrier `id` (1..16) for `nthreads` threads (a multiple of 32); not `.aligned`,
/// as [`sync_threads`].
#[inline(always)]
pub fn barrier_named(id: u32, nthreads: u32) {
    // SAFETY: as sync_threads, for the threads taking part.
    unsafe { asm!("barrier.sync {}, {};", in(reg32) id, in(reg32) nthreads, options(nostack)) }
}

/// Load with acquire semantics at system scope: sees what a peer GPU or the host released.
#[inline(always)]
pub unsafe fn ld_acquire_sys(p: *const u64) -> u64 {
    let v: u64;
    asm!("ld.acquire.sys.global.u64 {}, [{}];", out(reg64) v, in(reg64) p, options(nostack));
    v
}

/// Store with release semantics at system scope: everything this thread wrote (and what it
/// observed through a barrier) is visible to whoever acquires the value.
#[inline(always)]
pub unsafe fn st_release_sys(p: *mut u64, v: u64) {
    asm!("st.release.sys.global.u64 [{}], {};", in(reg64) p, in(reg64) v, options(nostack));
}

#[inline(always)]
pub unsafe fn ld_volatile(p: *const u64) -> u64 {
    let v: u64;
    asm!("ld.volatile.global.u64 {}, [{}];", out(reg64) v, in(reg64) p, options(nostack));
    v
}

#[inline(always)]
pub unsafe fn st_volatile(p: *mut u64, v: u64) {
    asm!("st.volatile.global.u64 [{}], {};", in(reg64) p, in(reg64) v, options(nostack));
}

/// `atomicAdd` on a u64 of this GPU's memory: the value before.
#[inline(always)]
pub unsafe fn atomic_add_u64(p: *mut u64, v: u64) -> u64 {
    let old: u64;
    asm!("atom.add.u64 {}, [{}], {};", out(reg64) old, in(reg64) p, in(reg64) v, options(nostack));
    old
}

/// Adds `v` to a u64 with release semantics at system scope (a peer GPU's memory too): what
/// this thread wrote before is visible to whoever acquires the sum.
#[inline(always)]
pub unsafe fn red_add_release_sys(p: *mut u64, v: u64) {
    asm!("red.release.sys.global.add.u64 [{}], {};", in(reg64) p, in(reg64) v, options(nostack));
}

/// `__threadfence_system()`.
#[inline(always)]
pub fn fence_sys() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.sys;", options(nostack)) }
}

/// `__threadfence()`.
#[inline(always)]
pub fn fence_gpu() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) }
}

/// 16-byte load that bypasses L1 (data written by other GPUs must never come from a stale L1 line).
#[inline(always)]
pub unsafe fn ld_pack(p: *const Pack16) -> Pack16 {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!("ld.global.cg.v4.u32 {{{}, {}, {}, {}}}, [{}];",
        out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) p, options(nostack, readonly));
    Pack16([a, b, c, d])
}

/// 16-byte volatile load, for polling LL lines: every call reads memory again (never a cached
/// L1 line, never hoisted out of the loop), and the four words come from one access.
#[inline(always)]
pub unsafe fn ld_volatile_pack(p: *const Pack16) -> Pack16 {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!("ld.volatile.global.v4.u32 {{{}, {}, {}, {}}}, [{}];",
        out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) p, options(nostack, readonly));
    Pack16([a, b, c, d])
}

/// 16-byte store.
#[inline(always)]
pub unsafe fn st_pack(p: *mut Pack16, v: Pack16) {
    let [a, b, c, d] = v.0;
    asm!("st.global.v4.u32 [{}], {{{}, {}, {}, {}}};",
        in(reg64) p, in(reg32) a, in(reg32) b, in(reg32) c, in(reg32) d, options(nostack));
}

/// 16-byte volatile store, as NCCL stores LL and LL128 lines: it leaves at once, unmerged,
/// for a peer polling the line's flag.
#[inline(always)]
pub unsafe fn st_volatile_pack(p: *mut Pack16, v: Pack16) {
    let [a, b, c, d] = v.0;
    asm!("st.volatile.global.v4.u32 [{}], {{{}, {}, {}, {}}};",
        in(reg64) p, in(reg32) a, in(reg32) b, in(reg32) c, in(reg32) d, options(nostack));
}

/// LL128: part `part` (0..8, 16 bytes each) of the 128-byte line at `line`, once the line's
/// flag (the last 8 bytes, in part 7) equals `flag`; None while it does not. Every lane of the
/// warp calls it at once, the 8 lanes of a line with its 8 parts: their loads are one 128-byte
/// access, which NVLink serves whole, so the flag vouches for the whole line. A null `line` is
/// a lane with no line (the whole group of 8): Some(zero).
#[inline(always)]
pub unsafe fn ll128_load(line: *const Pack16, part: usize, flag: u64) -> Option<Pack16> {
    // Lanes that diverged before (partial last lines) must load in one instruction: data
    // loaded apart from the flag may predate it.
    warp_sync(u32::MAX);
    let v = if line.is_null() {
        Pack16::default()
    } else {
        ld_volatile_pack(line.add(part))
    };
    let seen = (v.0[2] as u64) | ((v.0[3] as u64) << 32);
    let mine = line.is_null() || part != 7 || seen == flag;
    let flag_lane = (thread_idx() % 32) | 7;
    match shfl_sync(u32::MAX, mine as u32, flag_lane) != 0 {
        true => Some(v),
        false => None,
    }
}

/// LL128: writes part `part` of the line at `line` (null: nothing); the 8 lanes of a line store
/// together, one 128-byte access (see [`ll128_load`]). Every lane of the warp calls it at once.
#[inline(always)]
pub unsafe fn ll128_store(line: *mut Pack16, part: usize, v: Pack16) {
    // Reconverge first: with independent thread scheduling, lanes that diverged (a partial
    // last line stores part of its output) could otherwise store the flag's part before the
    // data parts, and a reader would see the flag over stale data.
    warp_sync(u32::MAX);
    if !line.is_null() {
        // Volatile: the line must travel as the warp wrote it, not buffered or merged.
        st_volatile_pack(line.add(part), v);
    }
}

/// Waits until every lane of `mask` arrives here (`bar.warp.sync`): they go on converged.
#[inline(always)]
pub fn warp_sync(mask: u32) {
    // SAFETY: a warp barrier among the lanes in `mask`, which all call it.
    unsafe { asm!("bar.warp.sync {};", in(reg32) mask, options(nostack)) }
}

/// Spin-loop hint: back off briefly so polling does not saturate the memory system.
#[inline(always)]
pub fn spin_pause() {
    // SAFETY: nanosleep only delays this thread (sm_70+).
    unsafe { asm!("nanosleep.u32 20;", options(nostack)) }
}

/// Warp shuffle: the value `v` of lane `src` (within `mask`).
#[inline(always)]
pub fn shfl_sync(mask: u32, v: u32, src: u32) -> u32 {
    let r: u32;
    // SAFETY: warp-synchronous register exchange among the lanes in `mask`.
    unsafe {
        asm!("shfl.sync.idx.b32 {}, {}, {}, 31, {};", out(reg32) r, in(reg32) v, in(reg32) src, in(reg32) mask, options(nostack))
    };
    r
}

/// Warp vote: true when `p` holds on any lane of `mask`.
#[inline(always)]
pub fn vote_any(mask: u32, p: bool) -> bool {
    let r: u32;
    // SAFETY: warp-synchronous vote among the lanes in `mask`.
    unsafe {
        asm!("{{ .reg .pred %p, %q; setp.ne.u32 %p, {}, 0; vote.sync.any.pred %q, %p, {}; selp.u32 {}, 1, 0, %q; }}",
            in(reg32) p as u32, in(reg32) mask, out(reg32) r, options(nostack))
    };
    r != 0
}

/// Warp vote: true when `p` holds on every lane of `mask`.
#[inline(always)]
pub fn vote_all(mask: u32, p: bool) -> bool {
    let r: u32;
    // SAFETY: warp-synchronous vote among the lanes in `mask`.
    unsafe {
        asm!("{{ .reg .pred %p, %q; setp.ne.u32 %p, {}, 0; vote.sync.all.pred %q, %p, {}; selp.u32 {}, 1, 0, %q; }}",
            in(reg32) p as u32, in(reg32) mask, out(reg32) r, options(nostack))
    };
    r != 0
}

/// Stop the kernel with an error the host sees as a launch failure.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: trap ends the kernel.
    unsafe { asm!("trap;", options(nostack, noreturn)) }
}

// The seven words p2p_param_item reads: four u64 fields, then kind (low half) and slot_bytes,
// then direct and offer_key.
const _: () = assert!(
    core::mem::size_of::<P2pItem>() == 56
        && core::mem::offset_of!(P2pItem, direct) == 40
        && core::mem::offset_of!(P2pItem, offer_key) == 48
        && core::mem::offset_of!(P2pItem, bytes) == 24
        && core::mem::offset_of!(P2pItem, kind) == 32
        && core::mem::offset_of!(P2pItem, slot_bytes) == 36
);

/// Work item `i` of the `nccl_p2p` kernel's parameter, read straight from the parameter space
/// with a run-time offset (PTX: a kernel parameter's address moved into a register is read with
/// `ld.param`). Indexing the parameter in Rust makes LLVM copy all of it (2.5 KiB) to local
/// memory in every thread first: on 2xH200 an 8-byte send/recv then took 31 us against
/// NCCL's 15. Call it from `nccl_p2p` only: the asm names that kernel's parameter.
#[inline(always)]
pub unsafe fn p2p_param_item(_args: &P2pArgs, i: usize) -> P2pItem {
    let base: u64;
    // SAFETY: takes the address of the enclosing kernel's parameter; no memory is touched.
    asm!("mov.b64 {}, nccl_p2p_param_0;", out(reg64) base, options(pure, nomem, nostack));
    let at =
        base + (core::mem::offset_of!(P2pArgs, items) + i * core::mem::size_of::<P2pItem>()) as u64;
    let word = |k: u64| -> u64 {
        let v: u64;
        // SAFETY: `i` < MAX_P2P_ITEMS (the caller checked it against nitems), so the 8-byte
        // word lies inside the parameter, which no one writes.
        asm!("ld.param.b64 {}, [{}];", out(reg64) v, in(reg64) at + 8 * k,
             options(pure, readonly, nostack));
        v
    };
    let last = word(4);
    P2pItem {
        conn: word(0),
        buff: word(1),
        src: word(2),
        bytes: word(3),
        kind: last as u32,
        slot_bytes: (last >> 32) as u32,
        direct: word(5),
        offer_key: word(6),
    }
}

// ---- Multicast memory (NVLink SHARP): sm_90 and PTX ISA 8.1 or newer ----
//
// `multimem.*` instructions take a multicast address (a mapping of a multicast object, which
// names one buffer on each member GPU): `ld_reduce` loads the value from every member and returns
// the reduction the switch computed; `st` writes every member; `red` reduces into every member.
// build.rs compiles this part only for architectures that have it (`--cfg nccl_rs_multimem`,
// with `+ptx81`): on older ones every function below traps, and the host never launches NVLS
// there (it never creates a multicast object unless the user set NCCL_NVLS_ENABLE to 1 and
// the devices support multicast).

/// `multimem.ld_reduce` of one 16-byte pack of `T` at multicast address `p` with `op`: the
/// widest form the ISA has for the type (`.v4.f32`, `.v4.f16x2`, `.v4.bf16x2` in one
/// instruction; `.f64`, `.u64`, `.s64` two, 32-bit integers four: integer forms take no
/// `.vec`). A (type, reduction) outside [`super::multimem_op`] traps.
#[cfg(nccl_rs_multimem)]
#[inline(always)]
pub unsafe fn multimem_ld_reduce<T: crate::types::Elem>(
    op: super::McOp,
    p: *const Pack16,
) -> Pack16 {
    use super::McOp::*;
    use crate::types::DataType::*;
    macro_rules! v4 {
        ($ins:literal) => {{
            let (a, b, c, d): (u32, u32, u32, u32);
            asm!(concat!("multimem.ld_reduce.relaxed.sys.global.", $ins, " {{{}, {}, {}, {}}}, [{}];"),
                out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) p, options(nostack));
            Pack16([a, b, c, d])
        }};
    }
    macro_rules! s32x4 {
        ($ins:literal) => {{
            let (a, b, c, d): (u32, u32, u32, u32);
            asm!(concat!("multimem.ld_reduce.relaxed.sys.global.", $ins, " {}, [{}];\n\t",
                         "multimem.ld_reduce.relaxed.sys.global.", $ins, " {}, [{}+4];\n\t",
                         "multimem.ld_reduce.relaxed.sys.global.", $ins, " {}, [{}+8];\n\t",
                         "multimem.ld_reduce.relaxed.sys.global.", $ins, " {}, [{}+12];"),
                out(reg32) a, in(reg64) p, out(reg32) b, in(reg64) p,
                out(reg32) c, in(reg64) p, out(reg32) d, in(reg64) p, options(nostack));
            Pack16([a, b, c, d])
        }};
    }
    macro_rules! s64x2 {
        ($ins:literal) => {{
            let (a, b): (u64, u64);
            asm!(concat!("multimem.ld_reduce.relaxed.sys.global.", $ins, " {}, [{}];\n\t",
                         "multimem.ld_reduce.relaxed.sys.global.", $ins, " {}, [{}+8];"),
                out(reg64) a, in(reg64) p, out(reg64) b, in(reg64) p, options(nostack));
            Pack16([a as u32, (a >> 32) as u32, b as u32, (b >> 32) as u32])
        }};
    }
    match (T::DTYPE, op) {
        (Float32, Add) => v4!("add.v4.f32"),
        (Float16, Add) => v4!("add.v4.f16x2"),
        (Float16, Min) => v4!("min.v4.f16x2"),
        (Float16, Max) => v4!("max.v4.f16x2"),
        (Bfloat16, Add) => v4!("add.v4.bf16x2"),
        (Bfloat16, Min) => v4!("min.v4.bf16x2"),
        (Bfloat16, Max) => v4!("max.v4.bf16x2"),
        (Float64, Add) => s64x2!("add.f64"),
        (Int32, Add) => s32x4!("add.s32"),
        (Int32, Min) => s32x4!("min.s32"),
        (Int32, Max) => s32x4!("max.s32"),
        (Uint32, Add) => s32x4!("add.u32"),
        (Uint32, Min) => s32x4!("min.u32"),
        (Uint32, Max) => s32x4!("max.u32"),
        // The ISA's .add has no .s64: two's-complement sums are the same bits as .u64's.
        (Int64, Add) | (Uint64, Add) => s64x2!("add.u64"),
        (Int64, Min) => s64x2!("min.s64"),
        (Int64, Max) => s64x2!("max.s64"),
        (Uint64, Min) => s64x2!("min.u64"),
        (Uint64, Max) => s64x2!("max.u64"),
        _ => trap(),
    }
}

/// `multimem.st` of one 16-byte pack to every member at multicast address `p` (`.v4.f32`:
/// a store moves bits, whatever the element type).
#[cfg(nccl_rs_multimem)]
#[inline(always)]
pub unsafe fn multimem_st(p: *mut Pack16, v: Pack16) {
    let [a, b, c, d] = v.0;
    asm!("multimem.st.relaxed.sys.global.v4.f32 [{}], {{{}, {}, {}, {}}};",
        in(reg64) p, in(reg32) a, in(reg32) b, in(reg32) c, in(reg32) d, options(nostack));
}

/// `multimem.red.release.sys` adding `v` to the u64 at multicast address `p` on every member:
/// what this thread wrote before (and saw through a barrier) is visible to whoever acquires
/// the new value on any member.
#[cfg(nccl_rs_multimem)]
#[inline(always)]
pub unsafe fn multimem_red_add_u64(p: *mut u64, v: u64) {
    asm!("multimem.red.release.sys.global.add.u64 [{}], {};", in(reg64) p, in(reg64) v, options(nostack));
}

/// Without multicast (before sm_90): never called, the host launches no NVLS kernel here.
#[cfg(not(nccl_rs_multimem))]
#[inline(always)]
pub unsafe fn multimem_ld_reduce<T: crate::types::Elem>(
    _op: super::McOp,
    _p: *const Pack16,
) -> Pack16 {
    trap()
}

/// See above.
#[cfg(not(nccl_rs_multimem))]
#[inline(always)]
pub unsafe fn multimem_st(_p: *mut Pack16, _v: Pack16) {
    trap()
}

/// See above.
#[cfg(not(nccl_rs_multimem))]
#[inline(always)]
pub unsafe fn multimem_red_add_u64(_p: *mut u64, _v: u64) {
    trap()
}
