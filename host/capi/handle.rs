//! What a `ncclComm_t` points to: a communicator in creation, ready, or failed, plus a
//! finalize that may run in the background (non-blocking communicators).

use super::{null, CudaStream, NcclComm};
use crate::comm::{Comm, PendingComm, ReduceOp, Shared};
use crate::cuda::StreamHandle;
use crate::error::{Error, NcclResult, Result};
use nccl_device::types::DataType;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::thread::JoinHandle;

/// What a live handle carries in `magic` ("NCCLRSCM"); a destroyed one carries 0.
const COMM_MAGIC: u64 = 0x4e43_434c_5253_434d;

/// How many destroyed handles keep their memory, so that a recently destroyed `ncclComm_t`
/// is not reused by a new communicator and a call on it is refused, not run on the new one.
const DEAD_KEPT: usize = 1024;

/// Every `ncclComm_t` this library handed out and has not destroyed, by address, and the most
/// recent destroyed ones. An entry point looks its handle up here before touching it, so a
/// destroyed, doubly destroyed or garbage pointer is refused without being dereferenced.
#[derive(Default)]
struct Registry {
    live: HashMap<usize, Arc<CommHandle>>,
    dead: VecDeque<Arc<CommHandle>>,
}

fn registry() -> &'static RwLock<Registry> {
    static R: OnceLock<RwLock<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
}

fn not_live(p: *const CommHandle) -> Error {
    Error::invalid_argument(format!(
        "comm {p:p} is not a live communicator (destroyed, or not a ncclComm_t of this library)"
    ))
}

/// Registers a new handle and returns the `ncclComm_t` that names it.
pub(crate) fn hand_out(h: CommHandle) -> *mut CommHandle {
    let h = Arc::new(h);
    let p = Arc::as_ptr(&h) as *mut CommHandle;
    registry()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .live
        .insert(p as usize, h);
    p
}

/// The live handle `p` names (never dereferencing a pointer that is not one).
pub(crate) fn lookup(p: *const CommHandle) -> Result<Arc<CommHandle>> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    match r.live.get(&(p as usize)) {
        Some(h) if h.magic.load(Ordering::Acquire) == COMM_MAGIC => Ok(h.clone()),
        _ => Err(not_live(p)),
    }
}

/// Takes `p` out of the live handles (a destroy); a second take of it is refused.
pub(crate) fn take(p: *const CommHandle) -> Result<Arc<CommHandle>> {
    let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
    let h = r.live.remove(&(p as usize)).ok_or_else(|| not_live(p))?;
    h.magic.store(0, Ordering::Release);
    if r.dead.len() >= DEAD_KEPT {
        r.dead.pop_front();
    }
    r.dead.push_back(h.clone());
    Ok(h)
}

enum State {
    Pending(PendingComm),
    Ready(Shared),
    Failed(Error),
}

enum Finalize {
    NotCalled,
    Running(JoinHandle<Result<()>>),
    Done(Result<()>),
}

/// The object behind `ncclComm_t`.
pub struct CommHandle {
    /// [`COMM_MAGIC`] while the handle is live.
    magic: AtomicU64,
    blocking: bool,
    state: Mutex<State>,
    finalize: Mutex<Finalize>,
    /// The operators `ncclRedOpCreatePreMulSum` made on this communicator, by value, each
    /// with the datatype it was made for.
    user_ops: Mutex<BTreeMap<c_int, (DataType, ReduceOp)>>,
}

/// `ncclNumOps`: the first value of a user operator.
const FIRST_USER_OP: c_int = 5;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CommHandle {
    pub(crate) fn pending(p: PendingComm, blocking: bool) -> CommHandle {
        CommHandle {
            magic: AtomicU64::new(COMM_MAGIC),
            blocking,
            state: Mutex::new(State::Pending(p)),
            finalize: Mutex::new(Finalize::NotCalled),
            user_ops: Mutex::default(),
        }
    }

    pub(crate) fn from_comm(c: Comm) -> CommHandle {
        CommHandle {
            magic: AtomicU64::new(COMM_MAGIC),
            blocking: c.config().blocking,
            state: Mutex::new(State::Ready(Shared::new(c))),
            finalize: Mutex::new(Finalize::NotCalled),
            user_ops: Mutex::default(),
        }
    }

    /// Registers `op` (a PreMulSum) for calls on `dt` and returns its value: the lowest free
    /// one from `ncclNumOps` up.
    pub(crate) fn add_op(&self, dt: DataType, op: ReduceOp) -> c_int {
        let mut ops = lock(&self.user_ops);
        let v = (FIRST_USER_OP..)
            .find(|v| !ops.contains_key(v))
            .unwrap_or(FIRST_USER_OP);
        ops.insert(v, (dt, op));
        v
    }

    /// `ncclRedOpDestroy`.
    pub(crate) fn remove_op(&self, v: c_int) -> Result<()> {
        match lock(&self.user_ops).remove(&v) {
            Some(_) => Ok(()),
            None => Err(Error::invalid_argument(format!(
                "reduction {v} was not created on this communicator"
            ))),
        }
    }

    /// The operator `v` means on this communicator for a call on `dt`: a built-in, or a user
    /// operator made for the same datatype.
    pub(crate) fn reduce_op(&self, v: c_int, dt: DataType) -> Result<ReduceOp> {
        if let Some(op) = u32::try_from(v).ok().and_then(ReduceOp::from_raw) {
            return Ok(op);
        }
        match lock(&self.user_ops).get(&v) {
            Some(&(made_for, op)) if made_for == dt => Ok(op),
            Some(&(made_for, _)) => Err(Error::invalid_argument(format!(
                "reduction {v} was created for {} but the call is on {}",
                made_for.name(),
                dt.name()
            ))),
            None => Err(Error::invalid_argument(format!(
                "reduction {v} is not an ncclRedOp_t of this communicator"
            ))),
        }
    }

    /// The communicator, once created; Err(InProgress) while the creation runs, or the
    /// creation's error.
    fn resolve(&self) -> Result<Shared> {
        let mut st = lock(&self.state);
        let taken = match &*st {
            State::Ready(c) => return Ok(c.clone()),
            State::Failed(e) => return Err(e.clone()),
            State::Pending(p) => match p.try_take() {
                None => {
                    return Err(Error::in_progress(
                        "the communicator is still being created",
                    ))
                }
                Some(r) => r,
            },
        };
        match taken {
            Ok(c) => {
                let c = Shared::new(c);
                *st = State::Ready(c.clone());
                Ok(c)
            }
            Err(e) => {
                *st = State::Failed(e.clone());
                Err(e)
            }
        }
    }

    /// The finalize's state: None when none runs or ran, Some(InProgress), Some(outcome).
    fn finalize_state(&self) -> Option<Result<()>> {
        let mut f = lock(&self.finalize);
        if matches!(&*f, Finalize::Running(h) if h.is_finished()) {
            if let Finalize::Running(h) = std::mem::replace(&mut *f, Finalize::NotCalled) {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(Error::internal("finalize panicked")));
                *f = Finalize::Done(r);
            }
        }
        match &*f {
            Finalize::NotCalled => None,
            Finalize::Running(_) => Some(Err(Error::in_progress("finalize is in progress"))),
            Finalize::Done(r) => Some(r.clone()),
        }
    }

    /// `ncclCommGetAsyncError`'s answer.
    pub(crate) fn state(&self) -> NcclResult {
        let c = match self.resolve() {
            Ok(c) => c,
            Err(e) => return e.code,
        };
        if let Some(Err(e)) = self.finalize_state() {
            return e.code;
        }
        // A non-blocking group still issuing (InProgress) or failed; else the async error.
        c.async_state()
    }

    /// The communicator for a call that needs a complete one. Using it while its creation,
    /// finalize or a non-blocking group is still in progress is refused as NCCL refuses it
    /// (ncclInvalidArgument: "poll ncclCommGetAsyncError until ncclSuccess before the next
    /// call"); after a non-blocking group failed, every call returns that group's error.
    pub(crate) fn ready(&self) -> Result<Shared> {
        let busy = |what: &str| {
            Error::invalid_argument(format!(
                "{what} is still in progress (ncclInProgress): poll ncclCommGetAsyncError until \
                 it returns ncclSuccess before using the communicator"
            ))
        };
        let c = match self.resolve() {
            Ok(c) => c,
            Err(e) if e.code == NcclResult::InProgress => {
                return Err(busy("the communicator's creation"))
            }
            Err(e) => return Err(Error::new(e.code, e.message)),
        };
        if let Some(Err(e)) = self.finalize_state() {
            if e.code == NcclResult::InProgress {
                return Err(busy("ncclCommFinalize"));
            }
        }
        c.check_ready()?;
        Ok(c)
    }

    /// `ncclCommFinalize`.
    pub(crate) fn finalize(&self) -> Result<NcclResult> {
        let c = self.ready()?;
        if c.0.is_revoked() {
            // At once, as NCCL (not through the background of a non-blocking finalize).
            return Err(Error::invalid_argument(
                "ncclCommFinalize: the communicator was revoked (destroy or abort it)",
            ));
        }
        let mut f = lock(&self.finalize);
        if !matches!(&*f, Finalize::NotCalled) {
            return Err(Error::invalid_usage("ncclCommFinalize was already called"));
        }
        if self.blocking {
            let r = c.finalize();
            *f = Finalize::Done(r.clone());
            r.map(|()| NcclResult::Success)
        } else {
            let h = std::thread::Builder::new()
                .name("nccl-finalize".into())
                .spawn(move || c.finalize())
                .map_err(|e| Error::system(format!("cannot start a finalize thread: {e}")))?;
            *f = Finalize::Running(h);
            Ok(NcclResult::InProgress)
        }
    }

    /// Destroy is refused while the creation runs (abort, or poll until it completes).
    pub(crate) fn check_destroyable(&self) -> Result<()> {
        match self.resolve() {
            Err(e) if e.code == NcclResult::InProgress => Err(Error::invalid_usage(
                "ncclCommDestroy on a communicator still being created: poll \
                 ncclCommGetAsyncError until it completes, or call ncclCommAbort",
            )),
            _ => Ok(()),
        }
    }

    /// `ncclCommDestroy`: waits for a background finalize, then frees.
    pub(crate) fn destroy(&self) -> Result<()> {
        if let Finalize::Running(h) =
            std::mem::replace(&mut *lock(&self.finalize), Finalize::NotCalled)
        {
            let _ = h.join();
        }
        let state = std::mem::replace(
            &mut *lock(&self.state),
            State::Failed(Error::in_progress("destroyed")),
        );
        match state {
            State::Ready(c) => match Arc::try_unwrap(c.0) {
                Ok(c) => c.destroy(),
                // A background split of this parent still holds it; it frees it when done.
                Err(_) => Ok(()),
            },
            State::Pending(p) => {
                // Only when it already failed or completed (check_destroyable).
                match p.try_take() {
                    Some(Ok(c)) => c.destroy(),
                    _ => Ok(()),
                }
            }
            State::Failed(_) => Ok(()),
        }
    }

    /// `ncclCommAbort`: stops the creation or the communicator and frees it; the handle then
    /// answers every call with ncclInvalidUsage.
    pub(crate) fn abort(&self) {
        let state = std::mem::replace(
            &mut *lock(&self.state),
            State::Failed(Error::invalid_usage(
                "the communicator was aborted (ncclCommAbort)",
            )),
        );
        match state {
            State::Pending(p) => {
                p.abort();
                // A creation deferred to the end of this thread's group has not started: it
                // will fail at once there. Otherwise it stops promptly; wait for it.
                if crate::enqueue::group::depth() == 0 {
                    if let Ok(c) = p.wait() {
                        c.abort();
                    }
                }
            }
            State::Ready(c) => {
                c.abort();
                // A non-blocking group still issuing fails fast once aborted; its launches
                // must be over before the communicator's memory goes.
                c.wait_background();
            }
            State::Failed(_) => {}
        }
        if let Finalize::Running(h) =
            std::mem::replace(&mut *lock(&self.finalize), Finalize::NotCalled)
        {
            let _ = h.join();
        }
    }
}

// The C values a call passes, read as Rust ones.

/// The handle `comm` names: null, destroyed and garbage pointers are ncclInvalidArgument
/// (looked up among the live handles, never dereferenced).
pub(super) fn handle(comm: NcclComm) -> Result<Arc<CommHandle>> {
    if comm.is_null() {
        return Err(null("comm"));
    }
    lookup(comm)
}

pub(super) fn count_of(what: &str, v: c_int) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid_argument(format!("{what} {v} is negative")))
}

/// The ready communicator `comm` names, and `stream` as the Rust API's handle.
pub(super) fn coll_comm(comm: NcclComm, stream: CudaStream) -> Result<(Shared, StreamHandle)> {
    Ok((handle(comm)?.ready()?, stream_of(stream)))
}

pub(super) fn stream_of(stream: CudaStream) -> StreamHandle {
    StreamHandle(stream as usize as u64)
}

pub(super) fn dev(p: *const c_void) -> u64 {
    p as usize as u64
}

pub(super) fn dtype(v: c_int) -> Result<DataType> {
    u32::try_from(v)
        .ok()
        .and_then(DataType::from_raw)
        .ok_or_else(|| Error::invalid_argument(format!("datatype {v} is not an ncclDataType_t")))
}
