//! Registered buffers on the simulator: a send/recv between registered buffers of ranks that
//! share an address space skips the FIFO (each connection's counters advance one step per
//! message instead of one per slot), and gives the same bytes as the FIFO path; a rank that
//! did not register makes its peer fall back to copies, whichever side it is.

mod common;

use common::register::{check_steps, expected_steps, ring_bytes, ring_round, Who};
use nccl::{Backend, Comm};

/// FIFO slots of 4 KiB and 2 connections per peer: a part of 32 KiB or more (a message of 64 KiB
/// or more) fills its connection's FIFO, so it takes the handshake.
const SLOT: usize = 4096;
const CONNS: usize = 2;
const FIFO: usize = 8 * SLOT;

fn sim_comms(n: usize, extra: &[(&str, &str)]) -> Vec<Comm> {
    // Every test of this file sets the same values (the environment is the process's).
    std::env::set_var("NCCL_P2P_NVL_CHUNKSIZE", SLOT.to_string());
    std::env::set_var("NCCL_RS_SIM_P2P_CONNS", CONNS.to_string());
    for (k, v) in extra {
        std::env::set_var(k, v);
    }
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).expect("init_all on the simulator")
}

#[test]
fn registered_send_recv_skips_the_fifo_and_mixed_falls_back() {
    for n in [2usize, 3, 4, 8] {
        let comms = sim_comms(n, &[]);
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
}

#[test]
fn small_registered_messages_take_the_fifo() {
    let comms = sim_comms(2, &[]);
    // Both ranks' messages stay under two FIFOs (one per connection).
    for bytes in [1usize, 1000, 2 * FIFO - 400] {
        for (r, &s) in ring_round(&comms, Who::All, bytes, 3).iter().enumerate() {
            let want = expected_steps(ring_bytes(r, bytes), CONNS, SLOT, false);
            assert_eq!(s, want, "{bytes} bytes, rank {r}");
        }
    }
}

/// Ranks as processes: a registered buffer reaches its peers as a record (an IPC handle of its
/// allocation), which the sender maps before a launch; an offer whose record has not been
/// mapped yet is declined (the FIFO carries the message), so the first rounds after
/// registering may copy. Every round's bytes are checked; messages with an unregistered end
/// never go direct, and all-registered ones do once the records are in.
#[test]
fn registered_send_recv_across_processes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
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
            "registered_send_recv_across_processes",
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
fn captured_send_recv_go_direct_without_registration() {
    let comms = sim_comms(3, &[]);
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
}

/// Registered buffers of CUDA's virtual memory API (`ncclMemAlloc`), ranks as processes: such
/// memory has no IPC handle (the simulator refuses one, as `cuIpcGetMemHandle` does), so its
/// record carries a ticket for the allocation's descriptor, which the peer takes (over the
/// owner's Unix socket) and maps. Send/recv into the successor's registered VMM buffer and a
/// ring AllReduce (Simple) into registered VMM outputs then go direct once the records are in:
/// the last of several rounds on buffers registered once counts direct steps, and this
/// process mapped a peer's VMM allocation. With `NCCL_RS_VMM_IPC=0` the same calls copy
/// through the FIFOs (no direct step, nothing mapped). Random data, poisoned outputs and the
/// bytes after them checked, in every round of both runs.
#[test]
fn registered_vmm_buffers_across_processes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let c = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        let on = std::env::var("NCCL_RS_VMM_IPC").as_deref() != Ok("0");
        nccl::init_logging(); // NCCL_DEBUG for the rank processes
        common::register::vmm_rounds(&c, 3 * FIFO, 20_001, on);
        // Mapped or declined, nothing was an error (ncclGetLastError stays empty).
        assert_eq!(nccl::error::last_error(), "", "rank {rank}");
        let imports = nccl::cuda::sim::vmm_imports();
        if on {
            assert!(imports > 0, "rank {rank}: no peer VMM allocation mapped");
        } else {
            assert_eq!(
                imports, 0,
                "rank {rank}: mapped a VMM allocation with the path off"
            );
        }
        return;
    }
    for on in ["1", "0"] {
        common::procs::run(
            "registered_vmm_buffers_across_processes",
            2,
            &[
                ("NCCL_P2P_NVL_CHUNKSIZE", "4096"),
                ("NCCL_RS_SIM_P2P_CONNS", "2"),
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", "Ring"),
                ("NCCL_LOCAL_REGISTER", "1"),
                ("NCCL_RS_VMM_IPC", on),
            ],
        );
    }
}
