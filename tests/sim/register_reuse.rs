//! A registered buffer freed and replaced by another allocation at the same address, with ranks
//! as processes: the peer that mapped the old allocation must not write into it when the new
//! buffer is offered before the peer has heard of the change (its records travel apart from the
//! kernels' handshake). The offer names its allocation, so the stale mapping is declined and
//! the data takes the FIFO.

use crate::common::{self, procs};
use nccl::{Comm, DataType, ReduceOp};

/// Which zero-copy path carries rank 1's bytes into rank 0's registered output.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// An AllGather: rank 1's block, from its ring position.
    Ring,
    /// Rank 1 sends its block to rank 0.
    P2p,
}

/// Rank 1 writes its bytes straight into rank 0's registered output once it mapped it (an
/// AllGather's block, or a send). Rank 1 launches the next round (and so drains rank 0's
/// records) before rank 0 replaces its output by a new allocation at the same address and
/// registers that one: rank 1's table still maps the old allocation there, and the offer of
/// the new one must be declined. Checked, on both paths: every result, that the first output
/// went direct, that the replaced one did not, and that it goes direct once rank 1 has its
/// record.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_all_reduce_int32_max",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_gather, nccl_all_reduce_int32_max, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn a_buffer_at_a_reused_address_is_not_written_through_the_old_mapping() {
    let Some((rank, nranks, id)) = procs::child() else {
        procs::run(
            2,
            &[
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", "Ring"),
                ("NCCL_LOCAL_REGISTER", "1"),
                ("NCCL_RS_REGISTERED_CTAS", "0"),
            ],
        );
        return;
    };
    let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init_rank");
    // The host's side channel: its collectives order the two processes' steps.
    let side = comm
        .split(0, rank as i32, None)
        .unwrap()
        .expect("side comm");
    for path in [Path::Ring, Path::P2p] {
        replaced_output_is_declined(&comm, &side, path);
    }
}

fn replaced_output_is_declined(comm: &Comm, side: &Comm, path: Path) {
    let rank = comm.rank();
    let bytes = COUNT * comm.count();
    let inp = comm.device().alloc(COUNT).unwrap();
    let mut out = comm.device().alloc(bytes).unwrap();
    // SAFETY: deregistered below before the buffers are freed. (A send goes direct only
    // from a registered buffer.)
    let inp_handle = unsafe { comm.register_raw(inp.ptr(), COUNT).unwrap() };
    let mut handle = unsafe { comm.register_raw(out.ptr(), bytes).unwrap() };
    let mut seed = 1;
    // Rounds until rank 1 mapped rank 0's output (its record drained before a launch).
    until_direct(comm, side, path, &inp, &out, &mut seed);

    let stream = comm.device().stream_create().unwrap();
    let before = writes(comm, path);
    if rank == 1 {
        // Launched (its records drained) before rank 0 replaces its output.
        let want = launch(comm, path, &inp, &out, seed, stream);
        side_barrier(side);
        comm.device().stream_sync(stream).unwrap();
        check(
            &out,
            &want,
            rank,
            path,
            "the round after rank 0 replaced its output",
        );
    } else {
        side_barrier(side);
        let old = out.ptr();
        comm.deregister(handle).unwrap();
        drop(out);
        // The next allocation of the size at the old address (mappings of equal size fill
        // the freed hole once any higher hole that fits is taken).
        let mut misses = Vec::new();
        out = loop {
            let b = comm.device().alloc(bytes).unwrap();
            if b.ptr() == old {
                break b;
            }
            assert!(misses.len() < 256, "no allocation came back at {old:#x}");
            misses.push(b);
        };
        drop(misses);
        // SAFETY: deregistered below before `out` is freed.
        handle = unsafe { comm.register_raw(out.ptr(), bytes).unwrap() };
        let want = launch(comm, path, &inp, &out, seed, stream);
        comm.device().stream_sync(stream).unwrap();
        check(&out, &want, rank, path, "the replaced output");
    }
    assert!(
        !went_direct(comm, path, before),
        "{path:?}: rank 1 wrote into the replaced output as if it were the old one"
    );
    seed += 1;
    // Rank 1 maps the new allocation once its record is in, and writes into it again.
    until_direct(comm, side, path, &inp, &out, &mut seed);
    comm.deregister(handle).unwrap();
    comm.deregister(inp_handle).unwrap();
    comm.device().stream_destroy(stream).unwrap();
}

/// Bytes per rank: an AllGather's 16 KiB steps, several per channel.
const COUNT: usize = 70_001;

/// Rounds into `out` until one went direct (both ranks learn it over `side`), each result
/// checked; at most 100.
fn until_direct(
    comm: &Comm,
    side: &Comm,
    path: Path,
    inp: &nccl::DevBuffer,
    out: &nccl::DevBuffer,
    seed: &mut u64,
) {
    let stream = comm.device().stream_create().unwrap();
    for _ in 0..100 {
        let before = writes(comm, path);
        let want = launch(comm, path, inp, out, *seed, stream);
        comm.device().stream_sync(stream).unwrap();
        check(out, &want, comm.rank(), path, "a registered round");
        *seed += 1;
        let direct = went_direct(comm, path, before);
        if side_max(side, direct as i32) == 1 {
            comm.device().stream_destroy(stream).unwrap();
            return;
        }
    }
    panic!("{path:?}: rank 1 never wrote into rank 0's registered output");
}

/// What tells whether rank 1 wrote into rank 0's output: on the ring, the direct steps rank 0
/// counts; on the p2p path, the steps of rank 1's send (one per part when it goes direct).
fn writes(comm: &Comm, path: Path) -> u64 {
    match (path, comm.rank()) {
        (Path::Ring, 0) => comm.ring_direct_steps().unwrap().iter().sum(),
        (Path::P2p, 1) => common::register::send_steps(comm),
        _ => 0,
    }
}

/// Whether rank 1 wrote into rank 0's output since [`writes`] said `before` (false on the rank
/// that cannot tell).
fn went_direct(comm: &Comm, path: Path, before: u64) -> bool {
    let now = writes(comm, path);
    match (path, comm.rank()) {
        (Path::Ring, 0) => now > before,
        (Path::P2p, 1) => {
            let conns = comm.p2p_steps(0, true).unwrap().map_or(1, |v| v.len());
            let slot = comm.shape().p2p_slot_bytes as usize;
            now - before < common::register::expected_steps(COUNT, conns, slot, false)
        }
        _ => false,
    }
}

/// Writes this round's input and poisons `out`, launches the round on `stream` and returns
/// what `out` must then hold.
fn launch(
    comm: &Comm,
    path: Path,
    inp: &nccl::DevBuffer,
    out: &nccl::DevBuffer,
    seed: u64,
    stream: nccl::StreamHandle,
) -> Vec<u8> {
    use common::register::ag_block;
    let (n, r) = (comm.count(), comm.rank());
    inp.write(0, &ag_block(r, COUNT, seed)).unwrap();
    let mut want = vec![0xA5; n * COUNT];
    out.write(0, &want).unwrap();
    // SAFETY: both buffers hold what the calls need and outlive their stream's sync.
    unsafe {
        match path {
            Path::Ring => {
                comm.all_gather_raw(inp.ptr(), out.ptr(), COUNT, DataType::Uint8, stream)
                    .unwrap();
                want = (0..n).flat_map(|r| ag_block(r, COUNT, seed)).collect();
            }
            Path::P2p if r == 1 => comm
                .send_raw(inp.ptr(), COUNT, DataType::Uint8, 0, stream)
                .unwrap(),
            Path::P2p => {
                comm.recv_raw(out.ptr(), COUNT, DataType::Uint8, 1, stream)
                    .unwrap();
                want[..COUNT].copy_from_slice(&ag_block(1, COUNT, seed));
            }
        }
    }
    want
}

fn check(out: &nccl::DevBuffer, want: &[u8], rank: usize, path: Path, what: &str) {
    let mut got = vec![0u8; want.len()];
    out.read(0, &mut got).unwrap();
    let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
    assert!(
        wrong == 0,
        "{path:?}, rank {rank}: {what}: {wrong} of {} bytes wrong",
        want.len()
    );
}

/// The maximum of every rank's `v`, over the side communicator (blocking).
fn side_max(side: &Comm, v: i32) -> i32 {
    let buf = side.device().alloc(4).unwrap();
    buf.write(0, &v.to_le_bytes()).unwrap();
    let stream = side.device().stream_create().unwrap();
    // SAFETY: the buffer holds one int32 and outlives the sync.
    unsafe {
        side.all_reduce_raw(
            buf.ptr(),
            buf.ptr(),
            1,
            DataType::Int32,
            ReduceOp::MAX,
            stream,
        )
        .unwrap()
    };
    side.device().stream_sync(stream).unwrap();
    side.device().stream_destroy(stream).unwrap();
    let mut b = [0u8; 4];
    buf.read(0, &mut b).unwrap();
    i32::from_le_bytes(b)
}

/// Returns once every rank got here.
fn side_barrier(side: &Comm) {
    side_max(side, 0);
}
