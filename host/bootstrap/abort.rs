//! A flag that stops a bootstrap (and the communicator init around it) promptly: setting it
//! runs every registered hook, which shuts down the sockets a wait is blocked on, so that
//! `ncclCommAbort` on a communicator still being created returns at once instead of waiting for
//! the init timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::p2p::lock;
use crate::error::{Error, Result};

type Hook = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct Inner {
    aborted: AtomicBool,
    next: AtomicU64,
    hooks: Mutex<HashMap<u64, Hook>>,
}

/// Shared by the thread that creates a communicator and the one that may abort it. Clones
/// share the flag.
#[derive(Clone, Default)]
pub struct AbortFlag(Arc<Inner>);

impl std::fmt::Debug for AbortFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AbortFlag({})", self.is_aborted())
    }
}

/// Removes its hook when dropped.
pub(crate) struct HookGuard {
    flag: AbortFlag,
    id: u64,
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        lock(&self.flag.0.hooks).remove(&self.id);
    }
}

impl AbortFlag {
    pub fn new() -> AbortFlag {
        AbortFlag::default()
    }

    /// Sets the flag and runs every hook (each at most once). Idempotent.
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::SeqCst);
        let hooks: Vec<Hook> = lock(&self.0.hooks).drain().map(|(_, h)| h).collect();
        for h in hooks {
            h();
        }
    }

    pub fn is_aborted(&self) -> bool {
        self.0.aborted.load(Ordering::SeqCst)
    }

    /// Err(invalid_usage) once aborted.
    pub fn check(&self) -> Result<()> {
        if self.is_aborted() {
            Err(Error::invalid_usage("the communicator was aborted"))
        } else {
            Ok(())
        }
    }

    /// Runs `f` when the flag is set (at once if it already is); the hook is forgotten when
    /// the guard drops.
    pub(crate) fn hook(&self, f: impl Fn() + Send + Sync + 'static) -> HookGuard {
        let id = self.0.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.0.hooks).insert(id, Box::new(f));
        // Set before the insert: run it ourselves (abort may have drained before we inserted).
        if self.is_aborted() {
            if let Some(h) = lock(&self.0.hooks).remove(&id) {
                h();
            }
        }
        HookGuard {
            flag: self.clone(),
            id,
        }
    }

    /// Sleeps for `d`, waking early (with an error) when aborted.
    pub(crate) fn sleep(&self, d: std::time::Duration) -> Result<()> {
        let end = std::time::Instant::now() + d;
        loop {
            self.check()?;
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(left.min(std::time::Duration::from_millis(10)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn hooks_run_once_and_guards_remove_them() {
        let f = AbortFlag::new();
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        let kept = f.hook(move || {
            m.fetch_add(1, Ordering::SeqCst);
        });
        let m = n.clone();
        drop(f.hook(move || {
            m.fetch_add(100, Ordering::SeqCst);
        }));
        f.abort();
        f.abort();
        assert_eq!(n.load(Ordering::SeqCst), 1);
        drop(kept);
        let m = n.clone();
        let _late = f.hook(move || {
            m.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(
            n.load(Ordering::SeqCst),
            11,
            "a hook added after abort runs at once"
        );
        assert!(f.check().is_err());
    }
}
