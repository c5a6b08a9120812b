//! Copy-engine collectives (`comm/copy_engine.rs`, NCCL 2.28's `NCCL_CTA_POLICY_ZERO`) on the
//! simulator: with CTAPolicy zero (NCCL_CTA_POLICY=2 in an isolated child), AllGather and
//! AlltoAll whose receive buffers lie in a symmetric window run as copies and signals, no
//! kernel; out of a window they keep their kernels; ranks in one process and as processes.

use crate::common::windows::{collective_at, symmetric_windows};
use crate::common::{self, from_bytes, lend, to_bytes, Ranks};
use nccl::{Coll, DataType, DevBuffer};

const ZERO: &[(&str, &str)] = &[("NCCL_CTA_POLICY", "2")];

fn copy_engine_launches(ranks: &Ranks) -> u64 {
    ranks.comms.iter().map(|c| c.copy_engine_launches()).sum()
}

/// One AlltoAll of `count` f32 per block from `send[i]` into `recv[i]`, checked on every rank.
fn all_to_all_at(ranks: &Ranks, send: &[u64], recv: &[u64], count: usize, seed: usize) {
    let n = ranks.comms[0].count();
    let value =
        |from: usize, to: usize, j: usize| (seed * 7 + from * 1000 + to * 100 + j % 89) as f32;
    for (i, c) in ranks.comms.iter().enumerate() {
        let me = c.rank();
        let input: Vec<f32> = (0..n * count)
            .map(|k| value(me, k / count, k % count))
            .collect();
        let d = c.device();
        // SAFETY: the test's buffers, idle.
        unsafe {
            d.copy_htod_raw(send[i], to_bytes(&input)).unwrap();
            d.copy_htod_raw(recv[i], &vec![0xA5; n * count * 4])
                .unwrap();
        }
    }
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for (i, c) in lent.iter().enumerate() {
            let (sp, rp, st) = (send[i], recv[i], ranks.streams[i]);
            s.spawn(move || {
                // SAFETY: the test's buffers, alive until the synchronization below.
                unsafe { c.all_to_all_raw(sp, rp, count, DataType::Float32, st) }.unwrap();
                c.device().stream_sync(st).unwrap();
            });
        }
    });
    for (i, c) in ranks.comms.iter().enumerate() {
        let me = c.rank();
        let mut out = vec![0u8; n * count * 4];
        // SAFETY: as above.
        unsafe { c.device().copy_dtoh_raw(&mut out, recv[i]).unwrap() };
        let got: Vec<f32> = from_bytes(&out);
        let want: Vec<f32> = (0..n * count)
            .map(|k| value(k / count, me, k % count))
            .collect();
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            bad.is_none(),
            "AlltoAll rank {me}: element {bad:?} wrong (seed {seed})"
        );
    }
}

/// AllGather and AlltoAll into symmetric windows, several rounds alternating (the handshake's
/// counts go on), sends from plain buffers and from the window itself (AllGather in place);
/// into plain buffers they keep their kernels.
fn copy_engine_cases(ranks: &Ranks) {
    let n = ranks.comms[0].count();
    let local = ranks.comms.len() as u64;
    let count = 3001;
    let bytes = 2 * n * count * 4 + 512;
    let windows = symmetric_windows(&ranks.comms, bytes);
    let plain: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(bytes).unwrap())
        .collect();
    let at = |b: &[DevBuffer], off: usize| -> Vec<u64> {
        b.iter().map(|b| b.ptr() + off as u64).collect()
    };
    for round in 0..3 {
        let before = copy_engine_launches(ranks);
        collective_at(
            ranks,
            Coll::AllGather,
            &at(&plain, 0),
            &at(&windows, 256),
            count,
            round,
        );
        let in_place: Vec<u64> = ranks
            .comms
            .iter()
            .zip(&windows)
            .map(|(c, w)| w.ptr() + 256 + (c.rank() * count * 4) as u64)
            .collect();
        collective_at(
            ranks,
            Coll::AllGather,
            &in_place,
            &at(&windows, 256),
            count,
            round + 10,
        );
        all_to_all_at(
            ranks,
            &at(&plain, 0),
            &at(&windows, 256),
            count,
            round as usize,
        );
        assert_eq!(
            copy_engine_launches(ranks),
            before + 3 * local,
            "round {round}"
        );
    }
    let before = copy_engine_launches(ranks);
    let half = n * count * 4 + 256; // room for the guards around the output
    collective_at(
        ranks,
        Coll::AllGather,
        &at(&windows, 256),
        &at(&plain, half),
        count,
        99,
    );
    all_to_all_at(ranks, &at(&windows, 256), &at(&plain, half), count, 98);
    assert_eq!(
        copy_engine_launches(ranks),
        before,
        "plain receive buffers took the copy engines"
    );
}

#[test]
fn all_gather_and_all_to_all_on_the_copy_engines() {
    common::procs::isolated(ZERO, &[], || {
        common::sim();
        for n in [2, 4] {
            copy_engine_cases(&common::sim_ranks(n));
        }
    });
}

#[test]
fn copy_engine_collectives_between_processes() {
    let Some((rank, nranks, id)) = common::procs::child() else {
        common::sim();
        common::procs::run(3, ZERO);
        return;
    };
    let comm = nccl::Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).unwrap();
    copy_engine_cases(&Ranks::new(vec![comm]));
}
