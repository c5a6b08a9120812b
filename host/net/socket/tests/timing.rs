//! Time: keepalive against a silent host, late receivers, deregistration under way, and the
//! lab's throughput and round-trip measurements (ignored: run by hand).

use super::*;

/// One 256 MiB message over loopback, 1×1 and 4×4; prints the rate. Run with
/// `cargo test --workspace --all-features --lib net::socket -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput_256mib() {
    for (t, k) in [(1, 1), (4, 4)] {
        let net = lo_net(t, k);
        let (mut s, mut r) = pair(&net);
        let n = 256usize << 20;
        let mut a = Rng(1).bytes(n);
        let mut b = vec![0u8; n];
        let smr = reg_send(s.as_mut(), &mut a);
        let rmr = reg_recv(r.as_mut(), &mut b);
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t0 = Instant::now();
            let rq = r.irecv(&[recv_buf(rmr, n)]).unwrap().unwrap();
            let sq = s.isend(smr, 0, n, 0).unwrap().unwrap();
            wait_send(s.as_mut(), sq).unwrap();
            wait_recv(r.as_mut(), rq).unwrap();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        assert!(a == b);
        println!(
            "socket net loopback, {t} threads x {k} sockets: 256 MiB in {:.1} ms = {:.2} GB/s",
            best * 1e3,
            n as f64 / best / 1e9
        );
    }
}

/// Mean time (µs) of `rounds` round trips of `len`-byte messages over loopback (send,
/// receive, answer) between two connections made by `net`, the callers polling `test` as the
/// proxy does.
fn round_trip_us(net: &SocketNet, len: usize, rounds: usize) -> f64 {
    let (mut s1, mut r2) = pair(net);
    let (mut s2, mut r1) = pair(net);
    let t0 = std::thread::scope(|sc| {
        sc.spawn(move || {
            let mut buf = vec![0u8; len];
            let rmr = reg_recv(r2.as_mut(), &mut buf);
            let mut out = vec![1u8; len];
            let smr = reg_send(s2.as_mut(), &mut out);
            for _ in 0..rounds {
                let rq = r2.irecv(&[recv_buf(rmr, len)]).unwrap().unwrap();
                while r2.test(rq).unwrap().is_none() {}
                let sq = s2.isend(smr, 0, len, 0).unwrap().unwrap();
                while s2.test(sq).unwrap().is_none() {}
            }
        });
        let mut buf = vec![0u8; len];
        let rmr = reg_recv(r1.as_mut(), &mut buf);
        let mut out = vec![2u8; len];
        let smr = reg_send(s1.as_mut(), &mut out);
        let t0 = Instant::now();
        for _ in 0..rounds {
            let rq = r1.irecv(&[recv_buf(rmr, len)]).unwrap().unwrap();
            let sq = s1.isend(smr, 0, len, 0).unwrap().unwrap();
            while s1.test(sq).unwrap().is_none() {}
            while r1.test(rq).unwrap().is_none() {}
        }
        t0
    });
    t0.elapsed().as_secs_f64() * 1e6 / rounds as f64
}

/// Round trips of an 8-byte message over loopback; prints the mean. Run with
/// `cargo test --workspace --all-features --lib net::socket -- --ignored --nocapture`.
#[test]
#[ignore]
fn round_trip_8b() {
    println!(
        "socket net loopback: 8-byte round trip {:.1} us",
        round_trip_us(&lo_net(2, 2), 8, 20_000)
    );
}

/// Round trips of 32 KiB-1 MiB messages with the default inline limit (pieces from 64 KiB,
/// through the helper threads) and with every message inline on the caller's thread
/// (`NCCL_RS_SOCKET_INLINE_BYTES`), in turn; prints the means. Run as [`round_trip_8b`].
#[test]
#[ignore]
fn round_trip_inline_or_pieces() {
    for len in [32usize << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20] {
        let mut line = format!("socket net loopback, {len} B round trip:");
        for round in 0..2 {
            for below in [wire::DEFAULT_INLINE_BELOW, MAX_INLINE_BELOW] {
                let net = SocketNet::with_options(SocketOptions {
                    inline_below: below,
                    ..opts(2, 2, Family::V4)
                })
                .unwrap();
                let us = round_trip_us(&net, len, 2000);
                line.push_str(&format!(" r{round} limit {below}: {us:.1} us;"));
            }
        }
        println!("{line}");
    }
}

#[test]
fn keepalive_probes_add_up_to_the_peer_timeout() {
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .unwrap();
    // (timeout, seconds of silence before the first probe = between probes, probes)
    for (t, every, probes) in [
        (Duration::from_millis(3000), 1, 2),
        (Duration::from_millis(2500), 1, 2),
        (Duration::from_millis(500), 1, 1),
        (Duration::from_secs(60), 15, 3),
        (Duration::from_secs(10), 2, 4),
    ] {
        super::comm::keepalive(&s, t).unwrap();
        assert!(s.keepalive().unwrap());
        assert_eq!(
            s.keepalive_time().unwrap(),
            Duration::from_secs(every),
            "{t:?}"
        );
        assert_eq!(
            s.keepalive_interval().unwrap(),
            Duration::from_secs(every),
            "{t:?}"
        );
        assert_eq!(s.keepalive_retries().unwrap(), probes, "{t:?}");
    }
}

/// A receiver that posts its buffer long after the sender started (a rank late to a
/// collective) is no fault: the sender's sockets fill, the receiver's window closes, and the
/// send timeout (here 1 s, waited out 3 times) never fires, since the receiver's kernel
/// acknowledges everything it holds. (TCP_USER_TIMEOUT would end this connection: Linux counts
/// a zero window against it; 6.18 did so after 1 s in a probe with plain sockets.) Then every
/// byte arrives intact.
#[test]
fn a_receiver_late_past_the_send_timeout_is_no_fault() {
    let net = SocketNet::with_options(SocketOptions {
        send_timeout: Some(Duration::from_secs(1)),
        ..opts(1, 1, Family::V4)
    })
    .unwrap();
    let (mut s, mut r) = pair(&net);
    let len = 32 << 20;
    let mut a = Rng(23).bytes(len);
    let mut b = vec![0x5au8; len];
    let smr = reg_send(s.as_mut(), &mut a);
    let rmr = reg_recv(r.as_mut(), &mut b);
    let sq = s.isend(smr, 0, len, 0).unwrap().unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        assert_eq!(s.test(sq).unwrap(), None, "the send cannot finish unread");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rq = r.irecv(&[recv_buf(rmr, len)]).unwrap().unwrap();
    assert_eq!(wait_send(s.as_mut(), sq).unwrap(), len);
    assert_eq!(wait_recv(r.as_mut(), rq).unwrap(), vec![len]);
    assert!(a == b);
}

/// On a connection whose peer acknowledges, nothing is ever unacknowledged for long.
#[test]
fn acknowledged_data_is_not_taken_for_a_silent_host() {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (_a, _) = l.accept().unwrap();
    c.write_all(&[7u8; 1 << 16]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let sock = socket2::SockRef::from(&c);
    assert_eq!(
        super::comm::unacked_for(&sock, Duration::from_millis(100)),
        None
    );
}

#[test]
fn deregistering_withdraws_receives_that_have_not_begun() {
    // A proxy keeps receives posted ahead into its FIFO and deregisters the FIFO when the
    // connection closes: that is no misuse, and it must not leave an error behind (it used to
    // fail with "still used by 8 requests" and log a warning at every communicator's end).
    let net = lo_net(1, 1);
    let (mut s, mut r) = pair(&net);
    let mut a = vec![7u8; 64];
    let mut b = vec![0u8; 8 * 64];
    let smr = reg_send(s.as_mut(), &mut a);
    let rmr = reg_recv(r.as_mut(), &mut b);
    let reqs: Vec<Request> = (0..8)
        .map(|k| {
            let buf = RecvBuf {
                offset: k * 64,
                ..recv_buf(rmr, 64)
            };
            r.irecv(&[buf]).unwrap().unwrap()
        })
        .collect();
    // The first one completes; the other seven were never matched.
    let sq = s.isend(smr, 0, a.len(), 0).unwrap().unwrap();
    assert_eq!(wait_send(s.as_mut(), sq).unwrap(), 64);
    assert_eq!(wait_recv(r.as_mut(), reqs[0]).unwrap(), vec![64]);
    assert_eq!(&b[..64], &a[..]);
    r.dereg_mr(rmr)
        .expect("deregistering withdraws the posted receives");
    // A withdrawn request answers as such, not as pending.
    let e = r.test(reqs[1]).unwrap_err();
    assert!(e.message.contains("withdrawn"), "{e}");
    s.dereg_mr(smr).expect("the send completed");
}

/// One side's ends of the lab's connections: the sending ones, the receiving ones.
type SideEnds = (Vec<Box<dyn SendComm>>, Vec<Box<dyn RecvComm>>);

/// The proxy's traffic without a GPU (a lab tool for the cross-node bandwidth): `conns`
/// connections each way between two sides, each a FIFO of 8 slots of 512 KiB, every slot sent
/// again as soon as its send completes and received again as soon as it lands (an infinitely
/// fast kernel); one thread per side drives all of its sends and receives, as a proxy does.
/// Prints GB/s per direction. Run with `cargo test --workspace --all-features --lib
/// fifo_streams -- --ignored --nocapture` (NCCL_RS_LAB_CONNS=1,2,4,8; NCCL_RS_LAB_SECS).
#[test]
#[ignore]
fn fifo_streams() {
    const SLOTS: usize = 8;
    const SLOT: usize = 512 << 10;
    let list = std::env::var("NCCL_RS_LAB_CONNS").unwrap_or_else(|_| "1,2,4,8".into());
    let secs: f64 = std::env::var("NCCL_RS_LAB_SECS").map_or(2.0, |s| s.parse().unwrap());
    for conns in list.split(',').map(|c| c.trim().parse::<usize>().unwrap()) {
        let net = lo_net(1, 1);
        // Side k sends on sends[k] and receives on recvs[k]; a connection's two ends are
        // sends[k][i] and recvs[1 - k][i].
        let mut ends: Vec<SideEnds> = vec![(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
        for k in 0..2 {
            for _ in 0..conns {
                let (s, r) = pair(&net);
                ends[k].0.push(s);
                ends[1 - k].1.push(r);
            }
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        let moved: Vec<u64> = std::thread::scope(|sc| {
            let stop = &stop;
            let sides: Vec<_> = ends
                .into_iter()
                .map(|(mut sends, mut recvs)| {
                    sc.spawn(move || {
                        let mut sbufs: Vec<Vec<u8>> =
                            (0..conns).map(|_| vec![7u8; SLOTS * SLOT]).collect();
                        let mut rbufs: Vec<Vec<u8>> =
                            (0..conns).map(|_| vec![0u8; SLOTS * SLOT]).collect();
                        let smr: Vec<Mr> = sends
                            .iter_mut()
                            .zip(&mut sbufs)
                            .map(|(s, b)| reg_send(s.as_mut(), b))
                            .collect();
                        let rmr: Vec<Mr> = recvs
                            .iter_mut()
                            .zip(&mut rbufs)
                            .map(|(r, b)| reg_recv(r.as_mut(), b))
                            .collect();
                        // In flight per connection, oldest first: (slot, request).
                        let mut sq: Vec<VecDeque<(usize, Request)>> = vec![VecDeque::new(); conns];
                        let mut rq: Vec<VecDeque<(usize, Request)>> = vec![VecDeque::new(); conns];
                        let (mut snext, mut rnext) = (vec![0usize; conns], vec![0usize; conns]);
                        let mut got = 0u64;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            for i in 0..conns {
                                while sq[i].len() < SLOTS {
                                    let slot = snext[i] % SLOTS;
                                    let Some(q) =
                                        sends[i].isend(smr[i], slot * SLOT, SLOT, 0).unwrap()
                                    else {
                                        break;
                                    };
                                    sq[i].push_back((slot, q));
                                    snext[i] += 1;
                                }
                                while rq[i].len() < SLOTS {
                                    let slot = rnext[i] % SLOTS;
                                    let buf = RecvBuf {
                                        mr: rmr[i],
                                        offset: slot * SLOT,
                                        max_len: SLOT,
                                        tag: 0,
                                    };
                                    let Some(q) = recvs[i].irecv(&[buf]).unwrap() else {
                                        break;
                                    };
                                    rq[i].push_back((slot, q));
                                    rnext[i] += 1;
                                }
                                while let Some(&(_, q)) = sq[i].front() {
                                    if sends[i].test(q).unwrap().is_none() {
                                        break;
                                    }
                                    sq[i].pop_front();
                                }
                                while let Some(&(_, q)) = rq[i].front() {
                                    let Some(n) = recvs[i].test(q).unwrap() else {
                                        break;
                                    };
                                    got += n[0] as u64;
                                    rq[i].pop_front();
                                }
                            }
                            std::thread::yield_now();
                        }
                        // The comms go first (their threads joined), then the buffers they
                        // move bytes of, after both sides stopped (no errors to see).
                        (got, sends, recvs, sbufs, rbufs)
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_secs_f64(secs));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let done: Vec<_> = sides.into_iter().map(|h| h.join().unwrap()).collect();
            done.into_iter().map(|(g, ..)| g).collect()
        });
        println!(
            "socket net loopback, {conns} connection(s) each way, 8 x 512 KiB FIFOs, one \
             driving thread per side: {:.2} GB/s per direction",
            moved.iter().sum::<u64>() as f64 / 2.0 / secs / 1e9
        );
    }
}
