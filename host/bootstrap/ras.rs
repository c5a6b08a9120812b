//! The bootstrap's part of RAS: answering other ranks' queries with this rank's health record,
//! and gathering every rank's reply for a report (as bytes: RAS decodes them).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::wire::Channel;
use super::Bootstrap;
use crate::sockets;

/// Most answers to one rank's RAS queries in flight at once (a thread each). A rank asks on
/// behalf of its process's RAS clients, at most `ras::server`'s 4 at a time; queries past
/// this are dropped (the asker reports this rank as not answering) rather than each taking
/// a thread.
pub(crate) const MAX_RAS_ANSWERS_PER_PEER: usize = 8;

/// What became of one rank's RAS query, as the bootstrap saw it ([`Bootstrap::ras_gather`]).
pub(crate) enum RasReply {
    /// The asking rank itself: the caller has its own record.
    Mine,
    /// The bytes it answered with (RAS decodes them).
    Bytes(Vec<u8>),
    /// Known gone: its bootstrap connection ended without a goodbye.
    Dead(String),
    /// No answer in time, or the query could not be sent.
    Silent(String),
}

/// One answer in flight to a rank, counted until it drops.
struct InFlight(Arc<Vec<AtomicUsize>>, usize);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0[self.1].fetch_sub(1, Ordering::SeqCst);
    }
}

impl Bootstrap {
    /// From now on, a RAS query from another rank is answered with `record()` (encoded), from a
    /// thread of its own so that the reader goes on reading; at most
    /// [`MAX_RAS_ANSWERS_PER_PEER`] at a time for one asking rank.
    pub(crate) fn serve_ras(
        self: &Arc<Self>,
        record: impl Fn() -> Vec<u8> + Send + Sync + 'static,
    ) {
        let this = Arc::downgrade(self);
        let record = Arc::new(record);
        let busy: Arc<Vec<AtomicUsize>> =
            Arc::new((0..self.nranks()).map(|_| AtomicUsize::new(0)).collect());
        self.shared.set_ras_responder(Arc::new(move |from, query| {
            let Some(n) = busy.get(from) else {
                return;
            };
            if n.fetch_add(1, Ordering::SeqCst) >= MAX_RAS_ANSWERS_PER_PEER {
                n.fetch_sub(1, Ordering::SeqCst);
                log::debug!(
                    "RAS: query {query} of rank {from} dropped: {MAX_RAS_ANSWERS_PER_PEER} \
                     answers to it already in flight"
                );
                return;
            }
            let held = InFlight(busy.clone(), from);
            let (this, record) = (this.clone(), record.clone());
            let spawned = sockets::spawn("nccl-ras-answer", move || {
                let _held = held;
                if let Some(bs) = this.upgrade() {
                    if let Err(e) = bs.send_on(from, Channel::RasReply, query, &record()) {
                        log::debug!("RAS: answering rank {from}: {e}");
                    }
                }
            });
            if let Err(e) = spawned {
                log::warn!("RAS: cannot start a thread to answer rank {from}: {e}");
            }
        }));
    }

    /// Every rank's reply to a RAS query (ours is [`RasReply::Mine`]), each waited for until
    /// `timeout`.
    pub(crate) fn ras_gather(&self, timeout: Duration) -> Vec<RasReply> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let query = NEXT.fetch_add(1, Ordering::Relaxed);
        let (me, n) = (self.rank(), self.nranks());
        let mut asked = vec![false; n];
        for (r, a) in asked.iter_mut().enumerate().filter(|&(r, _)| r != me) {
            *a = self.shared.gone(r).is_none() && self.send_on(r, Channel::Ras, query, &[]).is_ok();
        }
        let deadline = sockets::deadline_after(timeout);
        (0..n)
            .map(|r| {
                if r == me {
                    return RasReply::Mine;
                }
                if let Some(why) = self.shared.gone(r) {
                    return RasReply::Dead(why);
                }
                if !asked[r] {
                    return RasReply::Silent("the query could not be sent".into());
                }
                match self.shared.take(r, Channel::RasReply, query, deadline) {
                    Ok(b) => RasReply::Bytes(b),
                    Err(_) => match self.shared.gone(r) {
                        Some(why) => RasReply::Dead(why),
                        None => RasReply::Silent(format!(
                            "no answer within {:.1} s",
                            timeout.as_secs_f64()
                        )),
                    },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::new_local_root_id;
    use std::sync::{Condvar, Mutex};
    use std::time::Instant;

    /// A rank flooding another with RAS queries gets at most MAX_RAS_ANSWERS_PER_PEER answers
    /// in flight (a thread each), not one per query; once the flood drains, a query is
    /// answered. The answers wait at a gate the test opens, so the limit is reached and held;
    /// every wait is on its event, under a bound that only turns a hang into a failure. The
    /// bootstrap is on loopback.
    #[test]
    fn a_flood_of_ras_queries_holds_few_answer_threads() {
        let id = new_local_root_id().expect("id");
        let t = Duration::from_secs(10);
        let bound = Duration::from_secs(60);
        let ranks: Vec<Arc<Bootstrap>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || Bootstrap::init(id, r, 2, t))
                })
                .collect();
            hs.into_iter()
                .map(|h| Arc::new(h.join().expect("rank thread").expect("init")))
                .collect()
        });
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (n, m, g) = (now.clone(), most.clone(), gate.clone());
        ranks[0].serve_ras(move || {
            let k = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(k, Ordering::SeqCst);
            let (open, cv) = &*g;
            let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
            while !*o {
                o = cv.wait(o).unwrap_or_else(|p| p.into_inner());
            }
            drop(o);
            n.fetch_sub(1, Ordering::SeqCst);
            b"rank=0\n".to_vec()
        });
        for q in 0..200 {
            ranks[1].send_on(0, Channel::Ras, q, &[]).expect("query");
        }
        // Every slot taken (the gate holds the answers); the rest of the flood is dropped.
        let t0 = Instant::now();
        while now.load(Ordering::SeqCst) < MAX_RAS_ANSWERS_PER_PEER {
            assert!(t0.elapsed() < bound, "the answers never took every slot");
            std::thread::sleep(Duration::from_millis(5));
        }
        let held = most.load(Ordering::SeqCst);
        println!("200 queries: at most {held} answers in flight");
        assert_eq!(held, MAX_RAS_ANSWERS_PER_PEER, "answers in flight at once");
        let (open, cv) = &*gate;
        *open.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        // The flood is over: a query is answered (one that came while the last of the flood
        // still held the slots is dropped, as the flood's were: the next one is asked).
        let t0 = Instant::now();
        let mut q = 1000;
        let got = loop {
            assert!(t0.elapsed() < bound, "no query answered after the flood");
            ranks[1].send_on(0, Channel::Ras, q, &[]).expect("query");
            let deadline = sockets::deadline_after(Duration::from_secs(1));
            if let Ok(got) = ranks[1].shared.take(0, Channel::RasReply, q, deadline) {
                break got;
            }
            q += 1;
        };
        assert_eq!(got, b"rank=0\n");
        assert!(most.load(Ordering::SeqCst) <= MAX_RAS_ANSWERS_PER_PEER);
    }
}
