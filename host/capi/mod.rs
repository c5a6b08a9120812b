//! The C ABI (feature `capi`): NCCL's functions under their C names, each also as `pnccl…`
//! (the profiling aliases), over the Rust API. `include/nccl.h` declares them.
//!
//! Every entry point checks its pointers (null: `ncclInvalidArgument`), catches panics (none
//! crosses into C: `ncclInternalError`), and records the message of any error for
//! `ncclGetLastError`. A `ncclComm_t` points to a [`CommHandle`]: a communicator that may
//! still be in creation (non-blocking config, or created inside a group), ready, or failed.
//! Every entry point finds its handle among the live ones before using it, so a destroyed,
//! doubly destroyed or garbage `ncclComm_t` is `ncclInvalidArgument` (a handle destroyed
//! long ago, whose address a new communicator reuses, names that new one: undetectable).

mod config;
mod handle;

pub use config::{NcclConfig, NCCL_CONFIG_MAGIC, NCCL_CONFIG_UNDEF_INT};
pub use handle::CommHandle;
use handle::{coll_comm, count_of, dev, dtype, handle, stream_of};

use crate::bootstrap::UniqueId;
use crate::comm::ReduceOp;
use crate::comm::{Comm, Config, PendingComm};
use crate::cuda::{DevBuffer, Device, StreamHandle};
use crate::enqueue::group;
use crate::error::{Error, NcclResult, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

/// `ncclComm_t`.
pub type NcclComm = *mut CommHandle;
/// `cudaStream_t` (a `CUstream`).
pub type CudaStream = *mut c_void;

/// Runs an entry point's body: errors become their code, panics `ncclInternalError`. The first
/// entry installs NCCL's logger (C programs expect `NCCL_DEBUG` to work).
fn guard(f: impl FnOnce() -> Result<NcclResult>) -> NcclResult {
    crate::debug::install_logger();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => e.code,
        Err(_) => Error::internal("a panic was caught at the C API boundary").code,
    }
}

/// `ncclScalarDevice`.
const SCALAR_DEVICE: c_int = 0;
/// `ncclScalarHostImmediate`.
const SCALAR_HOST_IMMEDIATE: c_int = 1;

fn null(what: &str) -> Error {
    Error::invalid_argument(format!("{what} is a null pointer"))
}

/// Defines `nccl<Name>` and its alias `pnccl<Name>`, both returning `ncclResult_t`.
macro_rules! export {
    ($(#[$doc:meta])* fn $name:ident / $alias:ident ($($a:ident : $t:ty),* $(,)?) $body:block) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Pointers must be null or valid for the access NCCL documents for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> NcclResult {
            guard(|| $body)
        }
        /// The profiling alias of the function of the same name without the `p`.
        ///
        /// # Safety
        /// As the function it aliases.
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($a: $t),*) -> NcclResult {
            $name($($a),*)
        }
    };
}

// After the macro: these files export entry points through it.
mod colls;
mod grow;
mod memory;
mod onesided;
pub use colls::*;
pub use grow::*;
pub use memory::*;
pub use onesided::*;

export! {
    /// `ncclGetVersion`.
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) {
        let v = version.as_mut().ok_or_else(|| null("version"))?;
        *v = crate::VERSION;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclGetUniqueId`.
    fn ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut UniqueId) {
        let out = unique_id.as_mut().ok_or_else(|| null("uniqueId"))?;
        *out = crate::bootstrap::get_unique_id()?;
        Ok(NcclResult::Success)
    }
}

/// Wraps a creation in a handle and stores it in `out`; what the creation call returns.
unsafe fn hand_out(out: *mut NcclComm, pending: PendingComm, blocking: bool) -> Result<NcclResult> {
    let h = CommHandle::pending(pending, blocking);
    let code = if !blocking {
        NcclResult::InProgress
    } else if group::depth() > 0 {
        // Created at the group's end; its errors come back from ncclGroupEnd.
        NcclResult::Success
    } else {
        // Blocking: the creation already ran; report its outcome here.
        h.ready()?;
        NcclResult::Success
    };
    *out = handle::hand_out(h);
    Ok(code)
}

unsafe fn init_scalable(
    out: *mut NcclComm,
    nranks: c_int,
    rank: c_int,
    ids: Vec<UniqueId>,
    config: *const NcclConfig,
) -> Result<NcclResult> {
    let slot = out.as_mut().ok_or_else(|| null("comm"))?;
    *slot = std::ptr::null_mut();
    let n = count_of("nranks", nranks)?;
    let r = count_of("rank", rank)?;
    let cfg = config::read(config)?;
    let blocking = cfg.resolve(None)?.blocking;
    let device = Device::current()?;
    let pending = Comm::start_init_rank_scalable_on(device, n, r, &ids, &cfg)?;
    hand_out(out, pending, blocking)
}

export! {
    /// `ncclCommInitRank`: on the calling thread's current device.
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut NcclComm, nranks: c_int, comm_id: UniqueId, rank: c_int) {
        init_scalable(comm, nranks, rank, vec![comm_id], std::ptr::null())
    }
}

export! {
    /// `ncclCommInitRankConfig`.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut NcclComm,
        nranks: c_int,
        comm_id: UniqueId,
        rank: c_int,
        config: *const NcclConfig,
    ) {
        init_scalable(comm, nranks, rank, vec![comm_id], config)
    }
}

export! {
    /// `ncclCommInitRankScalable`: `n_id` ids, rank r using the one NCCL's rule assigns it.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut NcclComm,
        nranks: c_int,
        myrank: c_int,
        n_id: c_int,
        comm_ids: *const UniqueId,
        config: *const NcclConfig,
    ) {
        if comm_ids.is_null() {
            return Err(null("commIds"));
        }
        let k = count_of("nId", n_id)?;
        if k == 0 {
            return Err(Error::invalid_argument("nId is 0"));
        }
        let ids = std::slice::from_raw_parts(comm_ids, k).to_vec();
        init_scalable(newcomm, nranks, myrank, ids, config)
    }
}

export! {
    /// `ncclCommInitAll`: one communicator per device, in this process; `devlist` NULL means
    /// devices 0 to ndev-1.
    fn ncclCommInitAll / pncclCommInitAll(comms: *mut NcclComm, ndev: c_int, devlist: *const c_int) {
        if comms.is_null() {
            return Err(null("comm"));
        }
        let n = count_of("ndev", ndev)?;
        if n == 0 {
            return Err(Error::invalid_argument("ndev is 0"));
        }
        let devs: Vec<i32> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            std::slice::from_raw_parts(devlist, n).to_vec()
        };
        let out = std::slice::from_raw_parts_mut(comms, n);
        out.fill(std::ptr::null_mut());
        for (slot, c) in out.iter_mut().zip(Comm::init_all(&devs)?) {
            *slot = handle::hand_out(CommHandle::from_comm(c));
        }
        Ok(NcclResult::Success)
    }
}

/// A split's or shrink's `config` (NULL: inherit the parent's) and whether its child is
/// created blocking.
///
/// # Safety
/// As [`config::read`].
unsafe fn child_config(config: *const NcclConfig, parent: &Comm) -> Result<(Option<Config>, bool)> {
    let cfg = match config.is_null() {
        true => None,
        false => Some(config::read(config)?),
    };
    let blocking = cfg
        .clone()
        .unwrap_or_default()
        .resolve(Some(parent.config()))?
        .blocking;
    Ok((cfg, blocking))
}

export! {
    /// `ncclCommSplit`: `newcomm` gets NULL for NCCL_SPLIT_NOCOLOR.
    fn ncclCommSplit / pncclCommSplit(
        comm: NcclComm,
        color: c_int,
        key: c_int,
        newcomm: *mut NcclComm,
        config: *const NcclConfig,
    ) {
        let parent = handle(comm)?.ready()?;
        let slot = newcomm.as_mut().ok_or_else(|| null("newcomm"))?;
        *slot = std::ptr::null_mut();
        let (cfg, blocking) = child_config(config, &parent)?;
        match Comm::start_split(&parent.0, color, key, cfg.as_ref())? {
            None => Ok(NcclResult::Success),
            Some(p) => hand_out(newcomm, p, blocking),
        }
    }
}

export! {
    /// `ncclCommShrink` (NCCL 2.27): the ranks not in `excludeRanksList` form `newcomm`, in
    /// their order here; excluded ranks do not call it. `shrinkFlags` NCCL_SHRINK_ABORT first
    /// stops the parent's operations in flight.
    fn ncclCommShrink / pncclCommShrink(
        comm: NcclComm,
        exclude_ranks_list: *const c_int,
        exclude_ranks_count: c_int,
        newcomm: *mut NcclComm,
        config: *const NcclConfig,
        shrink_flags: c_int,
    ) {
        let parent = handle(comm)?.ready()?;
        let slot = newcomm.as_mut().ok_or_else(|| null("newcomm"))?;
        *slot = std::ptr::null_mut();
        let n = count_of("excludeRanksCount", exclude_ranks_count)?;
        let exclude: Vec<usize> = match n {
            0 => Vec::new(),
            _ if exclude_ranks_list.is_null() => return Err(null("excludeRanksList")),
            // SAFETY: the caller's list holds excludeRanksCount ranks.
            _ => std::slice::from_raw_parts(exclude_ranks_list, n)
                .iter()
                .map(|&r| count_of("excluded rank", r))
                .collect::<Result<_>>()?,
        };
        let (cfg, blocking) = child_config(config, &parent)?;
        let pending = Comm::start_shrink(&parent.0, &exclude, cfg.as_ref(), shrink_flags)?;
        hand_out(newcomm, pending, blocking)
    }
}

export! {
    /// `ncclCommRevoke` (NCCL 2.28): stops this rank's operations in flight and keeps the
    /// communicator for shrink, split, destroy or abort (`comm/revoke.rs`). Not collective.
    /// `revokeFlags`: NCCL_REVOKE_DEFAULT (0). NULL is a no-op that succeeds, as in NCCL.
    fn ncclCommRevoke / pncclCommRevoke(comm: NcclComm, revoke_flags: c_int) {
        if comm.is_null() {
            return Ok(NcclResult::Success);
        }
        if revoke_flags != 0 {
            return Err(Error::invalid_argument(format!(
                "ncclCommRevoke: revokeFlags {revoke_flags:#x} is not NCCL_REVOKE_DEFAULT (0)"
            )));
        }
        handle(comm)?.ready()?.0.revoke()?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommFinalize`: flushes this rank's operations and waits for every rank; in the
    /// background (ncclInProgress) for a non-blocking communicator.
    fn ncclCommFinalize / pncclCommFinalize(comm: NcclComm) {
        handle(comm)?.finalize()
    }
}

export! {
    /// `ncclCommDestroy`: frees the communicator (after flushing this rank's operations).
    /// NULL is a no-op that succeeds, as in NCCL.
    fn ncclCommDestroy / pncclCommDestroy(comm: NcclComm) {
        if comm.is_null() {
            return Ok(NcclResult::Success);
        }
        handle(comm)?.check_destroyable()?;
        // A second destroy of the same handle (or one racing this) finds it gone.
        let h = handle::take(comm)?;
        h.destroy()?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommAbort`: stops everything (a creation in progress too) and frees the
    /// communicator, promptly, even when peers are gone. NULL is a no-op that succeeds, as in
    /// NCCL (PyTorch's watchdog relies on it: it aborts communicators it already aborted).
    fn ncclCommAbort / pncclCommAbort(comm: NcclComm) {
        if comm.is_null() {
            return Ok(NcclResult::Success);
        }
        // The communicator goes, but the handle's few bytes stay allocated: a thread racing
        // the abort with a call of its own (PyTorch's main thread against its watchdog, seen
        // on one H200) then gets ncclInvalidUsage instead of touching freed memory. A later
        // ncclCommDestroy of the handle frees it.
        let h = handle(comm)?;
        h.abort();
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommGetAsyncError`: ncclInProgress while a creation or finalize runs, then
    /// ncclSuccess or the error.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: NcclComm, async_error: *mut NcclResult) {
        let h = handle(comm)?;
        let out = async_error.as_mut().ok_or_else(|| null("asyncError"))?;
        *out = h.state();
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommCount`.
    fn ncclCommCount / pncclCommCount(comm: NcclComm, count: *mut c_int) {
        let c = handle(comm)?.ready()?;
        *count.as_mut().ok_or_else(|| null("count"))? = c.count() as c_int;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommCuDevice`.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: NcclComm, device: *mut c_int) {
        let c = handle(comm)?.ready()?;
        *device.as_mut().ok_or_else(|| null("device"))? = c.cu_device();
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommUserRank`.
    fn ncclCommUserRank / pncclCommUserRank(comm: NcclComm, rank: *mut c_int) {
        let c = handle(comm)?.ready()?;
        *rank.as_mut().ok_or_else(|| null("rank"))? = c.user_rank() as c_int;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclGroupStart`.
    fn ncclGroupStart / pncclGroupStart() {
        crate::group_start();
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclGroupEnd`: runs what the group recorded; its first error. ncclInProgress when the
    /// group's communicators are non-blocking: its operations are issued in the background.
    fn ncclGroupEnd / pncclGroupEnd() {
        Ok(match crate::group_end()? {
            crate::GroupStatus::InProgress => NcclResult::InProgress,
            _ => NcclResult::Success,
        })
    }
}

/// `NCCL_SIM_INFO_INITIALIZER`'s magic.
pub const NCCL_SIM_INFO_MAGIC: u32 = 0x7468_5283;

/// `ncclSimInfo_t` (version 1 of the structure: NCCL 2.25's).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclSimInfo {
    /// Bytes of the structure the caller has.
    pub size: usize,
    /// `NCCL_SIM_INFO_MAGIC` once `NCCL_SIM_INFO_INITIALIZER` set it.
    pub magic: u32,
    /// The NCCL version whose header built the structure.
    pub version: u32,
    /// µs, as NCCL's model gives it.
    pub estimated_time: f32,
}

/// The bytes of `ncclSimInfo_t` this library reads and writes: up to `estimatedTime`.
const SIM_INFO_USED: usize = std::mem::offset_of!(NcclSimInfo, estimated_time) + 4;

/// Checks a caller's `ncclSimInfo_t`.
unsafe fn sim_info<'a>(p: *mut NcclSimInfo) -> Result<&'a mut NcclSimInfo> {
    if p.is_null() {
        return Err(null("simInfo"));
    }
    // The size first: the rest is only read once it says the caller's structure holds it.
    let size = std::ptr::addr_of!((*p).size).read_unaligned();
    if size < SIM_INFO_USED {
        return Err(Error::invalid_argument(format!(
            "simInfo->size {size} is too small for ncclSimInfo_t ({} bytes): initialize it \
             with NCCL_SIM_INFO_INITIALIZER",
            std::mem::size_of::<NcclSimInfo>()
        )));
    }
    let info = p.as_mut().ok_or_else(|| null("simInfo"))?;
    if info.magic != NCCL_SIM_INFO_MAGIC {
        return Err(Error::invalid_argument(format!(
            "simInfo->magic {:#x} is not {NCCL_SIM_INFO_MAGIC:#x}: initialize it with \
             NCCL_SIM_INFO_INITIALIZER",
            info.magic
        )));
    }
    Ok(info)
}

export! {
    /// `ncclGroupSimulateEnd`: ends the group like ncclGroupEnd but launches nothing (the
    /// operations are dropped, as NCCL does) and stores the model's time of the group in
    /// `simInfo->estimatedTime` (µs). A bad `simInfo` is an invalid argument; the group ends
    /// all the same.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info_ptr: *mut NcclSimInfo) {
        let info = match sim_info(sim_info_ptr) {
            Ok(i) => i,
            Err(e) => {
                let _ = crate::group_simulate_end();
                return Err(e.context("ncclGroupSimulateEnd"));
            }
        };
        if let Some(t) = crate::group_simulate_end()? {
            info.estimated_time = t as f32;
        }
        Ok(NcclResult::Success)
    }
}

export! {
    /// nccl-rs extension: makes `device` the calling thread's current device (cudaSetDevice,
    /// for programs without the CUDA runtime, such as those on the simulator).
    fn ncclRsSetDevice / pncclRsSetDevice(device: c_int) {
        Device::open(device)?.make_current()?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// nccl-rs extension: waits for `stream` of the current device (cudaStreamSynchronize).
    fn ncclRsStreamSynchronize / pncclRsStreamSynchronize(stream: CudaStream) {
        Device::current()?.stream_sync(StreamHandle(stream as usize as u64))?;
        Ok(NcclResult::Success)
    }
}

/// The fixed strings of `ncclGetErrorString`, NUL-terminated.
fn error_strings() -> &'static [CString] {
    static S: OnceLock<Vec<CString>> = OnceLock::new();
    S.get_or_init(|| {
        use NcclResult::*;
        [
            Success,
            UnhandledCudaError,
            SystemError,
            InternalError,
            InvalidArgument,
            InvalidUsage,
            RemoteError,
            InProgress,
        ]
        .iter()
        .map(|r| CString::new(r.as_str()).unwrap_or_default())
        .chain(std::iter::once(
            CString::new("unknown result code").unwrap_or_default(),
        ))
        .collect()
    })
}

fn get_error_string(result: c_int) -> *const c_char {
    let all = error_strings();
    let i = usize::try_from(result)
        .ok()
        .filter(|&i| i + 1 < all.len())
        .unwrap_or(all.len() - 1);
    all[i].as_ptr()
}

/// `ncclGetErrorString`: a static string for every code (unknown codes included).
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    catch_unwind(|| get_error_string(result)).unwrap_or(std::ptr::null())
}

/// The profiling alias of `ncclGetErrorString`.
#[no_mangle]
pub extern "C" fn pncclGetErrorString(result: c_int) -> *const c_char {
    ncclGetErrorString(result)
}

std::thread_local! {
    static LAST: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
}

fn get_last_error() -> *const c_char {
    let text = crate::error::last_error().replace('\0', " ");
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        *l = CString::new(text).unwrap_or_default();
        l.as_ptr()
    })
}

/// `ncclGetLastError`: the message of the last error in this process (`comm` is unused, as
/// NCCL allows). The string stays valid until this thread's next call.
#[no_mangle]
pub extern "C" fn ncclGetLastError(_comm: NcclComm) -> *const c_char {
    catch_unwind(get_last_error).unwrap_or(std::ptr::null())
}

/// The profiling alias of `ncclGetLastError`.
#[no_mangle]
pub extern "C" fn pncclGetLastError(comm: NcclComm) -> *const c_char {
    ncclGetLastError(comm)
}

/// The device API (NCCL 2.28's `ncclDevComm`, for kernels that communicate themselves) is
/// not implemented: its entry points exist, so programs that link them load, and say so.
fn no_device_api(what: &str) -> Error {
    Error::invalid_usage(format!(
        "{what}: nccl-rs's device API is Rust (nccl_device::api, made by Comm::dev_comm); \
         NCCL's C++ device API (ncclDevComm) is not provided"
    ))
}

export! {
    /// `ncclDevCommCreate` (NCCL 2.28): not implemented (ncclInvalidUsage, with the reason).
    fn ncclDevCommCreate / pncclDevCommCreate(
        comm: NcclComm,
        _reqs: *const c_void,
        _out_dev_comm: *mut c_void,
    ) {
        handle(comm)?;
        Err(no_device_api("ncclDevCommCreate"))
    }
}

export! {
    /// `ncclDevCommDestroy` (NCCL 2.28): not implemented (ncclInvalidUsage, with the reason).
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: NcclComm, _dev_comm: *const c_void) {
        handle(comm)?;
        Err(no_device_api("ncclDevCommDestroy"))
    }
}

export! {
    /// `ncclRedOpCreatePreMulSum`: sum after multiplying each rank's input by `*scalar`. A
    /// host-immediate scalar is read here; a device one (`ncclScalarDevice`) is read by each
    /// collective's kernel when it runs, so it must stay allocated while the op is in use.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut c_int,
        scalar: *mut c_void,
        datatype: c_int,
        residence: c_int,
        comm: NcclComm,
    ) {
        let out = op.as_mut().ok_or_else(|| null("op"))?;
        if scalar.is_null() {
            return Err(null("scalar"));
        }
        let dt = dtype(datatype)?;
        let h = handle(comm)?;
        let reduce = match residence {
            SCALAR_DEVICE => ReduceOp::pre_mul_sum_device(scalar as u64),
            SCALAR_HOST_IMMEDIATE => {
                let mut bits = [0u8; 8];
                std::ptr::copy_nonoverlapping(scalar as *const u8, bits.as_mut_ptr(), dt.size());
                ReduceOp::pre_mul_sum(u64::from_le_bytes(bits))
            }
            r => {
                return Err(Error::invalid_argument(format!(
                    "scalar residence {r}: use ncclScalarDevice (0) or ncclScalarHostImmediate (1)"
                )))
            }
        };
        *out = h.add_op(dt, reduce);
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclRedOpDestroy`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: NcclComm) {
        handle(comm)?.remove_op(op)?;
        Ok(NcclResult::Success)
    }
}
