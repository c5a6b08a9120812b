//! LL sessions of the device API (`DevComm::ll_a2a`) on the simulator: every rank sends every
//! rank (itself included) its own values through several blocks, epochs within a launch and
//! across launches (both halves of every block, reused), and checks each value it receives;
//! an abort ends a receive no peer will satisfy; bad requirements and a slot past the
//! requested ones get clear errors.

use crate::common::{self, lend};
use nccl::{DevCommRequirements, NcclResult};
use nccl_device::api::DevComm;
use nccl_device::arch;

/// The value rank `from` sends rank `to` as line `slot` of block `block` in epoch `epoch`.
fn value(seed: u64, epoch: u64, block: u32, from: u32, to: u32, slot: usize) -> u64 {
    let x = seed ^ epoch << 56 ^ (block as u64) << 48 ^ (from as u64) << 40 ^ (to as u64) << 32;
    (x ^ slot as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[derive(Clone, Copy)]
struct ExchangeArgs {
    comm: DevComm,
    seed: u64,
    /// The epoch the launch starts at (the blocks' counts carry on across launches).
    first_epoch: u64,
    /// Device words: values that arrived wrong, and values received.
    wrong: u64,
    received: u64,
}

const EPOCHS_PER_LAUNCH: u64 = 3;

/// CTA `b` runs [`EPOCHS_PER_LAUNCH`] epochs of block `b`: in each, every thread sends its
/// slots to every rank (odd epochs one `send` per peer, even ones `bcast` of a value that
/// does not depend on the receiver), then receives every rank's and counts the wrong ones.
unsafe fn exchange(a: &ExchangeArgs) {
    let c = &a.comm;
    let block = arch::block_idx();
    let (mut wrong, mut received) = (0, 0);
    for e in 0..EPOCHS_PER_LAUNCH {
        let epoch = a.first_epoch + e;
        let bcast = epoch.is_multiple_of(2);
        let mut ll = c.ll_a2a(block);
        let want = |from: u32, to: u32, slot: usize| match bcast {
            true => value(a.seed, epoch, block, from, u32::MAX, slot),
            false => value(a.seed, epoch, block, from, to, slot),
        };
        let slots = (arch::thread_idx() as usize..ll.slots()).step_by(arch::block_dim() as usize);
        for slot in slots.clone() {
            match bcast {
                true => ll.bcast(slot, want(c.lsa_rank, 0, slot)),
                false => {
                    for to in 0..c.lsa_size {
                        ll.send(to, slot, want(c.lsa_rank, to, slot));
                    }
                }
            }
        }
        for slot in slots {
            for from in 0..c.lsa_size {
                let v = ll.recv(from, slot).expect("not aborted");
                wrong += (v != want(from, c.lsa_rank, slot)) as u64;
                received += 1;
            }
        }
        ll.end();
    }
    arch::atomic_add_u64(a.wrong as *mut u64, wrong);
    arch::atomic_add_u64(a.received as *mut u64, received);
}

/// In a child process, so that a hang (a line that never arrives) fails at the limit.
#[test]
fn ll_sessions_carry_every_rank_s_values() {
    common::procs::isolated(&[], &[], every_rank_s_values);
}

fn every_rank_s_values() {
    common::sim();
    let (blocks, slots, block_dim) = (3u32, 40u32, 16u32);
    for n in [2usize, 4, 8] {
        let ranks = common::sim_ranks(n);
        let lent = lend(&ranks.comms);
        let req = DevCommRequirements {
            ll_blocks: blocks,
            ll_slots: slots,
        };
        std::thread::scope(|s| {
            for (i, c) in lent.iter().enumerate() {
                let st = ranks.streams[i];
                s.spawn(move || {
                    let dc = c.dev_comm(req).unwrap();
                    let counts = c.device().alloc(16).unwrap();
                    counts.write(0, &[0u8; 16]).unwrap();
                    for launch in 0..2 {
                        let args = ExchangeArgs {
                            comm: dc.get(),
                            seed: 0x5EED + n as u64,
                            first_epoch: 1 + launch * EPOCHS_PER_LAUNCH,
                            wrong: counts.ptr(),
                            received: counts.ptr() + 8,
                        };
                        // SAFETY (inside): the device communicator and the counts outlive
                        // the kernels (drained below); every rank launches the same grids.
                        c.device()
                            .launch_on_simulator(blocks, block_dim, st, move || unsafe {
                                exchange(&args)
                            })
                            .unwrap();
                    }
                    c.device().stream_sync(st).unwrap();
                    let mut got = [0u8; 16];
                    counts.read(0, &mut got).unwrap();
                    let words: Vec<u64> = common::from_bytes(&got);
                    let expected = 2 * EPOCHS_PER_LAUNCH * (blocks * slots) as u64 * n as u64;
                    assert_eq!(
                        (words[0], words[1]),
                        (0, expected),
                        "rank {i} of {n}: (wrong, received)"
                    );
                });
            }
        });
    }
}

/// Rank 0 waits for a line rank 1 never sends; the abort ends the wait with `Aborted`.
#[test]
fn an_abort_ends_an_ll_receive() {
    let req = DevCommRequirements {
        ll_blocks: 1,
        ll_slots: 1,
    };
    // SAFETY: the communicator outlives the kernel (`an_abort_ends`).
    crate::device_api::an_abort_ends("an LL receive", req, |comm| unsafe {
        comm.ll_a2a(0).recv(1, 0).is_err()
    });
}

/// Requirements that differ between ranks or do not fit are refused on every rank; a slot
/// past the requested ones stops the kernel with a message on the simulator.
#[test]
fn bad_ll_requirements_and_slots_are_refused() {
    common::sim();
    let ranks = common::sim_ranks(2);
    let lent = lend(&ranks.comms);
    let asks = |req: [DevCommRequirements; 2]| -> Vec<NcclResult> {
        std::thread::scope(|s| {
            let hs: Vec<_> = lent
                .iter()
                .zip(req)
                .map(|(c, r)| s.spawn(move || c.dev_comm(r).err().map(|e| e.code)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap().expect("refused"))
                .collect()
        })
    };
    let small = DevCommRequirements {
        ll_blocks: 2,
        ll_slots: 8,
    };
    let other = DevCommRequirements {
        ll_slots: 9,
        ..small
    };
    assert_eq!(asks([small, other]), [NcclResult::InvalidUsage; 2]);
    let huge = DevCommRequirements {
        ll_blocks: 1 << 16,
        ll_slots: 1 << 16,
    };
    assert_eq!(asks([huge, huge]), [NcclResult::InvalidArgument; 2]);

    let single = common::sim_ranks(1);
    let (c1, st) = (&single.comms[0], single.streams[0]);
    let dc = c1.dev_comm(small).unwrap();
    let comm = dc.get();
    c1.device()
        .launch_on_simulator(1, 4, st, move || {
            // SAFETY: deliberately past the slots: the simulator must stop it.
            unsafe { comm.ll_a2a(0).send(0, 8, 1) };
        })
        .unwrap();
    let e = c1
        .device()
        .stream_sync(st)
        .expect_err("a slot past ll_slots");
    assert!(e.message.contains("LL slot past"), "{e}");
}
