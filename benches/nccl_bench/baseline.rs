//! NVIDIA NCCL, loaded at run time (dlopen through libloading): the baseline that runs beside
//! nccl-rs on the same buffers, streams and sizes.

use nccl::cuda::StreamHandle;
use nccl::{DataType, DevPtr, RedOpKind};
use std::ffi::{c_char, c_int, c_void, CStr};

/// `ncclComm_t`, movable to the thread that drives its GPU.
#[derive(Clone, Copy)]
pub struct NcclComm(*mut c_void);
// SAFETY: an NCCL communicator may be used from any thread (one thread at a time, which the
// benchmark guarantees: each communicator is driven by exactly one thread).
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

/// `ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)`.
pub type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)`.
pub type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream)`.
pub type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream)`.
pub type AllGatherFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)`.
pub type ReduceScatterFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclSend(sendbuff, count, datatype, peer, comm, stream)`; ncclRecv has the same shape.
pub type SendFn =
    unsafe extern "C" fn(*const c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId(pub [u8; 128]);

/// The entry points of NVIDIA NCCL the benchmark uses (C signatures of `nccl.h`).
pub struct Nccl {
    pub path: String,
    version: c_int,
    comm_init_all: unsafe extern "C" fn(*mut *mut c_void, c_int, *const c_int) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut *mut c_void, c_int, NcclUniqueId, c_int) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> c_int,
    all_reduce: AllReduceFn,
    broadcast: BroadcastFn,
    reduce: ReduceFn,
    all_gather: AllGatherFn,
    reduce_scatter: ReduceScatterFn,
    pub send: SendFn,
    pub recv: SendFn,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    comm_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    /// `ncclCommRegister(comm, buff, size, &handle)`.
    comm_register: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut *mut c_void) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_last_error: Option<unsafe extern "C" fn(*mut c_void) -> *const c_char>,
}

impl Nccl {
    pub fn load(path: &std::path::Path) -> Result<Nccl, String> {
        let shown = path.display().to_string();
        // SAFETY: loading NVIDIA NCCL runs its initialisers, which only set up the library. The
        // library is never unloaded (leaked below): its threads may outlive any scope of ours.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load the baseline library {shown}: {e}"))?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        macro_rules! sym {
            ($name:literal, $t:ty) => {{
                // SAFETY: the type is the C signature nccl.h documents for this symbol.
                let s = unsafe { lib.get::<$t>(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{shown} is not an NCCL library: no {}: {e}", $name))?;
                *s
            }};
        }
        let get_version = sym!("ncclGetVersion", unsafe extern "C" fn(*mut c_int) -> c_int);
        let get_last_error = {
            // SAFETY: as in sym!; this one is optional (NCCL 2.13 and later).
            let s = unsafe {
                lib.get::<unsafe extern "C" fn(*mut c_void) -> *const c_char>(b"ncclGetLastError\0")
            };
            s.ok().map(|s| *s)
        };
        let nccl = Nccl {
            path: shown.clone(),
            version: 0,
            comm_init_all: sym!(
                "ncclCommInitAll",
                unsafe extern "C" fn(*mut *mut c_void, c_int, *const c_int) -> c_int
            ),
            comm_init_rank: sym!(
                "ncclCommInitRank",
                unsafe extern "C" fn(*mut *mut c_void, c_int, NcclUniqueId, c_int) -> c_int
            ),
            get_unique_id: sym!(
                "ncclGetUniqueId",
                unsafe extern "C" fn(*mut NcclUniqueId) -> c_int
            ),
            all_reduce: sym!("ncclAllReduce", AllReduceFn),
            broadcast: sym!("ncclBroadcast", BroadcastFn),
            reduce: sym!("ncclReduce", ReduceFn),
            all_gather: sym!("ncclAllGather", AllGatherFn),
            reduce_scatter: sym!("ncclReduceScatter", ReduceScatterFn),
            send: sym!("ncclSend", SendFn),
            recv: sym!("ncclRecv", SendFn),
            group_start: sym!("ncclGroupStart", unsafe extern "C" fn() -> c_int),
            group_end: sym!("ncclGroupEnd", unsafe extern "C" fn() -> c_int),
            comm_destroy: sym!(
                "ncclCommDestroy",
                unsafe extern "C" fn(*mut c_void) -> c_int
            ),
            comm_register: sym!(
                "ncclCommRegister",
                unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut *mut c_void) -> c_int
            ),
            get_error_string: sym!(
                "ncclGetErrorString",
                unsafe extern "C" fn(c_int) -> *const c_char
            ),
            get_last_error,
        };
        let mut version = 0;
        // SAFETY: writes one int.
        let r = unsafe { get_version(&mut version) };
        nccl.check(r, "ncclGetVersion")?;
        Ok(Nccl { version, ..nccl })
    }

    pub fn version_string(&self) -> String {
        let v = self.version;
        if v >= 10000 {
            format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
        } else {
            format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100)
        }
    }

    /// Whether NVIDIA NCCL can run `dt` with `op` (no built-in PreMulSum; fp8 from 2.24).
    pub fn supports(&self, dt: DataType, op: RedOpKind) -> bool {
        let fp8 = matches!(dt, DataType::Float8e4m3 | DataType::Float8e5m2);
        crate::args::nccl_op(op).is_some() && (!fp8 || self.version >= 22400)
    }

    fn check(&self, r: c_int, what: &str) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NCCL returns NUL-terminated strings it owns.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: both return pointers to strings NCCL owns.
        let code = text(unsafe { (self.get_error_string)(r) });
        let last = match self.get_last_error {
            // SAFETY: as above; a null communicator asks for the process's last error.
            Some(f) => text(unsafe { f(std::ptr::null_mut()) }),
            None => String::new(),
        };
        let last = if last.is_empty() {
            String::new()
        } else {
            format!(": {last}")
        };
        Err(format!(
            "NVIDIA NCCL {what} failed: {code} (ncclResult_t {r}){last}"
        ))
    }

    /// `ncclCommRegister` of `bytes` at `buff` (kept until the communicator is destroyed).
    pub fn register(&self, comm: &NcclComm, buff: DevPtr, bytes: usize) -> Result<(), String> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: `buff` is device memory of the communicator's GPU holding `bytes`, alive
        // until the communicator is destroyed; one handle is written.
        let r = unsafe { (self.comm_register)(comm.0, buff as *mut c_void, bytes, &mut handle) };
        self.check(r, "ncclCommRegister")
    }

    pub fn comm_init_all(&self, devs: &[i32]) -> Result<Vec<NcclComm>, String> {
        let mut comms = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for one communicator per device in `devs`.
        let r =
            unsafe { (self.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) };
        self.check(r, "ncclCommInitAll")?;
        Ok(comms.into_iter().map(NcclComm).collect())
    }

    /// `ncclGetUniqueId` (with NCCL_COMM_ID set, the id of that address; else a root starts
    /// in this process).
    pub fn get_unique_id(&self) -> Result<NcclUniqueId, String> {
        let mut id = NcclUniqueId([0; 128]);
        // SAFETY: writes one ncclUniqueId.
        let r = unsafe { (self.get_unique_id)(&mut id) };
        self.check(r, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// `ncclCommInitRank` on the current device (the caller made `dev`'s context current
    /// through ours: NCCL takes the device the runtime says is current).
    pub fn comm_init_rank(
        &self,
        nranks: usize,
        id: NcclUniqueId,
        rank: usize,
    ) -> Result<NcclComm, String> {
        let mut comm = std::ptr::null_mut();
        // SAFETY: writes one communicator; id is passed by value as nccl.h declares.
        let r = unsafe { (self.comm_init_rank)(&mut comm, nranks as c_int, id, rank as c_int) };
        self.check(r, "ncclCommInitRank")?;
        Ok(NcclComm(comm))
    }

    pub fn comm_destroy(&self, c: NcclComm) -> Result<(), String> {
        // SAFETY: c came from ncclCommInitAll and is destroyed once.
        let r = unsafe { (self.comm_destroy)(c.0) };
        self.check(r, "ncclCommDestroy")
    }

    pub fn group_start(&self) -> Result<(), String> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.group_start)() }, "ncclGroupStart")
    }

    pub fn group_end(&self) -> Result<(), String> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.group_end)() }, "ncclGroupEnd")
    }

    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dt: c_int,
        op: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: the buffers are device memory of the communicator's GPU (allocated by nccl-rs
        // in the device's primary context, which the CUDA runtime shares) holding at least
        // `count` elements, and the stream is a CUstream of that context.
        let r = unsafe {
            (self.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dt,
                op,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclAllReduce")
    }

    #[allow(clippy::too_many_arguments)]
    pub fn broadcast(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dt: c_int,
        root: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: device memory of the communicator's GPU holding at least
        // `count` elements on both sides, and a CUstream of that context.
        let r = unsafe {
            (self.broadcast)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dt,
                root,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclBroadcast")
    }

    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dt: c_int,
        op: c_int,
        root: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: device memory of the communicator's GPU holding at least
        // `count` elements on both sides, and a CUstream of that context.
        let r = unsafe {
            (self.reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dt,
                op,
                root,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclReduce")
    }

    pub fn all_gather(
        &self,
        send: DevPtr,
        recv: DevPtr,
        sendcount: usize,
        dt: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: device memory of the communicator's GPU, `sendcount`
        // elements to read and nranks × `sendcount` to write, and a CUstream of that context.
        let r = unsafe {
            (self.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                sendcount,
                dt,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclAllGather")
    }

    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter(
        &self,
        send: DevPtr,
        recv: DevPtr,
        recvcount: usize,
        dt: c_int,
        op: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: device memory of the communicator's GPU, nranks ×
        // `recvcount` elements to read and `recvcount` to write, and a CUstream of that context.
        let r = unsafe {
            (self.reduce_scatter)(
                send as *const c_void,
                recv as *mut c_void,
                recvcount,
                dt,
                op,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclReduceScatter")
    }

    /// `ncclSend` or `ncclRecv` (`f`, named `name`): `count` elements of `buf` to or from `peer`.
    #[allow(clippy::too_many_arguments)]
    pub fn p2p(
        &self,
        f: SendFn,
        name: &str,
        buf: DevPtr,
        count: usize,
        dt: c_int,
        peer: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: `count` elements of device memory of the communicator's
        // GPU (read by ncclSend, written by ncclRecv), and a CUstream of that context.
        let r = unsafe { f(buf as *const c_void, count, dt, peer, comm.0, stream.0 as _) };
        self.check(r, name)
    }
}
