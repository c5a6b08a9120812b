//! A mixture-of-experts dispatch and combine written with the device API's puts and signals
//! (`kernels::moe`: DeepEP's pattern). Every rank holds tokens and one expert; the kernel
//! sends each token to its expert, runs the experts, and brings every answer back to its
//! token's place. Inside a node the puts are stores into peers' windows; across nodes
//! (`--processes --nodes 2`) they go through GIN. Two rounds, the signals' totals growing.

use crate::check;
use kernels::moe::{dispatch_block, expert, route, Moe, MOE};
use nccl::{Comm, DeviceBuffer, Module, Op, Stream};
use std::error::Error;

const TOKENS: u32 = 48;
const HIDDEN: u32 = 96;

/// Rank `r`'s tokens in round `seed`: small integers (every expert's answer is exact).
fn tokens(seed: u32, r: usize) -> Vec<f32> {
    (0..TOKENS * HIDDEN)
        .map(|i| ((seed as usize + r * 31 + i as usize * 7) % 101) as f32)
        .collect()
}

/// One rank: two rounds of dispatch, experts and combine, each checked.
pub fn rank(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    let (r, n) = (comm.rank(), comm.count());
    let dev = comm.device();
    let block = dispatch_block(TOKENS, HIDDEN);
    let floats = (TOKENS * HIDDEN) as usize;
    let mut dispatch = DeviceBuffer::<u8>::zeroed(dev, n * block)?;
    let mut combine = DeviceBuffer::<f32>::zeroed(dev, n * floats)?;
    let stage = DeviceBuffer::<u8>::zeroed(dev, 2 * n * block)?;
    let mut x = DeviceBuffer::<f32>::zeroed(dev, floats)?;
    let mut out = DeviceBuffer::<f32>::zeroed(dev, floats)?;
    let mut barrier = DeviceBuffer::<f32>::zeroed(dev, 1)?;
    // The windows come before the device communicator: across nodes its GIN needs them.
    let w_dispatch = comm.window(&mut dispatch, true)?;
    let w_combine = comm.window(&mut combine, true)?;
    let dc = comm.dev_comm(Default::default())?;
    let dw_dispatch = comm.dev_window(&dc, w_dispatch.handle())?;
    let dw_combine = comm.dev_window(&dc, w_combine.handle())?;
    let stream = Stream::new(dev)?;
    if r == 0 {
        let v = dc.get();
        let gin = if v.gin != 0 {
            "GIN to the others"
        } else {
            "no GIN"
        };
        println!("rank 0: LSA team of {} of {n} ranks, {gin}", v.lsa_size);
    }
    // MOE_TRACE=1: every rank says each step (where a hang stopped).
    let trace = |what: &str| {
        if std::env::var_os("MOE_TRACE").is_some() {
            eprintln!("rank {r}: {what}");
        }
    };
    for round in 1..=2 {
        trace(&format!("round {round}"));
        let seed = 17 * round + 3;
        let mine = tokens(seed, r);
        // The copies wait for this rank's stream only: with ranks as threads sharing a GPU, a
        // copy that waits for every stream of the device (`copy_from_host`) would wait for a
        // peer's kernel that waits for this rank.
        x.copy_from_host_after(&mine, &stream)?;
        out.copy_from_host_after(&vec![f32::NAN; floats], &stream)?;
        // Every rank is done reading the previous round's windows.
        trace("barrier");
        comm.all_reduce_in_place(&mut barrier, Op::SUM, &stream)?;
        trace("launch");
        let args = Moe {
            comm: dc.get(),
            dispatch: dw_dispatch.get(),
            combine: dw_combine.get(),
            x: x.as_raw_ptr(),
            stage: stage.as_raw_ptr(),
            out: out.as_raw_ptr(),
            tokens: TOKENS,
            hidden: HIDDEN,
            round,
            seed,
        };
        // SAFETY: every buffer outlives the kernel (the stream is drained below); every rank
        // launches it with a grid of `n` CTAs in the same round.
        unsafe { module.launch(&MOE, n as u32, 128, stream.handle(), args)? };
        let got = out.to_vec_after(&stream)?;
        trace("kernel done");
        let want: Vec<f32> = (0..floats)
            .map(|i| {
                let t = i as u32 / HIDDEN;
                expert(route(seed, r as u32, t, n as u32), mine[i])
            })
            .collect();
        check(r, &got, &want)?;
    }
    drop((dw_dispatch, dw_combine, dc));
    w_combine.deregister()?;
    w_dispatch.deregister()?;
    Ok(())
}
