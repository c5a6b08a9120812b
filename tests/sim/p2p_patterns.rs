//! The point-to-point patterns of NCCL's documentation, built from ncclSend/ncclRecv in groups,
//! on the simulator: one-to-all (scatter), all-to-one (gather) and neighbor exchange, with
//! roots other than 0, a different size per peer and direction (some far larger than the
//! FIFO, so senders wait for credit and wrap it), poisoned outputs with a poisoned tail that
//! must survive, one thread driving every rank.

use crate::common::{self, from_bytes, to_bytes, Ranks};
use nccl::{DataType, DevBuffer};

/// What rank `from` sends to rank `to` (message `k` of the pair): `len` int32 values unique to
/// the message.
fn payload(from: usize, to: usize, len: usize) -> Vec<i32> {
    payload_k(from, to, 0, len)
}

fn payload_k(from: usize, to: usize, k: usize, len: usize) -> Vec<i32> {
    (0..len)
        .map(|j| (((from * 64 + to) * 2 + k) << 20 | j) as i32)
        .collect()
}

/// Sizes from 1 to 45000 int32 (176 KiB, many times the simulator's FIFO).
fn len(from: usize, to: usize) -> usize {
    1 + (from * 37 + to * 101) % 3000
        + if (from + to).is_multiple_of(3) {
            42_000
        } else {
            0
        }
}

/// Poisoned values after every receive buffer's `len`: a write past the message shows here.
const TAIL: usize = 16;

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

/// A receive buffer of `n` values and a tail, all poisoned.
fn poisoned(ranks: &Ranks, r: usize, n: usize) -> DevBuffer {
    alloc_with(ranks, r, &vec![POISON; n + TAIL])
}

/// The first `n` values of a [`poisoned`] buffer, after checking its tail.
fn read_received(b: &DevBuffer, n: usize, what: &str) -> Vec<i32> {
    let all = read(b, n + TAIL);
    assert!(
        all[n..].iter().all(|&v| v == POISON),
        "{what}: written past its end"
    );
    all[..n].to_vec()
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
    let dst: Vec<DevBuffer> = (0..n).map(|r| poisoned(ranks, r, len(root, r))).collect();
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        let s = ranks.streams[r];
        if r == root {
            for (q, off) in offs[..n].iter().enumerate() {
                let p = src.ptr() + (off * 4) as u64;
                unsafe { c.send_raw(p, len(root, q), i32t, q, s) }.unwrap();
            }
        }
        unsafe { c.recv_raw(dst[r].ptr(), len(root, r), i32t, root, s) }.unwrap();
    }
    nccl::group_end().unwrap();
    sync(ranks);
    for (r, d) in dst.iter().enumerate() {
        let what = format!("scatter from {root} to {r} of {n}");
        let got = read_received(d, len(root, r), &what);
        assert!(got == payload(root, r, len(root, r)), "{what}: wrong data");
    }
    // Gather: every rank's piece lands at its offset in the root's receive buffer.
    let goffs: Vec<usize> = (0..=n)
        .map(|r| (0..r).map(|q| len(q, root)).sum())
        .collect();
    let srcs: Vec<DevBuffer> = (0..n)
        .map(|r| alloc_with(ranks, r, &payload(r, root, len(r, root))))
        .collect();
    let gathered = poisoned(ranks, root, goffs[n]);
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        let s = ranks.streams[r];
        unsafe { c.send_raw(srcs[r].ptr(), len(r, root), i32t, root, s) }.unwrap();
        if r == root {
            for (q, off) in goffs[..n].iter().enumerate() {
                let p = gathered.ptr() + (off * 4) as u64;
                unsafe { c.recv_raw(p, len(q, root), i32t, q, s) }.unwrap();
            }
        }
    }
    nccl::group_end().unwrap();
    sync(ranks);
    let want: Vec<i32> = (0..n)
        .flat_map(|q| payload(q, root, len(q, root)))
        .collect();
    let what = format!("gather into {root} of {n}");
    assert!(
        read_received(&gathered, goffs[n], &what) == want,
        "{what}: wrong data"
    );
}

/// Every rank sends to and receives from both ring neighbours (the docs' neighbor exchange),
/// a different size each way. With two ranks both neighbours are one peer: its two messages
/// must arrive in the order they were posted (their contents and sizes differ).
fn neighbor_exchange(ranks: &Ranks) {
    let n = ranks.comms.len();
    let i32t = DataType::Int32;
    let nb = |r: usize| [(r + n - 1) % n, (r + 1) % n];
    let mut bufs = Vec::new();
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        let s = ranks.streams[r];
        for (k, peer) in nb(r).into_iter().enumerate() {
            // Message k to `peer` pairs with its message 1-k back to us (we are its other
            // neighbour); with two ranks, posting order pairs them instead: k with k.
            let back = if n == 2 { k } else { 1 - k };
            let (lo, li) = (len(r, peer) + 7 * k, len(peer, r) + 7 * back);
            let out = alloc_with(ranks, r, &payload_k(r, peer, k, lo));
            let inb = poisoned(ranks, r, li);
            unsafe { c.send_raw(out.ptr(), lo, i32t, peer, s) }.unwrap();
            unsafe { c.recv_raw(inb.ptr(), li, i32t, peer, s) }.unwrap();
            bufs.push((r, k, peer, back, li, out, inb));
        }
    }
    nccl::group_end().unwrap();
    sync(ranks);
    for (r, k, peer, back, li, _, inb) in &bufs {
        let what = format!("rank {r} of {n} from neighbour {k}");
        let got = read_received(inb, *li, &what);
        assert!(
            got == payload_k(*peer, *r, *back, *li),
            "{what}: wrong data"
        );
    }
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn scatter_and_gather_from_every_root() {
    for n in [2usize, 3, 5] {
        let ranks = common::sim_ranks(n);
        for root in [0, n - 1, n / 2] {
            scatter_gather(&ranks, root);
        }
    }
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn neighbor_exchange_on_2_4_and_8_ranks() {
    for n in [2usize, 4, 8] {
        let ranks = common::sim_ranks(n);
        neighbor_exchange(&ranks);
        neighbor_exchange(&ranks); // the connections again, with their step counters
    }
}

/// NCCL 2.28's `ncclAlltoAll`, `ncclGather` and `ncclScatter` ([`Comm::all_to_all`],
/// [`Comm::gather`], [`Comm::scatter`]), one thread driving every rank inside a group: blocks
/// of `count` values (odd, and larger than the FIFO), every root, out of place and in place
/// at the root, poisoned outputs with a tail that must survive.
fn nccl_2_28_patterns(ranks: &Ranks, count: usize, root: usize, in_place: bool) {
    let n = ranks.comms.len();
    let i32t = DataType::Int32;
    let block = (count * 4) as u64;
    let what =
        |op: &str| format!("{op} of {n} ranks, {count} values, root {root}, in place {in_place}");
    // All-to-all: block j of rank r's send goes to rank j.
    let sends: Vec<DevBuffer> = (0..n)
        .map(|r| {
            alloc_with(
                ranks,
                r,
                &(0..n)
                    .flat_map(|j| payload(r, j, count))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let recvs: Vec<DevBuffer> = (0..n).map(|r| poisoned(ranks, r, n * count)).collect();
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        unsafe {
            c.all_to_all_raw(
                sends[r].ptr(),
                recvs[r].ptr(),
                count,
                i32t,
                ranks.streams[r],
            )
        }
        .unwrap();
    }
    nccl::group_end().unwrap();
    sync(ranks);
    for (r, b) in recvs.iter().enumerate() {
        let want: Vec<i32> = (0..n).flat_map(|i| payload(i, r, count)).collect();
        assert!(
            read_received(b, n * count, &what("all_to_all")) == want,
            "{}: rank {r}",
            what("all_to_all")
        );
    }
    // Gather: rank i's values land at block i on the root. In place, the root's own values
    // already sit in its block of the output.
    let out = poisoned(ranks, root, n * count);
    let own = alloc_with(ranks, root, &payload(root, root, count));
    let srcs: Vec<DevBuffer> = (0..n)
        .map(|r| alloc_with(ranks, r, &payload(r, root, count)))
        .collect();
    if in_place {
        out.write(root * count * 4, to_bytes(&payload(root, root, count)))
            .unwrap();
    }
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        let send = match (r == root, in_place) {
            (true, true) => out.ptr() + root as u64 * block,
            (true, false) => own.ptr(),
            _ => srcs[r].ptr(),
        };
        unsafe { c.gather_raw(send, out.ptr(), count, i32t, root, ranks.streams[r]) }.unwrap();
    }
    nccl::group_end().unwrap();
    sync(ranks);
    let want: Vec<i32> = (0..n).flat_map(|i| payload(i, root, count)).collect();
    assert!(
        read_received(&out, n * count, &what("gather")) == want,
        "{}",
        what("gather")
    );
    // Scatter: block i of the root's input lands in rank i's output.
    let all: Vec<i32> = (0..n).flat_map(|i| payload(root, i, count)).collect();
    let src = alloc_with(ranks, root, &all);
    let dsts: Vec<DevBuffer> = (0..n).map(|r| poisoned(ranks, r, count)).collect();
    nccl::group_start();
    for (r, c) in ranks.comms.iter().enumerate() {
        let recv = if r == root && in_place {
            src.ptr() + root as u64 * block
        } else {
            dsts[r].ptr()
        };
        unsafe { c.scatter_raw(src.ptr(), recv, count, i32t, root, ranks.streams[r]) }.unwrap();
    }
    nccl::group_end().unwrap();
    sync(ranks);
    for (r, d) in dsts.iter().enumerate() {
        if r == root && in_place {
            assert!(
                read(&src, n * count) == all,
                "{}: the root's input changed",
                what("scatter")
            );
            continue;
        }
        let got = read_received(d, count, &what("scatter"));
        assert!(
            got == payload(root, r, count),
            "{}: rank {r}",
            what("scatter")
        );
    }
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn nccl_2_28_all_to_all_gather_and_scatter() {
    for n in [2usize, 3, 4] {
        let ranks = common::sim_ranks(n);
        for (count, root, in_place) in [
            (1usize, 0, false),
            (20_011, n - 1, false),
            (777, n / 2, true),
        ] {
            nccl_2_28_patterns(&ranks, count, root, in_place);
        }
    }
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn nccl_2_28_patterns_reject_bad_arguments() {
    let ranks = common::sim_ranks(2);
    let (c, s) = (&ranks.comms[0], ranks.streams[0]);
    let b = poisoned(&ranks, 0, 64);
    let code = |r: nccl::Result<()>| r.unwrap_err().code;
    let bad = nccl::NcclResult::InvalidArgument;
    assert_eq!(
        code(unsafe { c.all_to_all_raw(b.ptr(), b.ptr(), 8, DataType::Int32, s) }),
        bad,
        "in place"
    );
    assert_eq!(
        code(unsafe { c.gather_raw(b.ptr(), b.ptr(), 8, DataType::Int32, 2, s) }),
        bad,
        "root"
    );
    assert_eq!(
        code(unsafe { c.scatter_raw(b.ptr(), b.ptr(), 8, DataType::Int32, 5, s) }),
        bad,
        "root"
    );
    assert_eq!(
        code(unsafe { c.all_to_all_raw(b.ptr(), 0, usize::MAX / 2, DataType::Int32, s) }),
        bad,
        "size"
    );
}
