//! The order of a communicator's splits and shrinks. Each exchanges messages over the
//! parent's bootstrap to agree on its children; two of them in flight at once (non-blocking
//! splits run on threads of their own, blocking ones inside a group run side by side at its
//! end) would interleave those messages differently on different ranks. So each takes a
//! ticket when it is called, in program order, which is the same on every rank, and runs its
//! exchange only in its turn.

use crate::bootstrap::AbortFlag;
use crate::error::Result;
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
struct State {
    /// Tickets given out so far.
    issued: u64,
    /// The ticket whose turn it is.
    turn: u64,
    /// Tickets past `turn` already done (their job ended, or was dropped without running).
    done: BTreeSet<u64>,
}

/// A communicator's turns.
#[derive(Default)]
pub(crate) struct Turns {
    state: Mutex<State>,
    changed: Condvar,
}

/// One split's or shrink's place in line. Dropping it ends its turn (or, taken before its turn
/// came, lets the turn pass it by), so a job that fails or never runs blocks nobody.
pub(crate) struct Ticket {
    turns: Arc<Turns>,
    n: u64,
}

impl Turns {
    /// The next ticket, at the call.
    pub(crate) fn ticket(self: &Arc<Self>) -> Ticket {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.issued += 1;
        Ticket {
            turns: self.clone(),
            n: s.issued - 1,
        }
    }
}

impl Ticket {
    /// Waits for this ticket's turn, or until `abort` is raised (its error).
    pub(crate) fn wait(&self, abort: &AbortFlag) -> Result<()> {
        let t = &self.turns;
        let mut s = t.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.turn < self.n {
            abort.check()?;
            s = t
                .changed
                .wait_timeout(s, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let t = &self.turns;
        let mut s = t.state.lock().unwrap_or_else(|p| p.into_inner());
        s.done.insert(self.n);
        loop {
            let turn = s.turn;
            if !s.done.remove(&turn) {
                break;
            }
            s.turn = turn + 1;
        }
        t.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_follow_the_tickets_and_skip_dropped_ones() {
        let turns = Arc::new(Turns::default());
        let (a, b, c) = (turns.ticket(), turns.ticket(), turns.ticket());
        let order = Arc::new(Mutex::new(Vec::new()));
        let abort = AbortFlag::new();
        std::thread::scope(|s| {
            // c and a wait on threads started out of order; b is dropped unused.
            for (name, t) in [("c", c), ("a", a)] {
                let (order, abort) = (order.clone(), &abort);
                s.spawn(move || {
                    t.wait(abort).unwrap();
                    order.lock().unwrap().push(name);
                    drop(t);
                });
            }
            std::thread::sleep(Duration::from_millis(20));
            drop(b);
        });
        assert_eq!(*order.lock().unwrap(), ["a", "c"]);
        // An abort ends a wait that would never be served.
        let (first, second) = (turns.ticket(), turns.ticket());
        let abort = AbortFlag::new();
        abort.abort();
        assert!(second.wait(&abort).is_err());
        drop(first);
    }
}
