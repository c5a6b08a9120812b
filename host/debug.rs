//! NCCL_DEBUG (VERSION, WARN, INFO, TRACE) mapped onto `log` through `env_logger`, set up once
//! by the first communicator; a program that installed its own logger keeps it.

use std::sync::Once;

pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let level = match crate::env::raw("NCCL_DEBUG")
            .map(|v| v.to_ascii_uppercase())
            .as_deref()
        {
            Some("TRACE") => log::LevelFilter::Trace,
            Some("INFO") => log::LevelFilter::Info,
            Some("WARN") => log::LevelFilter::Warn,
            Some("VERSION") => {
                eprintln!("NCCL version {} (nccl-rs)", crate::VERSION_STRING);
                log::LevelFilter::Error
            }
            _ => log::LevelFilter::Error,
        };
        let _ = env_logger::Builder::new()
            .filter_level(level)
            .format(|buf, rec| {
                use std::io::Write;
                let host = std::env::var("HOSTNAME").unwrap_or_default();
                writeln!(
                    buf,
                    "{host}:{}:{} NCCL {} {}",
                    std::process::id(),
                    crate::debug::tid(),
                    rec.level(),
                    rec.args()
                )
            })
            .try_init();
    });
}

/// The calling thread's kernel id, as NCCL prints it.
pub fn tid() -> i64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) }
}
