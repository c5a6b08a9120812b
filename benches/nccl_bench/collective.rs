//! The collectives the table measures: their sizes and bus-bandwidth factors, where their
//! buffers lie, how to launch them on either library and what they should produce.

use crate::baseline::{Nccl, NcclComm};
use crate::data::{encode, make_inputs, reduce_ref, CheckData, Expect, Seg, Src};
use crate::ranks::Rank;
use nccl::{DataType, DevPtr, RedOpKind};
use nccl_device::types::Elem;
use nccl_device::with_elem;
use std::ffi::c_int;

/// A collective the table can measure: its sizes, its bus-bandwidth factor, how to launch it on
/// either library and what it should produce. SendRecv is nccl-tests' `sendrecv`: every rank
/// sends its buffer to the next rank and receives the previous rank's, in one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    SendRecv,
}

impl Collective {
    /// The tuner's name for it (none for send/receive: no algorithm or protocol is chosen).
    pub fn tuned(self) -> Option<nccl::Coll> {
        Some(match self {
            Collective::AllReduce => nccl::Coll::AllReduce,
            Collective::Broadcast => nccl::Coll::Broadcast,
            Collective::Reduce => nccl::Coll::Reduce,
            Collective::AllGather => nccl::Coll::AllGather,
            Collective::ReduceScatter => nccl::Coll::ReduceScatter,
            Collective::SendRecv => return None,
        })
    }
}

/// The element counts of one test of a collective.
#[derive(Clone, Copy, Debug)]
pub struct Counts {
    /// The count argument of the call (per rank for AllGather and ReduceScatter).
    pub count: usize,
    /// Bytes the table reports as the size (algbw = size / time): as nccl-tests, the larger of
    /// a rank's input and output.
    pub size_bytes: usize,
}

impl Collective {
    pub const ALL: [Collective; 6] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "AllReduce",
            Collective::Broadcast => "Broadcast",
            Collective::Reduce => "Reduce",
            Collective::AllGather => "AllGather",
            Collective::ReduceScatter => "ReduceScatter",
            Collective::SendRecv => "SendRecv",
        }
    }

    /// The name nccl-tests gives its test (`all_gather` for `all_gather_perf`).
    pub fn test_name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// `all_gather`, `allgather`, `AllGather`, `all-gather`.
    pub fn parse(s: &str) -> Option<Collective> {
        let key = |t: &str| t.replace(['_', '-'], "").to_ascii_lowercase();
        let k = key(s);
        Collective::ALL
            .into_iter()
            .find(|c| key(c.test_name()) == k)
    }

    /// busbw = algbw * factor: what each link carries, comparable across rank counts.
    pub fn bus_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        }
    }

    pub fn has_op(self) -> bool {
        match self {
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter => true,
            Collective::Broadcast | Collective::AllGather | Collective::SendRecv => false,
        }
    }

    pub fn has_root(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }

    /// The root column: `root`, or -1 for rootless collectives.
    pub fn root_column(self, root: usize) -> i64 {
        if self.has_root() {
            root as i64
        } else {
            -1
        }
    }

    /// The counts for a test of `bytes` bytes of `dt` on `nranks` ranks.
    pub fn counts(self, bytes: usize, dt: DataType, nranks: usize) -> Counts {
        let elems = bytes / dt.size();
        match self {
            Collective::AllGather | Collective::ReduceScatter => {
                let count = elems / nranks;
                Counts {
                    count,
                    size_bytes: count * nranks * dt.size(),
                }
            }
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::SendRecv => Counts {
                count: elems,
                size_bytes: elems * dt.size(),
            },
        }
    }

    /// Bytes of a rank's (input, output) for a call of `count` elements of `size` bytes.
    pub fn io_bytes(self, count: usize, size: usize, nranks: usize) -> (usize, usize) {
        match self {
            Collective::AllGather => (count * size, nranks * count * size),
            Collective::ReduceScatter => (nranks * count * size, count * size),
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::SendRecv => (count * size, count * size),
        }
    }

    /// Bytes of (send, recv) buffers per rank for tests up to `max_bytes`: both hold the
    /// largest size, since in-place calls put input and output in the receive buffer.
    pub fn buffer_bytes(self, max_bytes: usize, _nranks: usize) -> (usize, usize) {
        (max_bytes, max_bytes)
    }

    /// (send, recv) pointers of `rank` for `call`. In place, both lie in the receive buffer
    /// where NCCL defines them: AllGather's input is block `rank` of its output,
    /// ReduceScatter's output is block `rank` of its input.
    pub fn pointers(self, rank: &Rank, call: &Call) -> (DevPtr, DevPtr) {
        if !call.in_place {
            return (rank.send.ptr(), rank.recv.ptr());
        }
        let base = rank.recv.ptr();
        let block = (rank.comm.rank() * call.counts.count * call.dt.size()) as DevPtr;
        match self {
            Collective::AllGather => (base + block, base),
            Collective::ReduceScatter => (base, base + block),
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (base, base),
            // Not measured in place (see `in_place_applies`).
            Collective::SendRecv => (rank.send.ptr(), rank.recv.ptr()),
        }
    }

    /// What `rank`'s output should hold after `call` on `nranks` ranks.
    pub fn expect(self, rank: usize, nranks: usize, call: &Call) -> Expect {
        let count = call.counts.count;
        let seg = |src, phase| Seg {
            src,
            phase,
            elems: count,
        };
        let (segs, defined) = match self {
            Collective::AllReduce => (vec![seg(Src::Reduced, 0)], true),
            Collective::Reduce => (vec![seg(Src::Reduced, 0)], rank == call.root),
            Collective::Broadcast => (vec![seg(Src::Input(call.root), 0)], true),
            Collective::AllGather => ((0..nranks).map(|r| seg(Src::Input(r), 0)).collect(), true),
            Collective::ReduceScatter => (vec![seg(Src::Reduced, rank * count)], true),
            Collective::SendRecv => (vec![seg(Src::Input((rank + nranks - 1) % nranks), 0)], true),
        };
        Expect { segs, defined }
    }

    /// Whether the in-place columns mean anything: a send/receive pair in one buffer would
    /// race (the previous rank's data may land before ours left), so it runs out of place only.
    pub fn in_place_applies(self) -> bool {
        self != Collective::SendRecv
    }

    /// The ranks a send/receive pair of `rank` goes to and comes from.
    fn ring_peers(rank: usize, nranks: usize) -> (usize, usize) {
        ((rank + 1) % nranks, (rank + nranks - 1) % nranks)
    }

    /// What an error of `call` on `rank` says about the call.
    fn describe(self, rank: &Rank, call: &Call) -> String {
        let mut s = format!(
            "{} (rank {}, {}",
            self.name(),
            rank.comm.rank(),
            call.dt.name()
        );
        if self.has_op() {
            s += &format!(" {}", call.op.name());
        }
        if self.has_root() {
            s += &format!(" root {}", call.root);
        }
        s += &format!(
            " count {}{})",
            call.counts.count,
            if call.in_place { " in-place" } else { "" }
        );
        s
    }

    pub fn launch_ours(self, rank: &Rank, call: &Call) -> Result<(), String> {
        let (send, recv) = self.pointers(rank, call);
        let (c, count, dt, stream) = (&rank.comm, call.counts.count, call.dt, rank.stream.handle());
        let op = crate::args::ours(call.op, dt);
        let r = match self {
            Collective::AllReduce => unsafe { c.all_reduce_raw(send, recv, count, dt, op, stream) },
            Collective::Broadcast => unsafe {
                c.broadcast_raw(send, recv, count, dt, call.root, stream)
            },
            Collective::Reduce => unsafe {
                c.reduce_raw(send, recv, count, dt, op, call.root, stream)
            },
            Collective::AllGather => unsafe { c.all_gather_raw(send, recv, count, dt, stream) },
            Collective::ReduceScatter => unsafe {
                c.reduce_scatter_raw(send, recv, count, dt, op, stream)
            },
            Collective::SendRecv => {
                let (to, from) = Collective::ring_peers(c.rank(), c.count());
                nccl::group_start();
                let sent = unsafe { c.send_raw(send, count, dt, to, stream) };
                let received = unsafe { c.recv_raw(recv, count, dt, from, stream) };
                let ended = nccl::group_end().map(|_| ());
                sent.and(received).and(ended)
            }
        };
        r.map_err(|e| format!("nccl-rs {}: {e}", self.describe(rank, call)))
    }

    pub fn launch_nccl(
        self,
        lib: &Nccl,
        comm: NcclComm,
        rank: &Rank,
        call: &Call,
    ) -> Result<(), String> {
        let (send, recv) = self.pointers(rank, call);
        let (count, dt, stream) = (call.counts.count, call.dt as c_int, rank.stream.handle());
        let op = || {
            crate::args::nccl_op(call.op)
                .ok_or_else(|| format!("NVIDIA NCCL has no built-in {}", call.op.name()))
        };
        let root = call.root as c_int;
        match self {
            Collective::AllReduce => lib.all_reduce(send, recv, count, dt, op()?, comm, stream),
            Collective::Broadcast => lib.broadcast(send, recv, count, dt, root, comm, stream),
            Collective::Reduce => lib.reduce(send, recv, count, dt, op()?, root, comm, stream),
            Collective::AllGather => lib.all_gather(send, recv, count, dt, comm, stream),
            Collective::ReduceScatter => {
                lib.reduce_scatter(send, recv, count, dt, op()?, comm, stream)
            }
            Collective::SendRecv => {
                let (to, from) = Collective::ring_peers(rank.comm.rank(), rank.comm.count());
                lib.group_start()?;
                let sent = lib.p2p(
                    lib.send,
                    "ncclSend",
                    send,
                    count,
                    dt,
                    to as c_int,
                    comm,
                    stream,
                );
                let received = lib.p2p(
                    lib.recv,
                    "ncclRecv",
                    recv,
                    count,
                    dt,
                    from as c_int,
                    comm,
                    stream,
                );
                let ended = lib.group_end();
                sent.and(received).and(ended)
            }
        }
        .map_err(|e| format!("{e} ({})", self.describe(rank, call)))
    }

    /// Host data for a check of `call` on `nranks` ranks: every rank's input and their
    /// reduction (cheap: one period), whatever the collective.
    pub fn check_data(self, call: &Call, nranks: usize, seed: u64) -> CheckData {
        fn build<T: Elem>(call: &Call, nranks: usize, seed: u64) -> CheckData {
            let inputs: Vec<Vec<T>> = (0..nranks)
                .map(|r| make_inputs::<T>(call.op, seed, r))
                .collect();
            let (reduced, tol) = reduce_ref(&inputs, call.op, call.dt);
            CheckData {
                dt: call.dt,
                inputs: inputs.iter().map(|v| encode(v)).collect(),
                reduced: encode(&reduced),
                tol,
            }
        }
        with_elem!(call.dt, T => build::<T>(call, nranks, seed))
    }
}

/// One call of the table: collective, type, op, counts, placement.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub coll: Collective,
    pub dt: DataType,
    pub op: RedOpKind,
    pub counts: Counts,
    /// Root rank (Broadcast and Reduce; ignored by the others).
    pub root: usize,
    pub in_place: bool,
}
