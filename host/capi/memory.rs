//! Memory in the C ABI: `ncclMemAlloc` / `ncclMemFree`, and buffer and window registration.

use super::*;

/// Buffers from `ncclMemAlloc`, by address.
fn allocations() -> &'static Mutex<HashMap<u64, DevBuffer>> {
    static ALLOCS: OnceLock<Mutex<HashMap<u64, DevBuffer>>> = OnceLock::new();
    ALLOCS.get_or_init(|| Mutex::new(HashMap::new()))
}

export! {
    /// `ncclMemAlloc`: device memory on the current device, through the CUDA virtual memory
    /// API (shareable by POSIX file descriptor, rounded to the allocation granularity).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) {
        let out = ptr.as_mut().ok_or_else(|| null("ptr"))?;
        let buf = Device::current()?.alloc_vmm(size)?;
        *out = buf.ptr() as usize as *mut c_void;
        allocations()
            .lock()
            .map_err(|_| Error::internal("allocation table poisoned"))?
            .insert(buf.ptr(), buf);
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclMemFree`.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) {
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        let buf = allocations()
            .lock()
            .map_err(|_| Error::internal("allocation table poisoned"))?
            .remove(&dev(ptr));
        match buf {
            Some(b) => {
                drop(b);
                Ok(NcclResult::Success)
            }
            None => Err(Error::invalid_argument(format!(
                "{ptr:p} was not allocated by ncclMemAlloc"
            ))),
        }
    }
}

export! {
    /// `ncclCommRegister`: checks and records the buffer (zero-copy paths do not use it yet).
    fn ncclCommRegister / pncclCommRegister(
        comm: NcclComm,
        buff: *mut c_void,
        size: usize,
        handle_out: *mut *mut c_void,
    ) {
        let out = handle_out.as_mut().ok_or_else(|| null("handle"))?;
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        // SAFETY: the C caller's buffer, under NCCL's contract (valid while registered).
        *out = c.register_raw(dev(buff), size)? as usize as *mut c_void;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommDeregister`.
    fn ncclCommDeregister / pncclCommDeregister(comm: NcclComm, reg: *mut c_void) {
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        c.deregister(reg as usize as u64)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommWindowRegister` (NCCL 2.27): registers `buff` as a window of this
    /// communicator, on every rank at once (`comm/window.rs`). `winFlags`: NCCL_WIN_DEFAULT
    /// (0) or NCCL_WIN_COLL_SYMMETRIC (1). A collective call: inside a group (one thread for
    /// several ranks) it runs at `ncclGroupEnd`, each rank's on a thread of its own, and
    /// `*win` is filled then, as in NCCL.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: NcclComm,
        buff: *mut c_void,
        size: usize,
        win: *mut *mut c_void,
        win_flags: c_int,
    ) {
        let out = win.as_mut().ok_or_else(|| null("win"))?;
        if !(0..=1).contains(&win_flags) {
            return Err(Error::invalid_argument(format!(
                "ncclCommWindowRegister: winFlags {win_flags:#x} are neither NCCL_WIN_DEFAULT (0) \
                 nor NCCL_WIN_COLL_SYMMETRIC (1)"
            )));
        }
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        let (buff, flags) = (dev(buff), win_flags as u32);
        if group::depth() == 0 {
            // SAFETY: the C caller's buffer, under NCCL's contract (valid while registered).
            *out = c.window_register_raw(buff, size, flags)? as usize as *mut c_void;
            return Ok(NcclResult::Success);
        }
        let out_at = out as *mut *mut c_void as usize;
        // A communicator's registrations in one group run in the order they were made: each is
        // an exchange with the peers' same registration.
        group::parallel_in_turn(comm as usize, Box::new(move || {
            // SAFETY: as above; `win` stays valid until ncclGroupEnd returns (NCCL's contract).
            unsafe {
                let h = c.window_register_raw(buff, size, flags)?;
                *(out_at as *mut *mut c_void) = h as usize as *mut c_void;
            }
            Ok(())
        }))?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommWindowDeregister` (NCCL 2.27).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: NcclComm, win: *mut c_void) {
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        c.window_deregister_raw(win as usize as u64)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclWinGetUserPtr` (NCCL 2.29): the buffer `win` was registered with on this rank.
    /// Local (not collective). A window this communicator does not have is an invalid argument
    /// (NCCL says internal error).
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(
        comm: NcclComm,
        win: *mut c_void,
        out_user_ptr: *mut *mut c_void,
    ) {
        let out = out_user_ptr.as_mut().ok_or_else(|| null("outUserPtr"))?;
        if win.is_null() {
            return Err(null("win"));
        }
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        *out = c.window_user_ptr(win as usize as u64)? as usize as *mut c_void;
        Ok(NcclResult::Success)
    }
}

/// `ncclCommProperties_t` of NCCL 2.29 (its device header `nccl_device/core.h`): a header (size,
/// magic, version), then what 2.29.2 defined; from 2.29.4 three fields more.
#[repr(C)]
#[allow(missing_docs)] // NCCL's fields, named as in its header (snake case here).
pub struct CommProperties {
    pub size: usize,
    pub magic: std::ffi::c_uint,
    pub version: std::ffi::c_uint,
    pub rank: c_int,
    pub n_ranks: c_int,
    pub cuda_dev: c_int,
    pub nvml_dev: c_int,
    pub device_api_support: bool,
    pub multimem_support: bool,
    pub gin_type: c_int,
    pub n_lsa_teams: c_int,
    pub host_rma_support: bool,
    pub railed_gin_type: c_int,
}

/// Bytes of the 2.29.2 layout, which ends at `gin_type`.
const PROPERTIES_2292: usize = std::mem::offset_of!(CommProperties, n_lsa_teams);

export! {
    /// `ncclCommQueryProperties` (NCCL 2.29): the communicator's properties into `props`,
    /// which `NCCL_COMM_PROPERTIES_INITIALIZER` must have initialised (its magic). The caller's
    /// `size` says its layout: 2.29.2's at least, the fields 2.29.4 added written where it
    /// holds them (its `version` is not used: programs that take it from `ncclGetVersion` pass
    /// ours). Local, not collective.
    fn ncclCommQueryProperties / pncclCommQueryProperties(
        comm: NcclComm,
        props: *mut CommProperties,
    ) {
        if props.is_null() {
            return Err(null("props"));
        }
        let (size, magic) = (
            std::ptr::read_unaligned(std::ptr::addr_of!((*props).size)),
            std::ptr::read_unaligned(std::ptr::addr_of!((*props).magic)),
        );
        if magic != super::config::NCCL_CONFIG_MAGIC {
            return Err(Error::invalid_usage(
                "ncclCommQueryProperties: ncclCommProperties_t must be initialized with \
                 NCCL_COMM_PROPERTIES_INITIALIZER (its magic is not NCCL_API_MAGIC)",
            ));
        }
        if size < PROPERTIES_2292 {
            return Err(Error::invalid_argument(format!(
                "ncclCommQueryProperties: a ncclCommProperties_t of {size} bytes: NCCL 2.29's \
                 holds {PROPERTIES_2292} or more"
            )));
        }
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        let p = c.properties()?;
        // Field by field through the pointer: the caller's struct may be 2.29.2's, shorter
        // than ours.
        macro_rules! put {
            ($field:ident, $v:expr) => {
                std::ptr::addr_of_mut!((*props).$field).write_unaligned($v)
            };
        }
        put!(rank, p.rank as c_int);
        put!(n_ranks, p.nranks as c_int);
        put!(cuda_dev, p.cuda_dev);
        put!(nvml_dev, p.nvml_dev);
        put!(device_api_support, p.device_api);
        put!(multimem_support, p.multimem);
        put!(gin_type, p.gin as c_int);
        if size >= std::mem::size_of::<CommProperties>() {
            put!(n_lsa_teams, p.lsa_teams as c_int);
            put!(host_rma_support, p.host_rma);
            put!(railed_gin_type, p.railed_gin as c_int);
        }
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommMemStats` (NCCL 2.29): the device memory this communicator holds
    /// (`Comm::device_memory`): 0 `ncclStatGpuMemSuspend`, what `ncclCommSuspend` releases
    /// (the connections' blocks of CUDA's virtual memory API); 1 `ncclStatGpuMemSuspended`,
    /// whether it is released now; 2 `ncclStatGpuMemPersist`, the rest; 3
    /// `ncclStatGpuMemTotal`, both (suspended or not, as NCCL counts it).
    fn ncclCommMemStats / pncclCommMemStats(comm: NcclComm, stat: c_int, value: *mut u64) {
        let out = value.as_mut().ok_or_else(|| null("value"))?;
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        let total = c.device_memory() as u64;
        let suspendable = (c.suspendable_memory() as u64).min(total);
        *out = match stat {
            0 => suspendable,
            1 => u64::from(c.is_suspended()),
            2 => total - suspendable,
            3 => total,
            s => {
                return Err(Error::invalid_argument(format!(
                    "ncclCommMemStats: stat {s} is none of ncclCommMemStat_t's (0 to 3)"
                )))
            }
        };
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommSuspend` (NCCL 2.29): with `NCCL_SUSPEND_MEM` releases the device memory of
    /// the communicator's connections until `ncclCommResume` (`comm/suspend.rs`). Collective.
    fn ncclCommSuspend / pncclCommSuspend(comm: NcclComm, flags: c_int) {
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        c.suspend(flags as u32)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommResume` (NCCL 2.29): takes back what `ncclCommSuspend` released, at the same
    /// addresses. Collective.
    fn ncclCommResume / pncclCommResume(comm: NcclComm) {
        let (c, _) = coll_comm(comm, std::ptr::null_mut())?;
        c.resume()?;
        Ok(NcclResult::Success)
    }
}
