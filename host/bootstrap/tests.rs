use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use super::id::{id_from_comm_id, IdFields};
use super::wire::{self, Channel, Hello, Msg};
use super::*;
use crate::error::NcclResult;

const T: Duration = Duration::from_secs(10);

/// The bound of [`within`]: generous, yet shorter than the timeouts and retries the tests
/// below tell apart from a prompt answer (60 s operation timeouts, ~56 s of connect retries).
const BOUND: Duration = Duration::from_secs(30);

/// Runs `f` on a thread of its own and fails the test if it has not returned after `bound`:
/// a bound that only turns a hang (or a wait for a whole timeout) into a failure, never a
/// timing claim. Every id here is on loopback (`new_local_root_id`): the tests never use the
/// machine's own interfaces.
fn within<R: Send>(what: &str, bound: Duration, f: impl FnOnce() -> R + Send) -> R {
    thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        s.spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(bound)
            .unwrap_or_else(|_| panic!("{what}: not done after {bound:?}"))
    })
}

/// xorshift64*: reproducible randomness without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Runs `f` on `nranks` threads that each joined the bootstrap of `id`.
fn with_ranks<R: Send>(
    id: &UniqueId,
    nranks: usize,
    f: impl Fn(Bootstrap) -> R + Sync,
) -> Vec<Result<R>> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..nranks)
            .map(|r| {
                let f = &f;
                s.spawn(move || Bootstrap::init(id, r, nranks, T).map(f))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

fn payload(rank: usize, round: usize) -> Vec<u8> {
    (0..rank * 37 + round * 5 + rank % 3)
        .map(|i| (i * 31 + rank * 7 + round) as u8)
        .collect()
}

#[test]
fn id_round_trip_and_rejection() {
    let v4 = IdFields {
        root: SocketAddr::from((Ipv4Addr::new(10, 1, 2, 3), 4567)),
        nonce: 0x0123_4567_89ab_cdef,
        flags: 0,
    };
    let v6 = IdFields {
        root: SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::new(0xfe80, 0, 0, 0, 1, 2, 3, 4),
            9,
            0,
            7,
        )),
        nonce: 42,
        flags: id::FLAG_ROOT_AT_INIT,
    };
    for f in [v4, v6] {
        let id = UniqueId::encode(&f);
        assert_eq!(id.fields().expect("decode"), f);
        assert_eq!(id.decode().expect("decode"), (f.root, f.nonce));
        assert!(format!("{id:?}").contains(&f.root.to_string()));
        let mut bad = id;
        bad.internal[0] ^= 1;
        let e = bad.decode().expect_err("wrong magic");
        assert_eq!(e.code, NcclResult::InvalidArgument);
        assert!(e.message.contains("never produced"), "{}", e.message);
        assert_eq!(format!("{bad:?}"), "UniqueId(<not a bootstrap id>)");
    }
    let zero = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    assert!(zero.decode().is_err());
    let a = new_local_root_id().expect("id");
    let b = new_local_root_id().expect("id");
    assert_ne!(a, b);
    assert_ne!(a.decode().expect("a").1, b.decode().expect("b").1);

    assert!(id_from_comm_id("not an address").is_err());
    assert!(id_from_comm_id("127.0.0.1:0").is_err());
    let c = id_from_comm_id(" 127.0.0.1:5555 ").expect("comm id");
    assert_eq!(c, id_from_comm_id("127.0.0.1:5555").expect("comm id"));
    assert_eq!(
        c.decode().expect("decode").0,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 5555))
    );
}

fn check_group(nranks: usize) {
    let id = new_local_root_id().expect("id");
    let results = with_ranks(&id, nranks, |bs| -> Result<()> {
        let r = bs.rank();
        assert_eq!(bs.nranks(), nranks);
        assert_eq!(bs.peer_addresses().len(), nranks);
        for round in 0..3 {
            let all = bs.allgather(&payload(r, round))?;
            for (q, got) in all.iter().enumerate() {
                assert_eq!(got, &payload(q, round), "rank {r} round {round} from {q}");
            }
            bs.barrier()?;
        }
        // Point-to-point: every rank sends to its two ring neighbours on two tags.
        let next = (r + 1) % nranks;
        let prev = (r + nranks - 1) % nranks;
        for tag in [7u32, 9] {
            for seq in 0..3u8 {
                bs.send(next, tag, &[r as u8, tag as u8, seq])?;
                bs.send(prev, tag + 100, &[r as u8, seq])?;
            }
        }
        for tag in [9u32, 7] {
            for seq in 0..3u8 {
                assert_eq!(bs.recv(prev, tag)?, vec![prev as u8, tag as u8, seq]);
                assert_eq!(bs.recv(next, tag + 100)?, vec![next as u8, seq]);
            }
        }
        bs.barrier()
    });
    for (r, res) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r} init: {e}"))
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

#[test]
fn groups_of_2_3_8() {
    for n in [1, 2, 3, 8] {
        check_group(n);
    }
}

/// 64 ranks as threads: init and an allgather (how long they take is the benchmark's).
#[test]
fn sixty_four_ranks_init_and_allgather() {
    let id = new_local_root_id().expect("id");
    let start = Instant::now();
    let results = with_ranks(&id, 64, |bs| {
        let all = bs.allgather(&payload(bs.rank(), 0))?;
        let ok = all.iter().enumerate().all(|(q, v)| *v == payload(q, 0));
        Ok::<_, Error>((ok, start.elapsed()))
    });
    let mut slowest = Duration::ZERO;
    for res in results {
        let (ok, t) = res.expect("init").expect("allgather");
        assert!(ok);
        slowest = slowest.max(t);
    }
    eprintln!("64 ranks: init + allgather in {slowest:?}");
}

#[test]
fn all_pairs_tags_self_and_large_messages() {
    let id = new_local_root_id().expect("id");
    let n = 4;
    let results = with_ranks(&id, n, |bs| -> Result<()> {
        let r = bs.rank();
        for p in 0..n {
            for tag in 0..3u32 {
                for seq in 0..4u8 {
                    bs.send(p, tag, &[r as u8, p as u8, tag as u8, seq])?;
                }
            }
        }
        for p in (0..n).rev() {
            for tag in (0..3u32).rev() {
                for seq in 0..4u8 {
                    assert_eq!(bs.recv(p, tag)?, vec![p as u8, r as u8, tag as u8, seq]);
                }
            }
        }
        // Both directions at once with messages larger than socket buffers: must not deadlock.
        let peer = r ^ 1;
        let big: Vec<u8> = (0..(8 << 20)).map(|i| (i % 251) as u8 ^ r as u8).collect();
        bs.send(peer, 77, &big)?;
        let got = bs.recv(peer, 77)?;
        assert_eq!(got.len(), big.len());
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8 ^ peer as u8));
        bs.send(r, 5, b"")?;
        assert_eq!(bs.recv(r, 5)?, Vec::<u8>::new());
        assert!(bs.send(n, 0, b"x").is_err());
        assert!(bs.recv(n, 0).is_err());
        bs.barrier()
    });
    for res in results {
        res.expect("init").expect("rank");
    }
}

#[test]
fn missing_rank_times_out_everywhere() {
    let id = new_local_root_id().expect("id");
    let results: Vec<Result<Bootstrap>> = within("the ranks' init", BOUND, || {
        thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| s.spawn(move || Bootstrap::init(&id, r, 3, Duration::from_millis(500))))
                .collect();
            hs.into_iter().map(|h| h.join().expect("join")).collect()
        })
    });
    for res in results {
        let e = res.expect_err("must fail");
        assert_eq!(e.code, NcclResult::RemoteError);
        assert!(e.message.contains("only 2 of 3 ranks"), "{}", e.message);
        assert!(e.message.contains("missing ranks: 2"), "{}", e.message);
    }
}

#[test]
fn root_gone_gives_error_not_hang() {
    // An id pointing at a port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let id = UniqueId::encode(&IdFields {
        root: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        nonce: 1,
        flags: 0,
    });
    let e = within("an init with no root", BOUND, || {
        Bootstrap::init(&id, 0, 2, Duration::from_millis(300)).expect_err("no root")
    });
    assert_eq!(e.code, NcclResult::RemoteError);
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// Sends `bytes` to `addr`, then reads whatever comes back until the root closes.
fn poke(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect to root");
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    back
}

fn refusal(back: &[u8]) -> (NcclResult, String) {
    assert!(back.len() > 4, "no answer");
    match wire::decode(&back[4..]).expect("decodable answer") {
        Msg::Fail { code, message } => (code, message),
        other => panic!("unexpected answer {other:?}"),
    }
}

#[test]
fn root_survives_garbage() {
    let id = new_local_root_id().expect("id");
    let (root, nonce) = id.decode().expect("decode");
    // A silent connection stays open during the whole bootstrap.
    let silent = TcpStream::connect(root).expect("silent");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    assert!(poke(root, &rng.bytes(300)).is_empty());
    assert!(poke(root, &frame(&rng.bytes(40))).is_empty());
    assert!(poke(root, &[0xff, 0xff, 0xff, 0x7f, 1, 2, 3]).is_empty());
    // Truncated: announces 60 bytes, sends 10.
    let mut trunc = 60u32.to_le_bytes().to_vec();
    trunc.extend_from_slice(&[1; 10]);
    assert!(poke(root, &trunc).is_empty());
    let hello = |nonce, rank, nranks| {
        wire::encode_hello(&Hello {
            nonce,
            rank,
            nranks,
            timeout_ms: 1000,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 9)),
        })
    };
    let good = hello(nonce, 0, 3);
    // Wrong magic in an otherwise valid hello.
    let mut bad_magic = good.clone();
    bad_magic[5] ^= 0x40;
    assert!(poke(root, &bad_magic).is_empty());
    // Truncated hello.
    assert!(poke(root, &good[..good.len() - 3]).is_empty());
    // Valid hellos that the root must refuse, with a reason.
    let (code, msg) = refusal(&poke(root, &hello(nonce ^ 1, 0, 3)));
    assert_eq!(code, NcclResult::InvalidUsage, "{msg}");
    let (code, msg) = refusal(&poke(root, &hello(nonce, 3, 3)));
    assert_eq!(code, NcclResult::InvalidArgument, "{msg}");
    // After all that, a real bootstrap on the same id.
    for res in with_ranks(&id, 3, |bs| bs.allgather(&[bs.rank() as u8])) {
        assert_eq!(
            res.expect("init").expect("allgather"),
            vec![vec![0], vec![1], vec![2]]
        );
    }
    drop(silent);
}

#[test]
fn root_refuses_inconsistent_ranks() {
    let id = new_local_root_id().expect("id");
    let gate = Barrier::new(2);
    thread::scope(|s| {
        let first = s.spawn(|| {
            gate.wait();
            Bootstrap::init(&id, 0, 2, T)
        });
        let second = s.spawn(|| {
            gate.wait();
            thread::sleep(Duration::from_millis(100));
            let e = Bootstrap::init(&id, 1, 3, T).expect_err("nranks mismatch");
            assert_eq!(e.code, NcclResult::InvalidUsage, "{}", e.message);
            let e = Bootstrap::init(&id, 0, 2, T).expect_err("rank 0 twice");
            assert_eq!(e.code, NcclResult::InvalidUsage, "{}", e.message);
            Bootstrap::init(&id, 1, 2, T)
        });
        let a = first.join().expect("join").expect("rank 0");
        let b = second.join().expect("join").expect("rank 1");
        thread::scope(|s| {
            s.spawn(|| a.barrier().expect("barrier 0"));
            s.spawn(|| b.barrier().expect("barrier 1"));
        });
    });
}

#[test]
fn bad_arguments() {
    let id = new_local_root_id().expect("id");
    let e = Bootstrap::init(&id, 2, 2, T).expect_err("rank out of range");
    assert_eq!(e.code, NcclResult::InvalidArgument);
    let e = Bootstrap::init(&id, 0, 0, T).expect_err("no ranks");
    assert_eq!(e.code, NcclResult::InvalidArgument);
    let junk = UniqueId {
        internal: [7; UNIQUE_ID_BYTES],
    };
    let e = Bootstrap::init(&junk, 0, 1, T).expect_err("junk id");
    assert_eq!(e.code, NcclResult::InvalidArgument);
}

#[test]
fn comm_id_mode_root_started_by_rank0() {
    let mut roots = vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))];
    match TcpListener::bind("[::1]:0") {
        Ok(_) => roots.push(SocketAddr::from((Ipv6Addr::LOCALHOST, 0))),
        Err(e) => crate::test_aids::skipped(
            "no IPv6 loopback here",
            &format!("comm_id_mode_root_started_by_rank0, its IPv6 part (cannot bind [::1]: {e})"),
        ),
    }
    for any_port in roots {
        let root = TcpListener::bind(any_port)
            .and_then(|l| l.local_addr())
            .expect("free port");
        let id = id_from_comm_id(&root.to_string()).expect("id");
        assert_eq!(id.decode().expect("decode").0, root);
        for res in with_ranks(&id, 3, |bs| {
            assert_eq!(bs.peer_addresses()[bs.rank()].is_ipv6(), root.is_ipv6());
            bs.allgather(&payload(bs.rank(), 1))
        }) {
            let all = res.expect("init").expect("allgather");
            assert!(all.iter().enumerate().all(|(q, v)| *v == payload(q, 1)));
        }
    }
}

#[test]
fn dead_peer_abort_and_op_timeout() {
    let id = new_local_root_id().expect("id");
    let mut ranks: Vec<Bootstrap> = with_ranks(&id, 3, |bs| bs)
        .into_iter()
        .map(|r| r.expect("init"))
        .collect();
    let c = ranks.pop().expect("rank 2");
    let b = ranks.pop().expect("rank 1");
    let a = ranks.pop().expect("rank 0");

    // A live peer that never sends: the operation timeout.
    a.set_op_timeout(Duration::from_millis(200));
    let e = within("a receive nothing answers", BOUND, || {
        a.recv(2, 1).expect_err("nothing sent")
    });
    assert!(e.message.contains("timed out"), "{}", e.message);
    a.set_op_timeout(Duration::from_secs(60));

    // A message sent just before the sender goes away is still delivered; then the closed
    // connection is an immediate error, not a 60 s wait.
    c.send(0, 3, b"last words").expect("send");
    drop(c);
    assert_eq!(a.recv(2, 3).expect("delivered"), b"last words");
    // (Within the bound, shorter than the 60 s timeout: the closed connection answers.)
    let e = within("a receive from a gone peer", BOUND, || {
        a.recv(2, 3).expect_err("peer gone")
    });
    assert_eq!(e.code, NcclResult::RemoteError);

    // Abort wakes a waiting receiver, and every later call fails.
    within("an aborted receive", BOUND, || {
        thread::scope(|s| {
            let waiter = s.spawn(|| b.recv(0, 1));
            // Once the receiver waits (the bound turns a hang into a failure).
            let waiting = b
                .shared
                .wait_until(Instant::now() + BOUND, |_, takers| takers > 0);
            assert!(waiting, "the receive never waited");
            b.abort(false);
            let e = waiter.join().expect("join").expect_err("aborted");
            assert!(e.message.contains("aborted"), "{}", e.message);
        })
    });
    assert!(b.send(0, 1, b"x").is_err());
    assert!(b.recv(0, 1).is_err());
    assert!(b.allgather(b"x").is_err());
    assert!(b.barrier().is_err());
    // The aborted rank's peers see its connections close (before the 60 s timeout).
    assert!(within("a barrier with an aborted peer", BOUND, || a.barrier()).is_err());
}

/// A rank that goes without a goodbye (aborted, or its process died) is reported to every
/// survivor, also those with no connection to it; one that leaves on purpose (dropped, as
/// `ncclCommDestroy` does) is not.
#[test]
fn a_gone_peer_is_reported_to_every_rank() {
    use std::sync::{mpsc, Arc};
    let id = new_local_root_id().expect("id");
    let mut ranks: Vec<Arc<Bootstrap>> = with_ranks(&id, 4, Arc::new)
        .into_iter()
        .map(|r| r.expect("init"))
        .collect();
    let (tx, rx) = mpsc::channel::<(usize, Error)>();
    for bs in &ranks {
        let (tx, me) = (Mutex::new(tx.clone()), bs.rank());
        bs.watch(move |e| {
            let _ = lock(&tx).send((me, e));
        });
    }
    // Rank 3 leaves on purpose: nobody hears of a fault.
    drop(ranks.pop());
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a goodbye is no fault"
    );
    // Rank 1 aborts: rank 2 (its ring successor) sees the connection end, and tells rank 0,
    // which never had a connection from rank 1.
    ranks[1].abort(false);
    let mut heard = Vec::new();
    while heard.len() < 2 {
        let (who, e) = rx.recv_timeout(T).expect("a fault report in time");
        assert_eq!(e.code, NcclResult::RemoteError, "{e}");
        assert!(e.message.contains("peer rank 1 (bootstrap at "), "{e}");
        heard.push(who);
        if who == 0 {
            assert!(e.message.contains("as rank 2 saw"), "{e}");
        }
    }
    heard.sort();
    assert_eq!(heard, [0, 2]);
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "once per peer"
    );
    // Waits on the dead rank and collectives of all ranks now fail at once, not at the end
    // of their timeout (60 s here; the bound is liveness, not timing).
    for r in [0, 2] {
        ranks[r].set_op_timeout(Duration::from_secs(60));
    }
    let e = within("a receive from a dead rank", BOUND, || {
        ranks[0].recv(1, 7).expect_err("rank 1 is gone")
    });
    assert!(e.message.contains("is gone"), "{e}");
    assert!(within("a barrier with a dead rank", BOUND, || ranks[2].barrier()).is_err());
}

/// A rank that aborts the moment it learns of a dead peer (as an application does on an async
/// error) first lets its notices of that death out and says goodbye: the other survivors hear
/// of the dead rank, never of the one that aborted after it.
#[test]
fn an_abort_after_a_fault_passes_the_news_on() {
    use std::sync::{mpsc, Arc};
    let id = new_local_root_id().expect("id");
    let mut ranks: Vec<Arc<Bootstrap>> = with_ranks(&id, 4, Arc::new)
        .into_iter()
        .map(|r| r.expect("init"))
        .collect();
    let (tx, rx) = mpsc::channel::<(usize, Error)>();
    for bs in &ranks {
        let (tx, me) = (Mutex::new(tx.clone()), bs.rank());
        let this = Arc::downgrade(bs);
        bs.watch(move |e| {
            if me == 0 {
                if let Some(b) = this.upgrade() {
                    b.abort(true);
                }
            }
            let _ = lock(&tx).send((me, e));
        });
    }
    // Rank 3 dies; its ring successor, rank 0, sees it and aborts at once.
    ranks.pop().expect("rank 3").abort(false);
    let mut heard = Vec::new();
    while heard.len() < 3 {
        let (who, e) = rx.recv_timeout(T).expect("a fault report in time");
        assert!(
            e.message.contains("peer rank 3 (bootstrap at "),
            "rank {who}: {e}"
        );
        heard.push(who);
    }
    heard.sort();
    assert_eq!(heard, [0, 1, 2]);
    if let Ok((who, e)) = rx.recv_timeout(Duration::from_millis(500)) {
        panic!("rank {who} heard of a second fault: {e}");
    }
}

/// Knowing the unique id (its nonce) is not enough to pass as a rank: a greeting must carry
/// the key the claimed rank gave the root. A forged rank 1 cannot deliver a message in its
/// name; the real one still can.
#[test]
fn a_forged_rank_cannot_send_in_its_name() {
    let id = new_local_root_id().expect("id");
    let nonce = id.fields().expect("fields").nonce;
    let ranks: Vec<Bootstrap> = with_ranks(&id, 2, |bs| bs)
        .into_iter()
        .map(|r| r.expect("init"))
        .collect();
    let target = ranks[0].peer_addresses()[0];
    let forge = |key: u64| {
        let mut s = TcpStream::connect(target).expect("connect");
        let hello = wire::encode_connect(&wire::Connect {
            nonce,
            from: 1,
            nranks: 2,
            key,
        });
        s.write_all(&hello).expect("greet");
        let data = wire::encode_data(Channel::User, 9, b"forged").expect("frame");
        let _ = s.write_all(&data);
        s
    };
    // Without the key (any guess), and as the rank itself.
    let _a = forge(0);
    let _b = forge(0x5eed);
    // Without the nonce, and plain garbage: random bytes, a frame announcing 2 GiB, a
    // truncated greeting. None may kill the listener or reach the mailbox.
    let stranger = |bytes: &[u8]| {
        let mut s = TcpStream::connect(target).expect("connect");
        let _ = s.write_all(bytes);
        s
    };
    let wrong_nonce = wire::encode_connect(&wire::Connect {
        nonce: nonce ^ 0x40,
        from: 1,
        nranks: 2,
        key: 0,
    });
    let mut rng = Rng(0x5151_7e57);
    let _c = stranger(&wrong_nonce);
    let _d = stranger(&rng.bytes(500));
    let _e = stranger(&[0xff, 0xff, 0xff, 0x7f, 1, 2, 3]);
    let _f = stranger(&wrong_nonce[..wrong_nonce.len() / 2]);
    ranks[0].set_op_timeout(Duration::from_millis(500));
    let e = ranks[0]
        .recv(1, 9)
        .expect_err("the forged message must not arrive");
    assert!(e.message.contains("timed out"), "{e}");
    ranks[1].send(0, 9, b"real").expect("send");
    assert_eq!(ranks[0].recv(1, 9).expect("the real one"), b"real");
}

/// Greets the rank listening at `target` as rank `from` of `nranks` with `key`, and sends a
/// message in its name (user tag 9).
fn greet_as(target: SocketAddr, nonce: u64, nranks: usize, from: usize, key: u64) -> TcpStream {
    let mut s = TcpStream::connect(target).expect("connect");
    let hello = wire::encode_connect(&wire::Connect {
        nonce,
        from: from as u32,
        nranks: nranks as u32,
        key,
    });
    s.write_all(&hello).expect("greet");
    let data = wire::encode_data(Channel::User, 9, b"forged").expect("frame");
    let _ = s.write_all(&data);
    s
}

/// Whether the rank dropped this connection (end of stream or reset within 10 s).
fn dropped(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(T)).expect("timeout");
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Every key `member` holds: the table of its pairs, as the bootstrap keeps it.
fn keys_held_by(member: &Bootstrap) -> Vec<u64> {
    let mut held: Vec<u64> = member.peers.iter().map(|m| m.key).collect();
    held.extend(member.shared.known_keys().into_iter().flatten());
    held.sort_unstable();
    held.dedup();
    held
}

/// A member, with its own legitimate keys, cannot pass as another member: rank 2 greets rank
/// 0 as rank 1 with every key it holds, and rank 0 drops each of those connections; nothing
/// reaches rank 0's mailbox in rank 1's name, while rank 2 itself and the real rank 1 still
/// get through.
#[test]
fn a_member_cannot_greet_as_another_member() {
    let id = new_local_root_id().expect("id");
    let nonce = id.fields().expect("fields").nonce;
    let ranks: Vec<Bootstrap> = with_ranks(&id, 3, |bs| bs)
        .into_iter()
        .map(|r| r.expect("init"))
        .collect();
    let target = ranks[0].peer_addresses()[0];
    let held = keys_held_by(&ranks[2]);
    assert!(held.len() >= 2, "rank 2 holds {held:?}");
    for &k in &held {
        let s = greet_as(target, nonce, 3, 1, k);
        assert!(
            dropped(s),
            "rank 0 kept a greeting as rank 1 with rank 2's key {k:#x}"
        );
    }
    ranks[0].set_op_timeout(Duration::from_millis(500));
    let e = ranks[0]
        .recv(1, 9)
        .expect_err("the forged message must not arrive");
    assert!(e.message.contains("timed out"), "{e}");
    // The pairs' keys differ: what rank 0 expects from rank 1 is nothing rank 2 holds.
    let k01 = ranks[0].peers[1].key;
    assert_eq!(k01, ranks[1].peers[0].key);
    assert!(!held.contains(&k01));
    ranks[2].send(0, 9, b"two").expect("send");
    assert_eq!(ranks[0].recv(2, 9).expect("rank 2 as itself"), b"two");
    ranks[1].send(0, 9, b"real").expect("send");
    assert_eq!(ranks[0].recv(1, 9).expect("the real one"), b"real");
}

/// `nranks` ranks of a bootstrap with `nids` roots, each initialised on its own thread, and
/// the nonce of the first id (the one every greeting carries).
fn scalable_ranks(nids: usize, nranks: usize) -> (Vec<Bootstrap>, u64) {
    let ids: Vec<UniqueId> = (0..nids)
        .map(|_| new_local_root_id().expect("id"))
        .collect();
    let nonce = ids[0].fields().expect("fields").nonce;
    let ids = &ids;
    let ranks = thread::scope(|s| {
        let hs: Vec<_> = (0..nranks)
            .map(|r| {
                s.spawn(move || Bootstrap::init_scalable(ids, r, nranks, T, &AbortFlag::new()))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("join").expect("init"))
            .collect()
    });
    (ranks, nonce)
}

/// Rank `forger` greets `target` as rank `claimed` with each key of `tries`: `target` drops
/// every one of those connections, and nothing reaches it in `claimed`'s name.
fn assert_forgeries_dropped(
    ranks: &[Bootstrap],
    nonce: u64,
    (forger, target, claimed): (usize, usize, usize),
    tries: &[u64],
) {
    let addr = ranks[target].peer_addresses()[target];
    for &k in tries {
        let s = greet_as(addr, nonce, ranks.len(), claimed, k);
        assert!(
            dropped(s),
            "rank {target} kept a greeting as rank {claimed} from rank {forger}"
        );
    }
    ranks[target].set_op_timeout(Duration::from_millis(300));
    let e = ranks[target].recv(claimed, 9).expect_err("forged");
    assert!(e.message.contains("timed out"), "{e}");
}

/// For each (a, b), a message from rank a reaches rank b.
fn assert_pairs_talk(ranks: &[Bootstrap], pairs: &[(usize, usize)]) {
    for &(a, b) in pairs {
        ranks[a].send(b, 9, &[a as u8]).expect("send");
        ranks[b].set_op_timeout(T);
        assert_eq!(ranks[b].recv(a, 9).expect("recv"), vec![a as u8]);
    }
}

/// The same with several roots: a pair in one block (keys from that block's root) and a pair
/// of root 0's ranks (block 0 and the blocks' first ranks, keys from root 0) cannot be forged
/// by a third member with every key it holds.
#[test]
fn with_several_roots_a_member_cannot_greet_as_another_in_its_block() {
    // 6 ranks, 2 ids: blocks {0, 1, 2} and {3, 4, 5}; root 0 also serves rank 3.
    let (ranks, nonce) = scalable_ranks(2, 6);
    // (forger, target, claimed): in block 1; root 0's pair (0, 3) forged by 2 and by 5.
    for case in [(5, 4, 3), (4, 5, 3), (2, 0, 3), (5, 0, 3), (2, 3, 0)] {
        assert_forgeries_dropped(&ranks, nonce, case, &keys_held_by(&ranks[case.0]));
    }
    // Every pair still talks, across the blocks too.
    assert_pairs_talk(&ranks, &[(5, 4), (3, 0), (5, 1), (2, 4)]);
}

/// With three roots, a pair across two blocks neither of which is block 0's (and a pair of a
/// block 0 member and another block's member) has its key from a block-pair secret. A member
/// that is not its block's leader gets only the keys of its own pairs, so with everything it
/// was sent (its keys, and any secret it received) it cannot greet across blocks as another
/// member. (Leaders receive their block's secrets: they, and rank 0, are trusted relays.)
#[test]
fn with_several_roots_a_member_cannot_greet_across_blocks_as_another() {
    // 9 ranks, 3 ids: blocks {0, 1, 2}, {3, 4, 5}, {6, 7, 8}; leaders 0, 3, 6.
    let (ranks, nonce) = scalable_ranks(3, 9);
    // (forger, target, claimed)
    for case @ (forger, target, claimed) in [(5, 7, 4), (8, 4, 7), (1, 4, 2), (4, 2, 1), (2, 7, 1)]
    {
        let received = lock(&ranks[forger].setup_secrets).clone();
        let mut tries = keys_held_by(&ranks[forger]);
        tries.extend(received.iter().map(|&s| keys::pair_key(s, claimed, target)));
        assert_forgeries_dropped(&ranks, nonce, case, &tries);
    }
    // Only the leaders other than rank 0 were sent secrets.
    for (r, bs) in ranks.iter().enumerate() {
        let n = lock(&bs.setup_secrets).len();
        assert_eq!(n, if r == 3 || r == 6 { 3 } else { 0 }, "rank {r}");
    }
    // Every pair still talks, across every pair of blocks.
    assert_pairs_talk(&ranks, &[(4, 7), (7, 4), (2, 4), (8, 1), (5, 6), (0, 8)]);
}

/// A peer that sends faster than the rank takes: its reader stops at the budget (TCP then holds
/// the sender back), and every message still arrives, in order, once taken.
mod roots_and_wire;
