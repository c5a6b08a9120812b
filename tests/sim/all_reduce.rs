//! AllReduce on the CPU simulator with the tuner's own choices: the real device kernels on host
//! threads. (The LL matrices of every collective, type and reduction are `ll`'s: at the small
//! counts the tuner takes LL as well, so they are not repeated here.)

use crate::common::{self, check_all_reduce, Drive, Ranks, ALL_OPS};
use nccl::{Comm, DataType, ReduceOp};

#[test]
fn every_type_and_op_on_four_ranks() {
    common::type_op_matrix(&common::sim_ranks(4), &[1, 13, 4099], Drive::ThreadPerRank);
}

#[test]
fn rank_counts_and_odd_sizes() {
    for n in [1usize, 3, 4] {
        let comms = common::sim_ranks(n);
        for count in [0usize, 1, 7, 13, 4099, 50_000] {
            for in_place in [false, true] {
                let drive = [Drive::ThreadPerRank, Drive::OneThread, Drive::Group][count % 3];
                check_all_reduce(
                    &comms,
                    count,
                    DataType::Float32,
                    nccl::ReduceOp::SUM,
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
        let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank)
            .expect("init_rank in a child process");
        let ranks = Ranks::new(vec![comm]);
        for (dt, op) in [
            (DataType::Float32, nccl::ReduceOp::SUM),
            (DataType::Int64, nccl::ReduceOp::MAX),
            (DataType::Bfloat16, nccl::ReduceOp::AVG),
        ] {
            for count in [1usize, 31, 5000] {
                check_all_reduce(&ranks, count, dt, op, count % 2 == 1, 7, Drive::OneThread)
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        return;
    }
    for n in [2usize, 3, 4, 8] {
        common::procs::run(n, &[]);
    }
}

#[test]
fn eight_ranks_every_op() {
    let ranks = common::sim_ranks(8);
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

/// One communicator, collectives alternating between two streams without any sync between
/// them: the library must keep them in order (they share FIFOs and step counters).
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn launches_on_different_streams_stay_in_order() {
    let ranks = common::sim_ranks(3);
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
            let b = c.device().alloc(count * 4 + common::TAIL).unwrap();
            b.write(0, common::to_bytes(&vec![1.0f32; count])).unwrap();
            b.write(count * 4, &[common::POISON; common::TAIL]).unwrap();
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
                    nccl::ReduceOp::SUM,
                    s,
                )
            }
            .unwrap();
        }
    }
    for (i, c) in ranks.comms.iter().enumerate() {
        c.device().stream_sync(ranks.streams[i]).unwrap();
        c.device().stream_sync(extra[i]).unwrap();
        let mut out = vec![0u8; count * 4 + common::TAIL];
        bufs[i].read(0, &mut out).unwrap();
        common::check_tail(&out[count * 4..], &format!("rank {i}"))
            .unwrap_or_else(|e| panic!("{e}"));
        let got = common::from_bytes::<f32>(&out[..count * 4]);
        assert!(got.iter().all(|&v| v == 81.0), "rank {i}");
        c.device().stream_destroy(extra[i]).unwrap();
    }
}

/// PreMulSum with the scalar in device memory (ncclScalarDevice): the kernel reads it when it
/// runs.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_premulsum",
        nccl_rs_kernel = "nccl_all_reduce_int32_premulsum",
        nccl_rs_kernel = "nccl_all_reduce_half_premulsum"
    )),
    ignore = "needs nccl_all_reduce_{float,int32,half}_premulsum, which NCCL_RS_KERNELS left out"
)]
fn premulsum_with_a_device_scalar() {
    let ranks = common::sim_ranks(3);
    for dt in [DataType::Float32, DataType::Int32, DataType::Float16] {
        let count = 5000;
        let factor = if dt.is_float() { 0.5 } else { 3.0 };
        let bits = nccl_device::with_elem!(dt, T => nccl_device::types::Elem::to_bits(
            <T as nccl_device::types::Elem>::from_f64(factor)));
        let want_op = ReduceOp::pre_mul_sum(bits);
        let inputs: Vec<Vec<u8>> = (0..3)
            .map(|r| {
                nccl_device::with_elem!(dt, T =>
                common::to_bytes(&common::input::<T>(count, want_op, 5, r, 3)).to_vec())
            })
            .collect();
        let bytes = count * dt.size();
        let mut bufs = Vec::new();
        for (c, x) in ranks.comms.iter().zip(&inputs) {
            let (send, recv, scalar) = (
                c.device().alloc(bytes).unwrap(),
                c.device().alloc(bytes + common::TAIL).unwrap(),
                c.device().alloc(8).unwrap(),
            );
            send.write(0, x).unwrap();
            recv.write(0, &vec![common::POISON; bytes + common::TAIL])
                .unwrap();
            scalar.write(0, &bits.to_le_bytes()[..dt.size()]).unwrap();
            bufs.push((send, recv, scalar));
        }
        nccl::group_start();
        for (i, c) in ranks.comms.iter().enumerate() {
            let (send, recv, scalar) = &bufs[i];
            let op = ReduceOp::pre_mul_sum_device(scalar.ptr());
            unsafe { c.all_reduce_raw(send.ptr(), recv.ptr(), count, dt, op, ranks.streams[i]) }
                .unwrap();
        }
        nccl::group_end().unwrap();
        for (i, c) in ranks.comms.iter().enumerate() {
            c.device().stream_sync(ranks.streams[i]).unwrap();
            let mut out = vec![0u8; bytes + common::TAIL];
            bufs[i].1.read(0, &mut out).unwrap();
            let what = format!("{} rank {i}", dt.name());
            common::check_tail(&out[bytes..], &what).unwrap_or_else(|e| panic!("{e}"));
            nccl_device::with_elem!(dt, T => {
                let ins: Vec<Vec<T>> = inputs.iter().map(|b| common::from_bytes::<T>(b)).collect();
                let want = common::reference(&ins, want_op, dt);
                common::compare_bytes(&out[..bytes], &want, &what)
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
            ReduceOp::pre_mul_sum_device(host.as_ptr() as u64),
            ranks.streams[0],
        )
    }
    .unwrap_err();
    assert_eq!(e.code, nccl::NcclResult::InvalidArgument, "{e}");
    assert!(e.message.contains("premulsum scalar"), "{e}");
}
