//! Tests of passing descriptors between processes: offers, tickets, takers and their limits.

use super::*;
use std::os::fd::AsFd;

fn memfd(bytes: usize, fill: u8) -> OwnedFd {
    // SAFETY: a fresh descriptor, owned at once; the file is written through it.
    let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"fdpass-test".as_ptr(), 0)) };
    let mut f = std::fs::File::from(fd);
    f.write_all(&vec![fill; bytes]).unwrap();
    f.into()
}

#[test]
fn tickets_round_trip() {
    let t = Ticket {
        pid: 77,
        pid_ns: 0x1234_5678_9abc,
        start: 0xfeed_f00d_1234,
        sock: 3,
        key: 99,
        fd: 17,
    };
    assert_eq!(Ticket::decode(&t.encode()), t);
}

fn one_at_a_time() -> MutexGuard<'static, ()> {
    super::one_offering_test_at_a_time()
}

/// Threads of this process named as the listener's.
fn listener_tasks() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|r| {
            r.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|n| n.trim() == "nccl-fdpass")
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_descriptor_goes_over_the_socket_and_not_after_its_withdrawal() {
    let _one = one_at_a_time();
    let o = offer(memfd(4096, 7));
    let t = o.ticket();
    assert_ne!(t.sock, NO_SOCKET);
    // Over the socket as a peer process would (take() short-cuts our own pid).
    let fd = via_socket(&t).expect("over the socket");
    assert_eq!(file_size(fd.as_fd()).unwrap(), 4096);
    let mut f = std::fs::File::from(fd);
    let mut b = [0u8; 3];
    use std::io::{Seek, SeekFrom};
    f.seek(SeekFrom::Start(100)).unwrap();
    f.read_exact(&mut b).unwrap();
    assert_eq!(b, [7; 3]);
    assert!(take(&t).is_ok());
    drop(o);
    // Nothing on offer: the listener is gone (the connect is refused; a test forking
    // meanwhile may keep the socket a moment longer, then it resets).
    via_socket(&t).expect_err("withdrawn");
    assert!(take(&t).is_err());
    // A key not on offer while the listener runs: refused, and no pidfd_getfd after.
    let other = offer(memfd(16, 1));
    let bogus = Ticket {
        key: u64::MAX,
        ..other.ticket()
    };
    assert_eq!(via_socket(&bogus).expect_err("not on offer"), REFUSED);
    drop(other);
}

/// A socket of the owner's name bound by another process (here: ours, for a ticket of
/// another pid) is not believed: nothing is taken from it, whatever it sends.
#[test]
fn a_squatted_socket_name_is_refused() {
    let _one = one_at_a_time();
    let o = offer(memfd(64, 3));
    let t = Ticket {
        // A pid that is not ours (pid_max is at most 2^22).
        pid: (1 << 22) + 17,
        sock: 0,
        ..o.ticket()
    };
    let addr =
        SocketAddr::from_abstract_name(socket_name(t.pid, t.pid_ns, t.start, t.sock).as_bytes())
            .unwrap();
    let l = UnixListener::bind_addr(&addr).expect("squat the name");
    let fd = o.ticket().fd;
    // Two requests come (via_socket, then take_offered): the name stays bound for both.
    let squatter = std::thread::spawn(move || {
        for _ in 0..2 {
            if let Ok((mut s, _)) = l.accept() {
                let mut key = [0u8; 8];
                let _ = s.read_exact(&mut key);
                let _ = send_fd(&s, fd);
            }
        }
    });
    let e = via_socket(&t).expect_err("a squatter's descriptor");
    assert!(e.contains("not by the owner"), "{e}");
    let e = take_offered(&t).expect_err("a squatter's descriptor");
    assert!(e.message.contains("not by the owner"), "{e}");
    squatter.join().expect("the squatter thread");
}

/// `take_offered` never falls back to `pidfd_getfd`: a ticket naming another process (our
/// parent) and a descriptor number, without a socket, gives nothing, though
/// `pidfd_getfd` on it may be allowed here.
#[test]
fn take_offered_never_uses_pidfd_getfd() {
    let _one = one_at_a_time();
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() } as u32;
    for sock in [NO_SOCKET, 63] {
        let t = Ticket {
            pid: parent,
            pid_ns: pid_namespace(),
            start: 0,
            sock,
            key: 1,
            fd: 0,
        };
        assert!(take_offered(&t).is_err(), "socket {sock}");
    }
    // Our own offers come from the table, and only while on offer.
    let o = offer(memfd(32, 5));
    let t = o.ticket();
    let fd = take_offered(&t).expect("our own offer");
    assert_eq!(file_size(fd.as_fd()).unwrap(), 32);
    drop(o);
    assert!(take_offered(&t).is_err());
}

/// The fallback: `pidfd_getfd` on our own process (always allowed) takes the offered
/// descriptor by its number.
#[test]
fn pidfd_getfd_takes_a_descriptor_by_number() {
    let _one = one_at_a_time();
    let o = offer(memfd(100, 1));
    let fd = via_pidfd(&o.ticket()).expect("pidfd_getfd on ourselves");
    assert_eq!(file_size(fd.as_fd()).unwrap(), 100);
    let other_ns = Ticket {
        pid_ns: pid_namespace() ^ 1,
        ..o.ticket()
    };
    assert!(via_pidfd(&other_ns).is_err());
}

/// A ticket whose owner has exited is answered at once, with an error that says so: the
/// socket is not asked, nor the pid (another process may have it by now). A pid held by a
/// process that started at another time than the ticket says is no owner either. An owner
/// that is alive but does not listen is answered at once too (its socket refuses). Timed
/// only as a hang guard.
#[test]
fn an_exited_owner_is_answered_at_once() {
    // Not while another test checks that a stopped listener refuses: a child between its
    // fork and its exec holds our descriptors, the listener's among them, a moment longer.
    let _one = one_at_a_time();
    let t0 = std::time::Instant::now();
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("start a child");
    let pid = child.id();
    child.wait().expect("the child's exit");
    let gone = Ticket {
        pid,
        pid_ns: pid_namespace(),
        start: 1,
        sock: 0,
        key: 1,
        fd: 3,
    };
    let e = take(&gone).expect_err("an exited owner");
    assert!(e.message.contains("exited"), "{e}");
    // Our own pid, with another start time: as if our pid were reused.
    let me = Ticket {
        pid: std::process::id(),
        start: own_start(),
        ..gone
    };
    assert!(own_start() != 0 && !owner_gone(&me));
    let impostor = Ticket {
        start: own_start() + 1,
        ..me
    };
    assert!(owner_gone(&impostor));
    assert!(via_pidfd(&impostor).is_err());
    // A live process without a listener: refused, then pidfd_getfd fails (another
    // process's descriptor 3 that it does not have, or ptrace refused).
    let mut live = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("start a child");
    let lpid = live.id();
    let t = Ticket {
        pid: lpid,
        start: start_time(&lpid.to_string()).expect("the child's start"),
        sock: 7,
        fd: 1000,
        ..gone
    };
    assert!(!owner_gone(&t));
    let e = take(&t).expect_err("nothing listens there");
    assert!(e.message.contains("refused"), "{e}");
    let _ = live.kill();
    let _ = live.wait();
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

/// The listener runs while a descriptor is on offer and ends with the last offer (its
/// thread joined, its name free); 100 cycles of offering, taking over the socket and
/// withdrawing leave no listener thread behind.
#[test]
fn the_listener_ends_with_the_last_offer() {
    let _one = one_at_a_time();
    assert_eq!((listener_threads(), listener_tasks()), (0, 0));
    let a = offer(memfd(64, 1));
    let b = offer(memfd(64, 2));
    assert_eq!(a.ticket().sock, b.ticket().sock, "one listener for both");
    // A new thread names itself once it runs: give it a moment.
    let t0 = std::time::Instant::now();
    while listener_tasks() == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!((listener_threads(), listener_tasks()), (1, 1));
    let tb = b.ticket();
    drop(a);
    assert_eq!(listener_threads(), 1, "b is still on offer");
    assert!(via_socket(&tb).is_ok());
    drop(b);
    assert_eq!(listener_threads(), 0);
    // A joined thread's task may linger a moment in /proc.
    let t0 = std::time::Instant::now();
    while listener_tasks() > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(listener_tasks(), 0);
    via_socket(&tb).expect_err("no listener");
    for k in 0..100u8 {
        let o = offer(memfd(32, k));
        let fd = via_socket(&o.ticket()).expect("over the socket");
        assert_eq!(file_size(fd.as_fd()).unwrap(), 32);
        drop(fd);
        drop(o);
        assert_eq!(listener_threads(), 0, "cycle {k}");
    }
    let t0 = std::time::Instant::now();
    while listener_tasks() > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(listener_tasks(), 0, "a listener thread outlived 100 cycles");
}

/// Offer keys and the listener's name cannot be guessed from earlier ones: two keys differ in
/// more than a counter's low bits (sequential keys let any process of the user ask for the
/// next descriptor), and the name's number is not the first of a short list.
#[test]
fn offer_keys_and_socket_names_are_random() {
    let _one = one_at_a_time();
    let (a, b) = (offer(memfd(64, 1)), offer(memfd(64, 2)));
    let (ka, kb) = (a.ticket().key, b.ticket().key);
    assert!(
        ka.wrapping_sub(kb) > 1 << 32 && kb.wrapping_sub(ka) > 1 << 32,
        "{ka:#x} {kb:#x}"
    );
    assert!(
        a.ticket().sock >= 64,
        "socket name number {}",
        a.ticket().sock
    );
}
