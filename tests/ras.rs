//! RAS (issue 23): a query against a job with one rank killed and one that stopped issuing
//! names both — the dead one, and the one behind with the collective it has not issued — and
//! calls the communicator stuck. Ranks are simulator processes on this machine; every RAS
//! listener is on loopback (`NCCL_RAS_ADDR=127.0.0.1:0`: a free port per process).

mod common;

use nccl::{Backend, Comm, DataType, ReduceOp};
use std::time::{Duration, Instant};

fn all_reduce(comm: &Comm, buf: &nccl::DevBuffer, stream: nccl::StreamHandle) {
    unsafe {
        comm.all_reduce_raw(
            buf.ptr(),
            buf.ptr(),
            1024,
            DataType::Float32,
            ReduceOp::Sum,
            stream,
        )
    }
    .expect("issue an AllReduce");
}

#[test]
fn a_query_names_the_dead_and_the_late_rank() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank");
        let buf = comm.device().alloc(4096).expect("alloc");
        let stream = comm.device().stream_create().expect("stream");
        // Operation 1 on every rank.
        all_reduce(&comm, &buf, stream);
        comm.device()
            .stream_sync(stream)
            .expect("the first AllReduce");
        match rank {
            // Rank 3 dies; rank 2 stops issuing (but its process lives and answers queries).
            3 => unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            },
            2 => std::thread::sleep(Duration::from_secs(4)),
            _ => {
                // Operation 2 on ranks 0 and 1 only: it cannot complete.
                all_reduce(&comm, &buf, stream);
                let t0 = Instant::now();
                while comm.get_async_error().is_ok() {
                    assert!(
                        t0.elapsed() < Duration::from_secs(30),
                        "rank 3's death unseen"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                if rank == 1 {
                    std::thread::sleep(Duration::from_secs(4));
                } else {
                    let addr = nccl::ras::listening_on().expect("rank 0's RAS listener");
                    assert!(addr.ip().is_loopback(), "{addr}");
                    let text = nccl::ras::query(addr, false, Duration::from_secs(20))
                        .expect("a RAS answer");
                    eprintln!("{text}");
                    for want in [
                        "4 ranks",
                        "rank 3: DEAD",
                        "rank 2: BEHIND: issued 1 operations, others 2; has not issued operation 2 (AllReduce)",
                        "STUCK or FAILED: 1 rank dead, 1 rank behind",
                    ] {
                        assert!(text.contains(want), "no {want:?} in:\n{text}");
                    }
                    assert!(!text.contains("rank 1:"), "rank 1 is healthy:\n{text}");
                    // The client binary says the same, every rank included with -v.
                    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ncclras"))
                        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-v"])
                        .output()
                        .expect("run ncclras");
                    let text = String::from_utf8_lossy(&out.stdout);
                    assert!(out.status.success(), "{out:?}");
                    assert!(text.contains("rank 3: DEAD"), "{text}");
                    assert!(text.contains("rank 1: "), "-v lists every rank:\n{text}");
                }
            }
        }
        comm.abort();
        let _ = comm.device().stream_sync(stream);
        drop(buf);
        drop(comm);
        return;
    }
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_RAS_ADDR", "127.0.0.1:0"),
    ];
    common::procs::run_nodes_with_victim("a_query_names_the_dead_and_the_late_rank", 1, 4, &env, 3);
}
