//! Bad input on the simulator: every case is an error value with a message, never a panic or a
//! hang.

use crate::common::{self, procs};
use nccl::{Comm, DataType, NcclResult, ReduceOp, UniqueId};
use std::time::Instant;

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_all_reduce_uint32_sum"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_reduce_int32_sum, nccl_all_reduce_uint32_sum, which NCCL_RS_KERNELS left out"
)]
fn buffers_and_counts() {
    common::sim();
    let comms = Comm::init_all(&[0, 1]).expect("init");
    let c = &comms[0];
    let buf = c.device().alloc(4096).unwrap();
    let other = comms[1].device().alloc(4096).unwrap();
    let s = Default::default();
    let code = |r: nccl::Result<()>| r.unwrap_err().code;
    assert_eq!(
        code(unsafe { c.all_reduce_raw(0, buf.ptr(), 4, DataType::Float32, ReduceOp::SUM, s) }),
        NcclResult::InvalidArgument
    );
    assert_eq!(
        code(unsafe {
            c.all_reduce_raw(
                buf.ptr() + 1,
                buf.ptr(),
                4,
                DataType::Int32,
                ReduceOp::SUM,
                s,
            )
        }),
        NcclResult::InvalidArgument
    );
    assert_eq!(
        code(unsafe {
            c.all_reduce_raw(
                buf.ptr(),
                buf.ptr(),
                usize::MAX / 2,
                DataType::Float64,
                ReduceOp::SUM,
                s,
            )
        }),
        NcclResult::InvalidArgument
    );
    let e = unsafe {
        c.all_reduce_raw(
            other.ptr(),
            buf.ptr(),
            4,
            DataType::Float32,
            ReduceOp::SUM,
            s,
        )
    }
    .unwrap_err();
    assert!(e.message.contains("device 1"), "{e}");
    let host = [0u32; 8];
    let e = unsafe {
        c.all_reduce_raw(
            host.as_ptr() as u64,
            buf.ptr(),
            4,
            DataType::Uint32,
            ReduceOp::SUM,
            s,
        )
    }
    .unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidArgument);
    // (ncclGetLastError is per process, and other tests run beside this one: the error's own
    // message is what is checked.)
    assert!(e.message.contains("not device memory"), "{e}");
    // Zero elements: nothing to do, even with null buffers (as NCCL).
    assert!(unsafe { c.all_reduce_raw(0, 0, 0, DataType::Float32, ReduceOp::SUM, s) }.is_ok());
    assert_eq!(DataType::from_raw(12), None);
    assert_eq!(ReduceOp::from_raw(5), None);
}

#[test]
fn ranks_and_ids() {
    common::sim();
    let id = common::loopback_id();
    let dev = nccl::Device::open(0).unwrap();
    assert_eq!(
        Comm::init_rank_on(dev.clone(), 2, &id, 2).unwrap_err().code,
        NcclResult::InvalidArgument
    );
    assert_eq!(
        Comm::init_rank_on(dev.clone(), 0, &id, 0).unwrap_err().code,
        NcclResult::InvalidArgument
    );
    let garbage = UniqueId {
        internal: [0x5a; nccl::UNIQUE_ID_BYTES],
    };
    // Refused without waiting for anyone (a bound that only turns a hang into a failure).
    let e = procs::within("init on a garbage id", procs::limit(), move || {
        Comm::init_rank_on(dev, 2, &garbage, 0).unwrap_err()
    });
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    assert!(nccl::Device::open(1000).is_err());
}

/// NCCL_BOOTSTRAP_TIMEOUT_MS=500, in a child process: the init of a rank whose peer never
/// comes fails. The bound (60 s) only turns a hang into a failure; it is no timing claim, but
/// it is shorter than the default timeout (120 s), so a setting that was ignored fails too.
#[test]
fn missing_rank_times_out() {
    procs::isolated(&[("NCCL_BOOTSTRAP_TIMEOUT_MS", "500")], &[], || {
        common::sim();
        let id = common::loopback_id();
        let dev = common::sim_dev(2);
        let bound = std::time::Duration::from_secs(60);
        let e = procs::within("an init whose peer never comes", bound, move || {
            Comm::init_rank_on(dev, 2, &id, 0).unwrap_err()
        });
        assert_eq!(e.code, NcclResult::RemoteError, "{e}");
        assert!(e.message.contains("1 of 2"), "how many came: {e}");
    });
}

/// Issue 23, failure 1: every buffer is checked against its allocation, not just its first
/// byte. A short buffer is InvalidArgument naming the buffer and both sizes; AllGather's recv
/// and ReduceScatter's send are nranks × count; in-place offsets and the buffers NCCL ignores
/// (Reduce's recv and Broadcast's send off the root) are not refused.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_reduce_scatter_float_sum",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_reduce_float_sum",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather, nccl_reduce_scatter_float_sum, nccl_broadcast, nccl_reduce_float_sum, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn buffer_extents() {
    common::sim();
    let comms = Comm::init_all(&[0, 1]).expect("init");
    short_buffers_are_refused(&comms[0]);

    // What fits is accepted, and runs: in-place AllGather and ReduceScatter at their offsets,
    // Reduce with a short recv off the root, Broadcast with a short send off the root.
    let fits = Fits::new(&comms);
    fits.in_place_all_gather();
    fits.in_place_reduce_scatter();
    fits.reduce_with_a_short_recv_off_the_root();
    fits.broadcast_with_a_short_send_off_the_root();
    fits.destroy_streams();
}

/// `n` bytes of a xorshift sequence from `seed`.
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `r` is the refusal of a short buffer: InvalidArgument, its message naming the buffer
/// (`what`), the bytes the call needs and the bytes its allocation holds from the pointer on.
fn assert_short(r: nccl::Result<()>, what: &str, need: usize, avail: usize) {
    let e = r.expect_err("a short buffer must be refused");
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    for word in [what.to_string(), need.to_string(), avail.to_string()] {
        assert!(e.message.contains(&word), "'{word}' not in: {e}");
    }
}

/// `buffer_extents`' refusals, on rank `c` of two: every call with a buffer too short for its
/// count (10 calls), a null receive buffer and a registration past the end; none of them may
/// write a byte.
fn short_buffers_are_refused(c: &Comm) {
    let s = Default::default();
    let f32 = DataType::Float32;
    let small = c.device().alloc(4096).unwrap();
    let big = c.device().alloc(8192).unwrap();
    // Poisoned with a pattern that must survive every refused call (the case wrote past
    // `small` into the next allocation).
    let (small0, big0) = (pattern(4096, 0x5eed_1234), pattern(8192, 0xbeef_0987));
    small.write(0, &small0).unwrap();
    big.write(0, &big0).unwrap();
    let sum = ReduceOp::SUM;
    let refusals = Instant::now();
    // The case: 2048 floats in a 4 KiB buffer.
    assert_short(
        unsafe { c.all_reduce_raw(small.ptr(), big.ptr(), 2048, f32, sum, s) },
        "sendbuff",
        8192,
        4096,
    );
    assert_short(
        unsafe { c.all_reduce_raw(big.ptr(), small.ptr(), 2048, f32, sum, s) },
        "recvbuff",
        8192,
        4096,
    );
    // Bytes from the pointer to the end of the allocation, not the allocation's size.
    assert_short(
        unsafe { c.all_reduce_raw(big.ptr() + 8184, big.ptr(), 4, f32, sum, s) },
        "sendbuff",
        16,
        8,
    );
    // AllGather's output and ReduceScatter's input hold nranks × count elements.
    assert_short(
        unsafe { c.all_gather_raw(small.ptr(), small.ptr(), 1024, f32, s) },
        "recvbuff",
        8192,
        4096,
    );
    assert_short(
        unsafe { c.reduce_scatter_raw(small.ptr(), small.ptr(), 1024, f32, sum, s) },
        "sendbuff",
        8192,
        4096,
    );
    // The root's buffers of Broadcast and Reduce.
    assert_short(
        unsafe { c.broadcast_raw(small.ptr(), big.ptr(), 2048, f32, 0, s) },
        "sendbuff",
        8192,
        4096,
    );
    // Off the root, in place (ncclBcast): the one buffer is the receive buffer, and checked.
    assert_short(
        unsafe { c.broadcast_raw(small.ptr(), small.ptr(), 2048, f32, 1, s) },
        "recvbuff",
        8192,
        4096,
    );
    let e = unsafe { c.broadcast_raw(0, 0, 16, f32, 1, s) }.expect_err("a null buffer");
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    assert!(e.message.contains("recvbuff is a null pointer"), "{e}");
    assert_short(
        unsafe { c.reduce_raw(big.ptr(), small.ptr(), 2048, f32, sum, 0, s) },
        "recvbuff",
        8192,
        4096,
    );
    // Send and receive.
    assert_short(
        unsafe { c.send_raw(small.ptr(), 2048, f32, 1, s) },
        "sendbuff",
        8192,
        4096,
    );
    assert_short(
        unsafe { c.recv_raw(small.ptr(), 2048, f32, 1, s) },
        "recvbuff",
        8192,
        4096,
    );
    // Registration covers the whole range too.
    let e = unsafe { c.register_raw(small.ptr(), 8192) }.unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    // Nothing ran: both allocations hold their pattern.
    for (b, want, name) in [(&small, &small0, "small"), (&big, &big0, "big")] {
        let mut got = vec![0u8; want.len()];
        b.read(0, &mut got).unwrap();
        assert!(
            got == *want,
            "the {name} buffer changed under a refused call"
        );
    }
    // For docs/faults.md (no bound asserted): the slowest refusal.
    eprintln!(
        "short buffers: 10 calls refused in {:?} (all together, checks included), both buffers \
         intact",
        refusals.elapsed()
    );
}

/// Floats per rank of the calls that fit.
const COUNT: usize = 256;
/// Bytes of a rank's block of `COUNT` floats.
const BLOCK: usize = COUNT * 4;

/// `buffer_extents`' calls that fit, on two ranks: each rank's stream, a buffer of two blocks
/// (`whole`) and one of 4 bytes (`tiny`, for the buffers NCCL ignores off the root).
struct Fits<'a> {
    comms: &'a [Comm],
    streams: Vec<nccl::StreamHandle>,
    whole: Vec<nccl::DevBuffer>,
    tiny: Vec<nccl::DevBuffer>,
}

impl<'a> Fits<'a> {
    fn new(comms: &'a [Comm]) -> Fits<'a> {
        let streams = comms
            .iter()
            .map(|c| c.device().stream_create().unwrap())
            .collect();
        let whole = comms
            .iter()
            .map(|c| c.device().alloc(2 * BLOCK).unwrap())
            .collect();
        let tiny = comms.iter().map(|c| c.device().alloc(4).unwrap()).collect();
        Fits {
            comms,
            streams,
            whole,
            tiny,
        }
    }

    /// Every rank's `whole` filled with its values: rank r's float i is r × 1000 + i.
    fn fill(&self) {
        for (r, b) in self.whole.iter().enumerate() {
            let bytes: Vec<u8> = (0..2 * COUNT)
                .flat_map(|i| ((r * 1000 + i) as f32).to_le_bytes())
                .collect();
            b.write(0, &bytes).unwrap();
        }
    }

    /// `f` on every rank in one group, then every stream synchronized.
    fn run(&self, f: &dyn Fn(usize, &Comm) -> nccl::Result<()>) {
        nccl::group_start();
        for (r, c) in self.comms.iter().enumerate() {
            f(r, c).unwrap_or_else(|e| panic!("rank {r}: {e}"));
        }
        nccl::group_end().unwrap();
        for (r, c) in self.comms.iter().enumerate() {
            c.device().stream_sync(self.streams[r]).unwrap();
        }
    }

    /// In-place AllGather: rank r's input is block r of its output.
    fn in_place_all_gather(&self) {
        let f32 = DataType::Float32;
        self.fill();
        self.run(&|r, c| {
            let p = self.whole[r].ptr();
            unsafe { c.all_gather_raw(p + (r * BLOCK) as u64, p, COUNT, f32, self.streams[r]) }
        });
        for b in &self.whole {
            let got = floats(b, 2 * COUNT);
            for (i, v) in got.iter().enumerate() {
                let (r, j) = (i / COUNT, i % COUNT);
                assert_eq!(
                    *v,
                    (r * 1000 + r * COUNT + j) as f32,
                    "allgather element {i}"
                );
            }
        }
    }

    /// In-place ReduceScatter: rank r's output is block r of its input.
    fn in_place_reduce_scatter(&self) {
        let f32 = DataType::Float32;
        self.fill();
        self.run(&|r, c| {
            let p = self.whole[r].ptr();
            unsafe {
                c.reduce_scatter_raw(
                    p,
                    p + (r * BLOCK) as u64,
                    COUNT,
                    f32,
                    ReduceOp::SUM,
                    self.streams[r],
                )
            }
        });
        for (r, b) in self.whole.iter().enumerate() {
            let got = floats(b, 2 * COUNT);
            for j in 0..COUNT {
                let i = r * COUNT + j;
                assert_eq!(
                    got[i],
                    (1000 + 2 * i) as f32,
                    "reducescatter rank {r} element {j}"
                );
            }
        }
    }

    /// Reduce to rank 0; rank 1's recv is 4 bytes (NCCL ignores it off the root).
    fn reduce_with_a_short_recv_off_the_root(&self) {
        let f32 = DataType::Float32;
        self.fill();
        self.run(&|r, c| {
            let recv = if r == 0 {
                self.whole[0].ptr()
            } else {
                self.tiny[1].ptr()
            };
            unsafe {
                c.reduce_raw(
                    self.whole[r].ptr(),
                    recv,
                    2 * COUNT,
                    f32,
                    ReduceOp::SUM,
                    0,
                    self.streams[r],
                )
            }
        });
        let got = floats(&self.whole[0], 2 * COUNT);
        for (i, v) in got.iter().enumerate() {
            assert_eq!(*v, (1000 + 2 * i) as f32, "reduce element {i}");
        }
    }

    /// Broadcast from rank 0; rank 1's send is 4 bytes (ignored off the root).
    fn broadcast_with_a_short_send_off_the_root(&self) {
        let f32 = DataType::Float32;
        self.fill();
        self.run(&|r, c| {
            let send = if r == 0 {
                self.whole[0].ptr()
            } else {
                self.tiny[1].ptr()
            };
            unsafe {
                c.broadcast_raw(
                    send,
                    self.whole[r].ptr(),
                    2 * COUNT,
                    f32,
                    0,
                    self.streams[r],
                )
            }
        });
        assert_eq!(
            floats(&self.whole[1], 2 * COUNT),
            floats(&self.whole[0], 2 * COUNT)
        );
    }

    fn destroy_streams(self) {
        for (r, c) in self.comms.iter().enumerate() {
            c.device().stream_destroy(self.streams[r]).unwrap();
        }
    }
}

/// The first `n` floats of `b`.
fn floats(b: &nccl::cuda::DevBuffer, n: usize) -> Vec<f32> {
    let mut out = vec![0u8; n * 4];
    b.read(0, &mut out).unwrap();
    out.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
