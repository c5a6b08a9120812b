//! Simple steps of four FIFO slots (NCCL_RS_SLICE_STEPS=4, in a child process: half the FIFO
//! per step, so a sender has at most two steps in flight). Both ends of every connection
//! round their step counters up to a multiple of four before each operation; LL steps in
//! between (small counts) leave them at odd values, so a rounding that differed between the
//! two ends would hang or mix steps up. (The late-rank case is in `flow_control`.)

use crate::common::{self, Drive};

#[test]
fn every_collective_with_four_slot_steps() {
    let env = [("NCCL_RS_SLICE_STEPS", "4")];
    common::procs::isolated(&env, &[], || {
        let ranks = common::sim_ranks(3);
        let comms = &ranks.comms;
        assert_eq!(comms[0].shape().slice_steps, 4);
        let proto = |bytes| {
            comms[0]
                .tuning(nccl::Coll::AllReduce, bytes)
                .expect("a choice")
                .proto
        };
        assert_eq!(proto(4), nccl::tune::Proto::Ll, "small counts go by LL");
        // The smallest power-of-two size the tuner sends by Simple (4 MiB on 3 simulated
        // ranks): in floats it takes many four-slot steps (32 KiB) per channel; 1 and 4099 go
        // by LL.
        let simple_bytes = (12..28)
            .map(|s| 1usize << s)
            .find(|&b| proto(b) == nccl::tune::Proto::Simple)
            .expect("Simple for some size up to 128 MiB");
        let big = simple_bytes / 4 + 13;
        common::collective_matrix(&ranks, &[1, 4099, big], Drive::Group);
    });
}
