//! What device memory a communicator holds (`Comm::device_memory`, `ncclCommMemStats`): what
//! it allocated and has not freed, counted as it goes. A one-rank communicator holds no FIFO
//! or network buffers; a device communicator's area is counted while it lives and given back
//! when it drops; a symmetric window's state (made at the first) stays while the communicator
//! does; what the user allocates through `Comm::device` is not the communicator's.

use crate::common::windows::register_all;
use crate::common::{self, lend};
use nccl::DevCommRequirements;

#[test]
fn a_communicator_counts_what_it_holds() {
    common::sim();
    let one = common::sim_ranks(1);
    let small = one.comms[0].device_memory();
    let two = common::sim_ranks(2);
    let held: Vec<usize> = two.comms.iter().map(|c| c.device_memory()).collect();
    println!("device memory: 1 rank {small} bytes, 2 ranks {held:?}");
    assert!(
        small < 64 << 10,
        "one rank holds {small} bytes: no FIFO buffers"
    );
    assert!(
        held.iter().all(|&h| h > small),
        "two ranks' connections: {held:?}"
    );

    // The user's buffer is not the communicator's.
    let c = &two.comms[0];
    let user = c.device().alloc(1 << 20).unwrap();
    assert_eq!(c.device_memory(), held[0], "a user's allocation counted");

    // A device communicator's area while it lives (made by both ranks at once).
    let lent = lend(&two.comms);
    let req = DevCommRequirements {
        ll_blocks: 4,
        ll_slots: 64,
    };
    std::thread::scope(|s| {
        for (r, c) in lent.iter().enumerate() {
            let before = held[r];
            s.spawn(move || {
                let dc = c.dev_comm(req).unwrap();
                let during = c.device_memory();
                assert!(
                    during > before,
                    "rank {r}: a device communicator's area uncounted"
                );
                drop(dc);
                assert_eq!(
                    c.device_memory(),
                    before,
                    "rank {r}: its area not given back"
                );
            });
        }
    });

    // A window's one-sided state (the first window), then a symmetric window's state: both
    // stay with the communicator after their windows go.
    let bufs: Vec<_> = two
        .comms
        .iter()
        .map(|c| c.device().alloc(4096).unwrap())
        .collect();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    let plain = register_all(&two.comms, &ptrs, &[4096; 2], &[0; 2]);
    let with_plain: Vec<usize> = two.comms.iter().map(|c| c.device_memory()).collect();
    let sym = register_all(&two.comms, &ptrs, &[4096; 2], &[1; 2]);
    for (r, c) in two.comms.iter().enumerate() {
        let with_sym = c.device_memory();
        assert!(
            with_sym > with_plain[r],
            "rank {r}: the symmetric state uncounted"
        );
        c.window_deregister_raw(*sym[r].as_ref().unwrap()).unwrap();
        c.window_deregister_raw(*plain[r].as_ref().unwrap())
            .unwrap();
        assert_eq!(
            c.device_memory(),
            with_sym,
            "rank {r}: the state went with the window"
        );
    }
    drop(user);
}
