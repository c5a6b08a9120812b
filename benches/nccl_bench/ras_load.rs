//! `--ras-queries N`: RAS clients' load on a running job. A thread sends N `STATUS` queries a
//! second to this process's RAS listener while the tables are measured (each one a report of
//! every rank of every communicator here, `nccl::ras`), so a run with and a run without it
//! show what RAS costs the collectives.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The querying thread; [`Load::stop`] ends it and says how many queries were answered.
pub struct Load {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    /// Starts `per_second` queries a second (None when 0, or when RAS does not listen here).
    pub fn start(per_second: usize) -> Result<Option<Load>, String> {
        if per_second == 0 {
            return Ok(None);
        }
        let Some(addr) = nccl::ras::listening_on() else {
            return Err(
                "--ras-queries: RAS does not listen in this process (NCCL_RAS_ENABLE=0, \
                        or another process holds NCCL_RAS_ADDR)"
                    .into(),
            );
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s, a, f) = (
            Arc::clone(&stop),
            Arc::clone(&answered),
            Arc::clone(&failed),
        );
        let period = Duration::from_secs_f64(1.0 / per_second as f64);
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now();
            while !s.load(Ordering::Relaxed) {
                match nccl::ras::query(addr, false, Duration::from_secs(10)) {
                    Ok(_) => a.fetch_add(1, Ordering::Relaxed),
                    Err(_) => f.fetch_add(1, Ordering::Relaxed),
                };
                // A fixed rate: a slow answer is not made up for with a burst.
                next = (next + period).max(Instant::now());
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        println!("# RAS load: {per_second} STATUS queries a second to {addr} while measuring");
        Ok(Some(Load {
            stop,
            answered,
            failed,
            thread: Some(thread),
        }))
    }

    /// Ends the queries; prints how many were answered.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        println!(
            "# RAS load: {} queries answered, {} failed",
            self.answered.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed)
        );
    }
}
