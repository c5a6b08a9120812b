//! Point-to-point checks (all-to-all and ring shifts through ncclSend/ncclRecv) and the
//! late-rank AllReduce, shared by the simulator and GPU suites. Receive buffers are poisoned
//! with a poisoned tail past them; every received element and the tail are checked.

use super::check::{check_tail, compare_bytes, input, reference, POISON, TAIL};
use super::{from_bytes, lend, skip, to_bytes, Drive, Ranks};
use nccl::{Comm, DataType, ReduceOp};

/// All-to-all through ncclSend/ncclRecv in one group, a different size for every (sender,
/// receiver) pair (`scale` elements and up), self included; checks every received block and
/// the poisoned tail past it. Skipped (visibly) where this build has no point-to-point kernel.
pub fn check_all_to_all(ranks: &Ranks, scale: usize, drive: Drive) -> Result<(), String> {
    let n = ranks.comms[0].count();
    if !skip::p2p_or_skip(&|| format!("all-to-all of {n} ranks, scale {scale}")) {
        return Ok(());
    }
    let count = |from: usize, to: usize| scale + 7 * from + 3 * to;
    let value = |from: usize, to: usize, i: usize| ((from * 1000 + to) * 100_000 + i) as i32;
    let e = |e: nccl::Error| e.to_string();
    // Per local rank: (send buffers by peer, recv buffers by peer).
    let mut bufs = Vec::new();
    for c in &ranks.comms {
        let r = c.rank();
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for p in 0..n {
            let data: Vec<i32> = (0..count(r, p)).map(|i| value(r, p, i)).collect();
            let s = c.device().alloc(data.len() * 4 + 1).map_err(e)?;
            s.write(0, to_bytes(&data)).map_err(e)?;
            let len = count(p, r) * 4 + TAIL;
            let rb = c.device().alloc(len).map_err(e)?;
            rb.write(0, &vec![POISON; len]).map_err(e)?;
            sends.push(s);
            recvs.push(rb);
        }
        bufs.push((sends, recvs));
    }
    let lent = lend(&ranks.comms);
    let (comms, streams) = (&lent[..], &ranks.streams);
    let issue = |i: usize| -> Result<(), String> {
        let c = &comms[i];
        let r = c.rank();
        let i32t = DataType::Int32;
        for p in 0..n {
            let (s, rb) = (bufs[i].0[p].ptr(), bufs[i].1[p].ptr());
            unsafe { c.send_raw(s, count(r, p), i32t, p, streams[i]) }.map_err(e)?;
            unsafe { c.recv_raw(rb, count(p, r), i32t, p, streams[i]) }.map_err(e)?;
        }
        Ok(())
    };
    match drive {
        Drive::ThreadPerRank => {
            let rs: Vec<Result<(), String>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..ranks.comms.len())
                    .map(|i| {
                        let issue = &issue;
                        s.spawn(move || {
                            nccl::group_start();
                            let r = issue(i);
                            let end = nccl::group_end().map(|_| ()).map_err(e);
                            r.and(end)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("rank thread panicked".into()))
                    })
                    .collect()
            });
            rs.into_iter().collect::<Result<Vec<_>, _>>()?;
        }
        _ => {
            nccl::group_start();
            let r = (0..ranks.comms.len()).try_for_each(issue);
            let end = nccl::group_end().map(|_| ()).map_err(e);
            r?;
            end?;
        }
    }
    for (i, c) in ranks.comms.iter().enumerate() {
        c.device().stream_sync(ranks.streams[i]).map_err(e)?;
        let r = c.rank();
        for p in 0..n {
            let len = count(p, r) * 4;
            let mut out = vec![0u8; len + TAIL];
            bufs[i].1[p].read(0, &mut out).map_err(e)?;
            let what = format!("all-to-all, {n} ranks: rank {r} from {p}");
            check_tail(&out[len..], &what)?;
            let got = from_bytes::<i32>(&out[..len]);
            if let Some(k) = (0..got.len()).find(|&k| got[k] != value(p, r, k)) {
                return Err(format!(
                    "{what}: element {k} of {} is {} want {}",
                    got.len(),
                    got[k],
                    value(p, r, k)
                ));
            }
        }
    }
    Ok(())
}

/// Send/recv around the ring in one group, `count` i32 each way: every rank sends to the next
/// and receives from the previous, fresh data from `seed`, the receive buffer and a tail past
/// it poisoned first. Skipped (visibly) where this build has no point-to-point kernel.
pub fn check_ring_shift(ranks: &Ranks, count: usize, seed: u64) {
    let c = &ranks.comms[0];
    let (r, n) = (c.rank(), c.count());
    if !skip::p2p_or_skip(&|| format!("ring shift of {count} i32 on {n} ranks")) {
        return;
    }
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    // A different stream of values per (seed, sender), known to its receiver.
    let value = |from: usize, i: usize| {
        let x = (seed ^ (from as u64) << 40).wrapping_add(i as u64);
        (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33) as i32
    };
    let data: Vec<i32> = (0..count).map(|i| value(r, i)).collect();
    let dev = c.device();
    let sb = dev.alloc(count * 4).expect("send buffer");
    sb.write(0, to_bytes(&data)).expect("write");
    let rb = dev.alloc(count * 4 + TAIL).expect("recv buffer");
    rb.write(0, &vec![POISON; count * 4 + TAIL])
        .expect("poison");
    let st = ranks.streams[0];
    nccl::group_start();
    // SAFETY: both buffers hold `count` i32 and outlive the stream sync below.
    let sent = unsafe { c.send_raw(sb.ptr(), count, DataType::Int32, next, st) };
    let recvd = unsafe { c.recv_raw(rb.ptr(), count, DataType::Int32, prev, st) };
    let end = nccl::group_end();
    sent.and(recvd).expect("send/recv");
    end.expect("group end");
    dev.stream_sync(st).expect("sync");
    let mut out = vec![0u8; count * 4 + TAIL];
    rb.read(0, &mut out).expect("read");
    check_tail(&out[count * 4..], &format!("rank {r} from {prev}"))
        .unwrap_or_else(|e| panic!("{e}"));
    let got: Vec<i32> = from_bytes(&out[..count * 4]);
    if let Some(k) = (0..count).find(|&k| got[k] != value(prev, k)) {
        panic!(
            "rank {r} from {prev}: element {k} of {count} is {} want {}",
            got[k],
            value(prev, k)
        );
    }
}

/// Flow control under pressure: `n` simulated ranks (an `isolated` child's
/// NCCL_RS_SIM_DEVICES), an in-place float AllReduce of 2^18 elements (many FIFO steps per
/// channel) in buffers with a poisoned tail, rank `late` launching after the others so that
/// senders run ahead of it as far as the FIFOs allow; every rank's result and tail is checked.
/// The pause before the late launch is no synchronisation (the result must be right whatever
/// it is): it only makes the senders' race against the FIFO's head counter likely.
pub fn late_rank_all_reduce_at(n: usize, late: usize) {
    let ranks = super::sim_ranks(n);
    let count = 1 << 18;
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| input::<f32>(count, ReduceOp::SUM, 99, r, n))
        .collect();
    let want = reference(&inputs, ReduceOp::SUM, DataType::Float32);
    let comms: &[Comm] = &ranks.comms;
    let bufs: Vec<_> = comms
        .iter()
        .zip(&inputs)
        .map(|(c, x)| {
            let b = c.device().alloc(count * 4 + TAIL).unwrap();
            b.write(0, to_bytes(x)).unwrap();
            b.write(count * 4, &[POISON; TAIL]).unwrap();
            b
        })
        .collect();
    let order = (0..n).filter(|&i| i != late).chain([late]);
    for i in order {
        let c = &comms[i];
        if i == late {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let p = bufs[i].ptr();
        unsafe {
            c.all_reduce_raw(
                p,
                p,
                count,
                DataType::Float32,
                ReduceOp::SUM,
                ranks.streams[i],
            )
        }
        .unwrap();
    }
    for (i, c) in comms.iter().enumerate() {
        c.device().stream_sync(ranks.streams[i]).unwrap();
        let mut out = vec![0u8; count * 4 + TAIL];
        bufs[i].read(0, &mut out).unwrap();
        let what = format!("rank {i} of {n}, rank {late} late");
        check_tail(&out[count * 4..], &what).unwrap_or_else(|e| panic!("{e}"));
        compare_bytes(&out[..count * 4], &want, &what).unwrap_or_else(|e| panic!("{e}"));
    }
}
