//! The C entry points of the collectives with real buffers, on the simulator: ncclBroadcast,
//! ncclReduce, ncclAllGather and ncclReduceScatter (and ncclAllReduce beside them) called
//! through the C ABI on the communicators of ncclCommInitAll, every rank in one group, in and
//! out of place; outputs poisoned with a poisoned tail, each rank's result checked against the
//! host reference (exact inputs, exact comparison), the tail untouched.

use crate::common::{self, check_tail, compare_bytes, input, reference, to_bytes, POISON, TAIL};
use nccl::capi::*;
use nccl::{DataType, NcclResult, ReduceOp, StreamHandle};
use nccl_device::abi::Coll;
use std::ffi::{c_int, c_void};

/// `ncclFloat32` and `ncclSum` as the C header numbers them.
const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;

/// `n` communicators of this process (devices 0..n), through the C ABI.
fn init_all(n: usize) -> Vec<NcclComm> {
    common::sim();
    let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); n];
    // SAFETY: `n` slots; a NULL device list means devices 0..n.
    let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as c_int, std::ptr::null()) };
    assert_eq!(r, NcclResult::Success, "ncclCommInitAll");
    comms
}

/// One collective through its C entry point on every rank, in one group, on the legacy
/// default stream (NULL); checks every rank's output and the poisoned tail past it.
fn check(comms: &[NcclComm], coll: Coll, count: usize, root: usize, in_place: bool, seed: u64) {
    let n = comms.len();
    let what = format!(
        "{} through the C ABI, {n} ranks, count {count}, root {root}, in place {in_place}",
        coll.name()
    );
    let (dt, op) = (DataType::Float32, ReduceOp::SUM);
    if !common::skip::kernel_or_skip(coll, dt, op, &|| what.clone()) {
        return;
    }
    let (in_len, out_len) = match coll {
        Coll::AllGather => (count, n * count),
        Coll::ReduceScatter => (n * count, count),
        _ => (count, count),
    };
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(in_len, op, seed, r, n)).collect();
    let all: Vec<(f32, f64)> = match coll {
        Coll::Broadcast => inputs[root].iter().map(|&x| (x, 0.0)).collect(),
        Coll::AllGather => inputs.iter().flatten().map(|&x| (x, 0.0)).collect(),
        _ => reference(&inputs, op, dt),
    };
    let want = |r: usize| -> Option<Vec<(f32, f64)>> {
        match coll {
            Coll::Reduce if r != root => None,
            Coll::ReduceScatter => Some(all[r * count..(r + 1) * count].to_vec()),
            _ => Some(all.clone()),
        }
    };
    // Per rank: the buffers, and the send, receive and tail addresses.
    let mut bufs = Vec::new();
    for (r, x) in inputs.iter().enumerate() {
        let d = nccl::Device::open(r as i32).expect("the rank's device");
        let len = in_len.max(out_len) * 4;
        let (send, recv, tail, keep) = if in_place {
            let b = d.alloc(len + TAIL).expect("alloc");
            b.write(0, &vec![POISON; len + TAIL]).expect("poison");
            let (s, o) = match coll {
                Coll::AllGather => (r * count * 4, 0),
                Coll::ReduceScatter => (0, r * count * 4),
                _ => (0, 0),
            };
            b.write(s, to_bytes(x)).expect("input");
            let p = b.ptr();
            (p + s as u64, p + o as u64, p + len as u64, vec![b])
        } else {
            let s = d.alloc(in_len * 4).expect("alloc");
            s.write(0, to_bytes(x)).expect("input");
            let o = d.alloc(out_len * 4 + TAIL).expect("alloc");
            o.write(0, &vec![POISON; out_len * 4 + TAIL])
                .expect("poison");
            let (sp, op_) = (s.ptr(), o.ptr());
            (sp, op_, op_ + (out_len * 4) as u64, vec![s, o])
        };
        bufs.push((d, send, recv, tail, keep));
    }
    let ptr = |p: u64| p as usize as *mut c_void;
    let stream: CudaStream = std::ptr::null_mut();
    // SAFETY: the C ABI on live communicators and buffers that outlive the synchronisation.
    unsafe {
        assert_eq!(ncclGroupStart(), NcclResult::Success);
        for (r, &c) in comms.iter().enumerate() {
            let (s, o) = (ptr(bufs[r].1), ptr(bufs[r].2));
            let root = root as c_int;
            let res = match coll {
                Coll::Broadcast => ncclBroadcast(s, o, count, NCCL_FLOAT32, root, c, stream),
                Coll::Reduce => ncclReduce(s, o, count, NCCL_FLOAT32, NCCL_SUM, root, c, stream),
                Coll::AllGather => ncclAllGather(s, o, count, NCCL_FLOAT32, c, stream),
                Coll::ReduceScatter => {
                    ncclReduceScatter(s, o, count, NCCL_FLOAT32, NCCL_SUM, c, stream)
                }
                Coll::AllReduce => ncclAllReduce(s, o, count, NCCL_FLOAT32, NCCL_SUM, c, stream),
            };
            assert_eq!(res, NcclResult::Success, "{what}: rank {r}");
        }
        assert_eq!(ncclGroupEnd(), NcclResult::Success, "{what}");
    }
    for (r, (d, _, recv, tail, _)) in bufs.iter().enumerate() {
        d.stream_sync(StreamHandle(0))
            .expect("sync the legacy stream");
        let what = format!("{what}: rank {r}");
        let mut t = vec![0u8; TAIL];
        // SAFETY: the test's own buffers, idle after the synchronisation.
        unsafe { d.copy_dtoh_raw(&mut t, *tail) }.expect("read the tail");
        check_tail(&t, &what).unwrap_or_else(|e| panic!("{e}"));
        let Some(want) = want(r) else { continue };
        let mut out = vec![0u8; out_len * 4];
        // SAFETY: as above.
        unsafe { d.copy_dtoh_raw(&mut out, *recv) }.expect("read the output");
        compare_bytes(&out, &want, &what).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn c_collectives_carry_data_on_the_simulator() {
    for n in [2usize, 3] {
        let comms = init_all(n);
        let mut seed = 10 * n as u64;
        for coll in Coll::ALL {
            for (count, in_place) in [(1usize, false), (4099, false), (20_001, true)] {
                seed += 1;
                check(&comms, coll, count, n - 1, in_place, seed);
            }
        }
        for c in comms {
            // SAFETY: a live communicator, destroyed once.
            assert_eq!(unsafe { ncclCommDestroy(c) }, NcclResult::Success);
        }
    }
}
