//! Communicator lifecycle on the simulator: creation (bootstrap-backed init as threads and as
//! processes, configs, several roots, non-blocking, inside groups), split, finalize, destroy,
//! Drop.

use crate::common::{self, check_all_reduce, procs, Drive, Ranks, LOOPBACK};
use nccl::{Comm, Config, DataType, Device, NcclResult, ReduceOp, UniqueId};
use std::time::{Duration, Instant};

fn dev(i: usize) -> Device {
    common::sim_dev(i)
}

/// 16 simulated GPUs (every rank of a communicator needs a device of its own), in a child
/// process started so.
const SIXTEEN: &[(&str, &str)] = &[("NCCL_RS_SIM_DEVICES", "16")];

/// Runs `f(rank)` on a thread per rank and returns the results in rank order.
fn per_rank<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..n).map(|r| s.spawn(move || f(r))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Runs `f(rank, item)` for every rank at once, each on a thread of its own with its own
/// item (a `Comm` is `Send` but not `Sync`: each thread gets `&mut` its own).
fn each_rank<C: Send, T: Send>(items: &mut [C], f: impl Fn(usize, &mut C) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = items
            .iter_mut()
            .enumerate()
            .map(|(r, c)| s.spawn(move || f(r, c)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

fn sum_ok(comms: Vec<Comm>, count: usize) {
    let ranks = Ranks::new(comms);
    check_all_reduce(
        &ranks,
        count,
        DataType::Float32,
        ReduceOp::SUM,
        false,
        count as u64,
        Drive::ThreadPerRank,
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn init_rank_config_as_threads() {
    procs::isolated(SIXTEEN, &[], || {
        common::sim();
        for n in [2usize, 5, 16] {
            let id = common::loopback_id();
            let mut config = Config::default();
            config.max_ctas = Some(1);
            config.comm_name = Some(format!("threads-{n}"));
            let t = Instant::now();
            let comms: Vec<Comm> = per_rank(n, |r| {
                Comm::init_rank_config_on(dev(r), n, &id, r, &config).expect("init")
            });
            eprintln!("{n} ranks as threads: init in {:?}", t.elapsed());
            for (r, c) in comms.iter().enumerate() {
                assert_eq!((c.rank(), c.user_rank(), c.count()), (r, r, n));
                assert_eq!(c.cu_device(), r as i32);
                assert_eq!(c.shape().nchannels, 1, "maxCTAs bounds the channels");
                assert_eq!(
                    c.config().comm_name.as_deref(),
                    Some(&*format!("threads-{n}"))
                );
                assert!(c.get_async_error().is_ok());
            }
            sum_ok(comms, 1000);
        }
    });
}

#[test]
fn min_ctas_raises_the_channels() {
    common::sim();
    let id = common::loopback_id();
    let mut config = Config::default();
    config.min_ctas = Some(3);
    config.max_ctas = Some(3);
    let comms: Vec<Comm> = per_rank(2, |r| {
        Comm::init_rank_config_on(dev(r), 2, &id, r, &config).expect("init")
    });
    assert!(comms.iter().all(|c| c.shape().nchannels == 3));
    sum_ok(comms, 70_000);
}

#[test]
fn ranks_as_processes_split_and_reduce() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        common::sim();
        let comm = Comm::init_rank_config_on(dev(rank), nranks, &id, rank, &Config::default())
            .expect("init in a child process");
        // Two children: even and odd ranks, in reverse rank order.
        let child = comm
            .split((rank % 2) as i32, -(rank as i32), None)
            .expect("split")
            .expect("a color");
        let size = nranks / 2 + (rank % 2 == 0 && nranks % 2 == 1) as usize;
        assert_eq!(child.count(), size);
        assert_eq!(child.rank(), size - 1 - rank / 2);
        let ranks = Ranks::new(vec![child]);
        check_all_reduce(
            &ranks,
            777,
            DataType::Int32,
            ReduceOp::SUM,
            true,
            5,
            Drive::OneThread,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        drop(ranks);
        comm.finalize().expect("finalize");
        comm.destroy().expect("destroy");
        return;
    }
    for n in [2usize, 4, 5] {
        common::procs::run(n, &[]);
    }
}

#[test]
fn split_colors_keys_and_nocolor() {
    procs::isolated(&[LOOPBACK], &[], || {
        common::sim();
        let n = 7;
        let mut parents: Vec<Comm> = {
            let id = common::loopback_id();
            per_rank(n, |r| Comm::init_rank_on(dev(r), n, &id, r).expect("init"))
        };
        // Rank 6 joins nothing; colors 0 and 1 alternate; keys reverse the order within a color,
        // with a tie between ranks 0 and 2 (broken by parent rank).
        let color = |r: usize| {
            if r == 6 {
                nccl::SPLIT_NOCOLOR
            } else {
                (r % 2) as i32
            }
        };
        let key = |r: usize| if r == 2 { 10 } else { 10 - r as i32 };
        let children: Vec<Option<Comm>> = each_rank(&mut parents, |r, p| {
            p.split(color(r), key(r), None).expect("split")
        });
        assert!(children[6].is_none());
        // Color 0: ranks 0 (key 10), 2 (key 10), 4 (key 6) -> order 4, 0, 2.
        let want: [(usize, usize); 6] = [(1, 3), (2, 3), (2, 3), (1, 3), (0, 3), (0, 3)];
        for (r, (rank, count)) in want.iter().enumerate() {
            let c = children[r].as_ref().expect("child");
            assert_eq!((c.rank(), c.count()), (*rank, *count), "parent rank {r}");
            assert_eq!(c.cu_device(), r as i32, "same device as the parent");
        }
        let mut by_color: [Vec<(usize, Comm)>; 2] = [Vec::new(), Vec::new()];
        for (r, c) in children.into_iter().enumerate() {
            if let Some(c) = c {
                by_color[r % 2].push((c.rank(), c));
            }
        }
        for mut v in by_color {
            v.sort_by_key(|(r, _)| *r);
            sum_ok(v.into_iter().map(|(_, c)| c).collect(), 4099);
        }
        // The parents still work after the split.
        sum_ok(parents, 333);
    });
}

#[test]
fn invalid_color_fails_without_blocking_the_others() {
    procs::isolated(&[LOOPBACK], &[], || {
        common::sim();
        let id = common::loopback_id();
        let mut parents: Vec<Comm> =
            per_rank(3, |r| Comm::init_rank_on(dev(r), 3, &id, r).expect("init"));
        let res = each_rank(&mut parents, |r, p| {
            p.split(if r == 1 { -5 } else { 0 }, 0, None)
        });
        for (r, x) in res.into_iter().enumerate() {
            if r == 1 {
                assert_eq!(x.unwrap_err().code, NcclResult::InvalidArgument);
            } else {
                assert_eq!(x.expect("split").expect("child").count(), 2);
            }
        }
    });
}

#[test]
fn scalable_init_with_four_roots() {
    procs::isolated(SIXTEEN, &[], || {
        common::sim();
        let n = 10;
        let ids: Vec<UniqueId> = (0..4).map(|_| common::loopback_id()).collect();
        let comms: Vec<Comm> = per_rank(n, |r| {
            Comm::init_rank_scalable_on(dev(r), n, r, &ids, &Config::default()).expect("init")
        });
        sum_ok(comms, 5000);
        // More ids than ranks is an argument error, at once.
        let e = Comm::init_rank_scalable_on(dev(0), 2, 0, &ids, &Config::default()).unwrap_err();
        assert_eq!(e.code, NcclResult::InvalidArgument);
    });
}

#[test]
fn nonblocking_init_polled_to_completion() {
    common::sim();
    let n = 4;
    let id = common::loopback_id();
    let config = Config::blocking(false);
    // One thread starts every rank: only non-blocking creation makes that possible.
    let pending: Vec<_> = (0..n)
        .map(|r| Comm::start_init_rank_config_on(dev(r), n, &id, r, &config).expect("start"))
        .collect();
    // A bound that only turns a hang into a failure.
    procs::wait_until("the non-blocking inits complete", procs::limit(), || {
        pending.iter().all(|p| p.state() != NcclResult::InProgress)
    });
    let comms: Vec<Comm> = pending
        .iter()
        .map(|p| {
            assert_eq!(p.state(), NcclResult::Success);
            p.try_take().expect("done").expect("init")
        })
        .collect();
    assert!(pending[0].try_take().is_none(), "taken once");
    sum_ok(comms, 100);
}

#[test]
fn blocking_inits_inside_a_group_run_at_its_end() {
    common::sim();
    let n = 3;
    let id = common::loopback_id();
    nccl::group_start();
    let pending: Vec<_> = (0..n)
        .map(|r| {
            Comm::start_init_rank_config_on(dev(r), n, &id, r, &Config::blocking(true))
                .expect("start")
        })
        .collect();
    assert!(pending.iter().all(|p| p.state() == NcclResult::InProgress));
    nccl::group_end().expect("group end creates the communicators");
    let comms: Vec<Comm> = pending.iter().map(|p| p.wait().expect("init")).collect();
    sum_ok(comms, 64);
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn finalize_then_destroy_and_drop() {
    procs::isolated(&[], &[], || {
        common::sim();
        let n = 3;
        let id = common::loopback_id();
        let mut comms: Vec<Comm> =
            per_rank(n, |r| Comm::init_rank_on(dev(r), n, &id, r).expect("init"));
        let bufs: Vec<_> = comms
            .iter()
            .map(|c| c.device().alloc(4096).expect("alloc"))
            .collect();
        each_rank(&mut comms, |r, c| {
            let c = &*c;
            unsafe {
                c.all_reduce_raw(
                    bufs[r].ptr(),
                    bufs[r].ptr(),
                    1024,
                    DataType::Float32,
                    ReduceOp::SUM,
                    Default::default(),
                )
            }
            .expect("all_reduce");
            // finalize waits for the streams the communicator saw; until enqueue reports its
            // launches (Comm::note_stream), wait here for this one.
            c.device().stream_sync(Default::default()).expect("sync");
            c.finalize().expect("finalize");
            assert!(c.is_finalized());
            let e = unsafe {
                c.all_reduce_raw(
                    bufs[r].ptr(),
                    bufs[r].ptr(),
                    1,
                    DataType::Float32,
                    ReduceOp::SUM,
                    Default::default(),
                )
            }
            .unwrap_err();
            assert_eq!(e.code, NcclResult::InvalidUsage);
            assert_eq!(c.finalize().unwrap_err().code, NcclResult::InvalidUsage);
        });
        let mut comms = comms;
        let last = comms.pop().expect("a comm");
        last.destroy().expect("destroy");
        drop(comms); // Drop destroys the others
        drop(bufs);
    });
}

#[test]
fn several_communicators_per_device_used_concurrently() {
    common::sim();
    let n = 2;
    let (a, b) = (common::loopback_id(), common::loopback_id());
    let first: Vec<Comm> = per_rank(n, |r| Comm::init_rank_on(dev(r), n, &a, r).expect("init"));
    let second: Vec<Comm> = per_rank(n, |r| Comm::init_rank_on(dev(r), n, &b, r).expect("init"));
    std::thread::scope(|s| {
        s.spawn(|| sum_ok(first, 3000));
        s.spawn(|| sum_ok(second, 3001));
    });
}

#[test]
fn shrink_renumbers_the_ranks_left_and_keeps_the_parent() {
    procs::isolated(&[LOOPBACK], &[], || {
        common::sim();
        let n = 5;
        let id = common::loopback_id();
        let mut parents: Vec<Comm> =
            per_rank(n, |r| Comm::init_rank_on(dev(r), n, &id, r).expect("init"));
        // Ranks 1 and 3 leave (listed out of order); they do not call shrink.
        let exclude = [3usize, 1];
        let children: Vec<Option<Comm>> = each_rank(&mut parents, |r, p| {
            (!exclude.contains(&r)).then(|| {
                p.shrink(&exclude, None, nccl::SHRINK_DEFAULT)
                    .expect("shrink")
            })
        });
        let children: Vec<Comm> = children.into_iter().flatten().collect();
        for (i, (c, parent)) in children.iter().zip([0, 2, 4]).enumerate() {
            assert_eq!((c.rank(), c.count()), (i, 3), "parent rank {parent}");
            assert_eq!(c.cu_device(), parent, "same device as the parent");
        }
        sum_ok(children, 4099);
        // NCCL_SHRINK_DEFAULT leaves the parent whole.
        sum_ok(parents, 333);
    });
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn shrink_with_abort_leaves_a_dead_rank_behind() {
    procs::isolated(&[LOOPBACK], &[], || {
        common::sim();
        let n = 4;
        let id = common::loopback_id();
        let mut parents: Vec<Comm> =
            per_rank(n, |r| Comm::init_rank_on(dev(r), n, &id, r).expect("init"));
        let dead = 2;
        parents[dead].abort();
        // The others start an AllReduce that waits on the dead rank forever, then shrink it away:
        // NCCL_SHRINK_ABORT stops that AllReduce first.
        let bufs: Vec<_> = (0..n).map(|r| dev(r).alloc(4096 * 4).unwrap()).collect();
        let children: Vec<Option<Comm>> = each_rank(&mut parents, |r, p| {
            if r == dead {
                return None;
            }
            let p = &*p;
            unsafe {
                p.all_reduce_raw(
                    bufs[r].ptr(),
                    bufs[r].ptr(),
                    4096,
                    DataType::Float32,
                    ReduceOp::SUM,
                    Default::default(),
                )
            }
            .expect("launch");
            let child = p.shrink(&[dead], None, nccl::SHRINK_ABORT).expect("shrink");
            // The stopped parent takes no new work.
            let again = unsafe {
                p.all_reduce_raw(
                    bufs[r].ptr(),
                    bufs[r].ptr(),
                    1,
                    DataType::Float32,
                    ReduceOp::SUM,
                    Default::default(),
                )
            };
            assert_eq!(again.unwrap_err().code, NcclResult::InvalidUsage);
            Some(child)
        });
        for r in 0..n {
            if r != dead {
                dev(r)
                    .stream_sync(Default::default())
                    .expect("the stopped AllReduce returns");
            }
        }
        sum_ok(children.into_iter().flatten().collect(), 1000);
    });
}

#[test]
fn shrink_rejects_bad_lists_and_flags() {
    procs::isolated(&[LOOPBACK], &[], || {
        common::sim();
        let id = common::loopback_id();
        let parents: Vec<Comm> =
            per_rank(3, |r| Comm::init_rank_on(dev(r), 3, &id, r).expect("init"));
        let p = &parents[0];
        let bad = NcclResult::InvalidArgument;
        let code = |r: nccl::Result<Comm>| r.map(|_| ()).unwrap_err().code;
        assert_eq!(code(p.shrink(&[0], None, 0)), bad, "excludes itself");
        assert_eq!(code(p.shrink(&[3], None, 0)), bad, "out of range");
        assert_eq!(code(p.shrink(&[1, 1], None, 0)), bad, "twice");
        assert_eq!(code(p.shrink(&[1], None, 2)), bad, "unknown flag");
        // Nothing was sent: the parent still works.
        sum_ok(parents, 100);
    });
}

/// Two non-blocking splits issued back to back, as PyTorch's new_group does for its groups
/// ({0, 3} then {1, 2}, every rank calling both, no wait in between): their agreements run on
/// background threads, yet must not interleave over the parent's bootstrap (on 4 H200-sharing
/// processes they did: "split: rank 0 sent a malformed color/key record"). A shrink follows.
#[test]
fn back_to_back_nonblocking_splits_keep_their_order() {
    procs::isolated(&[LOOPBACK], &[], || {
        common::sim();
        let n = 4;
        for round in 0..5 {
            let id = common::loopback_id();
            let cfg = Config::blocking(false);
            let mut parents: Vec<Option<Comm>> = per_rank(n, |r| {
                Some(Comm::init_rank_config_on(dev(r), n, &id, r, &cfg).expect("init"))
            });
            for p in parents.iter().flatten() {
                while p.async_state() == NcclResult::InProgress {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let groups = [[0usize, 3], [1, 2]];
            // An Arc<Comm> stays on its thread (a Comm is not Sync): each rank's thread wraps
            // its own parent.
            let children: Vec<Vec<Comm>> = each_rank(&mut parents, |r, p| {
                // start_split takes an Arc (the split may outlive this call); it stays here.
                #[allow(clippy::arc_with_non_send_sync)]
                let parent = std::sync::Arc::new(p.take().expect("a parent"));
                let mut pending = Vec::new();
                for g in &groups {
                    let color = if g.contains(&r) {
                        0
                    } else {
                        nccl::SPLIT_NOCOLOR
                    };
                    pending.push(Comm::start_split(&parent, color, r as i32, None).expect("split"));
                }
                // Also a shrink of rank 1, right behind them, by the others.
                let shrunk = (r != 1).then(|| {
                    Comm::start_shrink(&parent, &[1], None, nccl::SHRINK_DEFAULT).expect("shrink")
                });
                pending
                    .into_iter()
                    .flatten()
                    .chain(shrunk)
                    .map(|p| {
                        p.wait()
                            .unwrap_or_else(|e| panic!("round {round} rank {r}: {e}"))
                    })
                    .collect()
            });
            for (r, cs) in children.iter().enumerate() {
                let counts: Vec<usize> = cs.iter().map(|c| c.count()).collect();
                let want = if r == 1 { vec![2] } else { vec![2, 3] };
                assert_eq!(counts, want, "round {round} rank {r}");
            }
        }
    });
}

/// ncclCommGrow (NCCL 2.29): 2 ranks become 4. Rank 0 makes the grow id; ranks 0 and 1 grow
/// (rank 0 with the id), ranks 2 and 3 join with it on devices of their own. The grown
/// communicator's ranks are the old ones first; AllReduce is right on it, and on the old one
/// after it. Bad calls: no rank or every rank passing the id (both refused, on every old rank
/// alike), a size not larger.
#[test]
fn grow_from_two_ranks_to_four() {
    procs::isolated(&[LOOPBACK], &[], || {
        common::sim();
        let id = common::loopback_id();
        let mut old: Vec<Comm> =
            per_rank(2, |r| Comm::init_rank_on(dev(r), 2, &id, r).expect("init"));
        let refused = |ids: [Option<UniqueId>; 2], n: usize, old: &mut [Comm]| {
            each_rank(old, |r, c| {
                c.grow(n, ids[r].as_ref(), None).err().map(|e| e.code)
            })
        };
        let grow_id = old[0].grow_unique_id().expect("a grow id");
        let usage = Some(NcclResult::InvalidUsage);
        assert_eq!(refused([None, None], 4, &mut old), [usage; 2], "no id");
        assert_eq!(
            refused([Some(grow_id), Some(grow_id)], 4, &mut old),
            [usage; 2],
            "two ids"
        );
        assert_eq!(
            refused([Some(grow_id), None], 2, &mut old),
            [Some(NcclResult::InvalidArgument); 2],
            "not larger"
        );
        // The ranks disagree on the size, or one fails its own checks: every rank hears of
        // it (none waits for the others).
        let sizes = each_rank(&mut old, |r, c| {
            c.grow(4 + r, (r == 0).then_some(&grow_id), None)
                .err()
                .map(|e| e.code)
        });
        assert_eq!(
            sizes,
            [Some(NcclResult::InvalidArgument); 2],
            "sizes differ"
        );
        let one_bad = each_rank(&mut old, |r, c| {
            let mut bad = Config::default();
            bad.min_ctas = (r == 1).then_some(0);
            c.grow(4, (r == 0).then_some(&grow_id), Some(&bad))
                .err()
                .map(|e| e.code)
        });
        assert_eq!(
            one_bad,
            [
                Some(NcclResult::InvalidUsage),
                Some(NcclResult::InvalidArgument)
            ],
            "rank 1's config is bad"
        );
        let mut slots: Vec<Option<Comm>> = old.into_iter().map(Some).chain([None, None]).collect();
        let grown: Vec<(Comm, Option<Comm>)> = each_rank(&mut slots, |r, slot| match slot.take() {
            Some(c) => {
                let g = c
                    .grow(4, (r == 0).then_some(&grow_id), None)
                    .expect("grow an old rank");
                (g, Some(c))
            }
            None => {
                let g = Comm::init_rank_config_on(dev(r), 4, &grow_id, r, &Config::default())
                    .expect("a new rank joins");
                (g, None)
            }
        });
        let (grown, old): (Vec<Comm>, Vec<Option<Comm>>) = grown.into_iter().unzip();
        for (r, c) in grown.iter().enumerate() {
            assert_eq!((c.rank(), c.count(), c.cu_device()), (r, 4, r as i32));
        }
        sum_ok(grown, 4099);
        sum_ok(old.into_iter().flatten().collect(), 1001);
    });
}
