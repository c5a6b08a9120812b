//! Issue 23: 1000 init / AllReduce / destroy cycles leave a process's threads, descriptors,
//! /dev/shm regions and memory where they were: ranks as threads of one process, and ranks
//! as processes (whose connections go through the simulator's shared-memory IPC regions).
//! The counts are of a whole process, so each test runs alone in child processes.
//!
//! `NCCL_RS_CYCLES` changes the number of cycles (default 1000).

use crate::common::{self, procs};
use nccl::{Comm, DataType, ReduceOp, UniqueId};
use std::time::Instant;

fn cycles() -> usize {
    std::env::var("NCCL_RS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// /dev/shm regions of this process (the simulator's device memory and IPC regions).
fn shm_regions() -> usize {
    let mine = format!("ncclrs-{}", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
                .count()
        })
        .unwrap_or(0)
}

/// Resident memory in KiB.
fn rss_kib() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy)]
struct Usage {
    threads: usize,
    fds: usize,
    shm: usize,
    rss_kib: usize,
}

fn usage() -> Usage {
    Usage {
        threads: count("/proc/self/task"),
        fds: count("/proc/self/fd"),
        shm: shm_regions(),
        rss_kib: rss_kib(),
    }
}

/// Runs `cycle(i)` for `n` cycles after 20 to warm up (devices, their stream threads and the
/// allocator's first arenas live as long as the process), and checks the process's usage
/// came back to where it was after the warm-up.
fn check_flat(what: &str, n: usize, mut cycle: impl FnMut(usize)) {
    let warm = 20;
    for i in 0..warm {
        cycle(i);
    }
    let before = usage();
    let t = Instant::now();
    let mut peak = before;
    for i in warm..warm + n {
        cycle(i);
        if i % 50 == 0 {
            let u = usage();
            peak.threads = peak.threads.max(u.threads);
            peak.fds = peak.fds.max(u.fds);
            peak.shm = peak.shm.max(u.shm);
            peak.rss_kib = peak.rss_kib.max(u.rss_kib);
        }
    }
    // Threads of a destroyed communicator may still be on their way out.
    let mut after = usage();
    let settle = Instant::now();
    while (after.threads > before.threads || after.fds > before.fds || after.shm > before.shm)
        && settle.elapsed().as_secs() < 10
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
        after = usage();
    }
    eprintln!(
        "{what}: {n} cycles in {:?} ({:?} each): before {before:?}, after {after:?}, peak {peak:?}",
        t.elapsed(),
        t.elapsed() / n.max(1) as u32
    );
    assert!(
        after.threads <= before.threads,
        "{what}: threads {} -> {}",
        before.threads,
        after.threads
    );
    assert!(
        after.fds <= before.fds,
        "{what}: descriptors {} -> {}",
        before.fds,
        after.fds
    );
    assert!(
        after.shm <= before.shm,
        "{what}: /dev/shm regions {} -> {}",
        before.shm,
        after.shm
    );
    // A leak of one communicator's buffers per cycle would be megabytes per cycle; allow the
    // allocator's own drift (8 MiB over the whole run).
    assert!(
        after.rss_kib <= before.rss_kib + 8 * 1024,
        "{what}: resident memory {} KiB -> {} KiB after {n} cycles",
        before.rss_kib,
        after.rss_kib
    );
}

/// One AllReduce over the communicators of this process (ranks `comm.rank()` of `nranks`),
/// issued in a group, with inputs that depend on the cycle; checks every result.
fn all_reduce_checked(comms: &[Comm], nranks: usize, i: usize) {
    let count = 256;
    let value = |r: usize, k: usize| (r * 1000 + k + i) as f32;
    let bufs: Vec<_> = comms
        .iter()
        .map(|c| {
            let b = c.device().alloc(count * 4).expect("alloc");
            let x: Vec<u8> = (0..count)
                .flat_map(|k| value(c.rank(), k).to_le_bytes())
                .collect();
            b.write(0, &x).expect("write");
            b
        })
        .collect();
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().expect("stream"))
        .collect();
    nccl::group_start();
    for (j, c) in comms.iter().enumerate() {
        let p = bufs[j].ptr();
        unsafe { c.all_reduce_raw(p, p, count, DataType::Float32, ReduceOp::SUM, streams[j]) }
            .unwrap_or_else(|e| panic!("cycle {i}: rank {}: {e}", c.rank()));
    }
    nccl::group_end().expect("group end");
    for (j, c) in comms.iter().enumerate() {
        c.device().stream_sync(streams[j]).expect("sync");
        let mut out = vec![0u8; count * 4];
        bufs[j].read(0, &mut out).expect("read");
        for (k, v) in out.chunks(4).enumerate() {
            let got = f32::from_le_bytes(v.try_into().unwrap());
            let want: f32 = (0..nranks).map(|r| value(r, k)).sum();
            assert_eq!(got, want, "cycle {i}: rank {}: element {k}", c.rank());
        }
        c.device()
            .stream_destroy(streams[j])
            .expect("stream destroy");
    }
}

fn destroy_all(comms: Vec<Comm>, i: usize) {
    for c in comms {
        let r = c.rank();
        c.destroy()
            .unwrap_or_else(|e| panic!("cycle {i}: rank {r}: destroy: {e}"));
    }
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn a_thousand_cycles_with_ranks_as_threads_leave_nothing_behind() {
    procs::isolated(&[], &[], cycles_as_threads);
}

fn cycles_as_threads() {
    common::sim();
    let devs: Vec<_> = (0..2)
        .map(|d| nccl::Device::open(d).expect("a simulated device"))
        .collect();
    let devs = &devs;
    // Each cycle: a fresh unique id (its root), the ranks' listeners and sockets.
    check_flat("ranks as threads", cycles(), |i| {
        let id = common::loopback_id();
        let comms: Vec<Comm> = std::thread::scope(|s| {
            let hs: Vec<_> = devs
                .iter()
                .enumerate()
                .map(|(r, d)| {
                    let id = &id;
                    s.spawn(move || Comm::init_rank_on(d.clone(), devs.len(), id, r))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("init thread"))
                .collect::<nccl::Result<_>>()
                .unwrap_or_else(|e| panic!("cycle {i}: init: {e}"))
        });
        all_reduce_checked(&comms, 2, i);
        destroy_all(comms, i);
    });
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_broadcast"
    )),
    ignore = "needs nccl_all_reduce_float_sum and nccl_broadcast, which NCCL_RS_KERNELS left out"
)]
fn a_thousand_cycles_with_ranks_as_processes_leave_nothing_behind() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let dev = common::sim_dev(rank);
        // A communicator that lives through the cycles hands each one's unique id from rank 0.
        let control = Comm::init_rank_on(dev.clone(), nranks, &id, rank).expect("control init");
        let id_buf = dev.alloc(nccl::UNIQUE_ID_BYTES).expect("alloc");
        let stream = dev.stream_create().expect("stream");
        let next_id = || -> UniqueId {
            if rank == 0 {
                let id = common::loopback_id();
                id_buf.write(0, &id.internal).expect("write");
            }
            unsafe {
                control.broadcast_raw(
                    id_buf.ptr(),
                    id_buf.ptr(),
                    nccl::UNIQUE_ID_BYTES,
                    DataType::Uint8,
                    0,
                    stream,
                )
            }
            .expect("broadcast the id");
            dev.stream_sync(stream).expect("sync");
            let mut id = UniqueId {
                internal: [0; nccl::UNIQUE_ID_BYTES],
            };
            id_buf.read(0, &mut id.internal).expect("read");
            id
        };
        check_flat(
            &format!("rank {rank} of {nranks} processes"),
            cycles(),
            |i| {
                let id = next_id();
                let comm = Comm::init_rank_on(dev.clone(), nranks, &id, rank)
                    .unwrap_or_else(|e| panic!("cycle {i}: init: {e}"));
                all_reduce_checked(std::slice::from_ref(&comm), nranks, i);
                destroy_all(vec![comm], i);
            },
        );
        control.destroy().expect("control destroy");
        return;
    }
    common::procs::run(2, &[]);
}
