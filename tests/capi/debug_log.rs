//! NCCL's logging end to end. Each test re-runs this test binary as a child process (only that
//! test, through the supervisor of `common::procs`) under some `NCCL_DEBUG*` settings; the child
//! installs the library's logger, creates communicators on the simulator, logs one probe line
//! per subsystem and exits; the parent reads what it wrote (file or stdout) and checks the
//! lines' format, which subsystems show and which do not.

use crate::common::procs;
use nccl::debug;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Every subsystem target, for the probes.
const PROBES: &[(&str, &str)] = &[
    ("INIT", debug::INIT),
    ("COLL", debug::COLL),
    ("P2P", debug::P2P),
    ("SHM", debug::SHM),
    ("NET", debug::NET),
    ("GRAPH", debug::GRAPH),
    ("TUNING", debug::TUNING),
    ("ENV", debug::ENV),
    ("ALLOC", debug::ALLOC),
    ("PROXY", debug::PROXY),
    ("BOOTSTRAP", debug::BOOTSTRAP),
];

fn is_child() -> bool {
    procs::is_child_for(&procs::current_test())
}

/// The child's work: NCCL's logger, two communicators on the simulator, the probes.
fn child_logs() {
    nccl::cuda::set_backend(nccl::Backend::Sim).expect("choose the simulator");
    assert!(nccl::init_logging(), "no other logger in this process");
    assert!(nccl::init_logging(), "a second call says it is still ours");
    let comms = nccl::Comm::init_all(&[0, 1]).expect("init_all on the simulator");
    for (name, target) in PROBES {
        log::info!(target: target, "probe info {name}");
    }
    log::warn!(target: debug::GRAPH, "probe warn GRAPH");
    drop(comms);
}

/// Runs the calling test in a child process with `env` set and every other NCCL_DEBUG*
/// variable removed; its exit status and output, whatever they are.
fn run_child(env: &[(&str, &str)]) -> Output {
    let test = procs::current_test();
    let mut cmd = procs::test_command(&test);
    cmd.arg("-q")
        .env("NCCL_RS_BACKEND", "sim")
        .env_remove("NCCL_CONF_FILE");
    for v in ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    procs::Supervisor::output(&test, cmd, procs::limit())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Lines the library's logger wrote (the test harness's own lines are left out).
fn nccl_lines(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.contains(" NCCL ") || l.starts_with("NCCL version"))
        .collect()
}

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nccl-rs-debug-log-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a scratch directory");
    d
}

/// The host name as gethostname(2) gives it, up to its first dot.
fn short_host() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("read the host name");
    h.trim().split('.').next().unwrap_or("").to_string()
}

/// Checks `line` is `host:pid:tid [dev] NCCL INFO …` or `host:pid:tid [dev] file:line NCCL WARN …`.
fn check_prefix(line: &str, host: &str, pid: u32) {
    let rest = line
        .strip_prefix(&format!("{host}:{pid}:"))
        .unwrap_or_else(|| panic!("not {host}:{pid}: first: {line:?}"));
    let (tid, rest) = rest.split_once(' ').expect("a space after the thread id");
    assert!(tid.parse::<u32>().is_ok(), "thread id {tid:?} in {line:?}");
    let rest = rest
        .strip_prefix('[')
        .unwrap_or_else(|| panic!("no [dev]: {line:?}"));
    let (dev, rest) = rest.split_once("] ").expect("the device's ]");
    assert!(
        dev.parse::<i32>().is_ok_and(|d| d >= -1),
        "device {dev:?} in {line:?}"
    );
    if let Some(msg) = rest.strip_prefix("NCCL INFO ") {
        assert!(!msg.is_empty(), "{line:?}");
    } else {
        let (at, msg) = rest
            .split_once(" NCCL WARN ")
            .unwrap_or_else(|| panic!("neither INFO nor WARN: {line:?}"));
        let (file, no) = at.rsplit_once(':').expect("file:line before NCCL WARN");
        assert!(
            file.ends_with(".rs") && no.parse::<u32>().is_ok(),
            "{line:?}"
        );
        assert!(!msg.is_empty(), "{line:?}");
    }
}

fn has(lines: &[&str], what: &str) -> bool {
    lines.iter().any(|l| l.ends_with(what))
}

#[test]
fn info_to_a_file_without_excluded_subsystems() {
    if is_child() {
        return child_logs();
    }
    let dir = scratch("file");
    let pattern = dir.join("nccl.%h.%p.log");
    let out = run_child(&[
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "^ENV,GRAPH,tuning"),
        ("NCCL_DEBUG_FILE", pattern.to_str().unwrap()),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(nccl_lines(&stdout).is_empty(), "lines on stdout:\n{stdout}");

    // The child's pid is in the file's name, with the short host name.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "one log file: {names:?}");
    let (host, pid) = names[0]
        .strip_prefix("nccl.")
        .and_then(|n| n.strip_suffix(".log"))
        .and_then(|n| n.rsplit_once('.'))
        .unwrap_or_else(|| panic!("file name {:?}", names[0]));
    assert_eq!(host, short_host());
    let pid: u32 = pid.parse().expect("the pid in the file name");
    assert_ne!(pid, std::process::id(), "the child's pid, not ours");

    let log = std::fs::read_to_string(Path::new(&dir).join(&names[0])).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(
        nccl_lines(&log).len(),
        lines.len(),
        "only NCCL lines:\n{log}"
    );
    for l in &lines {
        check_prefix(l, host, pid);
    }
    for s in [
        "INIT",
        "COLL",
        "P2P",
        "SHM",
        "NET",
        "ALLOC",
        "PROXY",
        "BOOTSTRAP",
    ] {
        assert!(
            has(&lines, &format!("probe info {s}")),
            "{s} missing:\n{log}"
        );
    }
    for s in ["ENV", "GRAPH", "TUNING"] {
        assert!(
            !has(&lines, &format!("probe info {s}")),
            "{s} excluded:\n{log}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" NCCL WARN ") && l.ends_with("probe warn GRAPH")),
        "warnings show whatever their subsystem:\n{log}"
    );
    // The library's own lines: the version (every subsystem), not the parameters (ENV).
    assert!(
        has(&lines, "NCCL INFO NCCL version 2.29.7 (nccl-rs)"),
        "{log}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("NCCL_DEBUG set to")),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn listed_subsystems_only_on_stdout() {
    if is_child() {
        return child_logs();
    }
    let out = run_child(&[("NCCL_DEBUG", "info"), ("NCCL_DEBUG_SUBSYS", "ENV,NET")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let lines = nccl_lines(&stdout);
    for l in &lines {
        check_prefix(l, &short_host(), lines_pid(l));
    }
    for s in ["ENV", "NET"] {
        assert!(
            has(&lines, &format!("probe info {s}")),
            "{s} missing:\n{stdout}"
        );
    }
    for s in ["INIT", "COLL", "P2P", "GRAPH", "BOOTSTRAP"] {
        assert!(
            !has(&lines, &format!("probe info {s}")),
            "{s} shown:\n{stdout}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("NCCL INFO NCCL_DEBUG_SUBSYS set to ENV,NET")),
        "the library's ENV lines:\n{stdout}"
    );
    assert!(has(&lines, "NCCL version 2.29.7 (nccl-rs)"), "{stdout}");
}

/// The pid field of a line (the child's).
fn lines_pid(l: &str) -> u32 {
    l.split(':')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

#[test]
fn version_prints_only_the_version() {
    if is_child() {
        return child_logs();
    }
    let out = run_child(&[("NCCL_DEBUG", "VERSION"), ("NCCL_DEBUG_SUBSYS", "ALL")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert_eq!(
        nccl_lines(&stdout),
        ["NCCL version 2.29.7 (nccl-rs)"],
        "{stdout}"
    );
    assert!(nccl_lines(&stderr).is_empty(), "{stderr}");
}

#[test]
fn abort_stops_at_the_first_warning() {
    if is_child() {
        assert!(nccl::init_logging());
        log::info!(target: debug::INIT, "probe before");
        log::warn!(target: debug::NET, "probe abort");
        unreachable!("NCCL_DEBUG=ABORT aborts at a warning");
    }
    let out = run_child(&[("NCCL_DEBUG", "ABORT")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(6), "SIGABRT:\n{stdout}\n{stderr}");
    let lines = nccl_lines(&stdout);
    assert!(has(&lines, "NCCL INFO probe before"), "{stdout}");
    assert!(has(&lines, "NCCL WARN probe abort"), "{stdout}");
    assert!(stderr.contains(" NCCL ABORT"), "{stderr}");
}

/// A program's own logger stays: `install_logger` says no, and the library's records (the
/// version among them) reach the program's logger.
#[test]
fn an_application_logger_is_kept() {
    if is_child() {
        struct Mine;
        static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        impl log::Log for Mine {
            fn enabled(&self, _: &log::Metadata) -> bool {
                true
            }
            fn log(&self, r: &log::Record) {
                SEEN.lock()
                    .unwrap()
                    .push(format!("{} {}", r.target(), r.args()));
            }
            fn flush(&self) {}
        }
        log::set_logger(&Mine).unwrap();
        log::set_max_level(log::LevelFilter::Info);
        nccl::cuda::set_backend(nccl::Backend::Sim).unwrap();
        assert!(!nccl::init_logging(), "the program's logger stays");
        let comms = nccl::Comm::init_all(&[0, 1]).expect("init_all on the simulator");
        drop(comms);
        let seen = SEEN.lock().unwrap();
        assert!(
            seen.iter()
                .any(|s| s == "nccl::ALL NCCL version 2.29.7 (nccl-rs)"),
            "{seen:?}"
        );
        return;
    }
    let out = run_child(&[("NCCL_DEBUG", "INFO")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(nccl_lines(&stdout).is_empty(), "NCCL's lines:\n{stdout}");
}

/// An application that installs `env_logger` first keeps it: `nccl::init_logging` says NCCL's
/// logger is not in place, creating communicators installs nothing (env_logger's own `init`
/// would panic if a logger had been set under it), and the library's records reach the
/// application's logger.
#[test]
fn an_application_env_logger_installed_first_stays() {
    if is_child() {
        env_logger::builder()
            .filter_level(log::LevelFilter::Info)
            .target(env_logger::Target::Stdout)
            .init();
        nccl::cuda::set_backend(nccl::Backend::Sim).unwrap();
        assert!(!nccl::init_logging(), "the application's logger stays");
        let comms = nccl::Comm::init_all(&[0, 1]).expect("init_all on the simulator");
        drop(comms);
        log::info!("the application logs after nccl");
        return;
    }
    let out = run_child(&[("NCCL_DEBUG", "INFO")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    // No line in NCCL's format (`host:pid:tid [dev] NCCL INFO ...`): env_logger wrote them all.
    assert!(!stdout.contains("NCCL INFO"), "NCCL's lines:\n{stdout}");
    assert!(
        stdout.contains("the application logs after nccl"),
        "{stdout}"
    );
    assert!(stdout.contains("NCCL version 2.29.7 (nccl-rs)"), "{stdout}");
}
