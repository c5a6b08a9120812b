//! What the libraries' own threads cost while nothing is asked of them: after the last
//! collective, with every communicator still alive, the CPU time of nccl-rs's threads (names
//! `nccl-…`: the proxy, the socket network's helpers, bootstrap) and of NVIDIA NCCL's (names
//! `NCCL …`: its proxy and service threads) over a quiet window, from `/proc/self/task`.
//! Issue 20 asks for the idle proxy's CPU time; the baseline beside it says what NCCL spends.

use std::time::{Duration, Instant};

/// Thread-name prefixes: nccl-rs's threads, NVIDIA NCCL's.
const OWNERS: [&str; 2] = ["nccl-", "NCCL"];

/// Clock ticks used so far and thread counts of each owner's threads ([`OWNERS`]).
fn ticks() -> [(u64, usize); 2] {
    OWNERS.map(nccl::debug::thread_cpu_ticks)
}

/// Waits out the proxies' hot window (`settle`), then measures `window` of quiet and returns
/// the line the bench prints: CPU ms per library and as a share of one core.
pub fn report(settle: Duration, window: Duration) -> String {
    std::thread::sleep(settle);
    let before = ticks();
    let t0 = Instant::now();
    std::thread::sleep(window);
    let after = ticks();
    let secs = t0.elapsed().as_secs_f64();
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let show = |k: usize, who: &str| {
        let ms = after[k].0.saturating_sub(before[k].0) as f64 * 1e3 / hz;
        format!(
            "{who} {ms:.0} ms ({:.1}% of a core, {} threads)",
            ms / 10.0 / secs,
            after[k].1
        )
    };
    let mut parts = vec![show(0, "nccl-rs")];
    if after[1].1 > 0 {
        parts.push(show(1, "NVIDIA NCCL"));
    }
    format!(
        "# CPU of the libraries' threads while idle ({secs:.1} s, communicators alive; clock ticks of {:.0} ms): {}",
        1e3 / hz,
        parts.join("; ")
    )
}
