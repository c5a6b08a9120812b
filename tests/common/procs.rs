//! Child processes, and the one supervisor every test that starts processes goes through.
//!
//! Tests start children for three reasons: ranks as processes (`run`, `run_nodes`, ...: copies
//! of this test binary running one test, told their rank and the unique id through the
//! environment), a test body that needs an environment of its own (`isolated`: NCCL_*
//! variables are read per process, so a test that sets them runs alone in a child started with
//! them, never with `std::env::set_var` beside other tests' threads), and programs (examples,
//! C programs, `ip netns exec` wrappers). [`Supervisor`] collects their output on threads (no
//! pipe fills up), kills the others when one fails (they would wait on it forever), turns a
//! hang into a failure after a generous deadline, and forwards the skips children report.
//!
//! A child runs its test by name with `--exact`: the name libtest gave the test in the parent
//! (`module::test`), read from the test's thread, so a test moved between modules or binaries
//! never names a test that does not exist (and a child that ran no test fails: "1 passed").

use super::skip;
use nccl::UniqueId;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Set in every child of this binary to the name of the test it runs.
pub const CHILD: &str = "NCCL_RS_TEST_CHILD";
const RANK: &str = "NCCL_RS_TEST_RANK";
const NRANKS: &str = "NCCL_RS_TEST_NRANKS";
const ID: &str = "NCCL_RS_TEST_ID";

/// The generous bound on a child's run: it only turns a hang into a failure. A fresh GPU host
/// JIT-compiles every kernel family a rank process loads (minutes for the type matrix), and a
/// simulator matrix on a loaded two-core machine takes minutes too;
/// `NCCL_RS_TEST_PROC_LIMIT_S` changes it.
pub fn limit() -> Duration {
    let s = std::env::var("NCCL_RS_TEST_PROC_LIMIT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1200);
    Duration::from_secs(s)
}

/// The libtest name of the running test (`module::test`): its thread's name.
pub fn current_test() -> String {
    let t = std::thread::current();
    match t.name() {
        Some(n) if n != "main" => n.to_string(),
        other => panic!(
            "procs: called from thread {other:?}, not from a test's own thread (the child's \
             test is named after it)"
        ),
    }
}

/// Whether this process is a child started to run `test`.
pub fn is_child_for(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|t| t == test)
}

/// A command that runs test `test` (and no other) in a fresh copy of this test binary.
pub fn test_command(test: &str) -> Command {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    add_test_args(&mut cmd, test);
    cmd
}

/// `test_command` behind a wrapper program (`ip netns exec NS`).
pub fn wrapped_test_command(wrapper: &[&str], test: &str) -> Command {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(wrapper[0]);
    cmd.args(&wrapper[1..]).arg(exe);
    add_test_args(&mut cmd, test);
    cmd
}

fn add_test_args(cmd: &mut Command, test: &str) {
    cmd.args([
        test,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, test);
}

/// Runs the calling test's `body` alone in a child process of its own, started with `set`
/// added to the environment and `unset` removed from it; in that child, runs `body`. Fails
/// the test if the child fails (with its output).
pub fn isolated(set: &[(&str, &str)], unset: &[&str], body: impl FnOnce()) {
    let test = current_test();
    if is_child_for(&test) {
        return body();
    }
    let mut cmd = test_command(&test);
    for k in unset {
        cmd.env_remove(k);
    }
    for (k, v) in set {
        cmd.env(k, v);
    }
    let mut s = Supervisor::start(vec![(format!("{test} {set:?}"), cmd)]);
    s.wait(limit(), &[]);
    s.check(&[]);
}

/// Set in an [`isolated_cases`] child to the label of its case.
const CASE: &str = "NCCL_RS_TEST_CASE";

/// As [`isolated`], once per case, one child after the other: each child is started with its
/// case's environment (every variable some case sets is first removed, so that no case sees
/// another's, nor the parent's) and runs `body` with the case's label.
pub fn isolated_cases(cases: &[(&str, &[(&str, &str)])], body: impl FnOnce(&str)) {
    let test = current_test();
    if is_child_for(&test) {
        let label = std::env::var(CASE).expect("the case of an isolated child");
        return body(&label);
    }
    for (label, env) in cases {
        let mut cmd = test_command(&test);
        for (k, _) in cases.iter().flat_map(|(_, e)| e.iter()) {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().copied()).env(CASE, label);
        let mut s = Supervisor::start(vec![(format!("{test}, case {label}"), cmd)]);
        s.wait(limit(), &[]);
        s.check(&[]);
    }
}

/// In a rank child of [`run`] and its kin: (rank, nranks, id).
pub fn child() -> Option<(usize, usize, UniqueId)> {
    let rank = std::env::var(RANK).ok()?.parse().ok()?;
    let nranks = std::env::var(NRANKS).ok()?.parse().ok()?;
    let hex = std::env::var(ID).ok()?;
    let mut id = UniqueId {
        internal: [0; nccl::UNIQUE_ID_BYTES],
    };
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((rank, nranks, id))
}

/// In the parent: runs `nranks` children of the calling test and fails with their output if
/// any fails.
#[cfg(feature = "internals")]
pub fn run(nranks: usize, extra_env: &[(&str, &str)]) {
    run_each(nranks, extra_env, |_| Vec::new());
}

/// Ranks as `nodes` × `per_node` processes: rank r runs on node r / per_node, told so by its
/// own `NCCL_HOSTID`, so that ranks of different nodes reach each other only through the
/// network (on this machine's loopback unless `extra_env` says otherwise).
#[cfg(feature = "internals")]
pub fn run_nodes(nodes: usize, per_node: usize, extra_env: &[(&str, &str)]) {
    run_inner(
        nodes * per_node,
        extra_env,
        None,
        &|r| node_env(r, per_node),
        &mut |_| Box::new(()),
    );
}

/// As [`run_nodes`], with `hold(&id)` called once the root of the ranks' unique id listens and
/// before any rank starts; what it returns is kept until every rank ended (a flood of
/// connections to the root, say).
#[cfg(feature = "internals")]
pub fn run_nodes_holding(
    nodes: usize,
    per_node: usize,
    extra_env: &[(&str, &str)],
    hold: &mut dyn FnMut(&UniqueId) -> Box<dyn std::any::Any>,
) {
    run_inner(
        nodes * per_node,
        extra_env,
        None,
        &|r| node_env(r, per_node),
        hold,
    );
}

/// As [`run_nodes`], where rank `victim` is expected to die (it kills itself): its exit is
/// not checked and does not stop the others, which must pass.
#[cfg(feature = "internals")]
pub fn run_nodes_with_victim(
    nodes: usize,
    per_node: usize,
    extra_env: &[(&str, &str)],
    victim: usize,
) {
    run_inner(
        nodes * per_node,
        extra_env,
        Some(victim),
        &|r| node_env(r, per_node),
        &mut |_| Box::new(()),
    );
}

#[cfg(feature = "internals")]
fn node_env(r: usize, per_node: usize) -> Vec<(String, String)> {
    vec![("NCCL_HOSTID".into(), format!("test-node-{}", r / per_node))]
}

/// As [`run`], with environment of each rank's own from `per_rank`.
#[cfg(feature = "internals")]
pub fn run_each(
    nranks: usize,
    extra_env: &[(&str, &str)],
    per_rank: impl Fn(usize) -> Vec<(String, String)>,
) {
    run_inner(nranks, extra_env, None, &per_rank, &mut |_| Box::new(()))
}

#[cfg(feature = "internals")]
fn run_inner(
    nranks: usize,
    extra_env: &[(&str, &str)],
    victim: Option<usize>,
    per_rank: &dyn Fn(usize) -> Vec<(String, String)>,
    hold: &mut dyn FnMut(&UniqueId) -> Box<dyn std::any::Any>,
) {
    let test = current_test();
    // The root this parent starts listens on loopback: tests never use an address of a real
    // interface. (A test that wants another root passes NCCL_COMM_ID to its children.)
    let id = nccl::bootstrap::new_local_root_id().expect("a loopback unique id");
    let _held = hold(&id);
    let hex: String = id.internal.iter().map(|b| format!("{b:02x}")).collect();
    let cmds = (0..nranks)
        .map(|r| {
            let mut cmd = test_command(&test);
            cmd.env(RANK, r.to_string())
                .env(NRANKS, nranks.to_string())
                .env(ID, &hex)
                // The ranks' own listeners and any root they start stay on loopback too.
                .env("NCCL_SOCKET_IFNAME", "lo");
            for (k, v) in extra_env {
                cmd.env(k, v);
            }
            for (k, v) in per_rank(r) {
                cmd.env(k, v);
            }
            (format!("rank {r}"), cmd)
        })
        .collect();
    let mut s = Supervisor::start(cmds);
    let exempt: Vec<usize> = victim.into_iter().collect();
    s.wait(limit(), &exempt);
    if std::env::var_os("NCCL_RS_TEST_SHOW_RANKS").is_some() {
        for (i, p) in s.procs.iter_mut().enumerate() {
            let (out, err) = p.output();
            eprintln!("--- rank {i} ({:?}):\n{out}{err}", p.status);
        }
    }
    s.check(&exempt);
}

/// One supervised process.
pub struct Proc {
    label: String,
    child: Child,
    /// Whether it runs a test of this binary (then it must report "1 passed").
    runs_test: bool,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    text: Option<(String, String)>,
    pub status: Option<ExitStatus>,
}

impl Proc {
    /// Its stdout and stderr (once it exited; waits for the pipes to close).
    pub fn output(&mut self) -> (String, String) {
        if self.text.is_none() {
            let join =
                |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
            self.text = Some((join(self.out.take()), join(self.err.take())));
        }
        self.text.clone().unwrap_or_default()
    }
}

fn drain<R: Read + Send + 'static>(mut r: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = r.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Processes started together and watched together.
pub struct Supervisor {
    pub procs: Vec<Proc>,
    pub started: Instant,
}

impl Supervisor {
    /// Starts every (label, command), its stdout and stderr piped and drained on threads.
    pub fn start(cmds: Vec<(String, Command)>) -> Supervisor {
        let started = Instant::now();
        let procs = cmds
            .into_iter()
            .map(|(label, mut cmd)| {
                let runs_test = cmd.get_envs().any(|(k, _)| k == CHILD);
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
                let mut child = cmd
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting {label} ({cmd:?}): {e}"));
                let out = drain(child.stdout.take().expect("piped stdout"));
                let err = drain(child.stderr.take().expect("piped stderr"));
                Proc {
                    label,
                    child,
                    runs_test,
                    out: Some(out),
                    err: Some(err),
                    text: None,
                    status: None,
                }
            })
            .collect();
        Supervisor { procs, started }
    }

    /// Looks at every process; how many still run.
    pub fn poll(&mut self) -> usize {
        let mut running = 0;
        for p in &mut self.procs {
            if p.status.is_none() {
                match p.child.try_wait() {
                    Ok(Some(s)) => p.status = Some(s),
                    _ => running += 1,
                }
            }
        }
        running
    }

    /// Kills every process still running.
    pub fn kill(&mut self) {
        for p in &mut self.procs {
            if p.status.is_none() {
                let _ = p.child.kill();
            }
        }
    }

    /// Waits until every process exited; how long that took. A process that fails (outside
    /// `exempt`: those expected to die, or to be stopped) gets the others killed, since they
    /// may wait on it forever; an exempt one still running once all the others are done is
    /// killed; past `limit` (a hang) every one is killed.
    pub fn wait(&mut self, limit: Duration, exempt: &[usize]) -> Duration {
        let t0 = Instant::now();
        loop {
            if self.poll() == 0 {
                return t0.elapsed();
            }
            let failed = self
                .procs
                .iter()
                .enumerate()
                .any(|(i, p)| !exempt.contains(&i) && p.status.is_some_and(|s| !s.success()));
            // (With no other process, an exempt one is waited for.)
            let others = self.procs.len() > exempt.len();
            let others_done = self
                .procs
                .iter()
                .enumerate()
                .all(|(i, p)| exempt.contains(&i) || p.status.is_some());
            if others && others_done {
                for &i in exempt {
                    let _ = self.procs[i].child.kill();
                }
            }
            if failed || t0.elapsed() > limit {
                if !failed {
                    eprintln!("procs: still running after {limit:?}: killed (a hang)");
                }
                self.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `cmd` (labelled `label`) to its end under `limit`, whatever its exit: its status
    /// (None if killed past `limit`), stdout and stderr; the skips it reported are forwarded.
    pub fn output(label: &str, cmd: Command, limit: Duration) -> std::process::Output {
        let mut s = Supervisor::start(vec![(label.to_string(), cmd)]);
        s.wait(limit, &[0]);
        let p = &mut s.procs[0];
        let (out, err) = p.output();
        skip::forward(&err);
        let status = p
            .status
            .unwrap_or_else(|| panic!("{label}: no exit status"));
        std::process::Output {
            status,
            stdout: out.into_bytes(),
            stderr: err.into_bytes(),
        }
    }

    /// Once every process exited: forwards the skips they reported, and fails the test with
    /// the output of each one (outside `exempt`) that did not pass. A test child passes when
    /// it exits 0 having run its one test ("1 passed"); another program when it exits 0.
    pub fn check(&mut self, exempt: &[usize]) {
        let mut failed = Vec::new();
        for (i, p) in self.procs.iter_mut().enumerate() {
            let (out, err) = p.output();
            skip::forward(&err);
            if exempt.contains(&i) {
                continue;
            }
            let ok = p.status.is_some_and(|s| s.success());
            if !ok || (p.runs_test && !out.contains("1 passed")) {
                failed.push(format!("{} ({:?}):\n{out}{err}", p.label, p.status));
            } else {
                // What the ranks measured, for the test's own output.
                for l in err.lines().filter(|l| l.starts_with("rank ")) {
                    eprintln!("{l}");
                }
            }
        }
        assert!(
            failed.is_empty(),
            "child processes failed:\n{}",
            failed.join("\n")
        );
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill();
        for p in &mut self.procs {
            let _ = p.child.wait();
        }
    }
}

/// Runs `f` on a thread of its own and fails the test if it has not returned within `limit`:
/// a generous bound that only turns a hang into a failure (never a timing claim).
pub fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {limit:?} (a hang)"),
    }
}

/// Polls `done` until it holds; fails the test naming `what` if it still does not after
/// `limit` (a generous bound: a hang, not slowness).
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what}: not after {limit:?} (a hang)");
        std::thread::sleep(Duration::from_millis(5));
    }
}
