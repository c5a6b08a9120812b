//! The system's clocks read in nanoseconds, for whatever stamps times: the proxy's timeline,
//! RAS's health records; and the timer slack of threads that poll for kernels.

/// `clock` (a Linux clock id) in ns.
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Lets this thread's short sleeps end on time: Linux lets a sleep of a few microseconds run
/// late by the thread's timer slack (50 µs by default), which a polling thread that kernels
/// wait on would pay on every nap. Set to 1 µs; harmless where refused.
pub(crate) fn fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a value and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
}
