//! Registered buffers of CUDA's virtual memory API (`ncclMemAlloc`) on the simulator, ranks as
//! processes: their records carry descriptors the peers map; withdrawals to a peer that exited
//! finish at once; a buffer over two allocations goes out as two records; registration cycles
//! leave no thread or descriptor behind.

use super::register::{child_comm, CONNS, FIFO};
use crate::common;
use nccl::Comm;

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
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_p2p",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum"
    )),
    ignore = "needs nccl_p2p, nccl_all_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn registered_vmm_buffers_across_processes() {
    if let Some(c) = child_comm() {
        let rank = c.rank();
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
            nccl::ReduceOp::SUM,
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
/// withdrawals waited out ~56 s of connect retries; here the retries have no end, so such a
/// withdrawal hangs, which the supervisor's bound turns into a failure (no speed is asserted).
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_p2p",
        nccl_rs_kernel = "nccl_all_reduce_uint64_sum"
    )),
    ignore = "needs nccl_p2p, nccl_all_reduce_uint64_sum, which NCCL_RS_KERNELS left out"
)]
fn withdrawals_to_an_exited_peer_finish_at_once() {
    if let Some(c) = child_comm() {
        let rank = c.rank();
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
        for h in regs {
            c.deregister(h).expect("deregister with the peer gone");
        }
        // SAFETY: the buffer outlives its registration.
        let h = unsafe { c.register_raw(bufs[2].ptr(), room) }.expect("register again");
        c.deregister(h).expect("deregister again");
        drop(bufs);
        drop(c);
        return;
    }
    // Connection retries without end: a withdrawal that retried its connections to the gone
    // peer (as before the fix: ~56 s of them) would now never end, and the supervisor's
    // bound turns that into a failure (no timing is asserted).
    let mut env = VMM_ENV.to_vec();
    env.push(("NCCL_SOCKET_RETRY_CNT", "1000000"));
    common::procs::run(2, &env);
}

/// A registered receive buffer over two VMM allocations side by side (one address range
/// mapped from two physical allocations): it goes to the peer as one record per allocation,
/// each mapped apart, so a message inside the first allocation and one inside the second both
/// go direct (before, only the part in the first allocation was exported and the second
/// message took the FIFO); a message straddling the two takes the FIFO for the part that
/// straddles (no one mapping of the peer's holds it), and every message's bytes are right,
/// with a poisoned tail that stays. An AllReduce into an output straddling the two is right.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_p2p",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum"
    )),
    ignore = "needs nccl_p2p, nccl_all_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn registered_vmm_buffer_over_adjacent_allocations() {
    if let Some(c) = child_comm() {
        let rank = c.rank();
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
                c.count(),
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
                    nccl::ReduceOp::SUM,
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
    common::procs::run(2, &VMM_ENV);
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
/// last; every round's bytes checked. The communicator's own connection blocks stay plain
/// (`NCCL_CUMEM_ENABLE=0`): VMM blocks that peers in other processes map keep their
/// descriptors on offer, and the listener, for the communicator's life.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn vmm_registration_cycles_leave_no_thread_or_descriptor() {
    if let Some(c) = child_comm() {
        let rank = c.rank();
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
    let mut env = VMM_ENV.to_vec();
    env.push(("NCCL_CUMEM_ENABLE", "0"));
    common::procs::run(2, &env);
}
