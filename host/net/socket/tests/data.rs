//! The data path: messages of every size arrive intact, in order and through every geometry;
//! failures of either end reach the other; requests are checked.

use super::*;

/// 0 B, 1 B, 4 KiB, 1 MiB and 64 MiB of random bytes, all posted at once, arrive intact and
/// in order.
fn sizes_arrive_intact(nthreads: usize, nsocks: usize) {
    let net = lo_net(nthreads, nsocks);
    assert_eq!(net.geometry(0).unwrap(), (nthreads, nsocks));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let sizes = [0usize, 1, 4 << 10, 1 << 20, 64 << 20];
    let mut srcs: Vec<Vec<u8>> = sizes.iter().map(|&n| rng.bytes(n)).collect();
    let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0x5a; n]).collect();
    let (mut s, mut r) = pair(&net);
    let mut recvs = Vec::new();
    for d in dsts.iter_mut() {
        let mr = reg_recv(r.as_mut(), d);
        let req = r
            .irecv(&[recv_buf(mr, d.len())])
            .unwrap()
            .expect("irecv slot");
        recvs.push(req);
    }
    let mut sends = Vec::new();
    for (i, src) in srcs.iter_mut().enumerate() {
        let mr = reg_send(s.as_mut(), src);
        let req = s
            .isend(mr, 0, src.len(), i as u32)
            .unwrap()
            .expect("isend slot");
        sends.push(req);
    }
    for (i, req) in sends.into_iter().enumerate() {
        assert_eq!(wait_send(s.as_mut(), req).unwrap(), sizes[i]);
    }
    for (i, req) in recvs.into_iter().enumerate() {
        assert_eq!(wait_recv(r.as_mut(), req).unwrap(), vec![sizes[i]]);
    }
    for (i, (a, b)) in srcs.iter().zip(&dsts).enumerate() {
        assert!(a == b, "message {i} ({} bytes) arrived changed", sizes[i]);
    }
}

#[test]
fn messages_arrive_intact_1x1() {
    sizes_arrive_intact(1, 1);
}

#[test]
fn messages_arrive_intact_4x4() {
    sizes_arrive_intact(4, 4);
}

#[test]
fn eight_in_flight_each_way() {
    let net = lo_net(2, 2);
    let (mut s, mut r) = pair(&net);
    let mut rng = Rng(7);
    // Inline, single-piece and many-piece messages mixed, at offsets inside one region each.
    let sizes: Vec<usize> = (0..8)
        .map(|i| [3, 70_000, 300_001, 2 << 20][i % 4] + i)
        .collect();
    let total: usize = sizes.iter().sum();
    let mut src = rng.bytes(total);
    let mut dst = vec![0u8; total + 8 * 16];
    let smr = reg_send(s.as_mut(), &mut src);
    let rmr = reg_recv(r.as_mut(), &mut dst);
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    let (mut so, mut ro) = (0, 0);
    for &n in &sizes {
        // Receive buffers larger than the messages: the sizes come from the sender.
        recvs.push(
            r.irecv(&[RecvBuf {
                mr: rmr,
                offset: ro,
                max_len: n + 16,
                tag: 1,
            }])
            .unwrap()
            .expect("irecv slot"),
        );
        ro += n + 16;
    }
    for &n in &sizes {
        sends.push(s.isend(smr, so, n, 1).unwrap().expect("isend slot"));
        so += n;
    }
    // Test in reverse order: completion does not depend on the order of the tests.
    for (i, req) in sends.iter().enumerate().rev() {
        assert_eq!(wait_send(s.as_mut(), *req).unwrap(), sizes[i]);
    }
    let (mut so, mut ro) = (0, 0);
    for (i, req) in recvs.iter().enumerate() {
        assert_eq!(wait_recv(r.as_mut(), *req).unwrap(), vec![sizes[i]]);
        let n = sizes[i];
        assert!(
            src[so..so + n] == dst[ro..ro + n],
            "message {i} arrived changed"
        );
        so += n;
        ro += n + 16;
    }
    // Completed requests are forgotten.
    assert_eq!(s.test(sends[0]).unwrap_err().code, NcclResult::InvalidUsage);
}

/// The callers' fast paths (a small message written by `isend` and read by `test` while the
/// helper threads sleep) interleaved with messages the threads move: a ping-pong of small
/// messages, some rounds sending a large one first so that the small one queues behind it,
/// every byte checked and every message in its own place.
#[test]
fn small_and_large_messages_interleave_intact() {
    let net = lo_net(2, 2);
    let (mut s, mut r) = pair(&net);
    let mut rng = Rng(11);
    let small = [0usize, 1, 13, 4096, wire::MIN_CHUNK - 1];
    let large = wire::MIN_CHUNK + 5;
    let mut src = rng.bytes(large + wire::MIN_CHUNK);
    let mut dst = vec![0u8; 2 * (large + wire::MIN_CHUNK)];
    let smr = reg_send(s.as_mut(), &mut src);
    let rmr = reg_recv(r.as_mut(), &mut dst);
    let slot = large + wire::MIN_CHUNK;
    for round in 0..200 {
        let n = small[round % small.len()];
        let with_large = round % 7 == 3;
        let at = |k: usize| RecvBuf {
            mr: rmr,
            offset: k * slot,
            max_len: slot,
            tag: 0,
        };
        let mut recvs = vec![r.irecv(&[at(0)]).unwrap().expect("irecv slot")];
        if with_large {
            recvs.push(r.irecv(&[at(1)]).unwrap().expect("irecv slot"));
        }
        let mut sizes = Vec::new();
        let mut sends = Vec::new();
        if with_large {
            sends.push(s.isend(smr, 0, large, 0).unwrap().expect("isend slot"));
            sizes.push((0, large));
        }
        sends.push(s.isend(smr, large, n, 0).unwrap().expect("isend slot"));
        sizes.push((large, n));
        if !with_large && round > 0 {
            // The connection is idle (every earlier message completed): the small message
            // went out inside `isend`.
            assert_eq!(s.test(sends[0]).unwrap(), Some(n), "round {round}");
        } else {
            for req in sends {
                wait_send(s.as_mut(), req).unwrap();
            }
        }
        for (k, req) in recvs.into_iter().enumerate() {
            let (from, len) = sizes[k];
            assert_eq!(
                wait_recv(r.as_mut(), req).unwrap(),
                vec![len],
                "round {round}"
            );
            assert!(
                src[from..from + len] == dst[k * slot..k * slot + len],
                "round {round}: message {k} ({len} bytes) arrived changed"
            );
        }
    }
}

/// The sender alone decides which messages go inline (`NCCL_RS_SOCKET_INLINE_BYTES`) and says
/// so in each header; the receiver follows the header, whatever its own setting. Messages on
/// both sides of every limit, all posted at once, arrive intact and in order; a receiver that
/// went by its own limit would lose the stream's framing.
#[test]
fn the_sender_chooses_inline_or_pieces_and_the_receiver_follows() {
    let sizes = [
        0usize,
        1,
        13,
        4096,
        wire::MIN_CHUNK - 1,
        wire::MIN_CHUNK,
        100_003,
        256 << 10,
        (1 << 20) + 3,
    ];
    for below in [
        0usize,
        1,
        wire::DEFAULT_INLINE_BELOW,
        256 << 10,
        MAX_INLINE_BELOW,
    ] {
        let sending = SocketNet::with_options(SocketOptions {
            inline_below: below,
            ..opts(2, 2, Family::V4)
        })
        .unwrap();
        let (mut s, mut r) = pair_between(&sending, &lo_net(2, 2));
        let mut rng = Rng(below as u64 + 5);
        let mut srcs: Vec<Vec<u8>> = sizes.iter().map(|&n| rng.bytes(n)).collect();
        let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0x5a; n + 64]).collect();
        let recvs: Vec<_> = dsts
            .iter_mut()
            .map(|d| {
                let mr = reg_recv(r.as_mut(), d);
                r.irecv(&[recv_buf(mr, d.len())])
                    .unwrap()
                    .expect("irecv slot")
            })
            .collect();
        let sends: Vec<_> = srcs
            .iter_mut()
            .map(|b| {
                let mr = reg_send(s.as_mut(), b);
                s.isend(mr, 0, b.len(), 3).unwrap().expect("isend slot")
            })
            .collect();
        for (i, req) in sends.into_iter().enumerate() {
            assert_eq!(
                wait_send(s.as_mut(), req).unwrap(),
                sizes[i],
                "limit {below}"
            );
        }
        for (i, req) in recvs.into_iter().enumerate() {
            assert_eq!(
                wait_recv(r.as_mut(), req).unwrap(),
                vec![sizes[i]],
                "limit {below}"
            );
            assert!(
                srcs[i][..] == dsts[i][..sizes[i]],
                "limit {below}: message {i} ({} bytes) arrived changed",
                sizes[i]
            );
        }
    }
}

#[test]
fn receiver_dropped_mid_transfer_fails_the_sender() {
    // 4 pieces of 64 MiB: more than a loopback socket buffers (up to ~36 MB here).
    let net = lo_net(2, 2);
    let mut src = vec![3u8; 256 << 20];
    let (mut s, r) = pair(&net);
    let mr = reg_send(s.as_mut(), &mut src);
    let req = s.isend(mr, 0, src.len(), 0).unwrap().unwrap();
    // Nobody receives: the sender stalls once the socket buffers are full.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(s.test(req).unwrap(), None);
    drop(r);
    let e = wait_send(s.as_mut(), req).unwrap_err();
    assert_eq!(e.code, NcclResult::RemoteError);
    assert!(e.message.contains("127.0.0.1"), "{}", e.message);
    let e = s.isend(mr, 0, 1, 0).unwrap_err();
    assert_eq!(e.code, NcclResult::RemoteError);
    assert!(s.test(req).is_err());
    // The region may go once the connection is dead.
    s.dereg_mr(mr).unwrap();
}

#[test]
fn sender_dropped_mid_transfer_fails_the_receiver() {
    // 2 pieces of 64 MiB: more than a loopback socket buffers.
    let net = lo_net(2, 1);
    let mut src = vec![5u8; 128 << 20];
    let mut dst = vec![0u8; 128 << 20];
    let (mut s, mut r) = pair(&net);
    let smr = reg_send(s.as_mut(), &mut src);
    let sreq = s.isend(smr, 0, src.len(), 0).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(s.test(sreq).unwrap(), None);
    drop(s);
    let rmr = reg_recv(r.as_mut(), &mut dst);
    // The header is there, so the receive is taken; the rest of the message never comes.
    let rreq = r.irecv(&[recv_buf(rmr, dst.len())]).unwrap().unwrap();
    let e = wait_recv(r.as_mut(), rreq).unwrap_err();
    assert_eq!(e.code, NcclResult::RemoteError);
    assert!(e.message.contains("127.0.0.1"), "{}", e.message);
    assert!(r.irecv(&[recv_buf(rmr, 1)]).is_err());
    assert!(r.test(rreq).is_err());
}

#[test]
fn idle_peer_going_away_is_noticed() {
    let net = lo_net(1, 1);
    // The sender closes in good order after one message: that message still arrives, and a
    // later receive stays pending without an error (the clean-close header; a sender that dies
    // sends none, and `peer_dropped_mid_transfer`-style tests cover that).
    let (mut s, mut r) = pair(&net);
    let mut one = vec![42u8; 10];
    let mut got = vec![0u8; 10];
    let smr = reg_send(s.as_mut(), &mut one);
    let sq = s.isend(smr, 0, 10, 0).unwrap().unwrap();
    wait_send(s.as_mut(), sq).unwrap();
    drop(s);
    let rmr = reg_recv(r.as_mut(), &mut got);
    let rq = r.irecv(&[recv_buf(rmr, 10)]).unwrap().unwrap();
    assert_eq!(wait_recv(r.as_mut(), rq).unwrap(), vec![10]);
    assert_eq!(got, one);
    let later = r.irecv(&[recv_buf(rmr, 10)]).unwrap().unwrap();
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert_eq!(r.test(later).expect("no error after a clean close"), None);
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(r);

    // The receiver leaves while idle: the sender's next isend (or its test) fails.
    let (mut s, r) = pair(&net);
    let smr = reg_send(s.as_mut(), &mut one);
    drop(r);
    let e = wait("isend after the peer left", || {
        match s.isend(smr, 0, 10, 0) {
            Err(e) => Some(e),
            Ok(Some(req)) => wait("its test", || match s.test(req) {
                Err(e) => Some(Some(e)),
                Ok(Some(_)) => Some(None),
                Ok(None) => None,
            }),
            Ok(None) => None,
        }
    });
    assert_eq!(e.code, NcclResult::RemoteError);
    assert!(e.message.contains("127.0.0.1"), "{}", e.message);
}

#[test]
fn waker_is_called_on_completion() {
    let net = lo_net(1, 1);
    let (mut s, mut r) = pair(&net);
    let woken = Arc::new(AtomicUsize::new(0));
    let (ws, wr) = (woken.clone(), woken.clone());
    s.set_waker(Arc::new(move || {
        ws.fetch_add(1, Ordering::SeqCst);
    }));
    r.set_waker(Arc::new(move || {
        wr.fetch_add(1000, Ordering::SeqCst);
    }));
    let mut a = vec![1u8; 200_000];
    let mut b = vec![0u8; 200_000];
    let smr = reg_send(s.as_mut(), &mut a);
    let rmr = reg_recv(r.as_mut(), &mut b);
    let rq = r.irecv(&[recv_buf(rmr, b.len())]).unwrap().unwrap();
    let sq = s.isend(smr, 0, a.len(), 0).unwrap().unwrap();
    // Test only after a waker call: the waker announces progress (thread 0 may call it once
    // it read the header of a message the caller has not come for), and the completion of a
    // request is announced by a waker call too, so between tests we only wait for the next
    // call, never poll.
    let (mut sent, mut got) = (None, None);
    while sent.is_none() || got.is_none() {
        let seen = woken.load(Ordering::SeqCst);
        if sent.is_none() {
            sent = s.test(sq).unwrap();
        }
        if got.is_none() {
            got = r.test(rq).unwrap();
        }
        if sent.is_none() || got.is_none() {
            wait("the next waker call", || {
                (woken.load(Ordering::SeqCst) != seen).then_some(())
            });
        }
    }
    assert_eq!(sent, Some(200_000));
    assert_eq!(got, Some(vec![200_000]));
    assert_eq!(a, b);
}

#[test]
fn requests_are_checked() {
    let net = lo_net(1, 1);
    let mut a = vec![0u8; 100];
    let mut b = vec![0u8; 100];
    let (mut s, mut r) = pair(&net);
    let smr = reg_send(s.as_mut(), &mut a);
    let rmr = reg_recv(r.as_mut(), &mut b);
    let bad = |e: crate::error::Error| e.code;
    assert_eq!(
        bad(s.isend(smr, 50, 51, 0).unwrap_err()),
        NcclResult::InvalidArgument
    );
    assert_eq!(
        bad(s.isend(smr, usize::MAX, 2, 0).unwrap_err()),
        NcclResult::InvalidArgument
    );
    assert_eq!(
        bad(s.isend(Mr(999), 0, 1, 0).unwrap_err()),
        NcclResult::InvalidArgument
    );
    assert_eq!(
        bad(r.irecv(&[recv_buf(rmr, 101)]).unwrap_err()),
        NcclResult::InvalidArgument
    );
    assert_eq!(
        bad(r.irecv(&[recv_buf(rmr, 1), recv_buf(rmr, 1)]).unwrap_err()),
        NcclResult::InvalidArgument
    );
    assert_eq!(bad(r.irecv(&[]).unwrap_err()), NcclResult::InvalidArgument);
    // SAFETY: never used: the kind is refused before anything is recorded.
    let cuda = unsafe { s.reg_mr(a.as_mut_ptr(), a.len(), PTR_CUDA) };
    assert_eq!(bad(cuda.unwrap_err()), NcclResult::InvalidArgument);
    // (Deregistering withdraws receives that have not begun: its own test below.)
    let rq = r.irecv(&[recv_buf(rmr, 100)]).unwrap().unwrap();
    // Requests beyond the limit wait.
    let mut held = Vec::new();
    while let Some(q) = r.irecv(&[recv_buf(rmr, 100)]).unwrap() {
        held.push(q);
        assert!(held.len() < 100, "irecv never says 'try again'");
    }
    assert_eq!(held.len() + 1, super::comm::MAX_REQUESTS);
    let sq = s.isend(smr, 0, 100, 0).unwrap().unwrap();
    assert_eq!(wait_send(s.as_mut(), sq).unwrap(), 100);
    assert_eq!(wait_recv(r.as_mut(), rq).unwrap(), vec![100]);
    assert_eq!(
        bad(s.test(Request(12345)).unwrap_err()),
        NcclResult::InvalidUsage
    );
    s.dereg_mr(smr).unwrap();
    assert_eq!(
        bad(s.dereg_mr(smr).unwrap_err()),
        NcclResult::InvalidArgument
    );
    // Dropping a comm with receives in flight stops its threads.
    drop(r);
}

/// A message longer than the receive posted for it fails that receive at once, naming both
/// sizes, and closes the connection (its bytes are not read: a header may claim any length):
/// later receives fail too. Inline and in pieces alike.
#[test]
fn a_message_longer_than_its_receive_closes_the_connection() {
    for (sent, posted) in [(100usize, 10usize), (1 << 20, 1 << 10)] {
        let net = lo_net(2, 2);
        let (mut s, mut r) = pair(&net);
        let mut src = vec![7u8; sent];
        let mut dst = vec![0u8; posted];
        let smr = reg_send(s.as_mut(), &mut src);
        let rmr = reg_recv(r.as_mut(), &mut dst);
        let rreq = r.irecv(&[recv_buf(rmr, posted)]).unwrap().unwrap();
        let _sreq = s.isend(smr, 0, sent, 0).unwrap().unwrap();
        let e = wait_recv(r.as_mut(), rreq).expect_err("a message longer than its receive");
        assert_eq!(e.code, NcclResult::RemoteError, "{sent} into {posted}: {e}");
        assert!(
            e.message.contains(&format!("{sent} bytes")) && e.message.contains("does not fit"),
            "{}",
            e.message
        );
        assert!(
            r.irecv(&[recv_buf(rmr, posted)]).is_err(),
            "{sent} into {posted}"
        );
        assert!(
            dst.iter().all(|&b| b == 0),
            "{sent} into {posted}: bytes written"
        );
    }
}
