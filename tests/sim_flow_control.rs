//! Flow control: with more ranks than FIFO slots, the ring lets a sender run more than
//! NCCL_STEPS steps ahead of a slow receiver; only the head counter stops it from overwriting
//! slots that were not read yet. One rank starts late to make that happen every time.

mod common;

use common::{compare, from_bytes, input, reference, to_bytes};
use nccl::{Backend, Comm, DataType, ReduceOp};

#[test]
fn a_late_rank_never_loses_data() {
    std::env::set_var("NCCL_RS_SIM_DEVICES", "16");
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    let n = 16;
    let comms =
        Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).expect("init 16 simulated ranks");
    // Many steps per channel: 64 KiB FIFOs of 8 slots, so a 1 MiB buffer takes many pieces.
    let count = 1 << 18;
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| input::<f32>(count, ReduceOp::Sum, 99, r))
        .collect();
    let want = reference(&inputs, ReduceOp::Sum, DataType::Float32);
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let bufs: Vec<_> = comms
        .iter()
        .zip(&inputs)
        .map(|(c, x)| {
            let b = c.device().alloc(count * 4).unwrap();
            b.write(0, to_bytes(x)).unwrap();
            b
        })
        .collect();
    let late = n - 1;
    for (i, c) in comms.iter().enumerate() {
        if i == late {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        c.all_reduce(
            bufs[i].ptr,
            bufs[i].ptr,
            count,
            DataType::Float32,
            ReduceOp::Sum,
            streams[i],
        )
        .unwrap();
    }
    for (i, c) in comms.iter().enumerate() {
        c.device().stream_sync(streams[i]).unwrap();
        let mut out = vec![0u8; count * 4];
        bufs[i].read(0, &mut out).unwrap();
        compare(&from_bytes::<f32>(&out), &want, &format!("rank {i}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
