//! The bootstrap's part of RAS: answering other ranks' queries with this rank's health record,
//! and gathering every rank's reply for a report (as bytes: RAS decodes them).
//!
//! A report gathers over a binary tree rooted at the asking rank (by rank relative to it: the
//! children of relative rank i are 2i+1 and 2i+2): each rank asks its children, adds its own
//! record to theirs and answers its parent with the lot. No rank sends or receives more than
//! three queries' worth of messages, and each record travels log2(n) hops (a ring would carry
//! n²/2 records in all: 2.5 GB for one query at 4,096 ranks). A child known gone is reported
//! dead and its children are asked in its place; a child that does not answer within its
//! budget leaves its subtree unheard, and the asking rank then asks each unheard rank directly
//! (the fan-out of before, only for them) with what is left of its timeout.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wire::Channel;
use super::Bootstrap;
use crate::sockets;

/// Most answers to one rank's RAS queries in flight at once (a thread each). A rank asks on
/// behalf of its process's RAS clients, at most `ras::server`'s 4 at a time; queries past
/// this are dropped (the asker reports this rank as not answering) rather than each taking
/// a thread.
pub(crate) const MAX_RAS_ANSWERS_PER_PEER: usize = 8;

/// What became of one rank's RAS query, as the bootstrap saw it ([`Bootstrap::ras_gather`]).
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// A query as it travels: the rank the tree is rooted at, and the milliseconds the receiver
/// has to answer (0: answer with its own record alone, asking nobody).
fn encode_query(origin: usize, budget_ms: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&(origin as u32).to_le_bytes());
    b[4..].copy_from_slice(&budget_ms.to_le_bytes());
    b
}

fn decode_query(b: &[u8]) -> Option<(usize, u32)> {
    let word = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
    (b.len() == 8).then_some(())?;
    Some((word(0)? as usize, word(4)?))
}

/// A subtree's answers as one message: per rank, its number, a kind (0 a record, 1 dead, 2
/// silent) and the bytes (the record, or why).
fn encode_answers(answers: &[(usize, RasReply)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (rank, a) in answers {
        let (kind, bytes): (u8, &[u8]) = match a {
            RasReply::Bytes(b) => (0, b),
            RasReply::Dead(why) => (1, why.as_bytes()),
            RasReply::Silent(why) => (2, why.as_bytes()),
            RasReply::Mine => continue,
        };
        out.extend_from_slice(&(*rank as u32).to_le_bytes());
        out.push(kind);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// A subtree's answers; None when anything is malformed or names a rank not below `n`.
fn decode_answers(mut b: &[u8], n: usize) -> Option<Vec<(usize, RasReply)>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let rank = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
        let kind = *b.get(4)?;
        let len = u32::from_le_bytes(b.get(5..9)?.try_into().ok()?) as usize;
        let bytes = b.get(9..9usize.checked_add(len)?)?;
        b = &b[9 + len..];
        let text = || String::from_utf8_lossy(bytes).into_owned();
        let reply = match kind {
            0 => RasReply::Bytes(bytes.to_vec()),
            1 => RasReply::Dead(text()),
            2 => RasReply::Silent(text()),
            _ => return None,
        };
        (rank < n).then_some(())?;
        out.push((rank, reply));
    }
    Some(out)
}

/// The children of relative rank `rel` in a tree of `n` ranks.
fn children(rel: usize, n: usize) -> impl Iterator<Item = usize> {
    [2 * rel + 1, 2 * rel + 2]
        .into_iter()
        .filter(move |&c| c < n)
}

/// The longest a rank waits for its children's answers, whatever budget a query names.
const MAX_BUDGET_MS: u32 = 120_000;

/// What a child gets of a budget: enough less that its answer is in before ours is due.
fn child_budget(budget_ms: u32) -> u32 {
    (budget_ms - budget_ms / 8).saturating_sub(2)
}

impl Bootstrap {
    /// From now on, a RAS query from another rank is answered with `record()` (encoded) and
    /// the records of this rank's subtree in the query's tree, from a thread of its own so
    /// that the reader goes on reading; at most [`MAX_RAS_ANSWERS_PER_PEER`] at a time for one
    /// asking rank.
    pub(crate) fn serve_ras(
        self: &Arc<Self>,
        record: impl Fn() -> Vec<u8> + Send + Sync + 'static,
    ) {
        let this = Arc::downgrade(self);
        let record = Arc::new(record);
        let busy: Arc<Vec<AtomicUsize>> =
            Arc::new((0..self.nranks()).map(|_| AtomicUsize::new(0)).collect());
        self.shared
            .set_ras_responder(Arc::new(move |from, query, payload: &[u8]| {
                let Some(n) = busy.get(from) else {
                    return;
                };
                let Some((origin, budget_ms)) = decode_query(payload) else {
                    log::debug!("RAS: a malformed query {query} from rank {from}");
                    return;
                };
                if n.fetch_add(1, Ordering::SeqCst) >= MAX_RAS_ANSWERS_PER_PEER {
                    n.fetch_sub(1, Ordering::SeqCst);
                    log::debug!(
                        "RAS: query {query} of rank {from} dropped: \
                         {MAX_RAS_ANSWERS_PER_PEER} answers to it already in flight"
                    );
                    return;
                }
                let held = InFlight(busy.clone(), from);
                let (this, record) = (this.clone(), record.clone());
                let spawned = sockets::spawn("nccl-ras-answer", move || {
                    let _held = held;
                    let Some(bs) = this.upgrade() else {
                        return;
                    };
                    let (me, nranks) = (bs.rank(), bs.nranks());
                    let mut answers = vec![(me, RasReply::Bytes(record()))];
                    if budget_ms > 0 && origin < nranks {
                        let rel = (me + nranks - origin) % nranks;
                        // A peer's number: bounded, so that no query holds this thread (and
                        // the bootstrap it holds open) for long.
                        let budget = Duration::from_millis(u64::from(budget_ms.min(MAX_BUDGET_MS)));
                        let kids = children(rel, nranks).collect();
                        answers.extend(bs.gather_subtrees(origin, query, kids, budget));
                    }
                    let bytes = encode_answers(&answers);
                    if let Err(e) = bs.send_on(from, Channel::RasReply, query, &bytes) {
                        log::debug!("RAS: answering rank {from}: {e}");
                    }
                });
                if let Err(e) = spawned {
                    log::warn!("RAS: cannot start a thread to answer rank {from}: {e}");
                }
            }));
    }

    /// The answers of the subtrees below relative ranks `kids` of the tree rooted at `origin`,
    /// within `budget`: each child asked with a smaller budget; a child known gone (or whose
    /// query cannot be sent) is answered for and its children asked in its place; a child
    /// silent past the budget is reported so, its subtree left unheard.
    fn gather_subtrees(
        &self,
        origin: usize,
        query: u32,
        mut kids: Vec<usize>,
        budget: Duration,
    ) -> Vec<(usize, RasReply)> {
        let n = self.nranks();
        let deadline = sockets::deadline_after(budget);
        let ms = u32::try_from(budget.as_millis()).unwrap_or(u32::MAX);
        let ask = encode_query(origin, child_budget(ms).max(1));
        let mut out = Vec::new();
        let mut asked = Vec::new();
        while let Some(rel) = kids.pop() {
            let r = (origin + rel) % n;
            let failed = match self.shared.gone(r) {
                Some(why) => Some(RasReply::Dead(why)),
                None => self.ask_ras(r, query, &ask).err(),
            };
            match failed {
                Some(reply) => {
                    out.push((r, reply));
                    kids.extend(children(rel, n));
                }
                None => asked.push(r),
            }
        }
        for r in asked {
            match self.take_ras(r, query, deadline) {
                Ok(b) => match decode_answers(&b, n) {
                    Some(a) => out.extend(a),
                    None => out.push((r, RasReply::Silent("a malformed answer".into()))),
                },
                Err(_) => out.push((r, self.unanswered(r, budget))),
            }
        }
        out
    }

    /// Sends RAS query `query` (payload `ask`) to `r`, its answer awaited from now on.
    fn ask_ras(&self, r: usize, query: u32, ask: &[u8]) -> Result<(), RasReply> {
        self.shared.await_ras(r, query);
        self.send_on(r, Channel::Ras, query, ask).map_err(|_| {
            self.shared.retire_ras(r, query);
            RasReply::Silent("the query could not be sent".into())
        })
    }

    /// The answer of `r` to `query` by `deadline`; after it, none is awaited any more.
    fn take_ras(&self, r: usize, query: u32, deadline: Instant) -> crate::error::Result<Vec<u8>> {
        let got = self.shared.take(r, Channel::RasReply, query, deadline);
        self.shared.retire_ras(r, query);
        got
    }

    /// Rank `r` did not answer in `waited`: dead if known gone, else silent.
    fn unanswered(&self, r: usize, waited: Duration) -> RasReply {
        match self.shared.gone(r) {
            Some(why) => RasReply::Dead(why),
            None => RasReply::Silent(format!("no answer within {:.1} s", waited.as_secs_f64())),
        }
    }

    /// Every rank's reply to a RAS query (ours is [`RasReply::Mine`]) within `timeout`: half
    /// of it for the tree, the rest for asking the ranks the tree did not hear from directly.
    pub(crate) fn ras_gather(&self, timeout: Duration) -> Vec<RasReply> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let (me, n) = (self.rank(), self.nranks());
        // Unique per asking rank, so that trees of several askers crossing one rank do not
        // take one another's answers.
        let query = NEXT
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(n as u32)
            .wrapping_add(me as u32);
        let start = Instant::now();
        let mut got: Vec<Option<RasReply>> = vec![None; n];
        got[me] = Some(RasReply::Mine);
        let tree = self.gather_subtrees(me, query, children(0, n).collect(), timeout / 2);
        for (r, reply) in tree {
            // A silent rank may still be heard directly; the first real answer stands.
            if r != me && matches!(got[r], None | Some(RasReply::Silent(_))) {
                got[r] = Some(reply);
            }
        }
        let unheard: Vec<usize> = (0..n)
            .filter(|&r| matches!(got[r], None | Some(RasReply::Silent(_))))
            .collect();
        if !unheard.is_empty() {
            let left = timeout.saturating_sub(start.elapsed());
            let deadline = sockets::deadline_after(left);
            let direct = encode_query(me, 0);
            let mut asked = Vec::new();
            for &r in &unheard {
                if let Some(why) = self.shared.gone(r) {
                    got[r] = Some(RasReply::Dead(why));
                    continue;
                }
                match self.ask_ras(r, query, &direct) {
                    Ok(()) => asked.push(r),
                    Err(reply) => got[r] = Some(reply),
                }
            }
            for r in asked {
                // The answer may be the tree's, come late: its subtree's records count too.
                let answers = match self.take_ras(r, query, deadline) {
                    Ok(b) => decode_answers(&b, n),
                    Err(_) => {
                        got[r] = Some(self.unanswered(r, timeout));
                        continue;
                    }
                };
                got[r] = Some(RasReply::Silent("a malformed answer".into()));
                for (from, reply) in answers.into_iter().flatten() {
                    if from == r
                        || (from != me && matches!(got[from], None | Some(RasReply::Silent(_))))
                    {
                        got[from] = Some(reply);
                    }
                }
            }
        }
        got.into_iter()
            .map(|g| g.unwrap_or_else(|| RasReply::Silent("not heard from".into())))
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
            ranks[1]
                .send_on(0, Channel::Ras, q, &encode_query(1, 0))
                .expect("query");
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
            ranks[1].ask_ras(0, q, &encode_query(1, 0)).expect("query");
            let deadline = sockets::deadline_after(Duration::from_secs(1));
            if let Ok(got) = ranks[1].take_ras(0, q, deadline) {
                break got;
            }
            q += 1;
        };
        let want = vec![(0, RasReply::Bytes(b"rank=0\n".to_vec()))];
        assert_eq!(decode_answers(&got, 2), Some(want));
        assert!(most.load(Ordering::SeqCst) <= MAX_RAS_ANSWERS_PER_PEER);
    }

    /// A report's gather over the tree hears every rank: a healthy job's every rank once; then
    /// with rank 1 (a child of the asking rank 0) silent, its subtree asked directly, and with
    /// rank 2 (the other child) dead, its children asked in its place. The silent rank's
    /// answer waits at a gate the test opens at the end. The bootstrap is on loopback.
    #[test]
    fn a_tree_gather_hears_every_rank_past_a_silent_and_a_dead_one() {
        const N: usize = 12;
        let id = new_local_root_id().expect("id");
        let t = Duration::from_secs(10);
        let ranks: Vec<Arc<Bootstrap>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..N)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || Bootstrap::init(id, r, N, t))
                })
                .collect();
            hs.into_iter()
                .map(|h| Arc::new(h.join().expect("rank thread").expect("init")))
                .collect()
        });
        let asked: Arc<Vec<AtomicUsize>> = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect());
        let gate = Arc::new((Mutex::new(true), Condvar::new()));
        for (r, bs) in ranks.iter().enumerate() {
            let (asked, gate) = (asked.clone(), gate.clone());
            bs.serve_ras(move || {
                asked[r].fetch_add(1, Ordering::SeqCst);
                let (open, cv) = &*gate;
                let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
                while r == 1 && !*o {
                    o = cv.wait(o).unwrap_or_else(|p| p.into_inner());
                }
                format!("rank={r}").into_bytes()
            });
        }
        let record = |r: usize| RasReply::Bytes(format!("rank={r}").into_bytes());
        let got = ranks[0].ras_gather(Duration::from_secs(10));
        let want: Vec<RasReply> = (0..N)
            .map(|r| if r == 0 { RasReply::Mine } else { record(r) })
            .collect();
        assert_eq!(got, want, "a healthy gather");
        let counts: Vec<usize> = asked.iter().map(|a| a.swap(0, Ordering::SeqCst)).collect();
        assert_eq!(counts[1..], [1; N - 1], "every rank asked once");

        *gate.0.lock().unwrap_or_else(|p| p.into_inner()) = false;
        ranks[2].abort(false);
        let t0 = Instant::now();
        while ranks[0].shared.gone(2).is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "rank 2's death unheard"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let got = ranks[0].ras_gather(Duration::from_secs(2));
        for (r, g) in got.iter().enumerate() {
            match r {
                0 => assert_eq!(*g, RasReply::Mine),
                1 => assert!(matches!(g, RasReply::Silent(_)), "rank 1: {g:?}"),
                2 => assert!(matches!(g, RasReply::Dead(_)), "rank 2: {g:?}"),
                _ => assert_eq!(
                    *g,
                    record(r),
                    "rank {r}, below a silent or dead rank or not"
                ),
            }
        }
        let counts: Vec<usize> = asked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        assert_eq!(counts[3..], [1; N - 3], "every live rank asked once");
        let (open, cv) = &*gate;
        *open.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }

    /// An answer no gather waits for (its asker gave up) is dropped on arrival, not kept in
    /// the mailbox for ever; an awaited one is kept until taken or retired.
    #[test]
    fn unawaited_ras_answers_are_dropped() {
        let id = new_local_root_id().expect("id");
        let t = Duration::from_secs(10);
        let bs = Bootstrap::init(&id, 0, 1, t).expect("init");
        let now = Instant::now();
        bs.shared.deliver(0, Channel::RasReply, 77, vec![1; 10]);
        assert!(
            bs.shared.take(0, Channel::RasReply, 77, now).is_err(),
            "kept"
        );
        bs.shared.await_ras(0, 78);
        bs.shared.deliver(0, Channel::RasReply, 78, vec![2; 10]);
        assert_eq!(bs.take_ras(0, 78, now).expect("awaited"), vec![2; 10]);
        bs.shared.deliver(0, Channel::RasReply, 78, vec![3; 10]);
        assert!(
            bs.shared.take(0, Channel::RasReply, 78, now).is_err(),
            "kept once retired"
        );
    }
}
