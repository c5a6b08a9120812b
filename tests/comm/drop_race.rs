//! Issue 22 (soundness): a rank that drops its communicator as soon as its own work finished,
//! while a peer in the same process is still finishing the same collective, must not free
//! memory the peer's kernel still writes (the peer's last acknowledgement lands in the memory
//! of the rank it received from). Ranks as threads, each dropping without finalize; many
//! rounds, since the window is a few instructions wide.

use crate::common;
use nccl::{Comm, DataType, ReduceOp};

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_max"),
    ignore = "needs nccl_all_reduce_float_max, which NCCL_RS_KERNELS left out"
)]
fn dropping_a_comm_while_a_peer_finishes_is_safe() {
    common::sim();
    let rounds: usize = std::env::var("NCCL_RS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let devs: Vec<_> = (0..3)
        .map(|d| nccl::Device::open(d).expect("a simulated device"))
        .collect();
    for round in 0..rounds {
        let id = common::loopback_id();
        std::thread::scope(|s| {
            for (r, d) in devs.iter().enumerate() {
                let id = &id;
                s.spawn(move || {
                    let comm = Comm::init_rank_on(d.clone(), 3, id, r).expect("init");
                    let stream = d.stream_create().expect("stream");
                    let buf = d.alloc(4096).expect("alloc");
                    buf.write(0, &vec![1u8; 4096]).expect("write");
                    for _ in 0..2 {
                        unsafe {
                            comm.all_reduce_raw(
                                buf.ptr(),
                                buf.ptr(),
                                1024,
                                DataType::Float32,
                                ReduceOp::MAX,
                                stream,
                            )
                        }
                        .expect("all_reduce");
                    }
                    d.stream_sync(stream).expect("sync");
                    // No finalize: this rank's memory goes while its peers may still be
                    // finishing.
                    drop(comm);
                    drop(buf);
                    d.stream_destroy(stream).expect("stream destroy");
                });
            }
        });
        if round % 50 == 0 {
            eprintln!("round {round}");
        }
    }
}
