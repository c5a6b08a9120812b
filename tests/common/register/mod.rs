//! Registered send/recv rounds, shared by the simulator and GPU suites: every rank sends to
//! its successor and receives from its predecessor between buffers that some ranks registered,
//! and each connection's step counter tells which path a message took.

use super::{lend, Rng};

mod capture;
mod coll;
#[allow(unused_imports)]
pub use capture::*;
#[allow(unused_imports)]
pub use coll::*;
use nccl::{Comm, DataType};
use nccl_device::abi::Coll;

/// Which ranks register their buffers in a round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Who {
    All,
    None,
    /// Even ranks register, odd ones do not: every message has one registered end.
    Even,
}

impl Who {
    pub fn registers(self, rank: usize) -> bool {
        match self {
            Who::All => true,
            Who::None => false,
            Who::Even => rank.is_multiple_of(2),
        }
    }
}

/// Bytes rank `from` sends to `from + 1`: over the FIFO's size, odd, different per rank.
pub fn ring_bytes(from: usize, base: usize) -> usize {
    base + 4 * 37 * from + 12
}

/// The bytes rank `from` sends in round `seed`: random, the same in every process.
fn ring_data(from: usize, base: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed.wrapping_mul(1000) + from as u64);
    (0..ring_bytes(from, base))
        .map(|_| rng.next() as u8)
        .collect()
}

/// One round over the communicators of this process (every rank of the job, or some: the
/// others run the same round in their processes): every rank sends to its successor and
/// receives from its predecessor in one group (random bytes, a poisoned receive buffer at an
/// offset inside a larger registered allocation). Checks the bytes and returns, per
/// communicator, how many steps its send connections advanced.
pub fn ring_round(comms: &[Comm], who: Who, base: usize, seed: u64) -> Vec<u64> {
    let n = comms[0].count();
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    // Buffers sit 256 bytes into their allocation, which is what gets registered.
    const LEAD: usize = 256;
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    let mut regs = Vec::new();
    for (i, c) in comms.iter().enumerate() {
        let r = c.rank();
        let out_bytes = ring_bytes(r, base);
        let in_bytes = ring_bytes((r + n - 1) % n, base);
        let s = c.device().alloc(LEAD + out_bytes).unwrap();
        s.write(LEAD, &ring_data(r, base, seed)).unwrap();
        let rb = c.device().alloc(LEAD + in_bytes + LEAD).unwrap();
        rb.write(0, &vec![0xA5; LEAD + in_bytes + LEAD]).unwrap();
        if who.registers(r) {
            // SAFETY: both buffers outlive their registrations (deregistered below).
            unsafe {
                regs.push((i, c.register_raw(s.ptr(), LEAD + out_bytes).unwrap()));
                regs.push((i, c.register_raw(rb.ptr(), LEAD + in_bytes + LEAD).unwrap()));
            }
        }
        sends.push(s);
        recvs.push(rb);
    }
    let before: Vec<u64> = comms.iter().map(send_steps).collect();
    let lent = lend(comms);
    nccl::group_start();
    for (i, c) in lent.iter().enumerate() {
        let r = c.rank();
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // SAFETY: the buffers hold these byte counts from LEAD on and live until the sync.
        unsafe {
            c.send_raw(
                sends[i].ptr() + LEAD as u64,
                ring_bytes(r, base),
                DataType::Uint8,
                next,
                streams[i],
            )
            .unwrap();
            c.recv_raw(
                recvs[i].ptr() + LEAD as u64,
                ring_bytes(prev, base),
                DataType::Uint8,
                prev,
                streams[i],
            )
            .unwrap();
        }
    }
    nccl::group_end().unwrap();
    for (i, c) in comms.iter().enumerate() {
        c.device().stream_sync(streams[i]).unwrap();
        let r = c.rank();
        let prev = (r + n - 1) % n;
        let want = ring_data(prev, base, seed);
        let len = want.len();
        let mut got = vec![0u8; LEAD + len + LEAD];
        recvs[i].read(0, &mut got).unwrap();
        assert!(
            got[..LEAD]
                .iter()
                .chain(&got[LEAD + len..])
                .all(|&b| b == 0xA5),
            "{n} ranks, {who:?}: rank {r} has bytes written outside its receive buffer"
        );
        if let Some(k) = (0..len).find(|&k| got[LEAD + k] != want[k]) {
            panic!(
                "{n} ranks, {who:?}, {len} bytes: rank {r}'s byte {k} from rank {prev} is wrong"
            );
        }
    }
    for (i, h) in regs {
        comms[i].deregister(h).unwrap();
    }
    for (c, s) in comms.iter().zip(streams) {
        c.device().stream_destroy(s).unwrap();
    }
    comms
        .iter()
        .zip(before)
        .map(|(c, b)| send_steps(c) - b)
        .collect()
}

/// The steps of rank `c`'s send connections to its successor, summed.
pub fn send_steps(c: &Comm) -> u64 {
    c.p2p_steps((c.rank() + 1) % c.count(), true)
        .unwrap()
        .map_or(0, |v| v.iter().sum())
}

/// Steps a message of `bytes` takes over `conns` connections of `slot`-byte FIFO slots: per
/// part (as `enqueue::p2p::part` cuts them), one when it goes direct (`direct` and the part fills
/// its FIFO of 8 slots), else one per slot (at least one).
pub fn expected_steps(bytes: usize, conns: usize, slot: usize, direct: bool) -> u64 {
    let per = bytes.div_ceil(conns).next_multiple_of(16);
    (0..conns)
        .map(|c| {
            let s = (c * per).min(bytes);
            let len = (s + per).min(bytes) - s;
            if direct && len >= 8 * slot {
                1
            } else {
                len.div_ceil(slot).max(1) as u64
            }
        })
        .sum()
}

/// Checks a round's steps (from [`ring_round`]): the direct path exactly where both ends of a
/// message registered.
pub fn check_steps(comms: &[Comm], who: Who, base: usize, steps: &[u64]) {
    let n = comms[0].count();
    let slot = comms[0].shape().p2p_slot_bytes as usize;
    for (c, &s) in comms.iter().zip(steps) {
        let r = c.rank();
        let conns = c
            .p2p_steps((r + 1) % n, true)
            .unwrap()
            .map_or(1, |v| v.len());
        let bytes = ring_bytes(r, base);
        let both = who.registers(r) && who.registers((r + 1) % n);
        let want = expected_steps(bytes, conns, slot, both);
        assert_eq!(
            s,
            want,
            "{n} ranks, {who:?}, {bytes} bytes: rank {r}'s send to {} took {s} steps",
            (r + 1) % n
        );
    }
}

/// Rounds on registered buffers of CUDA's virtual memory API (`ncclMemAlloc`), for a rank that
/// is a process of its own (its peers run the same rounds): three such buffers, registered
/// once; each of 6 rounds sends `ring_bytes(rank, p2p_base + 64 k)` random bytes to the
/// successor and receives the predecessor's into a poisoned buffer, then runs an AllReduce
/// (int32 sum, out of place) of `count` random elements into a poisoned output; results and
/// the bytes after them are checked in every round. The last round's send steps and
/// AllReduce direct steps per channel must be those of the direct path when `on`, else of the
/// FIFO (the records are in by then: every round needs every rank's launches).
pub fn vmm_rounds(c: &Comm, p2p_base: usize, count: usize, on: bool) {
    let (n, r) = (c.count(), c.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let room = (p2p_base + 64 * 6 + 4 * 37 * n + 1024).max(count * 4 + 1024);
    // ncclMemAlloc's memory: sends and AllReduce inputs, receives, AllReduce outputs.
    let bufs: Vec<nccl::DevBuffer> = (0..3)
        .map(|_| c.device().alloc_vmm(room).expect("alloc_vmm"))
        .collect();
    let regs: Vec<_> = bufs
        .iter()
        // SAFETY: the buffers outlive their registrations (deregistered below).
        .map(|b| unsafe { c.register_raw(b.ptr(), room) }.expect("register"))
        .collect();
    let (s, rb, out) = (&bufs[0], &bufs[1], &bufs[2]);
    let stream = c.device().stream_create().unwrap();
    let (mut p2p_steps, mut ring_steps) = (0u64, Vec::new());
    const ROUNDS: u64 = 6;
    for k in 0..ROUNDS {
        // Send/recv: a message of several FIFOs per connection, random bytes, a poisoned
        // receive buffer whose bytes past the message must stay.
        let base = p2p_base + 64 * k as usize;
        let mut rng = Rng::new(600 + k * 1000 + r as u64);
        let mine: Vec<u8> = (0..ring_bytes(r, base)).map(|_| rng.next() as u8).collect();
        s.write(0, &mine).unwrap();
        let len = ring_bytes(prev, base);
        rb.write(0, &vec![0x5A; len + 512]).unwrap();
        let before = send_steps(c);
        nccl::group_start();
        // SAFETY: both buffers hold `room` bytes, more than either message.
        unsafe {
            c.send_raw(s.ptr(), mine.len(), DataType::Uint8, next, stream)
                .unwrap();
            c.recv_raw(rb.ptr(), len, DataType::Uint8, prev, stream)
                .unwrap();
        }
        nccl::group_end().unwrap();
        c.device().stream_sync(stream).unwrap();
        p2p_steps = send_steps(c) - before;
        let mut rng = Rng::new(600 + k * 1000 + prev as u64);
        let want: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let mut got = vec![0u8; len + 512];
        rb.read(0, &mut got).unwrap();
        assert!(
            got[..len] == want[..],
            "rank {r}, round {k}: wrong bytes from {prev}"
        );
        assert!(
            got[len..].iter().all(|&b| b == 0x5A),
            "rank {r}, round {k}: bytes written past the message"
        );
        // AllReduce (int32 sum) out of place into the registered output, poisoned.
        let (inp, want) = coll_data(Coll::AllReduce, n, r, count, 700 + k);
        s.write(0, &inp).unwrap();
        out.write(0, &vec![0xA5; want.len() + 512]).unwrap();
        let before = c.ring_direct_steps().unwrap();
        // SAFETY: both buffers hold `room` bytes, more than the call's.
        unsafe {
            c.all_reduce_raw(
                s.ptr(),
                out.ptr(),
                count,
                DataType::Int32,
                nccl::ReduceOp::SUM,
                stream,
            )
            .unwrap();
        }
        c.device().stream_sync(stream).unwrap();
        let now = c.ring_direct_steps().unwrap();
        ring_steps = now.iter().zip(&before).map(|(a, b)| a - b).collect();
        let mut got = vec![0u8; want.len() + 512];
        out.read(0, &mut got).unwrap();
        assert!(
            got[..want.len()] == want[..],
            "rank {r}, round {k}: wrong AllReduce"
        );
        assert!(
            got[want.len()..].iter().all(|&b| b == 0xA5),
            "rank {r}, round {k}: AllReduce wrote past its output"
        );
    }
    // Withdrawn (the peers unmap them before their next launch), then one more AllReduce on
    // the same, now unregistered, buffers: the copy path, and no rank leaves before every
    // withdrawal was sent (a send to a rank that has exited waits out its retries).
    for h in regs {
        c.deregister(h).unwrap();
    }
    let (inp, want) = coll_data(Coll::AllReduce, n, r, 1001, 799);
    s.write(0, &inp).unwrap();
    out.write(0, &vec![0xA5; want.len()]).unwrap();
    let before = c.ring_direct_steps().unwrap();
    // SAFETY: both buffers hold `room` bytes, more than the call's.
    unsafe {
        c.all_reduce_raw(
            s.ptr(),
            out.ptr(),
            1001,
            DataType::Int32,
            nccl::ReduceOp::SUM,
            stream,
        )
        .unwrap();
    }
    c.device().stream_sync(stream).unwrap();
    assert_eq!(
        c.ring_direct_steps().unwrap(),
        before,
        "rank {r}: direct after withdrawal"
    );
    let mut got = vec![0u8; want.len()];
    out.read(0, &mut got).unwrap();
    assert!(
        got == want,
        "rank {r}: wrong AllReduce after the withdrawal"
    );
    c.device().stream_destroy(stream).unwrap();
    let slot = c.shape().p2p_slot_bytes as usize;
    let conns = c.p2p_steps(next, true).unwrap().map_or(1, |v| v.len());
    let bytes = ring_bytes(r, p2p_base + 64 * (ROUNDS as usize - 1));
    assert_eq!(
        p2p_steps,
        expected_steps(bytes, conns, slot, on),
        "rank {r} (VMM path on: {on}): send steps of the last round"
    );
    let want_ring = expected_direct(c, Coll::AllReduce, |_| on, count, false, true);
    assert_eq!(
        ring_steps, want_ring,
        "rank {r} (VMM path on: {on}): AllReduce direct steps per channel"
    );
    if on {
        assert!(
            ring_steps.iter().sum::<u64>() > 0,
            "rank {r}: the AllReduce took no direct step ({ring_steps:?})"
        );
    }
}
