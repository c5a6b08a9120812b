//! Faults and leaving: abort, watching peers (their departure, their silence), telling every
//! rank of a failure, and saying goodbye.

use super::*;
use crate::sockets;

impl Bootstrap {
    /// Closes every socket of this rank; waiting and later calls fail instead of hanging.
    /// No goodbye, so the peers take this rank for gone, as if its process had died — unless
    /// it aborts because of a fault (`after_fault`: its communicator already holds an error, or
    /// a peer is known gone): then the notices of that fault go out first, and it says goodbye,
    /// so that survivors keep naming the rank that really failed, not the first one to abort
    /// after it.
    pub fn abort(&self, after_fault: bool) {
        self.shared.clear_watcher();
        if after_fault || self.shared.any_gone() {
            self.finish_notices(NOTICE_GRACE);
            self.say_goodbye();
        }
        self.shared.close("aborted");
    }

    /// Waits, at most `grace`, for the fault notices being sent (`tell_everyone`).
    fn finish_notices(&self, grace: Duration) {
        let (count, done) = &self.notices;
        let until = Instant::now() + grace;
        let mut n = lock(count);
        while *n > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log::debug!("rank {}: {} fault notices unsent at abort", self.rank(), *n);
                return;
            }
            n = done
                .wait_timeout(n, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// From now on, a peer that goes without a goodbye (its process died, it aborted, its host
    /// vanished and keepalive gave up) is reported to `on_fault`, once per peer, and to every
    /// other rank: a rank that sees a peer's connection end tells everyone, so ranks that had
    /// no connection to the dead one learn of it too. Waits on a dead rank, and every allgather
    /// and barrier, then fail at once. `on_fault` runs on a bootstrap thread.
    pub(crate) fn watch(self: &Arc<Self>, on_fault: impl Fn(Error) + Send + Sync + 'static) {
        let me = self.rank();
        let this = Arc::downgrade(self);
        self.shared.set_watcher(Arc::new(move |f: Fault| {
            let bs = this.upgrade();
            let at = bs
                .as_ref()
                .and_then(|b| b.peers.get(f.dead))
                .map(|a| format!(" (bootstrap at {a})"))
                .unwrap_or_default();
            let err = match f.reported_by {
                None if f.hung => Error::remote(format!("rank {me}: {}{at}", f.why)),
                None => Error::remote(format!(
                    "rank {me}: peer rank {}{at} is gone (process died or aborted, or its host \
                     stopped answering): {}",
                    f.dead, f.why
                )),
                Some(by) => Error::remote(format!(
                    "rank {me}: peer rank {}{at} is gone, as rank {by} saw: {}",
                    f.dead, f.why
                )),
            };
            // The notices first: `on_fault` may lead to an abort, which lets them finish.
            if let (None, Some(bs)) = (f.reported_by, bs) {
                bs.tell_everyone(f);
            }
            on_fault(err);
        }));
    }

    /// Why `peer` is known to be gone (it died, aborted, or was reported hung), if it is.
    pub(crate) fn gone(&self, peer: usize) -> Option<String> {
        self.shared.gone(peer)
    }

    /// Another layer (the network transport) found `peer` failed: it is recorded as gone, as if
    /// its bootstrap connection had ended, and every other rank is told (once). The watcher is
    /// not called: the layer that saw it reports its own, more precise error.
    pub(crate) fn peer_failed(self: &Arc<Self>, peer: usize, why: &str) {
        if peer == self.rank() || peer >= self.nranks() {
            return;
        }
        if self.shared.mark_gone(peer, why) {
            self.clone().tell_everyone(Fault {
                dead: peer,
                hung: false,
                reported_by: None,
                why: why.to_string(),
            });
        }
    }

    /// From now on, until this bootstrap closes, a thread sends a heartbeat to the ring
    /// successor every `after` / 4 (at most 5 s), and watches the ring predecessor's: when none
    /// came for `after` while `busy()` (an operation of the communicator is outstanding), the
    /// predecessor is reported as a fault ("rank N has not responded for T s"), as one whose
    /// connection ended (`watch`): the communicator's async error and kernel abort flag here,
    /// a notice to every other rank. This catches a rank whose process is stopped (SIGSTOP, a
    /// debugger) or wholly stuck, which keeps its connections open and its kernel answering
    /// TCP, so nothing else sees it. The heartbeats are sent and read by threads of their own,
    /// so an application thread that is merely slow (or blocked in a collective) never trips it.
    /// A predecessor is watched only once its first heartbeat came (it watches too); a
    /// pause of this rank's own thread (this process stopped) restarts the count.
    ///
    /// Only the successor watches, and it may have nothing outstanding while another rank
    /// waits on the silent one (a receive from it, or a group the successor is not in). So a
    /// successor that is not busy reports the silence too, after `2 × after`: any rank waiting
    /// on a stopped rank learns of it within twice the bound, and a stopped rank is a fault
    /// after `2 × after` even where nobody waits.
    pub(crate) fn watch_hangs(
        self: &Arc<Self>,
        after: Duration,
        busy: impl Fn() -> bool + Send + 'static,
    ) {
        let (n, r) = (self.nranks(), self.rank());
        if n < 2 || after.is_zero() {
            return;
        }
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let period = (after / 4).clamp(Duration::from_millis(20), Duration::from_secs(5));
        let (this, shared) = (Arc::downgrade(self), self.shared.clone());
        let spawned = sockets::spawn("nccl-bs-beat", move || {
            let mut last = Instant::now();
            loop {
                let Some(bs) = this.upgrade() else { return };
                if bs.shared.is_closed() {
                    return;
                }
                let now = Instant::now();
                if now.duration_since(last) > period + after / 2 {
                    // This thread could not run for a while (this process was stopped, or
                    // starved): what it did not read meanwhile says nothing about the peer.
                    bs.shared.forgive(prev);
                }
                last = now;
                if bs.shared.gone(next).is_none() {
                    if let Err(e) = bs.send_on(next, Channel::Beat, 0, &[]) {
                        log::debug!("rank {r}: heartbeat to rank {next}: {e}");
                    }
                }
                if let Some(silent) = bs.shared.silent_for(prev) {
                    if silent >= after
                        && bs.shared.gone(prev).is_none()
                        && (silent >= after * 2 || busy())
                    {
                        bs.shared.hung(
                            prev,
                            format!(
                                "rank {prev} has not responded for {:.1} s (its process is \
                                 stopped or stuck; NCCL_RS_PEER_HANG_TIMEOUT_MS={})",
                                silent.as_secs_f64(),
                                after.as_millis()
                            ),
                        );
                    }
                }
                drop(bs);
                // Short naps, so that a closed bootstrap ends this thread soon.
                let wake = Instant::now() + period;
                while Instant::now() < wake {
                    std::thread::sleep(
                        wake.saturating_duration_since(Instant::now())
                            .min(Duration::from_millis(50)),
                    );
                    if this.strong_count() == 0 || shared.is_closed() {
                        return;
                    }
                }
            }
        });
        if let Err(e) = spawned {
            log::warn!("rank {r}: cannot start the heartbeat thread: {e}");
        }
    }

    /// Stops reporting faults (the watcher is dropped).
    pub(crate) fn unwatch(&self) {
        self.shared.clear_watcher();
    }

    /// Sends a fault notice to every rank but ourselves and the dead one, from a thread of its
    /// own (a rank that is slow to read must not hold up the reader that saw the fault).
    fn tell_everyone(self: Arc<Self>, f: Fault) {
        *lock(&self.notices.0) += 1;
        let this = self.clone();
        let spawned = sockets::spawn("nccl-bs-fault", move || {
            let why = wire::cut_text(&f.why).as_bytes();
            for r in (0..this.nranks()).filter(|&r| r != this.rank() && r != f.dead) {
                if let Err(e) = this.send_on(r, Channel::Fault, f.dead as u32, why) {
                    log::debug!("rank {}: fault notice to rank {r}: {e}", this.rank());
                }
            }
            this.notice_done();
        });
        if let Err(e) = spawned {
            log::warn!("bootstrap: cannot start the fault notice thread: {e}");
            self.notice_done();
        }
    }

    fn notice_done(&self) {
        let (count, done) = &self.notices;
        let mut n = lock(count);
        *n = n.saturating_sub(1);
        done.notify_all();
    }

    /// Tells every peer we hold a connection to that its end is coming on purpose. Best
    /// effort and quick: a peer that does not take the frame at once is skipped.
    pub(super) fn say_goodbye(&self) {
        if self.shared.is_closed() {
            return;
        }
        let Ok(frame) = wire::encode_data(Channel::Leave, 0, &[]) else {
            return;
        };
        for slot in &self.out {
            // A send stuck on this connection holds its lock; skip it rather than wait.
            if let Ok(mut conn) = slot.try_lock() {
                if let Some(c) = conn.as_mut() {
                    let _ = c.write(&frame, Duration::from_millis(100));
                }
            }
        }
    }
}
