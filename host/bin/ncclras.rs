//! `ncclras`: asks a job's RAS thread for the job's state and prints it, as NCCL's client does.
//!
//!     ncclras [-h HOST] [-p PORT] [-v] [-t SECONDS]
//!
//! Defaults: the host and port of `NCCL_RAS_ADDR`, else localhost:28028; `-v` asks for every
//! rank, not just the unhealthy ones; `-t` bounds the wait (default 30 s; 0: no bound).

use std::net::ToSocketAddrs;
use std::time::Duration;

fn main() {
    let default = std::env::var("NCCL_RAS_ADDR").unwrap_or_else(|_| "localhost:28028".into());
    let (mut host, mut port) = match default.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.to_string()),
        None => (default.clone(), "28028".into()),
    };
    let (mut verbose, mut secs) = (false, 30u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" => host = args.next().unwrap_or(host),
            "-p" => port = args.next().unwrap_or(port),
            "-v" => verbose = true,
            "-t" => secs = args.next().and_then(|s| s.parse().ok()).unwrap_or(secs),
            _ => {
                eprintln!("usage: ncclras [-h HOST] [-p PORT] [-v] [-t SECONDS]");
                std::process::exit(2);
            }
        }
    }
    let Some(addr) = format!("{host}:{port}")
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
    else {
        eprintln!("ncclras: cannot resolve {host}:{port}");
        std::process::exit(1);
    };
    let timeout = if secs == 0 {
        Duration::from_secs(u32::MAX as u64)
    } else {
        Duration::from_secs(secs)
    };
    match nccl::ras::query(addr, verbose, timeout) {
        Ok(text) => print!("{text}"),
        Err(e) => {
            eprintln!("ncclras: no answer from the RAS thread at {addr}: {e}");
            std::process::exit(1);
        }
    }
}
