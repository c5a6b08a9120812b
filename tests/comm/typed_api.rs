//! The typed Rust API on the simulator: DeviceBuffer<T>, the checked collectives, groups and
//! captures as scopes, and the refusals (every too-short buffer is ncclInvalidArgument with a
//! message naming the buffer and both sizes).

use crate::common::{self, procs};
use nccl::{Comm, DeviceBuffer, NcclResult, Op, Stream};

// A buffer's host copies wait for its whole device, which CUDA (and the simulator) refuse
// while any stream of the device captures a graph: the tests that capture run alone, in a
// child process of their own.

fn ranks(n: usize) -> (Vec<Comm>, Vec<Stream>) {
    common::sim();
    let comms = Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).expect("init_all");
    let streams = comms
        .iter()
        .map(|c| Stream::new(c.device()).expect("stream"))
        .collect();
    (comms, streams)
}

fn refused(r: nccl::Result<()>, words: &[&str]) {
    let e = r.expect_err("the call must be refused");
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    for w in words {
        assert!(e.message.contains(w), "{w:?} not in {:?}", e.message);
    }
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_premulsum",
        nccl_rs_kernel = "nccl_all_gather"
    )),
    ignore = "needs nccl_all_reduce_float_premulsum, nccl_all_gather, which NCCL_RS_KERNELS left out"
)]
fn typed_collectives_in_a_group() {
    let (comms, streams) = ranks(2);
    let n = 1000;
    let sends: Vec<DeviceBuffer<f32>> = comms
        .iter()
        .map(|c| {
            let v: Vec<f32> = (0..n).map(|i| (i + c.rank()) as f32).collect();
            DeviceBuffer::from_slice(c.device(), &v).unwrap()
        })
        .collect();
    let mut sums: Vec<DeviceBuffer<f32>> = comms
        .iter()
        .map(|c| DeviceBuffer::zeroed(c.device(), n).unwrap())
        .collect();
    let mut gathered: Vec<DeviceBuffer<f32>> = comms
        .iter()
        .map(|c| DeviceBuffer::zeroed(c.device(), 2 * n).unwrap())
        .collect();
    nccl::group(|g| {
        // Each buffer stays borrowed until the group ends: one `&mut` per buffer, from
        // iter_mut (indexing `&mut sums[i]` in the loop would borrow the whole Vec twice).
        for (i, (c, sum)) in comms.iter().zip(&mut sums).enumerate() {
            g.all_reduce(c, &sends[i], sum, Op::pre_mul_sum(2.0), &streams[i])?;
        }
        Ok(())
    })
    .unwrap();
    nccl::group(|g| {
        for (i, (c, out)) in comms.iter().zip(&mut gathered).enumerate() {
            g.all_gather(c, &sends[i], out, &streams[i])?;
        }
        Ok(())
    })
    .unwrap();
    for r in 0..2 {
        let want: Vec<f32> = (0..n).map(|i| 2.0 * (2 * i + 1) as f32).collect();
        assert_eq!(sums[r].to_vec().unwrap(), want);
        let g = gathered[r].to_vec().unwrap();
        assert_eq!(&g[..n], &sends[0].to_vec().unwrap()[..]);
        assert_eq!(&g[n..], &sends[1].to_vec().unwrap()[..]);
    }
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_bfloat16_max",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_sum"
    )),
    ignore = "needs nccl_all_reduce_bfloat16_max, nccl_reduce_scatter_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn in_place_views_and_half_types() {
    let (comms, streams) = ranks(2);
    // bf16 in place AllReduce on a view of the middle of the buffer: rank r holds
    // 8r, 8r + 1, ...; inside the view both ranks end with rank 1's values (the larger), and
    // outside it each keeps its own.
    let value = |r: usize, i: usize| half::bf16::from_f32((8 * r + i) as f32);
    let mut bufs: Vec<DeviceBuffer<half::bf16>> = comms
        .iter()
        .map(|c| {
            let v: Vec<_> = (0..8).map(|i| value(c.rank(), i)).collect();
            DeviceBuffer::from_slice(c.device(), &v).unwrap()
        })
        .collect();
    nccl::group(|g| {
        for (i, (c, b)) in comms.iter().zip(&mut bufs).enumerate() {
            g.all_reduce_in_place(c, b.slice_mut(2..6)?, Op::MAX, &streams[i])?;
        }
        Ok(())
    })
    .unwrap();
    for (r, b) in bufs.iter().enumerate() {
        let want: Vec<_> = (0..8)
            .map(|i| value(if (2..6).contains(&i) { 1 } else { r }, i))
            .collect();
        assert_eq!(b.to_vec().unwrap(), want, "rank {r}");
    }
    // i32 in-place ReduceScatter: block `rank` of each buffer gets the sums.
    let mut rs: Vec<DeviceBuffer<i32>> = comms
        .iter()
        .map(|c| DeviceBuffer::from_slice(c.device(), &[1, 2, 3, 4, 5, 6]).unwrap())
        .collect();
    nccl::group(|g| {
        for (i, (c, b)) in comms.iter().zip(&mut rs).enumerate() {
            g.reduce_scatter_in_place(c, b, Op::SUM, &streams[i])?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(&rs[0].to_vec().unwrap()[..3], &[2, 4, 6]);
    assert_eq!(&rs[1].to_vec().unwrap()[3..], &[8, 10, 12]);
}

#[test]
fn every_too_short_buffer_is_refused_with_its_sizes() {
    let (comms, streams) = ranks(2);
    let (c, s) = (&comms[0], &streams[0]);
    let d = c.device();
    let eight = DeviceBuffer::<f32>::zeroed(d, 8).unwrap();
    let mut four = DeviceBuffer::<f32>::zeroed(d, 4).unwrap();
    let mut fifteen = DeviceBuffer::<f32>::zeroed(d, 15).unwrap();
    refused(
        c.all_reduce(&eight, &mut four, Op::SUM, s),
        &["ncclAllReduce", "recvbuff", "4", "8"],
    );
    refused(
        c.all_gather(&eight, &mut fifteen, s),
        &["ncclAllGather", "recvbuff", "15", "16"],
    );
    refused(
        c.reduce_scatter(&fifteen, &mut eight_mut(d), Op::SUM, s),
        &["ncclReduceScatter", "sendbuff", "15", "16"],
    );
    refused(
        c.broadcast(Some(&four), &mut fifteen, 0, s),
        &["ncclBroadcast", "sendbuff", "4", "15"],
    );
    refused(
        c.reduce(&eight, Some(&mut four), Op::SUM, 0, s),
        &["ncclReduce", "recvbuff", "4", "8"],
    );
    refused(
        c.all_to_all(&eight, &mut four, s),
        &["ncclAlltoAll", "recvbuff", "4", "8"],
    );
    refused(
        c.all_gather_in_place(&mut fifteen, s),
        &["ncclAllGather", "15", "multiple"],
    );
    refused(
        c.broadcast::<&DeviceBuffer<f32>, _>(None, &mut four, 0, s),
        &["root", "sendbuff"],
    );
    let other = DeviceBuffer::<f32>::zeroed(comms[1].device(), 8).unwrap();
    refused(
        c.all_reduce(&other, &mut fifteen, Op::SUM, s),
        &["sendbuff", "device 1"],
    );
    refused(
        c.all_reduce(&eight, &mut fifteen, Op::SUM, &streams[1]),
        &["stream", "device 1"],
    );
    refused(
        c.reduce_scatter_in_place(&mut fifteen, Op::SUM, s),
        &["ncclReduceScatter", "15", "multiple"],
    );
    refused(
        c.reduce::<_, &mut DeviceBuffer<f32>>(&eight, None, Op::SUM, 0, s),
        &["root", "recvbuff"],
    );
    refused(
        c.all_to_all(&fifteen, &mut eight_mut(d), s),
        &["ncclAlltoAll", "15", "multiple"],
    );
    refused(eight.slice(4..9).map(|_| ()), &["4..9", "8 elements"]);
    refused(eight.chunks(0).map(|_| ()), &["0 elements"]);
    let other_reg = comms[1].register(&eight).map(|_| ());
    refused(other_reg, &["ncclCommRegister", "device 0", "device 1"]);
}

fn eight_mut(d: &nccl::Device) -> DeviceBuffer<f32> {
    DeviceBuffer::zeroed(d, 8).unwrap()
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_int32_sum"),
    ignore = "needs nccl_all_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn typed_calls_refuse_raw_groups_and_a_failed_group_drops_its_calls() {
    let (comms, streams) = ranks(2);
    let mut b = DeviceBuffer::<i32>::zeroed(comms[0].device(), 4).unwrap();
    nccl::group_start();
    let e = comms[0]
        .all_reduce_in_place(&mut b, Op::SUM, &streams[0])
        .unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    let nested = nccl::group(|_| Ok(())).unwrap_err();
    assert_eq!(nested.code, NcclResult::InvalidUsage, "{nested}");
    assert_eq!(nccl::group_end().unwrap(), nccl::GroupStatus::Complete);
    // Rank 0 alone queues an AllReduce, then the closure fails: nothing may launch (it would
    // wait for rank 1 forever), and the thread's group is closed.
    let failed = nccl::group(|g| {
        g.all_reduce_in_place(&comms[0], &mut b, Op::SUM, &streams[0])?;
        Err::<(), _>(nccl::Error::invalid_usage("the program changed its mind"))
    });
    assert!(failed.unwrap_err().message.contains("changed its mind"));
    streams[0].synchronize().unwrap();
    assert!(streams[0].is_idle().unwrap());
    nccl::group(|_| Ok(())).expect("no group is left open");
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_uint64_sum"),
    ignore = "needs nccl_all_reduce_uint64_sum, which NCCL_RS_KERNELS left out"
)]
fn captured_graph_replays_and_keeps_its_borrows() {
    procs::isolated(&[], &[], captured_graph);
}

fn captured_graph() {
    let (comms, streams) = ranks(1);
    let (c, s) = (&comms[0], &streams[0]);
    let send = DeviceBuffer::from_slice(c.device(), &[3u64, 4]).unwrap();
    let mut recv = DeviceBuffer::<u64>::zeroed(c.device(), 2).unwrap();
    {
        let graph = nccl::capture(s, |cap| cap.all_reduce(c, &send, &mut recv, Op::SUM, s))
            .expect("capture");
        graph.launch().unwrap();
        graph.launch().unwrap();
    }
    assert_eq!(recv.to_vec().unwrap(), vec![3, 4]);
    // A direct typed call on a capturing stream is refused (its graph could outlive it).
    c.device().capture_begin(s.handle()).unwrap();
    let e = c.all_reduce(&send, &mut recv, Op::SUM, s).unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    drop(c.device().capture_end(s.handle()));
}

/// A buffer dropped while its device cannot be waited for (a capture is open on it) keeps its
/// memory: freeing it could pull it from under a kernel still running. Outside a capture the
/// drop frees it.
#[cfg(feature = "internals")]
#[test]
fn a_buffer_dropped_during_a_capture_is_leaked_not_freed() {
    procs::isolated(&[], &[], dropped_during_a_capture);
}

#[cfg(feature = "internals")]
fn dropped_during_a_capture() {
    let (comms, streams) = ranks(1);
    let (c, s) = (&comms[0], &streams[0]);
    let d = c.device();
    let kept = DeviceBuffer::<u32>::zeroed(d, 1000).unwrap();
    let p = kept.as_raw_ptr();
    d.capture_begin(s.handle()).unwrap();
    drop(kept);
    drop(d.capture_end(s.handle()));
    assert!(
        d.pointer_extent(p, 4000).unwrap().is_some(),
        "the memory of a buffer dropped during a capture was freed"
    );
    let freed = DeviceBuffer::<u32>::zeroed(d, 1000).unwrap();
    let p = freed.as_raw_ptr();
    drop(freed);
    assert_eq!(d.pointer_extent(p, 4000).unwrap(), None);
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_p2p",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_reduce_int8_prod"
    )),
    ignore = "needs nccl_p2p, nccl_broadcast, nccl_reduce_int8_prod, which NCCL_RS_KERNELS left out"
)]
fn send_recv_over_chunks_rooted_calls_and_registration() {
    let (comms, streams) = ranks(3);
    let n = 3;
    let block = 5;
    // All-to-all by hand: block j of rank r's buffer to rank j, into block r there.
    let sends: Vec<DeviceBuffer<u64>> = comms
        .iter()
        .map(|c| {
            let v: Vec<u64> = (0..n * block)
                .map(|i| (100 * c.rank() + i) as u64)
                .collect();
            DeviceBuffer::from_slice(c.device(), &v).unwrap()
        })
        .collect();
    let mut recvs: Vec<DeviceBuffer<u64>> = comms
        .iter()
        .map(|c| DeviceBuffer::zeroed(c.device(), n * block).unwrap())
        .collect();
    let regs: Vec<_> = comms
        .iter()
        .zip(&sends)
        .map(|(c, b)| c.register(b).expect("register"))
        .collect();
    nccl::group(|g| {
        for (((c, send), recv), st) in comms.iter().zip(&sends).zip(&mut recvs).zip(&streams) {
            for (peer, (out, into)) in send.chunks(block)?.zip(recv.chunks_mut(block)?).enumerate()
            {
                g.send(c, out, peer, st)?;
                g.recv(c, into, peer, st)?;
            }
        }
        Ok(())
    })
    .unwrap();
    for r in regs {
        r.deregister().expect("deregister");
    }
    for (r, recv) in recvs.iter().enumerate() {
        let want: Vec<u64> = (0..n * block)
            .map(|i| (100 * (i / block) + r * block + i % block) as u64)
            .collect();
        assert_eq!(recv.to_vec().unwrap(), want, "rank {r}");
    }
    // Broadcast from rank 2 (the others give no send buffer), then Reduce (prod) to rank 1.
    let root_data = DeviceBuffer::from_slice(comms[2].device(), &[3i8, -2, 1]).unwrap();
    let mut outs: Vec<DeviceBuffer<i8>> = comms
        .iter()
        .map(|c| DeviceBuffer::zeroed(c.device(), 3).unwrap())
        .collect();
    nccl::group(|g| {
        for ((c, out), st) in comms.iter().zip(&mut outs).zip(&streams) {
            let send = (c.rank() == 2).then_some(&root_data);
            g.broadcast(c, send, out, 2, st)?;
        }
        Ok(())
    })
    .unwrap();
    for out in &outs {
        assert_eq!(out.to_vec().unwrap(), vec![3, -2, 1]);
    }
    let mut prod = DeviceBuffer::<i8>::zeroed(comms[1].device(), 3).unwrap();
    // The root's receive buffer is lent once, to the root's call.
    let mut root_recv = Some(&mut prod);
    nccl::group(|g| {
        for ((c, out), st) in comms.iter().zip(&outs).zip(&streams) {
            let recv = if c.rank() == 1 {
                root_recv.take()
            } else {
                None
            };
            g.reduce(c, out, recv, Op::PROD, 1, st)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(prod.to_vec().unwrap(), vec![27, -8, 1]);
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_half_premulsum"),
    ignore = "needs nccl_all_reduce_half_premulsum, which NCCL_RS_KERNELS left out"
)]
fn a_typed_group_of_non_blocking_communicators_is_not_an_error() {
    common::sim();
    let id = common::loopback_id();
    let cfg = nccl::Config::blocking(false);
    let mut comms: Vec<Comm> = (0..2)
        .map(|r| {
            nccl::Comm::start_init_rank_config_on(
                nccl::Device::open(r as i32).unwrap(),
                2,
                &id,
                r,
                &cfg,
            )
            .expect("start init")
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|p| p.wait().expect("init"))
        .collect();
    comms.sort_by_key(|c| c.rank());
    let streams: Vec<Stream> = comms
        .iter()
        .map(|c| Stream::new(c.device()).unwrap())
        .collect();
    let mut bufs: Vec<DeviceBuffer<half::f16>> = comms
        .iter()
        .map(|c| DeviceBuffer::from_slice(c.device(), &[half::f16::from_f32(0.5); 100]).unwrap())
        .collect();
    nccl::group(|g| {
        for ((c, b), s) in comms.iter().zip(&mut bufs).zip(&streams) {
            g.all_reduce_in_place(c, b, Op::pre_mul_sum(half::f16::from_f32(3.0)), s)?;
        }
        Ok(())
    })
    .expect("a non-blocking group in progress is waited for, not an error");
    for b in &bufs {
        assert_eq!(b.to_vec().unwrap(), vec![half::f16::from_f32(3.0); 100]);
    }
}

/// `Event`: recorded after a collective, it completes once the collective has run; two of
/// them time it; a stream made to wait on one orders its later work after it.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn events_order_and_time_stream_work() {
    let (comms, streams) = ranks(2);
    let n = 4096;
    let mut bufs: Vec<DeviceBuffer<f32>> = comms
        .iter()
        .map(|c| DeviceBuffer::from_slice(c.device(), &vec![1.0f32; n]).unwrap())
        .collect();
    let events: Vec<(nccl::Event, nccl::Event)> = comms
        .iter()
        .map(|c| {
            (
                nccl::Event::new(c.device()).unwrap(),
                nccl::Event::new(c.device()).unwrap(),
            )
        })
        .collect();
    for ((s, _), st) in events.iter().zip(&streams) {
        s.record(st).unwrap();
    }
    nccl::group(|g| {
        for ((c, b), s) in comms.iter().zip(&mut bufs).zip(&streams) {
            g.all_reduce_in_place(c, b, Op::SUM, s)?;
        }
        Ok(())
    })
    .unwrap();
    for ((_, e), st) in events.iter().zip(&streams) {
        e.record(st).unwrap();
    }
    // A second stream of rank 0, made to wait on the end event before anything waited on
    // it: once that stream has drained, the event has happened.
    let other = Stream::new(comms[0].device()).unwrap();
    other.wait(&events[0].1).unwrap();
    other.synchronize().unwrap();
    assert!(
        events[0].1.is_complete().unwrap(),
        "the stream ran past its wait"
    );
    for (s, e) in &events {
        e.synchronize().unwrap();
        assert!(e.is_complete().unwrap());
        // The span holds the AllReduce: some time, and a number of it.
        let ms = s.elapsed_ms(e).unwrap();
        assert!(ms > 0.0 && ms.is_finite(), "elapsed {ms} ms");
    }
    assert_eq!(bufs[0].to_vec().unwrap(), vec![2.0f32; n]);
    // An event of another device is refused, naming both devices.
    let e = events[1]
        .0
        .record(&streams[0])
        .expect_err("another device's stream");
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    assert!(
        e.message.contains("device 0") && e.message.contains("device 1"),
        "{e}"
    );
}

/// `DeviceBuffer::mem_alloc` (ncclMemAlloc): zeroed, registrable, and collectives on it are
/// right; a too-short one is still refused by its length, not by its (rounded) allocation.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_int32_sum"),
    ignore = "needs nccl_all_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn mem_alloc_buffers_carry_collectives() {
    let (comms, streams) = ranks(2);
    let n = 3001;
    let mut bufs: Vec<DeviceBuffer<i32>> = comms
        .iter()
        .map(|c| DeviceBuffer::mem_alloc(c.device(), n).expect("mem_alloc"))
        .collect();
    for b in &bufs {
        assert_eq!(b.len(), n);
        assert!(b.to_vec().unwrap().iter().all(|&v| v == 0), "not zeroed");
    }
    let inputs: Vec<Vec<i32>> = (0..2)
        .map(|r| (0..n as i32).map(|i| i * 31 + r * 7 - 5000).collect())
        .collect();
    for (b, v) in bufs.iter_mut().zip(&inputs) {
        b.copy_from_host(v).unwrap();
    }
    let regs: Vec<_> = comms
        .iter()
        .zip(&bufs)
        .map(|(c, b)| c.register(b).expect("register"))
        .collect();
    drop(regs);
    nccl::group(|g| {
        for ((c, b), s) in comms.iter().zip(&mut bufs).zip(&streams) {
            g.all_reduce_in_place(c, b, Op::SUM, s)?;
        }
        Ok(())
    })
    .unwrap();
    for b in &bufs {
        let want: Vec<i32> = (0..n).map(|i| inputs[0][i] + inputs[1][i]).collect();
        assert_eq!(b.to_vec().unwrap(), want);
    }
    let mut short = DeviceBuffer::<i32>::mem_alloc(comms[0].device(), n - 1).unwrap();
    refused(
        comms[0].all_reduce(&bufs[0], &mut short, Op::SUM, &streams[0]),
        &[&(n - 1).to_string(), &n.to_string()],
    );
}
