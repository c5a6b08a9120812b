//! Tests of the socket network. Loopback only (127.0.0.1 and ::1), interfaces chosen explicitly,
//! the environment never read; every wait is bounded by a deadline.

use super::ifaces::{self, Family};
use super::wire;
use super::*;
use crate::error::NcclResult;
use crate::net::{RecvBuf, Request, PTR_CUDA};
use std::collections::VecDeque;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest any test waits for anything.
const WAIT: Duration = Duration::from_secs(60);

fn opts(nthreads: usize, nsocks: usize, family: Family) -> SocketOptions {
    SocketOptions {
        ifname: Some("=lo".into()),
        family: Some(family),
        nthreads,
        nsocks_per_thread: nsocks,
        handshake_timeout: Duration::from_secs(20),
        retry_count: 3,
        retry_sleep_ms: 10,
        peer_timeout: Some(Duration::from_secs(10)),
        send_timeout: Some(Duration::from_secs(10)),
        inline_below: wire::DEFAULT_INLINE_BELOW,
    }
}

fn lo_net(nthreads: usize, nsocks: usize) -> SocketNet {
    SocketNet::with_options(opts(nthreads, nsocks, Family::V4)).expect("loopback device")
}

/// Listens, connects and accepts, the two sides polled on two threads.
fn pair(net: &SocketNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    pair_between(net, net)
}

/// [`pair`] with the sending end made by `sending` and the receiving end by `receiving`.
fn pair_between(
    sending: &SocketNet,
    receiving: &SocketNet,
) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (handle, mut listener) = receiving.listen(0).expect("listen");
    let mut connecting = sending.connect(0, &handle).expect("connect");
    let deadline = Instant::now() + WAIT;
    std::thread::scope(|s| {
        let acceptor = s.spawn(move || loop {
            if let Some(r) = listener.accept().expect("accept") {
                return r;
            }
            assert!(Instant::now() < deadline, "accept did not finish in time");
            std::thread::sleep(Duration::from_micros(200));
        });
        let send = loop {
            if let Some(c) = connecting.poll().expect("connect poll") {
                break c;
            }
            assert!(Instant::now() < deadline, "connect did not finish in time");
            std::thread::sleep(Duration::from_micros(200));
        };
        (send, acceptor.join().expect("acceptor thread"))
    })
}

/// xorshift64*, seeded with a constant: the same "random" bytes on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        for c in v.chunks_mut(8) {
            let x = self.next().to_le_bytes();
            c.copy_from_slice(&x[..c.len()]);
        }
        v
    }
}

fn reg_send(s: &mut dyn SendComm, buf: &mut [u8]) -> Mr {
    // SAFETY: every buffer registered in these tests outlives the requests that use it: each
    // test waits for its requests, or drops the comm (which joins its threads) first.
    unsafe { s.reg_mr(buf.as_mut_ptr(), buf.len(), PTR_HOST) }.expect("reg_mr")
}

fn reg_recv(r: &mut dyn RecvComm, buf: &mut [u8]) -> Mr {
    // SAFETY: as in `reg_send`.
    unsafe { r.reg_mr(buf.as_mut_ptr(), buf.len(), PTR_HOST) }.expect("reg_mr")
}

fn recv_buf(mr: Mr, max_len: usize) -> RecvBuf {
    RecvBuf {
        mr,
        offset: 0,
        max_len,
        tag: 0,
    }
}

/// Polls `f` until it gives an answer, failing the test at the deadline.
fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no answer within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn wait_send(s: &mut dyn SendComm, req: Request) -> crate::error::Result<usize> {
    wait("send test", || s.test(req).transpose())
}

fn wait_recv(r: &mut dyn RecvComm, req: Request) -> crate::error::Result<Vec<usize>> {
    wait("recv test", || r.test(req).transpose())
}

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
fn too_short_receive_fails_with_both_sizes_and_the_stream_goes_on() {
    let net = lo_net(2, 2);
    let (mut s, mut r) = pair(&net);
    let mut rng = Rng(11);
    for (long, short) in [(100_000usize, 50_000usize), (1000, 10)] {
        let mut big = rng.bytes(long);
        let mut next = rng.bytes(4096);
        let mut small = vec![0u8; short];
        let mut after = vec![0u8; 4096];
        let bmr = reg_send(s.as_mut(), &mut big);
        let nmr = reg_send(s.as_mut(), &mut next);
        let smr = reg_recv(r.as_mut(), &mut small);
        let amr = reg_recv(r.as_mut(), &mut after);
        let rq1 = r.irecv(&[recv_buf(smr, short)]).unwrap().unwrap();
        let rq2 = r.irecv(&[recv_buf(amr, 4096)]).unwrap().unwrap();
        let sq1 = s.isend(bmr, 0, long, 0).unwrap().unwrap();
        let sq2 = s.isend(nmr, 0, 4096, 0).unwrap().unwrap();
        let e = wait_recv(r.as_mut(), rq1).unwrap_err();
        assert_eq!(e.code, NcclResult::RemoteError);
        assert!(
            e.message.contains(&long.to_string()) && e.message.contains(&short.to_string()),
            "{}",
            e.message
        );
        // The long message was drained: the next one arrives intact.
        assert_eq!(wait_recv(r.as_mut(), rq2).unwrap(), vec![4096]);
        assert_eq!(after, next);
        assert_eq!(wait_send(s.as_mut(), sq1).unwrap(), long);
        assert_eq!(wait_send(s.as_mut(), sq2).unwrap(), 4096);
        s.dereg_mr(bmr).unwrap();
        s.dereg_mr(nmr).unwrap();
        r.dereg_mr(smr).unwrap();
        r.dereg_mr(amr).unwrap();
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

#[test]
fn ipv6_loopback() {
    let net = match SocketNet::with_options(opts(2, 1, Family::V6)) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("skipped: no IPv6 loopback address ({e})");
            return;
        }
    };
    assert_eq!(net.address(0).unwrap(), IpAddr::V6(Ipv6Addr::LOCALHOST));
    let (mut s, mut r) = pair(&net);
    let mut a = Rng(9).bytes(1 << 20);
    let mut b = vec![0u8; 1 << 20];
    let smr = reg_send(s.as_mut(), &mut a);
    let rmr = reg_recv(r.as_mut(), &mut b);
    let rq = r.irecv(&[recv_buf(rmr, b.len())]).unwrap().unwrap();
    let sq = s.isend(smr, 0, a.len(), 0).unwrap().unwrap();
    assert_eq!(wait_send(s.as_mut(), sq).unwrap(), 1 << 20);
    assert_eq!(wait_recv(r.as_mut(), rq).unwrap(), vec![1 << 20]);
    assert!(a == b);
}

#[test]
fn listener_ignores_strangers_and_gives_up_on_incomplete_connections() {
    let net = SocketNet::with_options(SocketOptions {
        handshake_timeout: Duration::from_millis(300),
        ..opts(1, 2, Family::V4)
    })
    .unwrap();
    let (handle, mut listener) = net.listen(0).unwrap();
    let info = wire::decode_handle(&handle).unwrap();
    assert_eq!(info.addr.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    // A stranger writing garbage is dropped.
    let mut stranger = TcpStream::connect(info.addr).unwrap();
    stranger.write_all(&[0xee; wire::HELLO_BYTES]).unwrap();
    // A control socket whose data sockets never come.
    let mut half = TcpStream::connect(info.addr).unwrap();
    let hello = wire::encode_hello(&wire::Hello {
        tag: info.tag,
        conn: wire::ConnId { pid: 1, serial: 1 },
        data_index: None,
        nthreads: 1,
        nsocks: 2,
    });
    half.write_all(&hello).unwrap();
    // A real connection still gets through.
    let mut c = net.connect(0, &handle).unwrap();
    let mut got_comm = false;
    let e = wait("the incomplete connection's error", || {
        if !got_comm {
            let _ = c.poll().unwrap();
        }
        match listener.accept() {
            Ok(Some(_)) => {
                got_comm = true;
                None
            }
            Ok(None) => None,
            Err(e) => Some(e),
        }
    });
    assert!(got_comm, "the real connection was not accepted first");
    assert_eq!(e.code, NcclResult::RemoteError);
    assert!(e.message.contains("1 of its 3 sockets"), "{}", e.message);
    drop((stranger, half));
}

/// A flood of silent connections to a listener holds at most `MAX_PENDING` of its descriptors
/// (the rest wait in the kernel's backlog; it used to take them all), and a real connection
/// still gets through once the handshake deadline has dropped the silent ones ahead of it.
#[test]
fn a_flood_of_silent_connections_holds_few_descriptors() {
    let net = SocketNet::with_options(SocketOptions {
        handshake_timeout: Duration::from_millis(300),
        ..opts(1, 2, Family::V4)
    })
    .unwrap();
    let (handle, mut listener) = net.listen(0).unwrap();
    let info = wire::decode_handle(&handle).unwrap();
    let fds = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let flood_size = 400;
    let before = fds();
    let flood: Vec<_> = (0..flood_size)
        .map(|_| TcpStream::connect(info.addr).unwrap())
        .collect();
    for _ in 0..20 {
        assert!(listener.accept().unwrap().is_none(), "nobody greeted");
        std::thread::sleep(Duration::from_millis(1));
    }
    // This process holds the flood's own sockets too; the listener may add MAX_PENDING. (Other
    // tests open and close sockets meanwhile: a wide margin, far below twice the flood.)
    let during = fds();
    assert!(
        during <= before + flood_size + handshake::MAX_PENDING + 100,
        "{flood_size} silent connections: descriptors {before} -> {during}"
    );
    let start = Instant::now();
    let mut c = net.connect(0, &handle).unwrap();
    let mut sender = None;
    let _receiver = wait("the real connection behind the flood", || {
        if sender.is_none() {
            sender = c.poll().unwrap();
        }
        listener.accept().unwrap()
    });
    eprintln!(
        "a connection behind {flood_size} silent ones: accepted in {:?}, descriptors {before} -> \
         {during} during the flood",
        start.elapsed()
    );
    drop(flood);
}

/// A listener's tag is not the process id and a counter in the clear (a stranger who knows
/// the pid could then greet the listener as one of its connections and fail its set-up).
#[test]
fn listener_tags_do_not_show_the_process_id() {
    let (a, b) = (handshake::next_tag(), handshake::next_tag());
    assert_ne!(a >> 32, u64::from(std::process::id()), "{a:#x}");
    assert_ne!(a, b);
}

#[test]
fn connect_to_nobody_fails_in_time() {
    let net = lo_net(1, 1);
    let (handle, listener) = net.listen(0).unwrap();
    drop(listener);
    let e = match net.connect(0, &handle) {
        Err(e) => e,
        Ok(mut c) => wait("connect's failure", || c.poll().err()),
    };
    assert_eq!(e.code, NcclResult::RemoteError);
    assert!(e.message.contains("127.0.0.1"), "{}", e.message);
    let zero = [0u8; crate::net::HANDLE_BYTES];
    assert_eq!(
        net.connect(0, &zero).err().map(|e| e.code),
        Some(NcclResult::InvalidArgument)
    );
    assert!(net.connect(1, &handle).is_err());
}

#[test]
fn loopback_properties() {
    let net = SocketNet::with_ifname("=lo").unwrap();
    assert_eq!(net.name(), "Socket");
    assert_eq!(net.ndevs(), 1);
    let p = net.properties(0).unwrap();
    assert_eq!(p.name, "lo");
    assert_eq!(p.guid, 0);
    assert_eq!(p.ptr_support, PTR_HOST);
    // lo has no PCI device and no speed in sysfs.
    assert_eq!(p.pci_path, "");
    assert_eq!(p.speed_mbps, DEFAULT_SPEED_MBPS);
    assert_eq!((p.latency_us, p.port), (0.0, 0));
    assert_eq!((p.max_comms, p.max_recvs), (65536, 1));
    assert_eq!(net.geometry(0).unwrap(), (1, 1));
    assert!(net.properties(1).is_err());
}

#[test]
fn unknown_interface_lists_the_real_ones() {
    let e = SocketNet::with_ifname("=no-such-if0")
        .err()
        .expect("must fail");
    assert_eq!(e.code, NcclResult::InvalidUsage);
    assert!(e.message.contains("no-such-if0"), "{}", e.message);
    assert!(e.message.contains("lo (127.0.0.1"), "{}", e.message);
}

#[test]
fn geometry_is_clamped_as_nccl() {
    let o = |t, s| SocketOptions {
        nthreads: t,
        nsocks_per_thread: s,
        ..SocketOptions::default()
    };
    assert_eq!(super::geometry(&o(0, 0), "lo"), (1, 1));
    assert_eq!(super::geometry(&o(4, 4), "lo"), (4, 4));
    assert_eq!(super::geometry(&o(40, 1), "lo"), (16, 1));
    assert_eq!(super::geometry(&o(16, 8), "lo"), (16, 4));
    assert_eq!(super::geometry(&o(3, 64), "lo"), (3, 21));
}

fn addrs(list: &[(&str, &str)]) -> Vec<(String, IpAddr)> {
    list.iter()
        .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
        .collect()
}

fn names(v: &[(String, IpAddr)]) -> Vec<&str> {
    v.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn interface_selection() {
    let all = addrs(&[
        ("lo", "127.0.0.1"),
        ("lo", "::1"),
        ("eth0", "fe80::1"),
        ("eth0", "10.0.0.2"),
        ("eth1", "fd00::5"),
        ("docker0", "172.17.0.1"),
        ("virbr0", "192.168.122.1"),
        ("ens1f0", "10.2.0.2"),
        ("ens1f0", "fd00::7"),
    ]);
    let sel = |spec: Option<&str>, fam| ifaces::select(&all, spec, fam);
    // Default: not lo, docker*, virbr*; IPv4 first within an interface.
    let d = sel(None, None).unwrap();
    assert_eq!(names(&d), ["eth0", "eth1", "ens1f0"]);
    assert_eq!(d[0].1, "10.0.0.2".parse::<IpAddr>().unwrap());
    assert_eq!(d[1].1, "fd00::5".parse::<IpAddr>().unwrap());
    // ib* first when there is one.
    let mut with_ib = all.clone();
    with_ib.extend(addrs(&[("ib0", "10.9.0.1")]));
    assert_eq!(
        names(&ifaces::select(&with_ib, None, None).unwrap()),
        ["ib0"]
    );
    // docker/virbr, then lo, only when nothing else exists.
    let few = addrs(&[("lo", "127.0.0.1"), ("docker0", "172.17.0.1")]);
    assert_eq!(
        names(&ifaces::select(&few, None, None).unwrap()),
        ["docker0"]
    );
    let lo = addrs(&[("lo", "127.0.0.1")]);
    assert_eq!(names(&ifaces::select(&lo, None, None).unwrap()), ["lo"]);
    // Prefixes, exclusions, exact names.
    assert_eq!(names(&sel(Some("eth"), None).unwrap()), ["eth0", "eth1"]);
    assert_eq!(
        names(&sel(Some("ens,dock"), None).unwrap()),
        ["docker0", "ens1f0"]
    );
    assert_eq!(
        names(&sel(Some("^eth,lo"), None).unwrap()),
        ["docker0", "virbr0", "ens1f0"]
    );
    assert_eq!(names(&sel(Some("=eth0"), None).unwrap()), ["eth0"]);
    assert_eq!(
        names(&sel(Some("^=eth0"), None).unwrap()),
        ["lo", "eth1", "docker0", "virbr0", "ens1f0"]
    );
    assert_eq!(names(&sel(Some("=eth0,=eth1"), None).unwrap()), ["eth0"]);
    assert_eq!(
        names(&sel(Some("=eth0,eth1"), None).unwrap()),
        ["eth0", "eth1"]
    );
    // Families: link-local IPv6 does not count.
    assert_eq!(
        names(&sel(Some("eth"), Some(Family::V6)).unwrap()),
        ["eth1"]
    );
    let v6 = sel(None, Some(Family::V6)).unwrap();
    assert_eq!(names(&v6), ["eth1", "ens1f0"]);
    assert_eq!(v6[1].1, "fd00::7".parse::<IpAddr>().unwrap());
    assert_eq!(
        sel(Some("=lo"), Some(Family::V6)).unwrap()[0].1,
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    );
    // Nothing matches: the error names the value and what exists.
    let e = sel(Some("=eth"), None).unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidUsage);
    assert!(
        e.message.contains("NCCL_SOCKET_IFNAME==eth"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("eth0 (fe80::1, 10.0.0.2)"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("ens1f0 (10.2.0.2, fd00::7)"),
        "{}",
        e.message
    );
    let e = sel(Some("=eth1"), Some(Family::V4)).unwrap_err();
    assert!(e.message.contains("AF_INET"), "{}", e.message);
    // No interface at all.
    let e = ifaces::select(&[], None, None).unwrap_err();
    assert_eq!(e.code, NcclResult::SystemError);
    assert!(e.message.contains("none"), "{}", e.message);
    // At most 16 devices.
    let many: Vec<(String, IpAddr)> = (0..20u8)
        .map(|i| {
            (
                format!("eth{i}"),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, i + 1)),
            )
        })
        .collect();
    assert_eq!(
        ifaces::select(&many, None, None).unwrap().len(),
        ifaces::MAX_IFS
    );
    // Family names.
    assert_eq!(Family::parse("AF_INET"), Some(Family::V4));
    assert_eq!(Family::parse("af_inet6"), Some(Family::V6));
    assert_eq!(Family::parse("AF_UNIX"), None);
}

#[test]
fn wire_formats() {
    for addr in ["127.0.0.1:4242", "[::1]:65535", "[fd00::1:2]:1"] {
        let h = wire::HandleInfo {
            addr: addr.parse().unwrap(),
            tag: 0x1234_5678_9abc_def0,
        };
        let b = wire::encode_handle(&h);
        assert_eq!(wire::decode_handle(&b).unwrap(), h);
    }
    let mut b = wire::encode_handle(&wire::HandleInfo {
        addr: "127.0.0.1:1".parse().unwrap(),
        tag: 1,
    });
    b[9] = 5;
    assert_eq!(
        wire::decode_handle(&b).unwrap_err().code,
        NcclResult::InvalidArgument
    );
    let hello = wire::Hello {
        tag: 77,
        conn: wire::ConnId {
            pid: 1234,
            serial: 99,
        },
        data_index: Some(15),
        nthreads: 4,
        nsocks: 4,
    };
    let b = wire::encode_hello(&hello);
    assert_eq!(wire::decode_hello(&b).unwrap(), hello);
    let ctrl = wire::Hello {
        data_index: None,
        ..hello
    };
    assert_eq!(
        wire::decode_hello(&wire::encode_hello(&ctrl)).unwrap(),
        ctrl
    );
    for bad in [
        wire::Hello {
            data_index: Some(16),
            ..hello
        },
        wire::Hello {
            nthreads: 17,
            nsocks: 1,
            ..hello
        },
        wire::Hello {
            nthreads: 8,
            nsocks: 9,
            data_index: None,
            ..hello
        },
    ] {
        assert!(wire::decode_hello(&wire::encode_hello(&bad)).is_err());
    }
    for inline in [false, true] {
        let h = wire::encode_header(123_456, 9, inline);
        assert_eq!(wire::decode_header(&h), Some((123_456, 9, inline)));
        let mut h = h;
        h[15] ^= 2;
        assert_eq!(wire::decode_header(&h), None);
    }
    // The two check words differ in their last bit only: each flip of it is the other way.
    let mut h = wire::encode_header(7, 1, false);
    h[12] ^= 1;
    assert_eq!(wire::decode_header(&h), Some((7, 1, true)));
}

#[test]
fn pieces_cover_each_message_once() {
    for nsocks in [1usize, 2, 3, 16, 64] {
        for len in [
            0usize,
            1,
            wire::MIN_CHUNK - 1,
            wire::MIN_CHUNK,
            wire::MIN_CHUNK + 1,
            300_001,
            1 << 20,
            (64 << 20) + 7,
        ] {
            let mut next = 0;
            let mut used = 0;
            for i in 0..nsocks {
                let r = wire::piece(len, nsocks, i);
                if r.is_empty() {
                    continue;
                }
                assert_eq!(r.start, next, "len {len} nsocks {nsocks} socket {i}");
                assert!(r.len() >= wire::MIN_CHUNK.min(len - r.start));
                next = r.end;
                used += 1;
            }
            // Whatever a sender's inline limit, a message it sends in pieces is covered (an
            // empty one by no piece).
            assert_eq!(next, len, "len {len} nsocks {nsocks}");
            assert_eq!(used == 0, len == 0, "len {len} nsocks {nsocks}");
        }
    }
    let d = wire::DEFAULT_INLINE_BELOW;
    assert!(wire::sends_inline(0, d) && wire::sends_inline(4096, d));
    assert!(!wire::sends_inline(d, d) && !wire::sends_inline(1 << 20, d));
    assert!(wire::sends_inline(0, 0) && !wire::sends_inline(1, 0));
    assert!(wire::sends_inline(1 << 20, 2 << 20));
    // 16 sockets each carry 4 MiB of 64 MiB.
    assert_eq!(wire::piece(64 << 20, 16, 15), (60 << 20)..(64 << 20));
    assert_eq!(wire::thread_of(5, 4), 1);
}

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
