//! What the crate's unit tests share, whichever room they test: checks skipped visibly, and a
//! shared memory object that belongs to nobody in the library. Compiled for tests only.

use std::ffi::CString;
use std::io::{self, Write};
use std::sync::Mutex;

/// A check this process skips, visibly: a line on stderr now (libtest does not capture a
/// direct write) and, when the process exits, how many checks each reason skipped. For the
/// crate's unit tests (namespaces that cannot be made, no IPv6 loopback, PTX not embedded).
pub(crate) fn skipped(reason: &str, what: &str) {
    use std::collections::BTreeMap;
    static COUNTS: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    extern "C" fn totals() {
        let counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
        for (reason, n) in counts.iter() {
            let _ = writeln!(
                io::stderr(),
                "nccl-rs unit tests: {n} checks skipped: {reason}"
            );
        }
    }
    // SAFETY: registers a plain `extern "C"` function with no arguments, once.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(totals);
    });
    *COUNTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(reason.to_string())
        .or_default() += 1;
    let _ = writeln!(
        io::stderr(),
        "nccl-rs unit tests: skipped check ({reason}): {what}"
    );
}

/// Lets this process hold at least `n` descriptors (a test that opens thousands of
/// connections), raising the soft limit, and the hard one where it is lower and we may.
pub(crate) fn allow_descriptors(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid rlimit structure.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= n {
            return;
        }
        lim.rlim_cur = n;
        lim.rlim_max = lim.rlim_max.max(n);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// For tests: a POSIX shared memory object that belongs to nobody in the library (another
/// program's, as far as the library can tell), removed when dropped.
pub(crate) struct ForeignObject {
    pub name: String,
    c: CString,
}

impl ForeignObject {
    /// `/<tag>-<pid>`, of `bytes` bytes.
    pub fn create(tag: &str, bytes: usize) -> ForeignObject {
        let name = format!("/{tag}-{}", std::process::id());
        let c = CString::new(name.clone()).expect("name");
        // SAFETY: plain system calls on a name of the test's; results checked.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
            assert!(fd >= 0, "shm_open: {}", std::io::Error::last_os_error());
            assert_eq!(libc::ftruncate(fd, bytes as libc::off_t), 0);
            libc::close(fd);
        }
        ForeignObject { name, c }
    }

    /// Whether the object is still there.
    pub fn exists(&self) -> bool {
        // SAFETY: a plain open of the test's name; the descriptor is closed at once.
        unsafe {
            let fd = libc::shm_open(self.c.as_ptr(), libc::O_RDWR, 0);
            if fd >= 0 {
                libc::close(fd);
            }
            fd >= 0
        }
    }
}

impl Drop for ForeignObject {
    fn drop(&mut self) {
        // SAFETY: unlinking the test's own name.
        unsafe { libc::shm_unlink(self.c.as_ptr()) };
    }
}
