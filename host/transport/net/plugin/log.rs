//! What a plugin's `init` is given to call back: NCCL's printf-style logger (formatted with the
//! C library's `vsnprintf`, then sent through `log` at the plugin's level) and, from v10 on, a
//! profiler callback that records nothing.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, VaList};

extern "C" {
    fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: VaList) -> c_int;
}

/// Longest plugin log line kept (NCCL's own lines are shorter).
const LINE_BYTES: usize = 1024;

/// The logger handed to the plugin (ncclDebugLogger_t).
///
/// # Safety
/// Called by the plugin with a NUL-terminated printf format whose arguments match it, as the
/// interface requires.
pub(super) unsafe extern "C" fn logger(
    level: c_int,
    flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
    args: ...
) {
    let wanted = match level {
        2 => log::Level::Warn,
        4 => log::Level::Error,
        5 => log::Level::Trace,
        1 | 3 => log::Level::Info,
        _ => return,
    };
    if fmt.is_null() || !log::log_enabled!(wanted) {
        return;
    }
    let mut buf = [0 as c_char; LINE_BYTES];
    // SAFETY: `buf` holds LINE_BYTES bytes and vsnprintf writes at most that many, always
    // NUL-terminated; the format and arguments are the plugin's, which matches them.
    let n = unsafe { vsnprintf(buf.as_mut_ptr(), LINE_BYTES, fmt, args) };
    if n < 0 {
        return;
    }
    // SAFETY: vsnprintf NUL-terminated `buf`.
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    // NCCL's subsystem bits: 1 is INIT; plugins log everything else as NET.
    let target = if flags & 1 != 0 {
        crate::debug::INIT
    } else {
        crate::debug::NET
    };
    log::log!(target: target, wanted, "{}", msg.trim_end());
}

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
