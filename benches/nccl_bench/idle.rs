//! What the libraries' own threads cost while nothing is asked of them: after the last
//! collective, with every communicator still alive, the CPU time of nccl-rs's threads (names
//! `nccl-…`: the proxy, the socket network's helpers, bootstrap) and of NVIDIA NCCL's (names
//! `NCCL …`: its proxy and service threads) over a quiet window, from `/proc/self/task`.
//! Issue 20 asks for the idle proxy's CPU time; the baseline beside it says what NCCL spends.

use std::time::{Duration, Instant};

/// Whose threads a name belongs to.
#[derive(Clone, Copy, PartialEq)]
enum Owner {
    Ours,
    Nccl,
    Other,
}

fn owner(name: &str) -> Owner {
    if name.starts_with("nccl-") {
        Owner::Ours
    } else if name.starts_with("NCCL") {
        Owner::Nccl
    } else {
        Owner::Other
    }
}

/// Clock ticks (user + system) used so far by this process's threads, per owner (ours, NCCL's),
/// and how many threads each has.
fn ticks() -> [(u64, usize); 2] {
    let mut sum = [(0u64, 0usize); 2];
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return sum;
    };
    for t in tasks.flatten() {
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let k = match owner(name.trim_end()) {
            Owner::Ours => 0,
            Owner::Nccl => 1,
            Owner::Other => continue,
        };
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The fields after the ")" closing the name: utime is field 14 of the line, stime 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        sum[k].0 += field(11) + field(12);
        sum[k].1 += 1;
    }
    sum
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
