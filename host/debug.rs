//! NCCL's logging: `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE`, in NCCL's line
//! format, over the `log` facade.
//!
//! The library emits every message through `log` and never installs a logger by itself
//! (rule 6 of docs/architecture.md): a Rust program keeps whatever logger it has, or calls [`crate::init_logging`]
//! to get NCCL's. The C ABI (feature `capi`) installs it on its first entry, because C, C++ and
//! Python programs expect `NCCL_DEBUG` to work as with NVIDIA's library.
//!
//! What NCCL's logger does, and so this one:
//!
//! - `NCCL_DEBUG` (case-insensitive): unset or unknown: nothing; `VERSION`: only the line
//!   `NCCL version 2.29.7 (nccl-rs)` when the first communicator is created; `WARN`: that line
//!   and warnings; `INFO`: warnings and information; `ABORT`: as `INFO`, and the first warning
//!   aborts the process (a core dump at the first sign of trouble); `TRACE`: everything.
//! - `NCCL_DEBUG_SUBSYS`: a comma list of `INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV, ALLOC,
//!   CALL, PROXY, NVLS, BOOTSTRAP, REG, PROFILE, RAS, ALL` (case-insensitive, unknown names
//!   ignored); a leading `^` selects every subsystem but the listed ones. Default
//!   `INIT,BOOTSTRAP,ENV`. Warnings print whatever their subsystem.
//! - `NCCL_DEBUG_FILE`: the file the lines go to, opened (truncated) once, at the first line;
//!   `%h` becomes the short host name, `%p` the process id, `%%` a `%`; any other `%x` stays as
//!   written. When it cannot be opened the lines go to the default, standard output (NCCL's
//!   default too), after a warning that says why.
//! - Lines: `host:pid:tid [dev] NCCL INFO msg`; warnings `host:pid:tid [dev] file:line NCCL WARN
//!   msg`; traces `host:pid:tid [dev] ms file:line NCCL TRACE msg` (ms since the logger started)
//!   and, for the CALL subsystem, `host:pid:tid NCCL CALL msg`. `host` is the host name from
//!   gethostname(2) up to its first dot, `tid` the kernel thread id.
//! - `[dev]` is the CUDA device of the logging thread: NCCL prints `cudaGetDevice`; this library
//!   keeps the ordinal the runtime last made current on the thread (`set_cuda_dev`, set where a
//!   communicator is created and where a call enters on one). A thread that never had one prints
//!   `[-1]` rather than claim a device it never used.
//!
//! A record's subsystem is its `log` target: one of this module's constants (`INIT`, `NET`, …:
//! `log::info!(target: crate::debug::NET, …)`), else the module it comes from (see
//! `subsystem_of`); records of other crates, which reach this logger only when a program
//! installed it, count as INIT.

use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, Once, OnceLock};
use std::time::Instant;

/// Explicit `log` targets, one per NCCL subsystem (`log::info!(target: debug::NET, …)`).
pub const INIT: &str = "nccl::INIT";
/// The `log` target of collective operations (`NCCL_DEBUG_SUBSYS=COLL`).
pub const COLL: &str = "nccl::COLL";
/// The `log` target of point-to-point operations (`P2P`).
pub const P2P: &str = "nccl::P2P";
/// The `log` target of the shared-memory transport (`SHM`).
pub const SHM: &str = "nccl::SHM";
/// The `log` target of the network transports (`NET`).
pub const NET: &str = "nccl::NET";
/// The `log` target of the topology search (`GRAPH`).
pub const GRAPH: &str = "nccl::GRAPH";
/// The `log` target of the tuner (`TUNING`).
pub const TUNING: &str = "nccl::TUNING";
/// The `log` target of parameter reports (`ENV`).
pub const ENV: &str = "nccl::ENV";
/// The `log` target of allocations (`ALLOC`).
pub const ALLOC: &str = "nccl::ALLOC";
/// The `log` target of API call traces (`CALL`).
pub const CALL: &str = "nccl::CALL";
/// The `log` target of the proxy threads (`PROXY`).
pub const PROXY: &str = "nccl::PROXY";
/// The `log` target of NVLink SHARP (`NVLS`).
pub const NVLS: &str = "nccl::NVLS";
/// The `log` target of the bootstrap network (`BOOTSTRAP`).
pub const BOOTSTRAP: &str = "nccl::BOOTSTRAP";
/// The `log` target of buffer registration (`REG`).
pub const REG: &str = "nccl::REG";
/// The `log` target of the profiler (`PROFILE`).
pub const PROFILE: &str = "nccl::PROFILE";
/// The `log` target of the reliability service (`RAS`).
pub const RAS: &str = "nccl::RAS";
/// Shown whatever `NCCL_DEBUG_SUBSYS` selects (when the level allows it).
pub const ALL: &str = "nccl::ALL";

/// NCCL's subsystem names and bits (the values of its `ncclDebugLogSubSys`).
const SUBSYSTEMS: &[(&str, u64)] = &[
    ("INIT", 1),
    ("COLL", 1 << 1),
    ("P2P", 1 << 2),
    ("SHM", 1 << 3),
    ("NET", 1 << 4),
    ("GRAPH", 1 << 5),
    ("TUNING", 1 << 6),
    ("ENV", 1 << 7),
    ("ALLOC", 1 << 8),
    ("CALL", 1 << 9),
    ("PROXY", 1 << 10),
    ("NVLS", 1 << 11),
    ("BOOTSTRAP", 1 << 12),
    ("REG", 1 << 13),
    ("PROFILE", 1 << 14),
    ("RAS", 1 << 15),
    ("ALL", u64::MAX),
];

fn bit(name: &str) -> u64 {
    SUBSYSTEMS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map_or(0, |&(_, b)| b)
}

/// `NCCL_DEBUG`, in NCCL's order (each level shows what the ones before it show).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    None,
    Version,
    Warn,
    Info,
    Abort,
    Trace,
}

impl Level {
    /// The level `NCCL_DEBUG` names; unset or unknown: none.
    pub(crate) fn parse(v: Option<&str>) -> Level {
        match v.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
            Some("VERSION") => Level::Version,
            Some("WARN") => Level::Warn,
            Some("INFO") => Level::Info,
            Some("ABORT") => Level::Abort,
            Some("TRACE") => Level::Trace,
            _ => Level::None,
        }
    }

    /// What a `log` record's level is in NCCL's terms (NCCL has no ERROR nor DEBUG).
    fn of_record(l: log::Level) -> Level {
        match l {
            log::Level::Error | log::Level::Warn => Level::Warn,
            log::Level::Info => Level::Info,
            log::Level::Debug | log::Level::Trace => Level::Trace,
        }
    }

    /// The `log` filter that lets through what this level prints.
    fn filter(self) -> log::LevelFilter {
        match self {
            Level::None | Level::Version => log::LevelFilter::Off,
            Level::Warn => log::LevelFilter::Warn,
            Level::Info | Level::Abort => log::LevelFilter::Info,
            Level::Trace => log::LevelFilter::Trace,
        }
    }
}

/// The subsystem mask `NCCL_DEBUG_SUBSYS` selects.
pub(crate) fn parse_subsys(v: Option<&str>) -> u64 {
    let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else {
        return bit("INIT") | bit("BOOTSTRAP") | bit("ENV");
    };
    let (invert, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let listed = list.split(',').map(|n| bit(n.trim())).fold(0, |m, b| m | b);
    if invert {
        !listed
    } else {
        listed
    }
}

/// `NCCL_DEBUG_FILE` with `%h` (host), `%p` (pid) and `%%` replaced.
pub(crate) fn expand_file_name(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The subsystem bit of a record's target: an explicit `nccl::<SUBSYS>` target, else the module it
/// was logged from (`nccl::bootstrap` BOOTSTRAP, `nccl::comm` INIT (its `register` REG, its `nvls`
/// NVLS), `nccl::enqueue::p2p` P2P, `nccl::enqueue` COLL, `nccl::transport::shm` SHM, `nccl::net`
/// and `nccl::transport::net` NET, `nccl::transport::nvls` NVLS, `nccl::transport` P2P,
/// `nccl::proxy` PROXY, `nccl::topo` and `nccl::graph` GRAPH, `nccl::tune` TUNING, `nccl::env` ENV,
/// `nccl::cuda` ALLOC, `nccl::capi` CALL), INIT for everything else.
pub(crate) fn subsystem_of(target: &str) -> u64 {
    let Some(path) = target.strip_prefix("nccl::") else {
        return bit("INIT");
    };
    let head = path.split("::").next().unwrap_or("");
    if !head.is_empty()
        && head
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    {
        let b = bit(head);
        if b != 0 {
            return b;
        }
    }
    const MODULES: &[(&str, &str)] = &[
        ("bootstrap", "BOOTSTRAP"),
        ("comm::register", "REG"),
        ("comm::nvls", "NVLS"),
        ("comm", "INIT"),
        ("enqueue::p2p", "P2P"),
        ("enqueue", "COLL"),
        ("transport::shm", "SHM"),
        ("transport::net", "NET"),
        ("net", "NET"),
        ("transport::nvls", "NVLS"),
        ("transport", "P2P"),
        ("proxy", "PROXY"),
        ("topo", "GRAPH"),
        ("graph", "GRAPH"),
        ("tune", "TUNING"),
        ("env", "ENV"),
        ("cuda", "ALLOC"),
        ("capi", "CALL"),
    ];
    let within = |m: &str| {
        path.strip_prefix(m)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    };
    MODULES
        .iter()
        .find(|(m, _)| within(m))
        .map_or(bit("INIT"), |&(_, s)| bit(s))
}

std::thread_local! {
    static CUDA_DEV: Cell<i32> = const { Cell::new(-1) };
}

/// Records `dev` as the calling thread's CUDA device for the `[dev]` field of its lines.
pub(crate) fn set_cuda_dev(dev: i32) {
    let _ = CUDA_DEV.try_with(|d| d.set(dev));
}

fn cuda_dev() -> i32 {
    CUDA_DEV.try_with(Cell::get).unwrap_or(-1)
}

crate::internal! {
    /// The calling thread's kernel id, as NCCL prints it.
    fn tid() -> i64 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::syscall(libc::SYS_gettid) }
    }
}

/// The CPU clock ticks (user + system, `/proc/self/task/*/stat`) used so far by this process's
/// threads whose names start with `prefix`, and how many such threads there are: read it twice
/// around a quiet window to see what the library's threads (`nccl-`: proxies, socket helpers,
/// bootstrap) spend while idle. A tick is `sysconf(_SC_CLK_TCK)`-th of a second; (0, 0) where
/// `/proc` cannot be read. Public for the benchmark (`nccl_bench --idle-cpu`).
pub fn thread_cpu_ticks(prefix: &str) -> (u64, usize) {
    let (mut ticks, mut threads) = (0, 0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    for t in tasks.flatten() {
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !name.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The fields after the ")" closing the name: utime is field 14 of the line, stime 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        ticks += field(11) + field(12);
        threads += 1;
    }
    (ticks, threads)
}

/// The host name up to its first dot (gethostname(2)), as NCCL prints it.
pub(crate) fn short_hostname() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: gethostname writes at most buf.len() bytes into buf.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc != 0 {
            return "localhost".into();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let name = String::from_utf8_lossy(&buf[..end]);
        name.split('.').next().unwrap_or("").to_string()
    })
}

/// Where a line comes from: the fields before `NCCL`.
pub(crate) struct Origin<'a> {
    pub host: &'a str,
    pub pid: u32,
    pub tid: i64,
    pub dev: i32,
    /// Source file and line (WARN and TRACE lines show them).
    pub at: Option<(&'a str, u32)>,
    /// Milliseconds since the logger started (TRACE lines).
    pub ms: f64,
}

/// One line in NCCL's format, newline included. `level` is Warn, Info or Trace.
pub(crate) fn format_line(level: Level, subsys: u64, o: &Origin, msg: fmt::Arguments) -> String {
    let Origin {
        host,
        pid,
        tid,
        dev,
        ..
    } = *o;
    let at = o.at.map(|(f, l)| format!("{f}:{l} ")).unwrap_or_default();
    match level {
        Level::Warn => format!("{host}:{pid}:{tid} [{dev}] {at}NCCL WARN {msg}\n"),
        Level::Trace if subsys == bit("CALL") => format!("{host}:{pid}:{tid} NCCL CALL {msg}\n"),
        Level::Trace => format!(
            "{host}:{pid}:{tid} [{dev}] {:.6} {at}NCCL TRACE {msg}\n",
            o.ms
        ),
        _ => format!("{host}:{pid}:{tid} [{dev}] NCCL INFO {msg}\n"),
    }
}

/// What the environment asks for; read once per process.
struct Settings {
    level: Level,
    mask: u64,
    file: Option<String>,
}

fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings {
        level: Level::parse(crate::env::DEBUG.raw().as_deref()),
        mask: parse_subsys(crate::env::DEBUG_SUBSYS.raw().as_deref()),
        file: crate::env::DEBUG_FILE.raw(),
    })
}

/// The destination of the lines: the file, or standard output.
enum Sink {
    Stdout,
    File(Mutex<File>),
}

struct NcclLogger {
    level: Level,
    mask: u64,
    start: Instant,
    sink: OnceLock<Sink>,
}

impl NcclLogger {
    fn passes(&self, level: Level, subsys: u64) -> bool {
        level <= self.level && (level == Level::Warn || subsys & self.mask != 0)
    }

    fn origin<'a>(&self, at: Option<(&'a str, u32)>) -> Origin<'a> {
        Origin {
            host: short_hostname(),
            pid: std::process::id(),
            tid: tid(),
            dev: cuda_dev(),
            at,
            ms: self.start.elapsed().as_secs_f64() * 1e3,
        }
    }

    /// The sink, opening `NCCL_DEBUG_FILE` at the first line.
    fn sink(&self) -> &Sink {
        self.sink.get_or_init(|| {
            let Some(pattern) = settings().file.as_deref() else {
                return Sink::Stdout;
            };
            let path = expand_file_name(pattern, short_hostname(), std::process::id());
            match open_private(&path, false) {
                Ok(f) => Sink::File(Mutex::new(f)),
                Err(e) => {
                    let line = format_line(
                        Level::Warn,
                        0,
                        &self.origin(Some((file!(), line!()))),
                        format_args!("cannot open NCCL_DEBUG_FILE {path}: {e}; logging to stdout"),
                    );
                    write_stdout(&line);
                    Sink::Stdout
                }
            }
        })
    }

    fn write(&self, line: &str) {
        match self.sink() {
            Sink::Stdout => write_stdout(line),
            Sink::File(f) => {
                let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
                let _ = f.write_all(line.as_bytes());
            }
        }
    }
}

fn write_stdout(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

impl log::Log for NcclLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        self.passes(Level::of_record(m.level()), subsystem_of(m.target()))
    }

    fn log(&self, r: &log::Record) {
        let level = Level::of_record(r.level());
        let subsys = subsystem_of(r.target());
        if !self.passes(level, subsys) {
            return;
        }
        let at = r.file().map(|f| (f, r.line().unwrap_or(0)));
        let origin = self.origin(at);
        self.write(&format_line(level, subsys, &origin, *r.args()));
        if level == Level::Warn && self.level == Level::Abort {
            let at = origin
                .at
                .map(|(f, l)| format!("{f}:{l} "))
                .unwrap_or_default();
            eprintln!(
                "\n{}:{}:{} [{}] {at}NCCL ABORT",
                origin.host, origin.pid, origin.tid, origin.dev
            );
            std::process::abort();
        }
    }

    fn flush(&self) {
        if let Some(Sink::File(f)) = self.sink.get() {
            let _ = f.lock().unwrap_or_else(|p| p.into_inner()).flush();
        }
    }
}

static LOGGER: OnceLock<NcclLogger> = OnceLock::new();
static INSTALLED: OnceLock<bool> = OnceLock::new();

crate::internal! {
    /// Makes NCCL's logger this process's `log` logger: lines in NCCL's format, filtered by
    /// `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS`, written to `NCCL_DEBUG_FILE` or standard output (see
    /// the module's documentation). It also sets `log`'s maximum level from `NCCL_DEBUG`, and
    /// records of other crates then go through it too.
    ///
    /// The library never calls it for Rust programs (it does for C programs, on their first call);
    /// call it early in `main` if you want NCCL's logs and have no logger of your own. Returns true
    /// when NCCL's logger is the process's logger (also on later calls), false when the program had
    /// already installed another one, which stays.
    fn install_logger() -> bool {
        *INSTALLED.get_or_init(|| {
            let s = settings();
            let logger = LOGGER.get_or_init(|| NcclLogger {
                level: s.level,
                mask: s.mask,
                start: Instant::now(),
                sink: OnceLock::new(),
            });
            match log::set_logger(logger) {
                Ok(()) => {
                    log::set_max_level(s.level.filter());
                    true
                }
                Err(_) => false,
            }
        })
    }
}

/// Whether NCCL's logger is the process's logger.
fn ours() -> Option<&'static NcclLogger> {
    if INSTALLED.get() == Some(&true) {
        LOGGER.get()
    } else {
        None
    }
}

/// Called when a communicator is created: reads the settings (once per process) and says the
/// version once, as NCCL does: a bare line at `NCCL_DEBUG=VERSION` or `WARN`, an INFO line
/// above. Under another logger it is an info record of target [`ALL`].
pub(crate) fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let line = format!("NCCL version {} (nccl-rs)", crate::VERSION_STRING);
        match ours() {
            Some(l) if matches!(l.level, Level::Version | Level::Warn) => {
                l.write(&format!("{line}\n"))
            }
            Some(l) if l.level == Level::None => {}
            _ => log::info!(target: ALL, "{line}"),
        }
    });
}

/// Opens a file the library writes for the user (`NCCL_DEBUG_FILE`, the proxy timeline,
/// kernel stamps): created readable by this user only (0600), and never through a symbolic
/// link (another user could point a predictable name at a file of ours). `append`: added to
/// the end, else truncated.
pub(crate) fn open_private(path: &str, append: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private file is 0600 and a symbolic link in its place is refused.
    #[test]
    fn private_files_are_this_user_s_and_follow_no_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nccl-rs-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("log");
        let _ = std::fs::remove_file(&file);
        open_private(file.to_str().unwrap(), false).unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = open_private(link.to_str().unwrap(), true).expect_err("through a link");
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn b(names: &[&str]) -> u64 {
        names.iter().map(|n| bit(n)).fold(0, |m, x| m | x)
    }

    #[test]
    fn levels() {
        assert_eq!(Level::parse(None), Level::None);
        assert_eq!(Level::parse(Some("info")), Level::Info);
        assert_eq!(Level::parse(Some(" Trace ")), Level::Trace);
        assert_eq!(Level::parse(Some("VERSION")), Level::Version);
        assert_eq!(Level::parse(Some("abort")), Level::Abort);
        assert_eq!(Level::parse(Some("loud")), Level::None);
        assert_eq!(Level::Abort.filter(), log::LevelFilter::Info);
        assert_eq!(Level::Version.filter(), log::LevelFilter::Off);
        assert_eq!(Level::of_record(log::Level::Error), Level::Warn);
        assert_eq!(Level::of_record(log::Level::Debug), Level::Trace);
    }

    #[test]
    fn subsystem_lists() {
        assert_eq!(parse_subsys(None), b(&["INIT", "BOOTSTRAP", "ENV"]));
        assert_eq!(parse_subsys(Some("")), parse_subsys(None));
        assert_eq!(parse_subsys(Some("INIT,NET")), b(&["INIT", "NET"]));
        assert_eq!(parse_subsys(Some(" coll , p2p ")), b(&["COLL", "P2P"]));
        assert_eq!(parse_subsys(Some("NET,BOGUS")), b(&["NET"]));
        assert_eq!(parse_subsys(Some("ALL")), u64::MAX);
        let not_env_graph = parse_subsys(Some("^ENV,GRAPH"));
        assert_eq!(not_env_graph & b(&["ENV", "GRAPH"]), 0);
        for s in ["INIT", "COLL", "P2P", "NET", "TUNING", "RAS", "BOOTSTRAP"] {
            assert_ne!(not_env_graph & bit(s), 0, "{s}");
        }
        assert_eq!(parse_subsys(Some("^ALL")), 0);
        assert_eq!(parse_subsys(Some("^")), u64::MAX);
    }

    #[test]
    fn file_names() {
        let f = |p| expand_file_name(p, "node7", 4242);
        assert_eq!(f("/tmp/nccl.%h.%p.log"), "/tmp/nccl.node7.4242.log");
        assert_eq!(f("%p-%p"), "4242-4242");
        assert_eq!(f("100%%.%h"), "100%.node7");
        assert_eq!(f("a%xb"), "a%xb");
        assert_eq!(f("end%"), "end%");
        assert_eq!(f("plain"), "plain");
    }

    #[test]
    fn targets_to_subsystems() {
        let s = subsystem_of;
        assert_eq!(s(NET), bit("NET"));
        assert_eq!(s(RAS), bit("RAS"));
        assert_eq!(s(ALL), u64::MAX);
        assert_eq!(s("nccl::bootstrap::socket"), bit("BOOTSTRAP"));
        assert_eq!(s("nccl::comm"), bit("INIT"));
        assert_eq!(s("nccl::comm::split"), bit("INIT"));
        assert_eq!(s("nccl::comm::register"), bit("REG"));
        assert_eq!(s("nccl::comm::nvls"), bit("NVLS"));
        assert_eq!(s("nccl::enqueue::p2p"), bit("P2P"));
        assert_eq!(s("nccl::enqueue::group"), bit("COLL"));
        assert_eq!(s("nccl::enqueue"), bit("COLL"));
        assert_eq!(s("nccl::transport::shm"), bit("SHM"));
        assert_eq!(s("nccl::net::socket"), bit("NET"));
        assert_eq!(s("nccl::transport::net"), bit("NET"));
        assert_eq!(s("nccl::transport::links"), bit("P2P"));
        assert_eq!(s("nccl::proxy"), bit("PROXY"));
        assert_eq!(s("nccl::topo::detect"), bit("GRAPH"));
        assert_eq!(s("nccl::graph"), bit("GRAPH"));
        assert_eq!(s("nccl::tune::plugin"), bit("TUNING"));
        assert_eq!(s("nccl::env"), bit("ENV"));
        assert_eq!(s("nccl::cuda::sim"), bit("ALLOC"));
        assert_eq!(s("nccl::capi"), bit("CALL"));
        assert_eq!(s("nccl::debug"), bit("INIT"));
        // A module whose name only starts like one of the table's is not that module.
        assert_eq!(s("nccl::environment"), bit("INIT"));
        assert_eq!(s("nccl::BOGUS"), bit("INIT"));
        assert_eq!(s("my_app::net"), bit("INIT"));
        assert_eq!(s("nccl"), bit("INIT"));
    }

    #[test]
    fn filtering() {
        let l = NcclLogger {
            level: Level::Info,
            mask: parse_subsys(Some("^GRAPH")),
            start: Instant::now(),
            sink: OnceLock::new(),
        };
        assert!(l.passes(Level::Info, bit("NET")));
        assert!(!l.passes(Level::Info, bit("GRAPH")));
        assert!(
            l.passes(Level::Warn, bit("GRAPH")),
            "warnings ignore the subsystems"
        );
        assert!(!l.passes(Level::Trace, bit("NET")));
        let abort = NcclLogger {
            level: Level::Abort,
            ..l
        };
        assert!(abort.passes(Level::Info, bit("INIT")));
        assert!(!abort.passes(Level::Trace, bit("INIT")));
    }

    #[test]
    fn line_format() {
        let o = Origin {
            host: "node7",
            pid: 12,
            tid: 34,
            dev: 3,
            at: Some(("host/comm/mod.rs", 56)),
            ms: 1.5,
        };
        let msg = "hello";
        assert_eq!(
            format_line(Level::Info, bit("INIT"), &o, format_args!("{msg}")),
            "node7:12:34 [3] NCCL INFO hello\n"
        );
        assert_eq!(
            format_line(Level::Warn, bit("NET"), &o, format_args!("{msg}")),
            "node7:12:34 [3] host/comm/mod.rs:56 NCCL WARN hello\n"
        );
        assert_eq!(
            format_line(Level::Trace, bit("COLL"), &o, format_args!("{msg}")),
            "node7:12:34 [3] 1.500000 host/comm/mod.rs:56 NCCL TRACE hello\n"
        );
        assert_eq!(
            format_line(Level::Trace, bit("CALL"), &o, format_args!("{msg}")),
            "node7:12:34 NCCL CALL hello\n"
        );
        let nowhere = Origin {
            at: None,
            dev: -1,
            ..o
        };
        assert_eq!(
            format_line(Level::Warn, 0, &nowhere, format_args!("{msg}")),
            "node7:12:34 [-1] NCCL WARN hello\n"
        );
    }

    #[test]
    fn thread_ticks_count_the_named_threads_only() {
        let (stop, started) = (
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
            std::sync::Arc::new(std::sync::Barrier::new(3)),
        );
        let spawn = |name: &str| {
            let (stop, started) = (stop.clone(), started.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    started.wait();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                })
                .unwrap()
        };
        let threads = [spawn("tick-probe-a"), spawn("tick-probe-b")];
        started.wait();
        assert_eq!(thread_cpu_ticks("tick-probe-").1, 2);
        assert_eq!(thread_cpu_ticks("tick-probe-a").1, 1);
        assert_eq!(thread_cpu_ticks("no-such-thread-name").1, 0);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        // A joined thread's task may linger a moment in /proc: give it a bounded while.
        let t0 = std::time::Instant::now();
        while thread_cpu_ticks("tick-probe-").1 > 0 && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(thread_cpu_ticks("tick-probe-").1, 0);
    }

    #[test]
    fn cuda_dev_is_per_thread() {
        set_cuda_dev(5);
        assert_eq!(cuda_dev(), 5);
        assert_eq!(std::thread::spawn(cuda_dev).join().unwrap(), -1);
    }

    #[test]
    fn hostname_is_short() {
        let h = short_hostname();
        assert!(!h.is_empty() && !h.contains('.'), "{h}");
    }
}
