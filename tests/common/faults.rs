//! A rank killed in the middle of a collective, shared by the simulator and GPU suites: what
//! every rank does, the victim included (it kills itself once its kernel runs).

use nccl::{Comm, DataType, ReduceOp};
use std::time::{Duration, Instant};

/// After one AllReduce of `count` floats that every rank finishes, issues `reps` more (enough
/// work to outlast the victim's 200 ms); rank `victim` then SIGKILLs itself. A survivor asserts
/// that its async error (ncclRemoteError or ncclSystemError, naming the victim) comes within
/// `limit`, then aborts, drains its stream and destroys, and says on stderr how long each took.
pub fn killed_mid_collective(
    comm: Comm,
    victim: usize,
    count: usize,
    reps: usize,
    limit: Duration,
) {
    let rank = comm.rank();
    let buf = comm.device().alloc(count * 4).expect("alloc");
    let stream = comm.device().stream_create().expect("stream");
    // One call every rank finishes first: the kernels are loaded (the driver's JIT on a cold
    // GPU host takes longer than the victim's 200 ms) and every connection is up, so the
    // victim dies inside the calls below, not during another rank's module load.
    let all_reduce = || {
        // SAFETY: `buf` holds `count` floats and outlives the kernels (the stream is drained
        // below before it is dropped).
        unsafe {
            comm.all_reduce_raw(
                buf.ptr(),
                buf.ptr(),
                count,
                DataType::Float32,
                ReduceOp::SUM,
                stream,
            )
        }
        .expect("issue the AllReduce")
    };
    all_reduce();
    comm.device()
        .stream_sync(stream)
        .expect("the first AllReduce");
    for _ in 0..reps {
        all_reduce();
    }
    if rank == victim {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: kill(2) on our own pid.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let t0 = Instant::now();
    let err = loop {
        if let Err(e) = comm.get_async_error() {
            break e;
        }
        assert!(
            t0.elapsed() < limit,
            "rank {rank}: no async error after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("rank {rank}: async error after {:?}: {err}", t0.elapsed());
    let t1 = Instant::now();
    comm.abort();
    eprintln!("rank {rank}: abort returned after {:?}", t1.elapsed());
    // The aborted kernel ends; only then may its buffer go (and only then may a failed check
    // below unwind: a panic that drops the buffer under the kernel would end the process in a
    // SIGSEGV that hides the failure).
    let _ = comm.device().stream_sync(stream);
    eprintln!("rank {rank}: stream drained after {:?}", t1.elapsed());
    drop(buf);
    comm.destroy().ok();
    eprintln!("rank {rank}: abort and destroy took {:?}", t1.elapsed());
    assert!(
        matches!(
            err.code,
            nccl::NcclResult::RemoteError | nccl::NcclResult::SystemError
        ),
        "{err}"
    );
    // The message names the dead rank.
    assert!(err.message.contains(&format!("rank {victim}")), "{err}");
}
