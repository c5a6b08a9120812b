//! Registered buffers on the simulator: a send/recv between registered buffers of ranks that
//! share an address space skips the FIFO (each connection's counters advance one step per
//! message instead of one per slot), and gives the same bytes as the FIFO path; a rank that
//! did not register makes its peer fall back to copies, whichever side it is.

mod common;

use common::{lend, Rng};
use nccl::{Backend, Comm, DataType};

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

/// Which ranks register their buffers in a round.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    All,
    None,
    /// Even ranks register, odd ones do not: every message has one registered end.
    Even,
}

impl Who {
    fn registers(self, rank: usize) -> bool {
        match self {
            Who::All => true,
            Who::None => false,
            Who::Even => rank % 2 == 0,
        }
    }
}

/// Bytes rank `from` sends to `from + 1`: over the FIFO's size, odd, different per rank.
fn ring_bytes(from: usize, base: usize) -> usize {
    base + 4 * 37 * from + 12
}

/// One round: every rank sends to its successor and receives from its predecessor in one
/// group (random bytes, a poisoned receive buffer at an offset inside a larger registered
/// allocation); checks the bytes and returns, per rank, how many steps its send connections
/// advanced.
fn ring_round(comms: &[Comm], who: Who, base: usize, seed: u64) -> Vec<u64> {
    let n = comms.len();
    let mut rng = Rng::new(seed);
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    // Buffers sit 256 bytes into their allocation, which is what gets registered.
    const LEAD: usize = 256;
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    let mut regs = Vec::new();
    let mut data = Vec::new();
    for (r, c) in comms.iter().enumerate() {
        let out_bytes = ring_bytes(r, base);
        let in_bytes = ring_bytes((r + n - 1) % n, base);
        let mine: Vec<u8> = (0..out_bytes).map(|_| rng.next() as u8).collect();
        let s = c.device().alloc(LEAD + out_bytes).unwrap();
        s.write(LEAD, &mine).unwrap();
        let rb = c.device().alloc(LEAD + in_bytes + LEAD).unwrap();
        rb.write(0, &vec![0xA5; LEAD + in_bytes + LEAD]).unwrap();
        if who.registers(r) {
            // SAFETY: both buffers outlive their registrations (deregistered below).
            unsafe {
                regs.push((r, c.register_raw(s.ptr(), LEAD + out_bytes).unwrap()));
                regs.push((r, c.register_raw(rb.ptr(), LEAD + in_bytes + LEAD).unwrap()));
            }
        }
        sends.push(s);
        recvs.push(rb);
        data.push(mine);
    }
    let before: Vec<u64> = comms.iter().map(|c| send_steps(c, n)).collect();
    let lent = lend(comms);
    nccl::group_start();
    for (r, c) in lent.iter().enumerate() {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // SAFETY: the buffers hold these byte counts from LEAD on and live until the sync.
        unsafe {
            c.send_raw(
                sends[r].ptr() + LEAD as u64,
                ring_bytes(r, base),
                DataType::Uint8,
                next,
                streams[r],
            )
            .unwrap();
            c.recv_raw(
                recvs[r].ptr() + LEAD as u64,
                ring_bytes(prev, base),
                DataType::Uint8,
                prev,
                streams[r],
            )
            .unwrap();
        }
    }
    nccl::group_end().unwrap();
    for (r, c) in comms.iter().enumerate() {
        c.device().stream_sync(streams[r]).unwrap();
        let prev = (r + n - 1) % n;
        let len = ring_bytes(prev, base);
        let mut got = vec![0u8; LEAD + len + LEAD];
        recvs[r].read(0, &mut got).unwrap();
        assert!(
            got[..LEAD]
                .iter()
                .chain(&got[LEAD + len..])
                .all(|&b| b == 0xA5),
            "{n} ranks, {who:?}: rank {r} has bytes written outside its receive buffer"
        );
        if let Some(k) = (0..len).find(|&k| got[LEAD + k] != data[prev][k]) {
            panic!(
                "{n} ranks, {who:?}, {len} bytes: rank {r}'s byte {k} from rank {prev} is wrong"
            );
        }
    }
    for (r, h) in regs {
        comms[r].deregister(h).unwrap();
    }
    for (c, s) in comms.iter().zip(streams) {
        c.device().stream_destroy(s).unwrap();
    }
    comms
        .iter()
        .enumerate()
        .map(|(r, c)| send_steps(c, n) - before[r])
        .collect()
}

/// The steps of rank `c`'s send connections to its successor, summed.
fn send_steps(c: &Comm, n: usize) -> u64 {
    c.p2p_steps((c.rank() + 1) % n, true)
        .unwrap()
        .map_or(0, |v| v.iter().sum())
}

/// Steps the FIFO takes for `bytes` split over the connections.
fn fifo_steps(bytes: usize) -> u64 {
    let per = bytes.div_ceil(CONNS).next_multiple_of(16);
    let parts = [per.min(bytes), bytes - per.min(bytes)];
    parts.iter().map(|&p| p.div_ceil(SLOT).max(1) as u64).sum()
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
            for (r, &s) in steps.iter().enumerate() {
                let both = who.registers(r) && who.registers((r + 1) % n);
                let want = if both {
                    CONNS as u64
                } else {
                    fifo_steps(ring_bytes(r, base))
                };
                assert_eq!(
                    s,
                    want,
                    "{n} ranks, {who:?}: rank {r}'s send to {} took {s} steps",
                    (r + 1) % n
                );
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
            assert_eq!(
                s,
                fifo_steps(ring_bytes(r, bytes)),
                "{bytes} bytes, rank {r}"
            );
        }
    }
}
