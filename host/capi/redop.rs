//! User reduction operators (`ncclRedOpCreatePreMulSum`, `ncclRedOpDestroy`): per
//! communicator, numbered from `ncclNumOps` up, each bound to the datatype it was made for.

use super::{null, NcclComm};
use crate::comm::ReduceOp;
use crate::error::{Error, Result};
use crate::DataType;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;

/// `ncclNumOps`: the first value of a user operator.
const FIRST_USER_OP: c_int = 5;
/// `ncclScalarDevice`.
pub const SCALAR_DEVICE: c_int = 0;
/// `ncclScalarHostImmediate`.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

struct UserOp {
    dt: DataType,
    op: ReduceOp,
}

/// (communicator address, op value) → the operator.
static OPS: Mutex<Option<HashMap<(usize, c_int), UserOp>>> = Mutex::new(None);

fn with_ops<R>(f: impl FnOnce(&mut HashMap<(usize, c_int), UserOp>) -> R) -> R {
    let mut g = OPS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// Registers `op` (a PreMulSum) for calls on `dt` and returns its value.
pub fn create(comm: NcclComm, dt: DataType, op: ReduceOp) -> Result<c_int> {
    if comm.is_null() {
        return Err(null("comm"));
    }
    with_ops(|ops| {
        let key = comm as usize;
        let next = (FIRST_USER_OP..)
            .find(|v| !ops.contains_key(&(key, *v)))
            .unwrap_or(FIRST_USER_OP);
        ops.insert((key, next), UserOp { dt, op });
        Ok(next)
    })
}

pub fn destroy(comm: NcclComm, op: c_int) -> Result<()> {
    with_ops(|ops| match ops.remove(&(comm as usize, op)) {
        Some(_) => Ok(()),
        None => Err(Error::invalid_argument(format!(
            "reduction {op} was not created on this communicator"
        ))),
    })
}

/// The operator `v` means on `comm` for a call on `dt`: a built-in, or a user operator made for
/// the same datatype.
pub fn resolve(comm: NcclComm, v: c_int, dt: DataType) -> Result<ReduceOp> {
    if let Some(op) = u32::try_from(v).ok().and_then(ReduceOp::from_raw) {
        return Ok(op);
    }
    with_ops(|ops| match ops.get(&(comm as usize, v)) {
        Some(u) if u.dt == dt => Ok(u.op),
        Some(u) => Err(Error::invalid_argument(format!(
            "reduction {v} was created for {} but the call is on {}",
            u.dt.name(),
            dt.name()
        ))),
        None => Err(Error::invalid_argument(format!(
            "reduction {v} is not an ncclRedOp_t of this communicator"
        ))),
    })
}

/// Forgets a destroyed communicator's operators.
pub fn forget(comm: NcclComm) {
    with_ops(|ops| ops.retain(|(c, _), _| *c != comm as usize));
}
