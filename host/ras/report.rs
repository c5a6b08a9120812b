//! The job's state as text: per communicator with a rank in this process, every rank's
//! record gathered over the communicator's bootstrap, then the verdict.

use std::fmt::Write;
use std::time::Duration;

use super::record::Record;
use crate::bootstrap::RasReply;

/// What became of one rank when asked.
pub(crate) enum Answer {
    Record(Record),
    /// Known gone: its bootstrap connection ended without a goodbye.
    Dead(String),
    /// No answer in time, or an answer that made no sense.
    Silent(String),
}

/// The report a `STATUS` (or, `verbose`, `VERBOSE STATUS`) query gets: every communicator of
/// this process, each rank asked within `timeout`.
pub fn report(verbose: bool, timeout: Duration) -> String {
    let entries = super::entries();
    let mut out = format!(
        "nccl-rs RAS report from pid {} ({} communicator{} here)\n",
        std::process::id(),
        entries.len(),
        if entries.len() == 1 { "" } else { "s" }
    );
    for e in &entries {
        let h = &e.health;
        let answers: Vec<Answer> = match e.bootstrap.upgrade() {
            Some(bs) => {
                let mine = h.record();
                answers(bs.ras_gather(timeout), mine)
            }
            None => continue,
        };
        let _ = writeln!(
            out,
            "\nCommunicator {:#018x}{}: {} ranks",
            h.comm_id,
            h.name
                .as_deref()
                .map(|n| format!(" \"{n}\""))
                .unwrap_or_default(),
            h.nranks
        );
        out += &verdict(&answers, verbose);
    }
    out
}

/// The bootstrap's replies to a RAS query as answers: ours is `mine`, every other rank's bytes
/// decoded (anything but a record of the rank that sent it is a malformed answer).
fn answers(replies: Vec<RasReply>, mine: Record) -> Vec<Answer> {
    let n = replies.len();
    let mut mine = Some(mine);
    replies
        .into_iter()
        .enumerate()
        .map(|(r, reply)| match reply {
            RasReply::Mine => Answer::Record(mine.take().expect("our own record once")),
            RasReply::Bytes(b) => match Record::decode(&b, n) {
                Some(rec) if rec.rank == r => Answer::Record(rec),
                _ => Answer::Silent("a malformed answer".into()),
            },
            RasReply::Dead(why) => Answer::Dead(why),
            RasReply::Silent(why) => Answer::Silent(why),
        })
        .collect()
}

/// One communicator's part of the report: a line per rank that is not healthy (every rank
/// when `verbose`), then whether it is stuck.
pub(crate) fn verdict(answers: &[Answer], verbose: bool) -> String {
    let mut out = String::new();
    let most = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Record(r) => Some(r.issued),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    // The operation the late ranks have not issued: from a rank that did.
    let missing_op = |seq: u64| {
        answers
            .iter()
            .filter_map(|a| match a {
                Answer::Record(r) => r.op(seq),
                _ => None,
            })
            .next()
            .unwrap_or("?")
            .to_string()
    };
    let (mut dead, mut silent, mut behind, mut failed, mut running) = (0, 0, 0, 0, 0);
    for (rank, a) in answers.iter().enumerate() {
        match a {
            Answer::Dead(why) => {
                dead += 1;
                let _ = writeln!(out, "  rank {rank}: DEAD ({why})");
            }
            Answer::Silent(why) => {
                silent += 1;
                let _ = writeln!(out, "  rank {rank}: NOT RESPONDING ({why})");
            }
            Answer::Record(r) => {
                let at = format!("pid {} on {}, device {}", r.pid, r.host, r.device);
                let idle = r
                    .idle_ms
                    .map(|ms| format!(", last issued {:.1} s ago", ms as f64 / 1e3))
                    .unwrap_or_default();
                if let Some(e) = &r.error {
                    failed += 1;
                    if verbose {
                        let _ = writeln!(out, "  rank {rank}: ERROR {e} ({at})");
                    }
                }
                if r.issued < most {
                    behind += 1;
                    let _ = writeln!(
                        out,
                        "  rank {rank}: BEHIND: issued {} operations, others {most}; has not \
                         issued operation {} ({}) ({at}{idle})",
                        r.issued,
                        r.issued + 1,
                        missing_op(r.issued + 1)
                    );
                } else if r.done == Some(false) {
                    running += 1;
                    if verbose {
                        let _ = writeln!(
                            out,
                            "  rank {rank}: operation {} ({}) in progress ({at}{idle})",
                            r.issued,
                            r.op(r.issued).unwrap_or("?")
                        );
                    }
                } else if verbose {
                    let _ = writeln!(
                        out,
                        "  rank {rank}: OK, {} operations issued and finished ({at}{idle})",
                        r.issued
                    );
                }
            }
        }
    }
    // Errors that follow from a dead rank (every survivor's async error names it) are no news.
    if dead > 0 {
        failed = 0;
    }
    let state = if dead + silent + behind + failed > 0 {
        let mut why = Vec::new();
        for (n, what) in [
            (dead, "dead"),
            (silent, "not responding"),
            (behind, "behind"),
            (failed, "with an error"),
        ] {
            if n > 0 {
                why.push(format!("{n} rank{} {what}", if n == 1 { "" } else { "s" }));
            }
        }
        format!("STUCK or FAILED: {}", why.join(", "))
    } else if running > 0 {
        format!("RUNNING: operation {most} in progress on {running} ranks")
    } else {
        format!("OK: every rank issued and finished {most} operations")
    };
    let _ = writeln!(out, "  state: {state}");
    out
}
