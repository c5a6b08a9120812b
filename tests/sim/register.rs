//! Registered buffers on the simulator: a send/recv between registered buffers of ranks that
//! share an address space skips the FIFO (each connection's counters advance one step per
//! message instead of one per slot), and gives the same bytes as the FIFO path; a rank that
//! did not register makes its peer fall back to copies, whichever side it is. (Registered
//! buffers of CUDA's virtual memory API are `register_vmm`'s.)

use crate::common::register::{check_steps, expected_steps, ring_bytes, ring_round, Who};
use crate::common::{self, procs};
use nccl::Comm;

/// FIFO slots of 4 KiB and 2 connections per peer: a part of 32 KiB or more (a message of 64 KiB
/// or more) fills its connection's FIFO, so it takes the handshake.
const SLOT: usize = 4096;
pub(crate) const CONNS: usize = 2;
pub(crate) const FIFO: usize = 8 * SLOT;

/// The FIFO's geometry above, for the child processes every test here runs in.
const FIFO_ENV: [(&str, &str); 2] = [
    ("NCCL_P2P_NVL_CHUNKSIZE", "4096"),
    ("NCCL_RS_SIM_P2P_CONNS", "2"),
];

/// A rank of a child process of [`procs::run`].
pub(crate) fn child_comm() -> Option<Comm> {
    let (rank, nranks, id) = procs::child()?;
    Some(
        Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init_rank in a child"),
    )
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn registered_send_recv_skips_the_fifo_and_mixed_falls_back() {
    procs::isolated(&FIFO_ENV, &[], || {
        for n in [2usize, 3, 4, 8] {
            let comms = common::sim_comms(n);
            // First round makes the connections, whichever path.
            ring_round(&comms, Who::None, 2 * FIFO, 1);
            for (round, who) in [Who::All, Who::None, Who::Even, Who::All]
                .into_iter()
                .enumerate()
            {
                let base = 3 * FIFO + 1000 * round;
                let steps = ring_round(&comms, who, base, 7 + round as u64);
                check_steps(&comms, who, base, &steps);
                if who == Who::All {
                    // Every part went direct: one step per connection.
                    assert!(steps.iter().all(|&s| s == CONNS as u64), "{steps:?}");
                }
            }
        }
    });
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn small_registered_messages_take_the_fifo() {
    procs::isolated(&FIFO_ENV, &[], || {
        let comms = common::sim_comms(2);
        // Both ranks' messages stay under two FIFOs (one per connection).
        for bytes in [1usize, 1000, 2 * FIFO - 400] {
            for (r, &s) in ring_round(&comms, Who::All, bytes, 3).iter().enumerate() {
                let want = expected_steps(ring_bytes(r, bytes), CONNS, SLOT, false);
                assert_eq!(s, want, "{bytes} bytes, rank {r}");
            }
        }
    });
}

/// Ranks as processes: a registered buffer reaches its peers as a record (an IPC handle of its
/// allocation), which the sender maps before a launch; an offer whose record has not been
/// mapped yet is declined (the FIFO carries the message), so the first rounds after
/// registering may copy. Every round's bytes are checked; messages with an unregistered end
/// never go direct, and all-registered ones do once the records are in.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn registered_send_recv_across_processes() {
    if let Some(comm) = child_comm() {
        let rank = comm.rank();
        let comms = vec![comm];
        ring_round(&comms, Who::None, 2 * FIFO, 1);
        for (k, who) in [Who::Even, Who::None].into_iter().enumerate() {
            let base = 3 * FIFO + 1000 * k;
            let steps = ring_round(&comms, who, base, 5 + k as u64);
            check_steps(&comms, who, base, &steps);
        }
        // The same buffers registered across rounds: records go out once, before this rank's
        // first launch of them, so the peers have them mapped for later rounds (every round
        // needs every rank's launch). All ranks run the same rounds; the last must be direct.
        let mut last = [0u64; 2];
        for k in 0..6 {
            let base = 3 * FIFO + 64 * k;
            last = ring_round_registered_once(&comms, base, 40 + k as u64);
        }
        let base = 3 * FIFO + 64 * 5;
        let want = expected_steps(ring_bytes(rank, base), last[1] as usize, SLOT, true);
        assert_eq!(
            last[0], want,
            "rank {rank}: registered messages did not go direct"
        );
        return;
    }
    for n in [2usize, 4] {
        common::procs::run(
            n,
            &[
                ("NCCL_P2P_NVL_CHUNKSIZE", "4096"),
                ("NCCL_RS_SIM_P2P_CONNS", "2"),
            ],
        );
    }
}

/// A round with buffers registered once for the whole process (kept registered between
/// rounds, so the peers' records are in after the first): returns [steps of this rank's sends,
/// its connections].
fn ring_round_registered_once(comms: &[Comm], base: usize, seed: u64) -> [u64; 2] {
    use std::sync::OnceLock;
    static BUFS: OnceLock<(nccl::DevBuffer, nccl::DevBuffer)> = OnceLock::new();
    let c = &comms[0];
    let (n, r) = (c.count(), c.rank());
    let room = 4 * FIFO + 64 * 64 + 4096;
    let (s, rb) = BUFS.get_or_init(|| {
        let s = c.device().alloc(room).unwrap();
        let rb = c.device().alloc(room).unwrap();
        // SAFETY: the buffers live (in the static) as long as the process.
        unsafe {
            c.register_raw(s.ptr(), room).unwrap();
            c.register_raw(rb.ptr(), room).unwrap();
        }
        (s, rb)
    });
    let prev = (r + n - 1) % n;
    let mut rng = common::Rng::new(seed * 1000 + r as u64);
    let mine: Vec<u8> = (0..ring_bytes(r, base)).map(|_| rng.next() as u8).collect();
    s.write(0, &mine).unwrap();
    let len = ring_bytes(prev, base);
    rb.write(0, &vec![0x5A; len]).unwrap();
    let stream = c.device().stream_create().unwrap();
    let before = common::register::send_steps(c);
    nccl::group_start();
    // SAFETY: both buffers hold `room` bytes, more than either message.
    unsafe {
        c.send_raw(
            s.ptr(),
            mine.len(),
            nccl::DataType::Uint8,
            (r + 1) % n,
            stream,
        )
        .unwrap();
        c.recv_raw(rb.ptr(), len, nccl::DataType::Uint8, prev, stream)
            .unwrap();
    }
    nccl::group_end().unwrap();
    c.device().stream_sync(stream).unwrap();
    c.device().stream_destroy(stream).unwrap();
    let mut rng = common::Rng::new(seed * 1000 + prev as u64);
    let want: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    let mut got = vec![0u8; len];
    rb.read(0, &mut got).unwrap();
    assert!(got == want, "rank {r}: wrong bytes from rank {prev}");
    let conns = c
        .p2p_steps((r + 1) % n, true)
        .unwrap()
        .map_or(1, |v| v.len());
    [common::register::send_steps(c) - before, conns as u64]
}

/// Graph registration: send/recv captured in a CUDA graph count as registered (NCCL_GRAPH_REGISTER,
/// on by default), so between ranks of one process every replay goes direct, on buffers nobody
/// registered; new bytes written before each replay arrive whole.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn captured_send_recv_go_direct_without_registration() {
    procs::isolated(&FIFO_ENV, &[], || {
        let comms = common::sim_comms(3);
        let n = comms.len();
        let base = 3 * FIFO;
        let streams: Vec<_> = comms
            .iter()
            .map(|c| c.device().stream_create().unwrap())
            .collect();
        let sends: Vec<_> = (0..n)
            .map(|r| comms[r].device().alloc(ring_bytes(r, base)).unwrap())
            .collect();
        let recvs: Vec<_> = (0..n)
            .map(|r| {
                comms[r]
                    .device()
                    .alloc(ring_bytes((r + n - 1) % n, base))
                    .unwrap()
            })
            .collect();
        // Connections first (outside any capture).
        ring_round(&comms, Who::None, base, 1);
        for (c, s) in comms.iter().zip(&streams) {
            c.device().capture_begin(*s).unwrap();
        }
        let lent = common::lend(&comms);
        nccl::group_start();
        for (r, c) in lent.iter().enumerate() {
            let prev = (r + n - 1) % n;
            // SAFETY: the buffers hold these counts and outlive the graphs' replays.
            unsafe {
                c.send_raw(
                    sends[r].ptr(),
                    ring_bytes(r, base),
                    nccl::DataType::Uint8,
                    (r + 1) % n,
                    streams[r],
                )
                .unwrap();
                c.recv_raw(
                    recvs[r].ptr(),
                    ring_bytes(prev, base),
                    nccl::DataType::Uint8,
                    prev,
                    streams[r],
                )
                .unwrap();
            }
        }
        nccl::group_end().unwrap();
        let graphs: Vec<_> = comms
            .iter()
            .zip(&streams)
            .map(|(c, s)| c.device().capture_end(*s).unwrap())
            .collect();
        for replay in 0..3u64 {
            let data: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    let mut rng = common::Rng::new(100 * replay + r as u64);
                    (0..ring_bytes(r, base)).map(|_| rng.next() as u8).collect()
                })
                .collect();
            for r in 0..n {
                sends[r].write(0, &data[r]).unwrap();
                recvs[r].write(0, &vec![0xA5; recvs[r].bytes()]).unwrap();
            }
            let before: Vec<u64> = comms.iter().map(common::register::send_steps).collect();
            for (g, s) in graphs.iter().zip(&streams) {
                g.launch(*s).unwrap();
            }
            for (r, c) in comms.iter().enumerate() {
                c.device().stream_sync(streams[r]).unwrap();
                let prev = (r + n - 1) % n;
                let mut got = vec![0u8; recvs[r].bytes()];
                recvs[r].read(0, &mut got).unwrap();
                assert!(
                    got == data[prev],
                    "replay {replay}: rank {r}'s bytes from rank {prev}"
                );
                let steps = common::register::send_steps(c) - before[r];
                assert_eq!(
                    steps, CONNS as u64,
                    "replay {replay}: rank {r}'s send was not direct"
                );
            }
        }
        drop(graphs);
        for (c, s) in comms.iter().zip(streams) {
            c.device().stream_destroy(s).unwrap();
        }
    });
}

/// Graph registration with ranks as processes: a captured receive registers its buffer and
/// tells the sender, whose capture waits for that (the marks of comm/graph_reg.rs), so every
/// replay of the graph sends straight into the peer's buffer, which nobody registered; once
/// the graphs are destroyed the next call withdraws the registration and messages copy again.
/// Random bytes, a poisoned receive buffer and its tail checked in every replay and round.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn captured_send_recv_go_direct_across_processes_until_the_graph_is_gone() {
    if let Some(c) = child_comm() {
        common::register::captured_p2p_rounds(&c, 3 * FIFO, CONNS, SLOT);
        return;
    }
    for n in [2usize, 3] {
        common::procs::run(
            n,
            &[
                ("NCCL_P2P_NVL_CHUNKSIZE", "4096"),
                ("NCCL_RS_SIM_P2P_CONNS", "2"),
                ("NCCL_GRAPH_REGISTER", "1"),
            ],
        );
    }
}

/// What a peer's withdrawn mapping waits for before it is undone (`Comm::launch_fence`): a
/// fence made while a kernel waits for its peer does not pass until that kernel has ended.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn a_launch_fence_waits_for_the_kernels_launched_before() {
    use nccl::DataType;
    use std::time::Duration;
    procs::isolated(&FIFO_ENV, &[], || {
        let comms = common::sim_comms(2);
        assert!(
            comms[0].launch_fence().unwrap().is_none(),
            "nothing launched, nothing to wait for"
        );
        const BYTES: usize = 4096;
        let bufs: Vec<_> = comms
            .iter()
            .map(|c| c.device().alloc(2 * BYTES).unwrap())
            .collect();
        let streams: Vec<_> = comms
            .iter()
            .map(|c| c.device().stream_create().unwrap())
            .collect();
        let sync = || {
            for (c, s) in comms.iter().zip(&streams) {
                c.device().stream_sync(*s).unwrap();
            }
        };
        // Both ways once, in one group, so the connections are made.
        nccl::group_start();
        for (r, c) in comms.iter().enumerate() {
            let (p, b) = (1 - r, bufs[r].ptr());
            // SAFETY: each buffer holds 2 * BYTES; synchronized below.
            unsafe {
                c.send_raw(b, BYTES, DataType::Uint8, p, streams[r])
                    .unwrap();
                c.recv_raw(b + BYTES as u64, BYTES, DataType::Uint8, p, streams[r])
                    .unwrap();
            }
        }
        nccl::group_end().unwrap();
        sync();
        // Rank 0's receive waits for a message rank 1 has not sent.
        // SAFETY: as above.
        unsafe {
            comms[0]
                .recv_raw(bufs[0].ptr(), BYTES, DataType::Uint8, 1, streams[0])
                .unwrap();
        }
        let fence = comms[0].launch_fence().unwrap().expect("a launch to fence");
        // A window for a wrong pass to show (no synchronisation: nothing waits on it).
        std::thread::sleep(Duration::from_millis(200));
        // Asked now, asserted once the receive can end (a failed assertion must not leave the
        // kernel waiting for the communicators' drop).
        let early = fence.passed();
        // SAFETY: as above.
        unsafe {
            comms[1]
                .send_raw(bufs[1].ptr(), BYTES, DataType::Uint8, 0, streams[1])
                .unwrap();
        }
        sync();
        assert!(!early, "passed while the receive still waited");
        // The fence's own stream follows the kernel's end: a bound that only turns a hang into
        // a failure, not a timing.
        procs::wait_until("the fence passes", procs::limit(), || fence.passed());
        for (c, s) in comms.iter().zip(&streams) {
            c.device().stream_destroy(*s).unwrap();
        }
    });
}
