//! The point-to-point patterns of NCCL's documentation, built from ncclSend/ncclRecv in groups,
//! on the simulator: one-to-all (scatter), all-to-one (gather) and neighbor exchange, with
//! roots other than 0, a different size per peer and direction, poisoned outputs, one thread
//! driving every rank.

mod common;

use common::{from_bytes, to_bytes, Ranks};
use nccl::{Backend, Comm, DataType, DevBuffer};

fn sim_comms(n: usize) -> Ranks {
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    Ranks::new(Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).expect("init_all"))
}

/// What rank `from` sends to rank `to`: `len(from, to)` int32 values unique to the pair.
fn payload(from: usize, to: usize, len: usize) -> Vec<i32> {
    (0..len)
        .map(|j| (from * 1_000_000 + to * 10_000 + j) as i32)
        .collect()
}

fn len(from: usize, to: usize) -> usize {
    1 + (from * 37 + to * 101) % 3000
}

fn alloc_with(ranks: &Ranks, r: usize, v: &[i32]) -> DevBuffer {
    let b = ranks.comms[r].device().alloc(v.len().max(1) * 4).unwrap();
    b.write(0, to_bytes(v)).unwrap();
    b
}

fn read(b: &DevBuffer, n: usize) -> Vec<i32> {
    let mut out = vec![0u8; n * 4];
    b.read(0, &mut out).unwrap();
    from_bytes(&out)
}

fn sync(ranks: &Ranks) {
    for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
        c.device().stream_sync(*s).expect("stream sync");
    }
}

const POISON: i32 = -0x5a5a5a5b;

/// One-to-all from `root` (to itself too), then all-to-one into `root`, as in the docs.
fn scatter_gather(ranks: &Ranks, root: usize) {
    let n = ranks.comms.len();
    let i32t = DataType::Int32;
    // Scatter: the root's send buffer holds every rank's piece back to back.
    let offs: Vec<usize> = (0..=n)
        .map(|r| (0..r).map(|q| len(root, q)).sum())
        .collect();
    let all: Vec<i32> = (0..n)
        .flat_map(|q| payload(root, q, len(root, q)))
        .collect();
    let src = alloc_with(ranks, root, &all);
    let dst: Vec<DevBuffer> = (0..n)
        .map(|r| alloc_with(ranks, r, &vec![POISON; len(root, r)]))
        .collect();
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        let s = ranks.streams[r];
        if r == root {
            for (q, off) in offs[..n].iter().enumerate() {
                let p = src.ptr + (off * 4) as u64;
                c.send(p, len(root, q), i32t, q, s).unwrap();
            }
        }
        c.recv(dst[r].ptr, len(root, r), i32t, root, s).unwrap();
    }
    nccl::group_end().unwrap();
    sync(ranks);
    for (r, d) in dst.iter().enumerate() {
        assert_eq!(
            read(d, len(root, r)),
            payload(root, r, len(root, r)),
            "scatter from {root} to {r} of {n}"
        );
    }
    // Gather: every rank's piece lands at its offset in the root's receive buffer.
    let goffs: Vec<usize> = (0..=n)
        .map(|r| (0..r).map(|q| len(q, root)).sum())
        .collect();
    let srcs: Vec<DevBuffer> = (0..n)
        .map(|r| alloc_with(ranks, r, &payload(r, root, len(r, root))))
        .collect();
    let gathered = alloc_with(ranks, root, &vec![POISON; goffs[n]]);
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        let s = ranks.streams[r];
        c.send(srcs[r].ptr, len(r, root), i32t, root, s).unwrap();
        if r == root {
            for (q, off) in goffs[..n].iter().enumerate() {
                let p = gathered.ptr + (off * 4) as u64;
                c.recv(p, len(q, root), i32t, q, s).unwrap();
            }
        }
    }
    nccl::group_end().unwrap();
    sync(ranks);
    let want: Vec<i32> = (0..n)
        .flat_map(|q| payload(q, root, len(q, root)))
        .collect();
    assert_eq!(read(&gathered, goffs[n]), want, "gather into {root} of {n}");
}

/// Every rank sends to and receives from both ring neighbours (the docs' neighbor exchange),
/// a different size each way.
fn neighbor_exchange(ranks: &Ranks) {
    let n = ranks.comms.len();
    let i32t = DataType::Int32;
    let nb = |r: usize| [(r + n - 1) % n, (r + 1) % n];
    let mut bufs = Vec::new();
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        let s = ranks.streams[r];
        for (k, peer) in nb(r).into_iter().enumerate() {
            let out = alloc_with(ranks, r, &payload(r, peer, len(r, peer)));
            let inb = alloc_with(ranks, r, &vec![POISON; len(peer, r)]);
            c.send(out.ptr, len(r, peer), i32t, peer, s).unwrap();
            c.recv(inb.ptr, len(peer, r), i32t, peer, s).unwrap();
            bufs.push((r, k, peer, out, inb));
        }
    }
    nccl::group_end().unwrap();
    sync(ranks);
    for (r, k, peer, _, inb) in &bufs {
        // With two ranks both neighbours are the same peer: its two messages arrive in order.
        let got = read(inb, len(*peer, *r));
        assert_eq!(
            got,
            payload(*peer, *r, len(*peer, *r)),
            "rank {r} from neighbour {k}"
        );
    }
}

#[test]
fn scatter_and_gather_from_every_root() {
    for n in [2usize, 3, 5] {
        let ranks = sim_comms(n);
        for root in [0, n - 1, n / 2] {
            scatter_gather(&ranks, root);
        }
    }
}

#[test]
fn neighbor_exchange_on_2_4_and_8_ranks() {
    for n in [2usize, 4, 8] {
        let ranks = sim_comms(n);
        neighbor_exchange(&ranks);
        neighbor_exchange(&ranks); // the connections again, with their step counters
    }
}
