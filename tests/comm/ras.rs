//! RAS (issue 23): a query against a job with one rank killed and one that stopped issuing
//! names both — the dead one, and the one behind with the collective it has not issued — and
//! calls the communicator stuck. Ranks are simulator processes on this machine; every RAS
//! listener is on loopback (`NCCL_RAS_ADDR=127.0.0.1:0`: a free port per process). The rank
//! processes wait for each other's events (a file rank 0 writes once it has asked, a stopped
//! process's state), each wait under a bound that only turns a hang into a failure.

use crate::common::{self, procs};
use nccl::{Comm, DataType, ReduceOp};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The rank processes' folder for their signals (set by the parent).
const SIGNALS: &str = "NCCL_RS_TEST_SIGNALS";

/// In a rank process: the signal file `name`.
fn signal(name: &str) -> PathBuf {
    PathBuf::from(std::env::var(SIGNALS).expect("the signals folder")).join(name)
}

/// In a rank process: waits until rank 0 is done asking (its `done` file).
fn wait_for_rank0() {
    procs::wait_until("rank 0 is done asking", procs::limit(), || {
        signal("done").exists()
    });
}

fn all_reduce(comm: &Comm, buf: &nccl::DevBuffer, stream: nccl::StreamHandle) {
    unsafe {
        comm.all_reduce_raw(
            buf.ptr(),
            buf.ptr(),
            1024,
            DataType::Float32,
            ReduceOp::SUM,
            stream,
        )
    }
    .expect("issue an AllReduce");
}

/// Runs the calling test's ranks (`per_node` processes on one node, `victim` expected to die)
/// with a RAS listener on a free loopback port each and a fresh signals folder.
fn run_ranks(per_node: usize, victim: Option<usize>) {
    let dir = common::plugins::scratch(&format!("ras-{}", per_node));
    let _ = std::fs::remove_file(dir.join("done"));
    let d = dir.to_string_lossy().into_owned();
    let env = [("NCCL_RAS_ADDR", "127.0.0.1:0"), (SIGNALS, d.as_str())];
    match victim {
        Some(v) => procs::run_nodes_with_victim(1, per_node, &env, v),
        None => procs::run_nodes(1, per_node, &env),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank process's last steps: abort (peers may be dead or stopped), drain, free.
fn end_rank(comm: Comm, buf: nccl::DevBuffer, stream: nccl::StreamHandle) {
    comm.abort();
    let _ = comm.device().stream_sync(stream);
    drop(buf);
    drop(comm);
}

/// A rank process's communicator on the simulator, with a 4 KiB buffer and a stream, after
/// operation 1 (an AllReduce) completed on every rank.
fn rank_after_one_all_reduce(
    rank: usize,
    nranks: usize,
    id: &nccl::UniqueId,
) -> (Comm, nccl::DevBuffer, nccl::StreamHandle) {
    let dev = common::sim_dev(rank);
    let comm = Comm::init_rank_on(dev, nranks, id, rank).expect("init_rank");
    let buf = comm.device().alloc(4096).expect("alloc");
    let stream = comm.device().stream_create().expect("stream");
    all_reduce(&comm, &buf, stream);
    comm.device()
        .stream_sync(stream)
        .expect("the first AllReduce");
    (comm, buf, stream)
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn a_query_names_the_dead_and_the_late_rank() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let (comm, buf, stream) = rank_after_one_all_reduce(rank, nranks, &id);
        match rank {
            // Rank 3 dies; rank 2 stops issuing (but its process lives and answers queries
            // until rank 0 is done asking).
            3 => unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            },
            2 => wait_for_rank0(),
            _ => {
                // Operation 2 on ranks 0 and 1 only: it cannot complete.
                all_reduce(&comm, &buf, stream);
                procs::wait_until("rank 3's death seen", procs::limit(), || {
                    comm.get_async_error().is_err()
                });
                if rank == 1 {
                    wait_for_rank0();
                } else {
                    let addr = nccl::ras::listening_on().expect("rank 0's RAS listener");
                    assert!(addr.ip().is_loopback(), "{addr}");
                    // Rank 1 issues its operation 2 about when this rank does; on a loaded
                    // machine it may still be on its way at the first queries: asked until
                    // it is not named (a bound turns a hang into a failure).
                    let mut text = String::new();
                    procs::wait_until("rank 1 seen issuing operation 2", procs::limit(), || {
                        text = nccl::ras::query(addr, false, Duration::from_secs(20))
                            .expect("a RAS answer");
                        !text.contains("rank 1:")
                    });
                    eprintln!("{text}");
                    for want in [
                        "4 ranks",
                        "rank 3: DEAD",
                        "rank 2: BEHIND: issued 1 operations, others 2; has not issued operation 2 (AllReduce)",
                        "STUCK or FAILED: 1 rank dead, 1 rank behind",
                    ] {
                        assert!(text.contains(want), "no {want:?} in:\n{text}");
                    }
                    assert!(!text.contains("rank 1:"), "rank 1 is healthy:\n{text}");
                    // The client binary says the same, every rank included with -v.
                    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ncclras"))
                        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-v"])
                        .output()
                        .expect("run ncclras");
                    let text = String::from_utf8_lossy(&out.stdout);
                    assert!(out.status.success(), "{out:?}");
                    assert!(text.contains("rank 3: DEAD"), "{text}");
                    assert!(text.contains("rank 1: "), "-v lists every rank:\n{text}");
                    std::fs::write(signal("done"), b"").expect("the done signal");
                }
            }
        }
        end_rank(comm, buf, stream);
        return;
    }
    run_ranks(4, Some(3));
}

/// A rank stopped by SIGSTOP (alive for the kernel, silent for everyone): its peers see no
/// error, and a query names it as not responding. It is woken after the query and the job
/// ends normally.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn a_query_names_a_stopped_rank() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let (comm, buf, stream) = rank_after_one_all_reduce(rank, nranks, &id);
        match rank {
            2 => {
                // A shell wakes this process once rank 0 is done asking (its bound only
                // turns a hang into a failure); meanwhile every thread of it is stopped.
                let pid = std::process::id();
                let done = signal("done");
                let script = format!(
                    "i=0; while [ ! -e '{}' ] && [ $i -lt 24000 ]; do sleep 0.05; i=$((i+1)); done; \
                     kill -CONT {pid}",
                    done.display()
                );
                let mut waker = std::process::Command::new("sh")
                    .args(["-c", &script])
                    .spawn()
                    .expect("start the waker");
                std::fs::write(signal("rank2.pid"), pid.to_string()).expect("the pid file");
                unsafe {
                    libc::raise(libc::SIGSTOP);
                }
                let _ = waker.wait();
            }
            1 => wait_for_rank0(),
            _ => {
                // Once rank 2 is stopped (its state in /proc says so).
                procs::wait_until("rank 2 stops", procs::limit(), || {
                    std::fs::read_to_string(signal("rank2.pid"))
                        .ok()
                        .and_then(|p| {
                            std::fs::read_to_string(format!("/proc/{}/stat", p.trim())).ok()
                        })
                        .and_then(|stat| stat.rsplit_once(") ").map(|(_, s)| s.starts_with('T')))
                        .unwrap_or(false)
                });
                let addr = nccl::ras::listening_on().expect("rank 0's RAS listener");
                let t = Instant::now();
                let text =
                    nccl::ras::query(addr, false, Duration::from_secs(20)).expect("a RAS answer");
                eprintln!("answered in {:?}:\n{text}", t.elapsed());
                for want in [
                    "3 ranks",
                    "rank 2: NOT RESPONDING",
                    "STUCK or FAILED: 1 rank not responding",
                ] {
                    assert!(text.contains(want), "no {want:?} in:\n{text}");
                }
                assert!(!text.contains("rank 1:"), "rank 1 is healthy:\n{text}");
                assert!(comm.get_async_error().is_ok(), "a stopped rank is not dead");
                std::fs::write(signal("done"), b"").expect("the done signal");
            }
        }
        end_rank(comm, buf, stream);
        return;
    }
    run_ranks(3, None);
}

/// Hostile clients on the RAS listener: a flood of silent connections holds at most a few
/// threads (the rest are turned away at once), garbage gets an error line or a closed
/// connection, and a real query still gets its report afterwards.
#[test]
fn the_ras_listener_survives_hostile_clients() {
    // Alone in a child process (it counts the process's threads), its listener on loopback.
    procs::isolated(&[("NCCL_RAS_ADDR", "127.0.0.1:0")], &[], hostile_clients);
}

fn hostile_clients() {
    use std::io::{Read, Write};
    common::sim();
    let comms = Comm::init_all(&[0]).expect("a one-rank communicator");
    let addr = nccl::ras::listening_on().expect("this process's RAS listener");
    assert!(addr.ip().is_loopback(), "{addr}");
    let threads = || std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count());
    let before = threads();
    let silent: Vec<_> = (0..100)
        .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
        .collect();
    // A window for threads beyond the bound to appear (no synchronisation).
    std::thread::sleep(Duration::from_millis(300));
    let during = threads();
    let answer = |bytes: &[u8]| {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        let _ = s.write_all(bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    // While the flood holds every slot, others are told so at once.
    let busy = answer(b"STATUS\n");
    drop(silent);
    assert!(
        during <= before + 4 + 2,
        "100 silent RAS clients: threads {before} -> {during}"
    );
    assert!(busy.starts_with("ERROR: too many"), "{busy:?}");
    // Garbage, once the slots are free again.
    let mut rng = common::Rng::new(23);
    let junk: Vec<u8> = (0..4000).map(|_| rng.next() as u8).collect();
    let t = Instant::now();
    let mut got = Vec::new();
    for bytes in [
        &b"HELLO\n"[..],
        &junk[..],
        &[b'A'; 100_000][..],
        &[0xff, 0xfe, b'\n'][..],
    ] {
        let mut text = answer(bytes);
        while text.starts_with("ERROR: too many") && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
            text = answer(bytes);
        }
        got.push(text);
    }
    assert!(got[0].starts_with("ERROR: unknown command"), "{:?}", got[0]);
    assert!(got[2].starts_with("ERROR: unknown command"), "{:?}", got[2]);
    for text in &got {
        assert!(
            !text.contains("Communicator"),
            "garbage got a report: {text:?}"
        );
    }
    // And a real query.
    let mut text = String::new();
    while t.elapsed() < Duration::from_secs(20) {
        text = nccl::ras::query(addr, false, Duration::from_secs(10)).expect("a RAS answer");
        if !text.starts_with("ERROR: too many") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        text.contains("Communicator") && text.contains("state: OK"),
        "{text}"
    );
    for c in comms {
        c.destroy().expect("destroy");
    }
}
