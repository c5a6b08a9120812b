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

/// The env of the process tests of registered VMM buffers below.
const VMM_ENV: [(&str, &str); 5] = [
    ("NCCL_P2P_NVL_CHUNKSIZE", "4096"),
    ("NCCL_RS_SIM_P2P_CONNS", "2"),
    ("NCCL_PROTO", "Simple"),
    ("NCCL_ALGO", "Ring"),
    ("NCCL_LOCAL_REGISTER", "1"),
];

/// One send to the successor and receive from the predecessor (ranks as processes, one
/// communicator here): `len(from)` random bytes (seeded by round and sender) from `send` into
/// `recv`, whose 512 bytes after the message are poisoned and must stay. Returns this rank's
/// send steps.
fn p2p_round(c: &Comm, send: u64, recv: u64, len: &dyn Fn(usize) -> usize, seed: u64) -> u64 {
    let (n, r) = (c.count(), c.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let dev = c.device();
    let data = |from: usize| -> Vec<u8> {
        let mut rng = common::Rng::new(seed * 1000 + from as u64);
        (0..len(from)).map(|_| rng.next() as u8).collect()
    };
    let mine = data(r);
    let want = data(prev);
    // SAFETY: both addresses are simulated device memory of the callers' buffers, which hold
    // the message (and the poisoned tail).
    unsafe {
        dev.copy_htod_raw(send, &mine).unwrap();
        dev.copy_htod_raw(recv, &vec![0x5A; want.len() + 512])
            .unwrap();
    }
    let stream = dev.stream_create().unwrap();
    let before = common::register::send_steps(c);
    nccl::group_start();
    // SAFETY: as above.
    unsafe {
        c.send_raw(send, mine.len(), nccl::DataType::Uint8, next, stream)
            .unwrap();
        c.recv_raw(recv, want.len(), nccl::DataType::Uint8, prev, stream)
            .unwrap();
    }
    nccl::group_end().unwrap();
    dev.stream_sync(stream).unwrap();
    dev.stream_destroy(stream).unwrap();
    let steps = common::register::send_steps(c) - before;
    let mut got = vec![0u8; want.len() + 512];
    // SAFETY: as above.
    unsafe { dev.copy_dtoh_raw(&mut got, recv).unwrap() };
    assert!(
        got[..want.len()] == want[..],
        "rank {r}, seed {seed}: wrong bytes from rank {prev}"
    );
    assert!(
        got[want.len()..].iter().all(|&b| b == 0x5A),
        "rank {r}, seed {seed}: bytes written past the message"
    );
    steps
}

/// Whether process `pid` has exited (gone, or a zombie its parent has not reaped yet).
fn exited(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
    }
}

/// Every rank's pid, by rank (an AllReduce of each rank's pid in its own slot).
fn rank_pids(c: &Comm) -> Vec<u64> {
    let (n, r) = (c.count(), c.rank());
    let dev = c.device();
    let mut mine = vec![0u64; n];
    mine[r] = std::process::id() as u64;
    let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    let b = dev.alloc(bytes.len()).unwrap();
    b.write(0, &bytes).unwrap();
    let stream = dev.stream_create().unwrap();
    // SAFETY: in place on a buffer of `n` 8-byte elements.
    unsafe {
        c.all_reduce_raw(
            b.ptr(),
            b.ptr(),
            n,
            nccl::DataType::Uint64,
            nccl::ReduceOp::Sum,
            stream,
        )
        .unwrap();
    }
    dev.stream_sync(stream).unwrap();
    dev.stream_destroy(stream).unwrap();
    let mut got = vec![0u8; bytes.len()];
    b.read(0, &mut got).unwrap();
    got.chunks(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

/// A rank that deregisters its VMM buffers after its peer's process exited finishes at once:
/// the withdrawals to the gone peer are skipped (the bootstrap knows it left, or its listener
/// refuses), not retried for a minute; registering and deregistering again also finishes.
/// Before the fix the
/// withdrawals waited out ~56 s of connect retries: the bound below (30 s, generous) is a
/// hang guard, not a speed test.
#[test]
fn withdrawals_to_an_exited_peer_finish_at_once() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let c = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        let room = 4 * FIFO + 1024;
        let bufs: Vec<nccl::DevBuffer> = (0..3)
            .map(|_| c.device().alloc_vmm(room).expect("alloc_vmm"))
            .collect();
        // SAFETY: the buffers outlive their registrations.
        let regs: Vec<_> = bufs
            .iter()
            .map(|b| unsafe { c.register_raw(b.ptr(), room) }.expect("register"))
            .collect();
        // Records out and mapped (the rounds' launches drain them).
        for k in 0..3 {
            p2p_round(&c, bufs[0].ptr(), bufs[1].ptr(), &|_| 3 * FIFO, 50 + k);
        }
        let pids = rank_pids(&c);
        if rank == 1 {
            // Gone with its registrations in place, its communicator destroyed.
            drop(c);
            return;
        }
        let peer = pids[1];
        let t0 = std::time::Instant::now();
        while !exited(peer) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(120),
                "rank 1 (pid {peer}) did not exit"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let t0 = std::time::Instant::now();
        for h in regs {
            c.deregister(h).expect("deregister with the peer gone");
        }
        // SAFETY: the buffer outlives its registration.
        let h = unsafe { c.register_raw(bufs[2].ptr(), room) }.expect("register again");
        c.deregister(h).expect("deregister again");
        let took = t0.elapsed();
        assert!(
            took < std::time::Duration::from_secs(30),
            "withdrawals to an exited peer took {took:?}"
        );
        drop(bufs);
        drop(c);
        return;
    }
    common::procs::run("withdrawals_to_an_exited_peer_finish_at_once", 2, &VMM_ENV);
}

/// A registered receive buffer over two VMM allocations side by side (one address range
/// mapped from two physical allocations): it goes to the peer as one record per allocation,
/// each mapped apart, so a message inside the first allocation and one inside the second both
/// go direct (before, only the part in the first allocation was exported and the second
/// message took the FIFO); a message straddling the two takes the FIFO for the part that
/// straddles (no one mapping of the peer's holds it), and every message's bytes are right,
/// with a poisoned tail that stays. An AllReduce into an output straddling the two is right.
#[test]
fn registered_vmm_buffer_over_adjacent_allocations() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let c = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        const PIECE: usize = nccl::cuda::sim::SIM_VMM_GRANULARITY;
        let pieces = c
            .device()
            .alloc_vmm_adjacent(&[PIECE, PIECE])
            .expect("adjacent VMM allocations");
        assert_eq!(pieces[1].ptr(), pieces[0].ptr() + PIECE as u64);
        let send = c.device().alloc_vmm(PIECE).expect("alloc_vmm");
        // The receive buffer: the second half of the first allocation and the first half of
        // the second.
        let boundary = pieces[1].ptr();
        let rb = boundary - (PIECE / 2) as u64;
        // SAFETY: the buffers outlive their registrations (deregistered below).
        let regs = unsafe {
            [
                c.register_raw(send.ptr(), PIECE)
                    .expect("register the send buffer"),
                c.register_raw(rb, PIECE)
                    .expect("register across two allocations"),
            ]
        };
        let msg = 256 << 10;
        let conns = CONNS;
        // (where in the receive buffer, whether every part must go direct)
        let cases = [
            (rb, true),
            (boundary + (64 << 10), true),
            (boundary - (64 << 10), false),
        ];
        for (k, &(at, direct)) in cases.iter().enumerate() {
            let mut steps = 0;
            // Records come in before a launch: the last of a few rounds counts.
            for round in 0..3 {
                let seed = 900 + 10 * k as u64 + round;
                steps = p2p_round(&c, send.ptr(), at, &|_| msg, seed);
            }
            let all_direct = steps == conns as u64;
            assert_eq!(
                all_direct, direct,
                "rank {rank}, message {k} at {:#x} (boundary {boundary:#x}): {steps} steps",
                at
            );
        }
        // An AllReduce (int32 sum) into an output straddling the boundary, poisoned around.
        let count = 48 << 10;
        let out = boundary - (count * 2) as u64;
        let stream = c.device().stream_create().unwrap();
        for round in 0..2u64 {
            let (inp, want) = common::register::coll_data(
                nccl_device::abi::Coll::AllReduce,
                nranks,
                rank,
                count,
                990 + round,
            );
            send.write(0, &inp).unwrap();
            // SAFETY: the output and 512 bytes after it lie inside the registered buffer.
            unsafe {
                c.device()
                    .copy_htod_raw(out, &vec![0xA5; want.len() + 512])
                    .unwrap();
                c.all_reduce_raw(
                    send.ptr(),
                    out,
                    count,
                    nccl::DataType::Int32,
                    nccl::ReduceOp::Sum,
                    stream,
                )
                .unwrap();
            }
            c.device().stream_sync(stream).unwrap();
            let mut got = vec![0u8; want.len() + 512];
            // SAFETY: as above.
            unsafe { c.device().copy_dtoh_raw(&mut got, out).unwrap() };
            assert!(
                got[..want.len()] == want[..],
                "rank {rank}: wrong AllReduce"
            );
            assert!(
                got[want.len()..].iter().all(|&b| b == 0xA5),
                "rank {rank}: AllReduce wrote past its output"
            );
        }
        c.device().stream_destroy(stream).unwrap();
        for h in regs {
            c.deregister(h).unwrap();
        }
        // One more call so that no rank leaves before the other's withdrawals are in.
        p2p_round(&c, send.ptr(), rb, &|_| 1000, 999);
        return;
    }
    common::procs::run(
        "registered_vmm_buffer_over_adjacent_allocations",
        2,
        &VMM_ENV,
    );
}

/// Threads and open descriptors of this process, and whether a descriptor listener runs.
fn threads_fds() -> (usize, usize, bool) {
    let count = |d: &str| std::fs::read_dir(d).map(|r| r.count()).unwrap_or(0);
    let listener = std::fs::read_dir("/proc/self/task")
        .map(|r| {
            r.flatten().any(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|n| n.trim() == "nccl-fdpass")
            })
        })
        .unwrap_or(false);
    (count("/proc/self/task"), count("/proc/self/fd"), listener)
}

/// 100 cycles of registering VMM buffers (their descriptors on offer, the peer taking and
/// mapping them before a send/recv) and deregistering them leave no thread and no descriptor
/// behind: the descriptor listener runs while a registration needs it and ends with the last
/// one (before, it lived for the whole process), and the offered and taken descriptors are all
/// closed. Counted in /proc/self/task and /proc/self/fd after the first cycle and after the
/// last; every round's bytes checked.
#[test]
fn vmm_registration_cycles_leave_no_thread_or_descriptor() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let c = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        let room = 3 * FIFO + 1024;
        let (s, rb) = (
            c.device().alloc_vmm(room).unwrap(),
            c.device().alloc_vmm(room).unwrap(),
        );
        let mut mapped_once = false;
        let mut cycle = |k: u64| {
            // SAFETY: the buffers outlive their registrations (deregistered below).
            let regs = unsafe {
                [
                    c.register_raw(s.ptr(), room).unwrap(),
                    c.register_raw(rb.ptr(), room).unwrap(),
                ]
            };
            // A new thread names itself once it runs: give it a moment.
            let t0 = std::time::Instant::now();
            while !threads_fds().2 && t0.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            let on_offer = threads_fds().2;
            let before = nccl::cuda::sim::vmm_imports();
            p2p_round(&c, s.ptr(), rb.ptr(), &|_| 3 * FIFO, 3000 + k);
            mapped_once |= nccl::cuda::sim::vmm_imports() > before;
            for h in regs {
                c.deregister(h).unwrap();
            }
            on_offer
        };
        assert!(
            cycle(0),
            "rank {rank}: no descriptor listener while registered"
        );
        // The first withdrawals drained (the peer's of cycle 0, at the latest in cycle 2) make
        // the communicator's fence stream (a thread on the simulator), which stays: counted
        // from there.
        cycle(1);
        cycle(2);
        let start = threads_fds();
        for k in 3..100 {
            cycle(k);
        }
        // One more call: no rank leaves before the other's last withdrawals are in.
        p2p_round(&c, s.ptr(), rb.ptr(), &|_| 1000, 4000);
        // Threads of others (streams, proxies) may still be ending: give them a while.
        let t0 = std::time::Instant::now();
        let mut now = threads_fds();
        while (now.0 > start.0 || now.1 > start.1)
            && t0.elapsed() < std::time::Duration::from_secs(20)
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
            now = threads_fds();
        }
        assert!(
            !now.2,
            "rank {rank}: the descriptor listener outlived the registrations"
        );
        assert!(
            now.0 <= start.0 && now.1 <= start.1,
            "rank {rank}: threads, descriptors after cycle 0 {:?}, after 100 {:?}",
            (start.0, start.1),
            (now.0, now.1)
        );
        assert!(
            mapped_once,
            "rank {rank}: the peer's VMM buffers were never mapped"
        );
        return;
    }
    common::procs::run(
        "vmm_registration_cycles_leave_no_thread_or_descriptor",
        2,
        &VMM_ENV,
    );
}

/// Graph registration with ranks as processes: a captured receive registers its buffer and
/// tells the sender, whose capture waits for that (the marks of comm/graph_reg.rs), so every
/// replay of the graph sends straight into the peer's buffer, which nobody registered; once
/// the graphs are destroyed the next call withdraws the registration and messages copy again.
/// Random bytes, a poisoned receive buffer and its tail checked in every replay and round.
#[test]
fn captured_send_recv_go_direct_across_processes_until_the_graph_is_gone() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let c = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        common::register::captured_p2p_rounds(&c, 3 * FIFO, CONNS, SLOT);
        return;
    }
    for n in [2usize, 3] {
        common::procs::run(
            "captured_send_recv_go_direct_across_processes_until_the_graph_is_gone",
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
fn a_launch_fence_waits_for_the_kernels_launched_before() {
    use nccl::DataType;
    use std::time::{Duration, Instant};
    let comms = sim_comms(2, &[]);
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
    // The fence's own stream follows the kernel's end: a bound, not a timing.
    let t0 = Instant::now();
    while !fence.passed() {
        assert!(t0.elapsed() < Duration::from_secs(30), "never passed");
        std::thread::sleep(Duration::from_millis(1));
    }
    for (c, s) in comms.iter().zip(&streams) {
        c.device().stream_destroy(*s).unwrap();
    }
}
