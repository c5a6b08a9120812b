//! The one error type of the runtime (rule 4 of docs/architecture.md): each variant is one `ncclResult_t`, and
//! every error carries the message that `ncclGetLastError` returns.

use std::fmt;
use std::sync::{Arc, Mutex};

/// `ncclResult_t`, value for value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NcclResult {
    /// `ncclSuccess`.
    Success = 0,
    /// `ncclUnhandledCudaError`: a CUDA call failed.
    UnhandledCudaError = 1,
    /// `ncclSystemError`: a system call failed (memory, sockets, threads).
    SystemError = 2,
    /// `ncclInternalError`: a bug in this library, or a peer that broke the protocol.
    InternalError = 3,
    /// `ncclInvalidArgument`: a bad argument (a null or too short buffer, a rank out of range, ...).
    InvalidArgument = 4,
    /// `ncclInvalidUsage`: a call made when it may not be (after finalize, inside a capture, ...).
    InvalidUsage = 5,
    /// `ncclRemoteError`: a peer failed or went away.
    RemoteError = 6,
    /// `ncclInProgress`: a non-blocking operation is still running.
    InProgress = 7,
}

impl NcclResult {
    /// The fixed string `ncclGetErrorString` returns for this code.
    pub fn as_str(self) -> &'static str {
        match self {
            NcclResult::Success => "no error",
            NcclResult::UnhandledCudaError => {
                "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
            }
            NcclResult::SystemError => {
                "unhandled system error (run with NCCL_DEBUG=INFO for details)"
            }
            NcclResult::InternalError => {
                "internal error - please report this issue to the nccl-rs developers"
            }
            NcclResult::InvalidArgument => {
                "invalid argument (run with NCCL_DEBUG=WARN for details)"
            }
            NcclResult::InvalidUsage => "invalid usage (run with NCCL_DEBUG=WARN for details)",
            NcclResult::RemoteError => "remote process exited or there was a network error",
            NcclResult::InProgress => "NCCL operation in progress",
        }
    }
}

/// An error: its `ncclResult_t`, a message saying what went wrong, and the error underneath
/// where there is one (an I/O error: [`std::error::Error::source`]).
#[derive(Clone, Debug)]
pub struct Error {
    /// The `ncclResult_t` it maps to.
    pub code: NcclResult,
    /// What went wrong (what `ncclGetLastError` returns).
    pub message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

/// Errors are equal when their code and message are (the source is what the message says).
impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl Eq for Error {}

/// A result whose error is an [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

impl Error {
    /// An error of `code` saying `message`.
    pub fn new(code: NcclResult, message: impl Into<String>) -> Error {
        let message = message.into();
        log::warn!("{message}");
        if let Ok(mut last) = LAST_ERROR.lock() {
            last.clone_from(&message);
        }
        Error {
            code,
            message,
            source: None,
        }
    }
    /// An error the library caused on purpose where it arises (a request withdrawn at
    /// teardown): neither logged nor kept as the last error.
    pub(crate) fn quiet(code: NcclResult, what: impl Into<String>) -> Error {
        Error {
            code,
            message: what.into(),
            source: None,
        }
    }
    /// An `InProgress` answer: not a failure, so neither logged nor kept as the last error.
    pub(crate) fn in_progress(what: impl Into<String>) -> Error {
        Error {
            code: NcclResult::InProgress,
            message: what.into(),
            source: None,
        }
    }
    /// The same error, with `source` as the error underneath it.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        self.source = Some(Arc::new(source));
        self
    }
    /// `ncclUnhandledCudaError`.
    pub fn cuda(message: impl Into<String>) -> Error {
        Error::new(NcclResult::UnhandledCudaError, message)
    }
    /// `ncclSystemError`.
    pub fn system(message: impl Into<String>) -> Error {
        Error::new(NcclResult::SystemError, message)
    }
    /// `ncclInternalError`.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(NcclResult::InternalError, message)
    }
    /// `ncclInvalidArgument`.
    pub fn invalid_argument(message: impl Into<String>) -> Error {
        Error::new(NcclResult::InvalidArgument, message)
    }
    /// `ncclInvalidUsage`.
    pub fn invalid_usage(message: impl Into<String>) -> Error {
        Error::new(NcclResult::InvalidUsage, message)
    }
    /// `ncclRemoteError`.
    pub fn remote(message: impl Into<String>) -> Error {
        Error::new(NcclResult::RemoteError, message)
    }
    /// Adds what was being done when the error happened, keeping the code.
    pub fn context(self, what: impl fmt::Display) -> Error {
        Error {
            source: self.source,
            ..Error::new(self.code, format!("{what}: {}", self.message))
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::system(format!("system call failed: {e}")).with_source(e)
    }
}

/// The message of the last error raised in this process (`ncclGetLastError`).
pub fn last_error() -> String {
    LAST_ERROR.lock().map(|s| s.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_nccl_result_t() {
        assert_eq!(NcclResult::InvalidArgument as i32, 4);
        assert_eq!(NcclResult::InProgress as i32, 7);
        let e = Error::invalid_usage("rank 9 out of range");
        assert_eq!(e.code, NcclResult::InvalidUsage);
        assert!(last_error().contains("rank 9") || !last_error().is_empty());
        assert!(e
            .context("ncclCommInitRank")
            .message
            .starts_with("ncclCommInitRank: "));
    }

    #[test]
    fn an_io_error_stays_the_source_through_context() {
        use std::error::Error as _;
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "peer reset");
        let e = Error::from(io).context("rank 1: recv from rank 0");
        assert_eq!(e.code, NcclResult::SystemError);
        let src = e.source().expect("the io::Error underneath");
        let io = src.downcast_ref::<std::io::Error>().expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        assert!(Error::internal("no source").source().is_none());
        assert_eq!(e.clone(), e, "equal by code and message");
    }
}
