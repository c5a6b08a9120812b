use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use super::id::{id_from_comm_id, IdFields};
use super::keys;
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
        secret: keys::Secret([3, u64::MAX]),
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
        secret: keys::Secret([0x5eed, 7]),
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
    let (fa, fb) = (a.fields().expect("a"), b.fields().expect("b"));
    assert_ne!(fa.secret, fb.secret);
    // The secret is in the id's bytes, and nowhere in what Debug shows.
    assert!(!format!("{a:?}").contains(&format!("{:x}", fa.secret.0[0])));

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
        secret: keys::Secret([1, 2]),
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

/// Connects to `addr`, reads its challenge, sends what `answer` makes of it, then reads
/// whatever comes back until the listener closes (None: no challenge came).
fn knock(addr: SocketAddr, answer: impl FnOnce(wire::Challenge) -> Vec<u8>) -> Vec<u8> {
    let s = TcpStream::connect(addr).expect("connect");
    let body = socket::read_frame(&s, wire::MAX_CTRL_BODY, Instant::now() + T).expect("challenge");
    let Ok(Msg::Challenge(c)) = wire::decode(&body) else {
        panic!("the first frame is not a challenge");
    };
    let mut w = &s;
    let _ = w.write_all(&answer(c));
    let _ = s.shutdown(std::net::Shutdown::Write);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut back = Vec::new();
    let _ = (&s).read_to_end(&mut back);
    back
}

/// A hello as `rank` of `nranks`, MACed with `key` over the root's challenge `c_root`.
fn hello_for(f: &IdFields, key: keys::Secret, c_root: u128, (rank, nranks): (u32, u32)) -> Vec<u8> {
    let mut h = Hello {
        nonce: f.nonce,
        rank,
        nranks,
        timeout_ms: 1000,
        addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 9)),
        challenge: 77,
        mac: 0,
    };
    h.mac = keys::mac(
        key,
        keys::Purpose::Hello,
        &[&wire::hello_fields(&h, c_root)],
    );
    wire::encode_hello(&h)
}

/// Garbage, hellos without the id's secret, and a hello recorded on another connection are
/// dropped without a word; a proven hello that is out of range is refused with a proven
/// reason; and a real bootstrap on the same id goes through afterwards.
#[test]
fn root_survives_garbage_strangers_and_replays() {
    let id = new_local_root_id().expect("id");
    let f = id.fields().expect("fields");
    let root = f.root;
    let key = keys::join_key(f.secret);
    // A silent connection stays open during the whole bootstrap.
    let silent = TcpStream::connect(root).expect("silent");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    assert!(knock(root, |_| rng.bytes(300)).is_empty());
    assert!(knock(root, |_| frame(&[7; 40])).is_empty());
    assert!(knock(root, |_| vec![0xff, 0xff, 0xff, 0x7f, 1, 2, 3]).is_empty());
    // Truncated: announces 60 bytes, sends 10.
    let mut trunc = 60u32.to_le_bytes().to_vec();
    trunc.extend_from_slice(&[1; 10]);
    assert!(knock(root, |_| trunc.clone()).is_empty());
    // A stranger who knows the address and the nonce, not the secret.
    let stranger = keys::join_key(keys::Secret([f.secret.0[0], !f.secret.0[1]]));
    assert!(knock(root, |c| hello_for(&f, stranger, c.challenge, (0, 3))).is_empty());
    // A hello proven for one challenge, replayed on another connection.
    let mut recorded = Vec::new();
    let back = knock(root, |c| {
        recorded = hello_for(&f, key, c.challenge, (3, 3));
        recorded.clone()
    });
    let (code, msg) = refusal(&back);
    assert_eq!(code, NcclResult::InvalidArgument, "{msg}");
    assert!(
        knock(root, |_| recorded.clone()).is_empty(),
        "a replay was answered"
    );
    // Wrong magic and a cut, in an otherwise proven hello.
    assert!(knock(root, |c| {
        let mut h = hello_for(&f, key, c.challenge, (0, 3));
        h[5] ^= 0x40;
        h
    })
    .is_empty());
    assert!(knock(root, |c| {
        let h = hello_for(&f, key, c.challenge, (0, 3));
        h[..h.len() - 3].to_vec()
    })
    .is_empty());
    // After all that, a real bootstrap on the same id.
    for res in with_ranks(&id, 3, |bs| bs.allgather(&[bs.rank() as u8])) {
        assert_eq!(
            res.expect("init").expect("allgather"),
            vec![vec![0], vec![1], vec![2]]
        );
    }
    drop(silent);
}

fn refusal(back: &[u8]) -> (NcclResult, String) {
    assert!(back.len() > 4, "no answer");
    match wire::decode(&back[4..]).expect("decodable answer") {
        Msg::Fail { code, message, .. } => (code, message),
        other => panic!("unexpected answer {other:?}"),
    }
}

/// A process that listens on the root's address (it bound the port first) and plays the
/// root's part without the id's secret: every rank refuses its answer, and its refusal, with
/// an error that names it; none takes it for the root.
#[test]
fn a_forged_root_is_refused_by_name() {
    let real = new_local_root_id().expect("id");
    let f = real.fields().expect("fields");
    let forger = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = forger.local_addr().expect("addr");
    let id = UniqueId::encode(&IdFields { root: at, ..f });
    let serve = thread::spawn(move || {
        // Two ranks: one gets a forged answer, the other a forged refusal.
        for i in 0..2 {
            let (s, _) = forger.accept().expect("accept");
            let c = wire::encode_challenge(&wire::Challenge {
                nonce: f.nonce,
                challenge: 5,
            });
            (&s).write_all(&c).expect("challenge");
            let _ = socket::read_frame(&s, wire::MAX_CTRL_BODY, Instant::now() + T);
            let reply = match i {
                0 => wire::encode_answer(&wire::Answer {
                    parent: None,
                    mac: 0x1234,
                }),
                _ => wire::encode_fail(NcclResult::InvalidUsage, "go away", 0x1234),
            };
            (&s).write_all(&reply).expect("answer");
            let _ = (&s).read(&mut [0u8; 1]);
        }
    });
    for rank in 0..2 {
        let e = Bootstrap::init(&id, rank, 2, T).expect_err("a forged root");
        assert_eq!(e.code, NcclResult::RemoteError, "{e}");
        assert!(
            e.message.contains(&at.to_string()) && e.message.contains("not the root"),
            "{e}"
        );
    }
    serve.join().expect("forger");
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
    let mut ranks: Vec<Arc<Bootstrap>> = with_ranks(&id, 8, Arc::new)
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
    // Rank 7 leaves on purpose: nobody hears of a fault.
    drop(ranks.pop());
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a goodbye is no fault"
    );
    // Rank 5 aborts. Its connections: to rank 2 (its parent in the gather tree) and rank 6
    // (its ring successor), which see them end; from ranks 2 and 4. Ranks 2 and 6 tell the
    // others, rank 0 among them, which never had a connection with rank 5.
    ranks[5].abort(false);
    let mut heard = Vec::new();
    while heard.len() < 6 {
        let (who, e) = rx.recv_timeout(T).expect("a fault report in time");
        assert_eq!(e.code, NcclResult::RemoteError, "{e}");
        assert!(e.message.contains("peer rank 5 (bootstrap at "), "{e}");
        heard.push(who);
        if who == 0 {
            assert!(
                e.message.contains("as rank 2 saw") || e.message.contains("as rank 6 saw"),
                "{e}"
            );
        }
    }
    heard.sort();
    assert_eq!(heard, [0, 1, 2, 3, 4, 6]);
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
        ranks[0].recv(5, 7).expect_err("rank 5 is gone")
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

/// Greets the rank listening at `target` as rank `from` of `nranks` with the key `key` of
/// the pair, answering its challenge (or, with `replay`, sending those greeting bytes
/// whatever the challenge); then sends a message in that rank's name (user tag 9). The bytes
/// of the greeting sent, and the stream.
fn greet_as(
    target: SocketAddr,
    (nonce, nranks, from, to): (u64, usize, usize, usize),
    key: keys::Secret,
    replay: Option<Vec<u8>>,
) -> (Vec<u8>, TcpStream) {
    let s = TcpStream::connect(target).expect("connect");
    let body = socket::read_frame(&s, wire::MAX_CTRL_BODY, Instant::now() + T).expect("challenge");
    let Ok(Msg::Challenge(c)) = wire::decode(&body) else {
        panic!("no challenge");
    };
    let greeting = replay.unwrap_or_else(|| {
        let mine = 99;
        let fields = wire::greet_fields(c.challenge, mine, from as u32, to as u32, nranks as u32);
        wire::encode_connect(&wire::Connect {
            nonce,
            from: from as u32,
            nranks: nranks as u32,
            challenge: mine,
            mac: keys::mac(key, keys::Purpose::Greet, &[&fields]),
        })
    });
    let mut w = &s;
    w.write_all(&greeting).expect("greet");
    let data = wire::encode_data(Channel::User, 9, b"forged").expect("frame");
    let _ = w.write_all(&data);
    (greeting, s)
}

/// Whether the rank dropped this connection without a proof (end of stream or reset within
/// 10 s, nothing read).
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

/// Knowing the unique id's address and nonce is not enough to pass as a rank: a greeting must
/// carry the MAC of the pair's key (from the id's secret) over the listener's fresh
/// challenge. A stranger with a wrong key, a greeting recorded on one connection and replayed
/// on another, a wrong nonce and plain garbage are all dropped; nothing reaches the mailbox in
/// rank 1's name; the real rank 1 still gets through.
#[test]
fn strangers_and_replayed_greetings_cannot_send_in_a_ranks_name() {
    let id = new_local_root_id().expect("id");
    let f = id.fields().expect("fields");
    let ranks: Vec<Bootstrap> = with_ranks(&id, 3, |bs| bs)
        .into_iter()
        .map(|r| r.expect("init"))
        .collect();
    let target = ranks[0].peer_addresses()[0];
    let who = (f.nonce, 3, 1, 0);
    let stranger = keys::Secret([f.secret.0[0] ^ 1, f.secret.0[1]]);
    let (_, s) = greet_as(target, who, keys::pair_key(stranger, 1, 0), None);
    assert!(dropped(s), "rank 0 kept a stranger's greeting as rank 1");
    // The right key for the wrong pair (rank 2's pair with rank 0, claimed as rank 1's).
    let (_, s) = greet_as(target, who, keys::pair_key(f.secret, 2, 0), None);
    assert!(dropped(s), "rank 0 kept a greeting with another pair's key");
    // A valid greeting, recorded, then replayed on a new connection: the first one is
    // answered with a proof (it is valid), the replay is dropped.
    let (recorded, valid) = greet_as(target, who, keys::pair_key(f.secret, 1, 0), None);
    // (Kept open to the end: its close without a goodbye would report rank 1 gone.)
    let mut proof = [0u8; 4];
    (&valid)
        .read_exact(&mut proof)
        .expect("a valid greeting is answered with a proof");
    let (_, s) = greet_as(target, who, keys::pair_key(f.secret, 1, 0), Some(recorded));
    assert!(dropped(s), "rank 0 kept a replayed greeting");
    // Without the nonce, and plain garbage: random bytes, a frame announcing 2 GiB, a
    // truncated greeting. None may kill the listener or reach the mailbox.
    let raw = |bytes: &[u8]| {
        let mut s = TcpStream::connect(target).expect("connect");
        let _ = s.write_all(bytes);
        s
    };
    let (_, wrong_nonce) = greet_as(
        target,
        (f.nonce ^ 0x40, 3, 1, 0),
        keys::pair_key(f.secret, 1, 0),
        None,
    );
    assert!(dropped(wrong_nonce));
    let mut rng = Rng(0x5151_7e57);
    let _d = raw(&rng.bytes(500));
    let _e = raw(&[0xff, 0xff, 0xff, 0x7f, 1, 2, 3]);
    // The one valid greeting above delivered its message: take it, then nothing more came.
    assert_eq!(
        ranks[0].recv(1, 9).expect("the valid greeting's"),
        b"forged"
    );
    ranks[0].set_op_timeout(Duration::from_millis(500));
    let e = ranks[0]
        .recv(1, 9)
        .expect_err("no other message in rank 1's name");
    assert!(e.message.contains("timed out"), "{e}");
    ranks[1].send(0, 9, b"real").expect("send");
    assert_eq!(ranks[0].recv(1, 9).expect("the real one"), b"real");
    drop(valid);
}

/// A peer that sends faster than the rank takes: its reader stops at the budget (TCP then holds
/// the sender back), and every message still arrives, in order, once taken.
mod roots_and_wire;
