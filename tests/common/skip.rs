//! Checks skipped on purpose, visibly. libtest captures what a test prints, so a test that
//! printed "skipped" and returned used to pass unseen. Here every skipped check writes one line
//! straight to the process's stderr (`std::io::stderr()` is not captured), and at exit the
//! process prints how many checks each reason skipped. A child process's lines reach its parent
//! through the supervisor (`procs`), which counts them as its own.
//!
//! The usual reason: the kernel researcher's build (`NCCL_RS_KERNELS` at build time) left the
//! kernel of a (collective, type, reduction) out, and the library refuses such a call.

use nccl::{DataType, ReduceOp};
use nccl_device::abi::Coll;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Mutex, Once};

/// Starts every line that reports one skipped check: `<MARK><reason>): <what>`.
const MARK: &str = "nccl-rs tests: skipped check (";
/// The reason of checks whose kernel this build left out (the total at exit names the filter).
pub const LEFT_OUT: &str = "kernel left out";

/// Skipped checks so far, by reason.
static COUNTS: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
static AT_EXIT: Once = Once::new();

/// What a reason means, in the totals at exit.
fn describe(reason: &str) -> String {
    match reason {
        LEFT_OUT => format!(
            "kernels left out by NCCL_RS_KERNELS={:?}",
            nccl_device::kernel_set::FILTER.unwrap_or("")
        ),
        other => other.to_string(),
    }
}

/// Records one skipped check: a line on stderr now, counted in the total printed at exit.
pub fn record(reason: &str, what: &str) {
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no arguments, once.
        unsafe { libc::atexit(print_totals) };
    });
    *COUNTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(reason.to_string())
        .or_default() += 1;
    let _ = writeln!(std::io::stderr(), "{MARK}{reason}): {what}");
}

extern "C" fn print_totals() {
    let counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
    let mut err = std::io::stderr();
    for (reason, n) in counts.iter() {
        let checks = if *n == 1 { "check" } else { "checks" };
        let _ = writeln!(
            err,
            "nccl-rs tests: {n} {checks} skipped: {}",
            describe(reason)
        );
    }
}

/// How many checks this process skipped so far (its children's included, once forwarded).
pub fn total() -> usize {
    COUNTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .sum()
}

/// The skipped checks a child process reported in `output`, counted here as well (and shown
/// on this process's stderr, which is not captured).
pub fn forward(output: &str) {
    for line in output.lines() {
        if let Some((reason, what)) = line
            .strip_prefix(MARK)
            .and_then(|rest| rest.split_once("): "))
        {
            record(reason, &format!("{what} (in a child process)"));
        }
    }
}

/// The kernel entry point a collective call of `coll` on `dt` with `op` runs.
pub fn kernel_name(coll: Coll, dt: DataType, op: ReduceOp) -> String {
    if coll.copies() {
        format!("nccl_{}", coll.symbol())
    } else {
        format!("nccl_{}_{}_{}", coll.symbol(), dt.name(), op.kind().name())
    }
}

/// Whether this build holds the kernel of (`coll`, `dt`, `op`).
pub fn built(coll: Coll, dt: DataType, op: ReduceOp) -> bool {
    nccl_device::kernel_set::built_coll(coll, dt, op.kind())
}

/// True when the kernel of (`coll`, `dt`, `op`) is built; otherwise records the check `what`
/// as skipped and returns false.
pub fn kernel_or_skip(coll: Coll, dt: DataType, op: ReduceOp, what: &dyn Fn() -> String) -> bool {
    if built(coll, dt, op) {
        return true;
    }
    record(
        LEFT_OUT,
        &format!("{} ({})", what(), kernel_name(coll, dt, op)),
    );
    false
}

/// As [`kernel_or_skip`] for the point-to-point kernel (send/recv and the patterns built on it).
pub fn p2p_or_skip(what: &dyn Fn() -> String) -> bool {
    let entry = nccl_device::kernel_set::P2P_ENTRY;
    if nccl_device::kernel_set::built(entry) {
        return true;
    }
    record(LEFT_OUT, &format!("{} ({entry})", what()));
    false
}
