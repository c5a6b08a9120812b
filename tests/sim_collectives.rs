//! AllReduce on the CPU simulator: the real device kernels on host threads.

mod common;

use common::{check_all_reduce, Drive, Ranks, ALL_OPS};
use nccl::{Backend, Comm, DataType, ReduceOp};

fn sim_comms(n: usize) -> Ranks {
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    let devs: Vec<i32> = (0..n as i32).collect();
    Ranks::new(Comm::init_all(&devs).expect("init_all on the simulator"))
}

#[test]
fn every_type_and_op_on_two_and_four_ranks() {
    common::type_op_matrix(&sim_comms(2), &[0, 1, 37, 1000], Drive::OneThread);
    common::type_op_matrix(&sim_comms(4), &[1, 13, 4099], Drive::ThreadPerRank);
}

#[test]
fn rank_counts_and_odd_sizes() {
    for n in [1usize, 3, 4] {
        let comms = sim_comms(n);
        for count in [0usize, 1, 7, 13, 4099, 50_000] {
            for in_place in [false, true] {
                let drive = [Drive::ThreadPerRank, Drive::OneThread, Drive::Group][count % 3];
                check_all_reduce(
                    &comms,
                    count,
                    DataType::Float32,
                    nccl::ReduceOp::Sum,
                    in_place,
                    count as u64,
                    drive,
                )
                .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
            }
        }
    }
}

#[test]
fn ranks_as_processes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm =
            Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child process");
        let ranks = Ranks::new(vec![comm]);
        for (dt, op) in [
            (DataType::Float32, nccl::ReduceOp::Sum),
            (DataType::Int64, nccl::ReduceOp::Max),
            (DataType::Bfloat16, nccl::ReduceOp::Avg),
        ] {
            for count in [1usize, 31, 5000] {
                check_all_reduce(&ranks, count, dt, op, count % 2 == 1, 7, Drive::OneThread)
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        return;
    }
    for n in [2usize, 3, 4, 8] {
        common::procs::run("ranks_as_processes", n, &[]);
    }
}

#[test]
fn eight_ranks_every_op() {
    let ranks = sim_comms(8);
    for op in ALL_OPS {
        check_all_reduce(
            &ranks,
            999,
            DataType::Float16,
            op,
            false,
            3,
            Drive::ThreadPerRank,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        check_all_reduce(&ranks, 1001, DataType::Int32, op, true, 4, Drive::OneThread)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn every_collective_on_2_3_4_and_8_ranks() {
    for (n, drive) in [
        (2, Drive::Group),
        (3, Drive::OneThread),
        (4, Drive::ThreadPerRank),
        (8, Drive::OneThread),
    ] {
        common::collective_matrix(&sim_comms(n), &[1, 17, 3000], drive);
    }
}

/// One communicator, collectives alternating between two streams without any sync between
/// them: the library must keep them in order (they share FIFOs and step counters).
#[test]
fn launches_on_different_streams_stay_in_order() {
    let ranks = sim_comms(3);
    let extra: Vec<_> = ranks
        .comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let count = 20_000;
    let bufs: Vec<_> = ranks
        .comms
        .iter()
        .map(|c| {
            let b = c.device().alloc(count * 4).unwrap();
            b.write(0, common::to_bytes(&vec![1.0f32; count])).unwrap();
            b
        })
        .collect();
    // Four in-place sums: every element becomes 3^4 = 81.
    for round in 0..4 {
        for (i, c) in ranks.comms.iter().enumerate() {
            let s = if round % 2 == 0 {
                ranks.streams[i]
            } else {
                extra[i]
            };
            unsafe {
                c.all_reduce_raw(
                    bufs[i].ptr(),
                    bufs[i].ptr(),
                    count,
                    DataType::Float32,
                    nccl::ReduceOp::Sum,
                    s,
                )
            }
            .unwrap();
        }
    }
    for (i, c) in ranks.comms.iter().enumerate() {
        c.device().stream_sync(ranks.streams[i]).unwrap();
        c.device().stream_sync(extra[i]).unwrap();
        let mut out = vec![0u8; count * 4];
        bufs[i].read(0, &mut out).unwrap();
        assert!(
            common::from_bytes::<f32>(&out).iter().all(|&v| v == 81.0),
            "rank {i}"
        );
        c.device().stream_destroy(extra[i]).unwrap();
    }
}

/// PreMulSum with the scalar in device memory (ncclScalarDevice): the kernel reads it when it
/// runs.
#[test]
fn premulsum_with_a_device_scalar() {
    let ranks = sim_comms(3);
    for dt in [DataType::Float32, DataType::Int32, DataType::Float16] {
        let count = 5000;
        let factor = if dt.is_float() { 0.5 } else { 3.0 };
        let bits = nccl_device::with_elem!(dt, T => nccl_device::types::Elem::to_bits(
            <T as nccl_device::types::Elem>::from_f64(factor)));
        let want_op = ReduceOp::PreMulSum { scalar_bits: bits };
        let inputs: Vec<Vec<u8>> = (0..3)
            .map(|r| {
                nccl_device::with_elem!(dt, T =>
                common::to_bytes(&common::input::<T>(count, want_op, 5, r)).to_vec())
            })
            .collect();
        let bytes = count * dt.size();
        let mut bufs = Vec::new();
        for (c, x) in ranks.comms.iter().zip(&inputs) {
            let (send, recv, scalar) = (
                c.device().alloc(bytes).unwrap(),
                c.device().alloc(bytes).unwrap(),
                c.device().alloc(8).unwrap(),
            );
            send.write(0, x).unwrap();
            scalar.write(0, &bits.to_le_bytes()[..dt.size()]).unwrap();
            bufs.push((send, recv, scalar));
        }
        nccl::group_start();
        for (i, c) in ranks.comms.iter().enumerate() {
            let (send, recv, scalar) = &bufs[i];
            let op = ReduceOp::PreMulSumDevice {
                scalar: scalar.ptr(),
            };
            unsafe { c.all_reduce_raw(send.ptr(), recv.ptr(), count, dt, op, ranks.streams[i]) }
                .unwrap();
        }
        nccl::group_end().unwrap();
        for (i, c) in ranks.comms.iter().enumerate() {
            c.device().stream_sync(ranks.streams[i]).unwrap();
            let mut out = vec![0u8; bytes];
            bufs[i].1.read(0, &mut out).unwrap();
            nccl_device::with_elem!(dt, T => {
                let ins: Vec<Vec<T>> = inputs.iter().map(|b| common::from_bytes::<T>(b)).collect();
                let want = common::reference(&ins, want_op, dt);
                common::compare(&common::from_bytes::<T>(&out), &want, &format!("{} rank {i}", dt.name()))
            })
            .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    // A scalar that is not device memory of the communicator's GPU is refused.
    let c = &ranks.comms[0];
    let buf = c.device().alloc(64).unwrap();
    let host = [0f32; 1];
    let e = unsafe {
        c.all_reduce_raw(
            buf.ptr(),
            buf.ptr(),
            4,
            DataType::Float32,
            ReduceOp::PreMulSumDevice {
                scalar: host.as_ptr() as u64,
            },
            ranks.streams[0],
        )
    }
    .unwrap_err();
    assert_eq!(e.code, nccl::NcclResult::InvalidArgument, "{e}");
    assert!(e.message.contains("premulsum scalar"), "{e}");
}
