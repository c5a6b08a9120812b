//! Memory that the ranks of one communicator in this process reach in each other, kept until
//! the last of them is gone.
//!
//! Ranks in one process address each other's connection memory directly (see
//! `transport::p2p::import`). A rank's work can end while a peer's kernel is still finishing
//! the same collective: the peer's last acknowledgement (its head) lands in the memory of the
//! rank it received from. A rank that dropped its communicator then and freed that memory made
//! the peer write into freed memory (SIGSEGV on the simulator, one run in four in the
//! examples). So a communicator with peers in this process leaves its peer-visible parts here
//! when it drops, and they are freed with the last member's. Each member drains its own
//! stream before it drops, so once all have, no kernel of the communicator runs.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// The in-process members' shared keep: what members left behind, freed when it drops.
#[derive(Default)]
pub(crate) struct Keep {
    left: Mutex<Vec<Box<dyn Any + Send + Sync>>>,
}

impl Keep {
    /// Keeps `part` until every in-process member of the communicator has dropped.
    pub(crate) fn leave(&self, part: impl Any + Send + Sync) {
        self.left
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(part));
    }
}

fn members() -> &'static Mutex<HashMap<u64, Weak<Keep>>> {
    static M: std::sync::OnceLock<Mutex<HashMap<u64, Weak<Keep>>>> = std::sync::OnceLock::new();
    M.get_or_init(Mutex::default)
}

/// The keep of communicator `comm_id` in this process, made by its first member. Every
/// member must join before any rank's init completes (before the connection exchange), so that
/// no member can drop the keep while another has yet to join.
pub(crate) fn join(comm_id: u64) -> Arc<Keep> {
    let mut m = members().lock().unwrap_or_else(|p| p.into_inner());
    m.retain(|_, k| k.strong_count() > 0);
    if let Some(k) = m.get(&comm_id).and_then(Weak::upgrade) {
        return k;
    }
    let k = Arc::new(Keep::default());
    m.insert(comm_id, Arc::downgrade(&k));
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flag(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn parts_go_with_the_last_member() {
        let freed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, b) = (join(0xfeed_0001), join(0xfeed_0001));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &join(0xfeed_0002)));
        a.leave(Flag(freed.clone()));
        drop(a);
        assert!(
            !freed.load(std::sync::atomic::Ordering::SeqCst),
            "b is still there"
        );
        drop(b);
        assert!(freed.load(std::sync::atomic::Ordering::SeqCst));
    }
}
