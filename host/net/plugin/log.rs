//! What a plugin's `init` is given to call back: NCCL's logger (`crate::plugin_log`) and, from
//! v10 on, a profiler callback that records nothing.

pub(super) use crate::plugin_log::logger_fn;
use std::ffi::{c_int, c_void};

/// The profiler callback handed to v10 and v11 plugins: no profiler runs, so no event is
/// recorded; an event handle asked for is null.
///
/// # Safety
/// `e_handle` is null or a writable pointer, as the interface requires.
pub(super) unsafe extern "C" fn profiler(
    e_handle: *mut *mut c_void,
    _kind: c_int,
    _p_handle: *mut c_void,
    _plugin_id: i64,
    _ext: *mut c_void,
) -> c_int {
    if !e_handle.is_null() {
        // SAFETY: non-null and writable (above).
        unsafe { *e_handle = std::ptr::null_mut() };
    }
    0
}
