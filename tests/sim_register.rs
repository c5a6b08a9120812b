//! Registered buffers on the simulator: a send/recv between registered buffers of ranks that
//! share an address space skips the FIFO (each connection's counters advance one step per
//! message instead of one per slot), and gives the same bytes as the FIFO path; a rank that
//! did not register makes its peer fall back to copies, whichever side it is.

mod common;

use common::register::{check_steps, expected_steps, ring_bytes, ring_round, Who};
use nccl::{Backend, Comm};

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
            check_steps(&comms, who, base, &steps);
            if who == Who::All {
                // Every part went direct: one step per connection.
                assert!(steps.iter().all(|&s| s == CONNS as u64), "{steps:?}");
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
            let want = expected_steps(ring_bytes(r, bytes), CONNS, SLOT, false);
            assert_eq!(s, want, "{bytes} bytes, rank {r}");
        }
    }
}
