//! The bootstrap's part of RAS: answering other ranks' queries with this rank's health record,
//! and gathering every rank's record for a report.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::socket;
use super::wire::Channel;
use super::Bootstrap;
use crate::ras::Record;
use crate::ras::report::Answer;

impl Bootstrap {
    /// From now on, a RAS query from another rank is answered with `record()` (encoded), from a
    /// thread of its own so that the reader goes on reading.
    pub(crate) fn serve_ras(self: &Arc<Self>, record: impl Fn() -> Vec<u8> + Send + Sync + 'static) {
        let this = Arc::downgrade(self);
        let record = Arc::new(record);
        self.shared.set_ras_responder(Arc::new(move |from, query| {
            let (this, record) = (this.clone(), record.clone());
            let spawned = socket::spawn("nccl-ras-answer", move || {
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

    /// Every rank's answer to a RAS query (ours is `mine`), each waited for until `timeout`.
    pub(crate) fn ras_gather(&self, mine: Record, timeout: Duration) -> Vec<Answer> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let query = NEXT.fetch_add(1, Ordering::Relaxed);
        let (me, n) = (self.rank(), self.nranks());
        let mut asked = vec![false; n];
        for (r, a) in asked.iter_mut().enumerate().filter(|&(r, _)| r != me) {
            *a = self.shared.gone(r).is_none() && self.send_on(r, Channel::Ras, query, &[]).is_ok();
        }
        let deadline = socket::deadline_after(timeout);
        let mut mine = Some(mine);
        (0..n)
            .map(|r| {
                if r == me {
                    return Answer::Record(mine.take().expect("our own record once"));
                }
                if let Some(why) = self.shared.gone(r) {
                    return Answer::Dead(why);
                }
                if !asked[r] {
                    return Answer::Silent("the query could not be sent".into());
                }
                match self.shared.take(r, Channel::RasReply, query, deadline) {
                    Ok(b) => match Record::decode(&b, n) {
                        Some(rec) if rec.rank == r => Answer::Record(rec),
                        _ => Answer::Silent("a malformed answer".into()),
                    },
                    Err(_) => match self.shared.gone(r) {
                        Some(why) => Answer::Dead(why),
                        None => Answer::Silent(format!(
                            "no answer within {:.1} s",
                            timeout.as_secs_f64()
                        )),
                    },
                }
            })
            .collect()
    }
}
