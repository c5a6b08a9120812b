//! Flow control: with more ranks than FIFO slots, the ring lets a sender run more than
//! NCCL_STEPS steps ahead of a slow receiver; only the head counter stops it from overwriting
//! slots that were not read yet. One rank starts late to make that happen every time.

mod common;

use nccl::Backend;

#[test]
fn a_late_rank_never_loses_data() {
    std::env::set_var("NCCL_RS_SIM_DEVICES", "16");
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    common::late_rank_all_reduce(16);
}
