//! The RAS listener of this process, and the client side of its text protocol: the client
//! sends one line, `STATUS` or `VERBOSE STATUS`, and reads the report until the server closes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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
        if crate::env::int("NCCL_RAS_ENABLE") == 0 {
            return None;
        }
        let spec = crate::env::raw("NCCL_RAS_ADDR").unwrap_or_else(|| DEFAULT_ADDR.into());
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
        let spawned = crate::bootstrap::socket::spawn("nccl-ras", move || loop {
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
    BASE_TIMEOUT * crate::env::int("NCCL_RAS_TIMEOUT_FACTOR").clamp(1, 1000) as u32
}

fn serve_client(s: TcpStream, busy: &Arc<AtomicUsize>) {
    if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
        busy.fetch_sub(1, Ordering::SeqCst);
        let mut s = s;
        let _ = s.write_all(b"ERROR: too many RAS clients at once; try again\n");
        return;
    }
    let busy = busy.clone();
    let spawned = crate::bootstrap::socket::spawn("nccl-ras-client", move || {
        let _ = answer(s);
        busy.fetch_sub(1, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        log::warn!("RAS: cannot start a client thread: {e}");
    }
}

fn answer(s: TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(BASE_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&s).take(256)).read_line(&mut line)?;
    let text = match line.trim().to_ascii_uppercase().as_str() {
        "STATUS" => super::report(false, rank_timeout()),
        "VERBOSE STATUS" => super::report(true, rank_timeout()),
        other => format!("ERROR: unknown command {other:?}; send STATUS or VERBOSE STATUS\n"),
    };
    let mut w = &s;
    w.write_all(text.as_bytes())?;
    w.flush()
}

/// Asks the RAS thread at `addr` for the job's state (the client side; `ncclras` uses it).
pub fn query(addr: SocketAddr, verbose: bool, timeout: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    // The server waits up to its own timeout per rank; ours bounds the whole answer.
    s.set_read_timeout(Some(timeout))?;
    s.write_all(if verbose {
        b"VERBOSE STATUS\n"
    } else {
        b"STATUS\n"
    })?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
