//! The logger NCCL hands its plugins (network, tuner, profiler): `ncclDebugLogger_t`, a
//! printf-style function, formatted with the C library's `vsnprintf` and sent through `log`
//! at the plugin's level.
//!
//! Defining a C-variadic function needs nightly Rust (`c_variadic`). Built with a stable
//! compiler (build.rs sets `nccl_rs_variadic` only for nightly ones), the logger takes the
//! named arguments alone and logs the format text as it is, its `%` fields unfilled.

/// `ncclDebugLogger_t`: (level, subsystem flags, file, line, printf format, ...).
pub type Logger = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

#[cfg(nccl_rs_variadic)]
use std::ffi::VaList;
use std::ffi::{c_char, c_int, c_ulong, CStr};

#[cfg(nccl_rs_variadic)]
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
#[cfg(nccl_rs_variadic)]
pub(crate) unsafe extern "C" fn logger(
    level: c_int,
    flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
    args: ...
) {
    let Some(wanted) = wanted(level, fmt) else {
        return;
    };
    let mut buf = [0 as c_char; LINE_BYTES];
    // SAFETY: `buf` holds LINE_BYTES bytes and vsnprintf writes at most that many, always
    // NUL-terminated; the format and arguments are the plugin's, which matches them.
    let n = unsafe { vsnprintf(buf.as_mut_ptr(), LINE_BYTES, fmt, args) };
    if n < 0 {
        return;
    }
    // SAFETY: vsnprintf NUL-terminated `buf`.
    emit(wanted, flags, unsafe { CStr::from_ptr(buf.as_ptr()) });
}

/// The logger handed to the plugin, as a stable compiler can define it: the named arguments
/// only (on the C ABIs of Linux x86-64 and AArch64 they arrive where a variadic callee finds
/// them, and the variadic ones are left unread), the format logged unfilled.
///
/// # Safety
/// As the variadic logger.
#[cfg(not(nccl_rs_variadic))]
unsafe extern "C" fn logger_named(
    level: c_int,
    flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
) {
    if let Some(wanted) = wanted(level, fmt) {
        // SAFETY: a NUL-terminated format, as the interface requires.
        emit(wanted, flags, unsafe { CStr::from_ptr(fmt) });
    }
}

/// [`logger_named`] as the variadic logger type the plugin calls.
#[cfg(not(nccl_rs_variadic))]
pub(crate) fn logger_fn() -> Logger {
    let f: unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char) = logger_named;
    // SAFETY: see logger_named: the named arguments are passed alike to a variadic and a
    // non-variadic callee on the targets this library builds for.
    unsafe { std::mem::transmute(f) }
}

/// The variadic logger as the plugin's logger type.
#[cfg(nccl_rs_variadic)]
pub(crate) fn logger_fn() -> Logger {
    logger
}

/// The `log` level of a plugin's level, when a line at it would be shown.
fn wanted(level: c_int, fmt: *const c_char) -> Option<log::Level> {
    let wanted = match level {
        2 => log::Level::Warn,
        4 => log::Level::Error,
        5 => log::Level::Trace,
        1 | 3 => log::Level::Info,
        _ => return None,
    };
    (!fmt.is_null() && log::log_enabled!(wanted)).then_some(wanted)
}

fn emit(wanted: log::Level, flags: c_ulong, msg: &CStr) {
    let msg = msg.to_string_lossy();
    // NCCL's subsystem bits: 1 is INIT, 0x40 TUNING; plugins log everything else as NET.
    let target = if flags & 1 != 0 {
        crate::debug::INIT
    } else if flags & 0x40 != 0 {
        crate::debug::TUNING
    } else {
        crate::debug::NET
    };
    log::log!(target: target, wanted, "{}", msg.trim_end());
}
