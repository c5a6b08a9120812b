//! The RAS listener of this process, and the client side of its text protocol: the client
//! sends one line, `STATUS` or `VERBOSE STATUS`, and reads the report until the server closes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// NCCL's default RAS address.
const DEFAULT_ADDR: &str = "localhost:28028";
/// A query's wait for each rank, before `NCCL_RAS_TIMEOUT_FACTOR`.
const BASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Clients served at once; more are closed at once.
const MAX_CLIENTS: usize = 4;

fn bound() -> &'static OnceLock<Option<SocketAddr>> {
    static B: OnceLock<Option<SocketAddr>> = OnceLock::new();
    &B
}

/// Where this process's RAS thread listens; None when RAS is off, the address is taken (by
/// another process of the job on this host, usually) or not usable.
pub fn listening_on() -> Option<SocketAddr> {
    bound().get().copied().flatten()
}

/// Starts the RAS thread, once per process, unless `NCCL_RAS_ENABLE=0`.
pub(crate) fn start_once() {
    bound().get_or_init(|| {
        if crate::env::RAS_ENABLE.int() == 0 {
            return None;
        }
        let spec = crate::env::RAS_ADDR
            .raw()
            .unwrap_or_else(|| DEFAULT_ADDR.into());
        let listener = match spec
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.find_map(|a| TcpListener::bind(a).ok()))
        {
            Some(l) => l,
            None => {
                log::info!(
                    "RAS: cannot listen on {spec} (NCCL_RAS_ADDR; taken by another process of \
                     the job?); this process answers other ranks' queries only"
                );
                return None;
            }
        };
        let addr = listener.local_addr().ok()?;
        let busy = Arc::new(AtomicUsize::new(0));
        let spawned = crate::sockets::spawn("nccl-ras", move || loop {
            match listener.accept() {
                Ok((s, _)) => serve_client(s, &busy),
                Err(e) => {
                    log::warn!("RAS: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        match spawned {
            Ok(_) => {
                log::info!("RAS: listening on {addr}");
                Some(addr)
            }
            Err(e) => {
                log::warn!("RAS: cannot start its thread: {e}");
                None
            }
        }
    });
}

/// Each rank's wait in a query: 5 s × `NCCL_RAS_TIMEOUT_FACTOR`.
fn rank_timeout() -> Duration {
    BASE_TIMEOUT * crate::env::RAS_TIMEOUT_FACTOR.int().clamp(1, 1000) as u32
}

/// Whether the client at the other end of `s` runs as this process's user: RAS reports name
/// processes, hosts and errors, for the job's owner only. The client must be on this host
/// (its socket in the kernel's tables, owned by our effective uid).
fn owner_only(s: &TcpStream) -> Result<(), String> {
    let (peer, me) = (s.peer_addr(), s.local_addr());
    let (Ok(peer), Ok(me)) = (peer, me) else {
        return Err("ERROR: cannot tell who is asking\n".into());
    };
    // SAFETY: geteuid has no preconditions.
    let owner = unsafe { libc::geteuid() };
    match crate::sockets::local_peer_uid(peer, me) {
        Some(uid) if uid == owner => Ok(()),
        Some(uid) => Err(format!(
            "ERROR: RAS answers only the user running the job (uid {owner}), not uid {uid}\n"
        )),
        None => Err("ERROR: RAS answers only clients on this host\n".into()),
    }
}

fn serve_client(s: TcpStream, busy: &Arc<AtomicUsize>) {
    if let Err(refusal) = owner_only(&s) {
        log::info!(
            "RAS: refused a client at {:?}: {}",
            s.peer_addr(),
            refusal.trim()
        );
        let mut s = s;
        let _ = s.write_all(refusal.as_bytes());
        return;
    }
    if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
        busy.fetch_sub(1, Ordering::SeqCst);
        let mut s = s;
        let _ = s.write_all(b"ERROR: too many RAS clients at once; try again\n");
        return;
    }
    let busy = busy.clone();
    let spawned = crate::sockets::spawn("nccl-ras-client", move || {
        let _ = answer(s);
        busy.fetch_sub(1, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        log::warn!("RAS: cannot start a client thread: {e}");
    }
}

/// Serves one client: its command line within `BASE_TIMEOUT`, then the report, all of it
/// written within `BASE_TIMEOUT` of the report being ready: a client that reads slowly (a byte
/// every few seconds) holds this thread no longer than one that stopped.
fn answer(s: TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(BASE_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&s).take(256)).read_line(&mut line)?;
    let text = match line.trim().to_ascii_uppercase().as_str() {
        "STATUS" => cached_report(false),
        "VERBOSE STATUS" => cached_report(true),
        other => format!("ERROR: unknown command {other:?}; send STATUS or VERBOSE STATUS\n"),
    };
    write_before(&s, text.as_bytes(), Instant::now() + BASE_TIMEOUT)
}

/// Writes `bytes` to `s` in chunks, failing (TimedOut) once `deadline` passes.
fn write_before(s: &TcpStream, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    let mut w = s;
    for chunk in bytes.chunks(16 << 10) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_write_timeout(Some(left))?;
        w.write_all(chunk)?;
    }
    w.flush()
}

/// How long a report is served again instead of asking every rank anew: a client that asks
/// a hundred times a second costs the job's bootstraps one round of queries a second.
const REPORT_REUSE: Duration = Duration::from_secs(1);

/// The report of the last `REPORT_REUSE` (one per verbosity), else a fresh one. Clients wait
/// for one another here, so one report is made at a time.
fn cached_report(verbose: bool) -> String {
    static LAST: Mutex<[Option<(Instant, String)>; 2]> = Mutex::new([None, None]);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let slot = &mut last[usize::from(verbose)];
    if let Some((at, text)) = slot {
        if at.elapsed() < REPORT_REUSE {
            return text.clone();
        }
    }
    let text = super::report(verbose, rank_timeout());
    *slot = Some((Instant::now(), text.clone()));
    text
}

/// Longest answer a client takes (a verbose report is a line or two per rank).
pub(crate) const MAX_ANSWER: usize = 16 << 20;

/// Asks the RAS thread at `addr` for the job's state (the client side; `ncclras` uses it).
/// Whatever answers is a stranger until proven otherwise: an answer longer than
/// `MAX_ANSWER`, one still coming after `timeout`, or one that is not UTF-8 is an error.
pub fn query(addr: SocketAddr, verbose: bool, timeout: Duration) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    let deadline = std::time::Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.write_all(if verbose {
        b"VERBOSE STATUS\n"
    } else {
        b"STATUS\n"
    })?;
    // The server waits up to its own timeout per rank; ours bounds the whole answer.
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(Error::new(
                ErrorKind::TimedOut,
                format!(
                    "the answer was not complete within {:.1} s ({} bytes so far)",
                    timeout.as_secs_f64(),
                    out.len()
                ),
            ));
        }
        s.set_read_timeout(Some(left))?;
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // The read's own timeout (Linux says WouldBlock): the deadline above decides.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        if out.len() + n > MAX_ANSWER {
            return Err(Error::new(
                ErrorKind::InvalidData,
                format!("the answer exceeds {MAX_ANSWER} bytes: not a RAS report"),
            ));
        }
        out.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(out)
        .map(|text| crate::sockets::printable(&text))
        .map_err(|_| Error::new(ErrorKind::InvalidData, "the answer is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn control_characters_of_an_answer_are_shown_not_obeyed() {
        let shown = crate::sockets::printable("rank 3: \u{1b}]0;owned\u{7}gone\r\n\tok\n");
        assert_eq!(shown, "rank 3: \\u{1b}]0;owned\\u{7}gone\\u{d}\n\tok\n");
    }

    /// A loopback listener that reads the query line and answers with `send` (the test's
    /// stranger posing as a RAS thread).
    fn stranger(send: impl FnOnce(&mut TcpStream) + Send + 'static) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut line = String::new();
                let _ = BufReader::new(&s).read_line(&mut line);
                send(&mut s);
            }
        });
        addr
    }

    /// The client bounds what it takes: an answer past MAX_ANSWER, one that trickles past the
    /// timeout and one that is not text are errors, not a growing buffer or a wait for ever.
    #[test]
    fn the_client_bounds_what_a_server_sends() {
        // A megabyte more than the cap (an endless stream would be the same to the client):
        // refused once past the cap; before, read whole, however long.
        let addr = stranger(|s| {
            let block = vec![b'A'; 1 << 20];
            for _ in 0..MAX_ANSWER / block.len() + 1 {
                if s.write_all(&block).is_err() {
                    return;
                }
            }
        });
        let e = query(addr, false, Duration::from_secs(20)).expect_err("oversized answer");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        // A byte every 50 ms: ends at the whole answer's timeout (each read alone would
        // never time out).
        let addr = stranger(|s| {
            for _ in 0..400 {
                if s.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = query(addr, false, Duration::from_millis(500));
            let _ = tx.send((r, t.elapsed()));
        });
        let (r, took) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the query ended (a trickling answer held it for 10 s)");
        let e = r.expect_err("trickling answer");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        println!("trickling answer refused after {took:?}");
        // Not text.
        let addr = stranger(|s| {
            let _ = s.write_all(&[0xff, 0xfe, 0x00]);
        });
        let e = query(addr, false, Duration::from_secs(5)).expect_err("binary answer");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        // A true report under the cap is taken whole.
        let addr = stranger(|s| {
            let _ = s.write_all(b"OK: every rank issued and finished 3 operations\n");
        });
        let text = query(addr, false, Duration::from_secs(5)).expect("an answer");
        assert!(text.starts_with("OK:"), "{text}");
    }

    /// A client of another user (a child switched to `nobody`) is refused; one of ours is not.
    #[test]
    fn only_the_owner_is_answered() {
        use std::os::unix::process::CommandExt;
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let at = l.local_addr().expect("addr");
        let ours = TcpStream::connect(at).expect("connect");
        let (theirs, _) = l.accept().expect("accept");
        assert_eq!(owner_only(&theirs), Ok(()));
        drop((ours, theirs));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            crate::test_aids::skipped("not root", "RAS refuses another uid (cannot switch)");
            return;
        }
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{}; echo STATUS >&3; cat <&3",
            at.port()
        );
        let child = std::process::Command::new("bash")
            .args(["-c", &script])
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::piped())
            .spawn();
        let Ok(child) = child else {
            crate::test_aids::skipped("no bash", "RAS refuses another uid");
            return;
        };
        let (s, _) = l.accept().expect("accept nobody's connection");
        let refusal = owner_only(&s).expect_err("another uid");
        assert!(refusal.contains("not uid 65534"), "{refusal}");
        // The listener's own path: refused before any report is made.
        serve_client(s, &Arc::new(AtomicUsize::new(0)));
        let out = child.wait_with_output().expect("child");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.starts_with("ERROR: RAS answers only"), "{said}");
    }

    /// A client that reads a byte now and then is cut off at the answer's deadline, not kept
    /// for as long as it trickles.
    #[test]
    fn a_slow_reader_is_cut_off_at_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s, _) = l.accept().expect("accept");
        // Far more than the socket buffers take, and nobody reading.
        let big = vec![b'x'; 64 << 20];
        let e = write_before(&s, &big, Instant::now() + Duration::from_millis(300))
            .expect_err("the client never reads");
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ),
            "{e}"
        );
        drop(client);
    }
}
