//! UCX's own log messages: to standard error, never standard output, with the bytes of
//! the message escaped (UCX may quote what a peer sent, such as parts of a worker address).
//!
//! UCX prints to standard output unless `UCX_LOG_FILE` says otherwise, and it reads that
//! variable when the library is loaded, before `main`: too late to set it from the
//! program. So the crate pushes its own log handler (`ucs_log_push_handler`, libucs) the
//! first time a [`crate::Context`] is made. UCX still decides what to log
//! (`UCX_LOG_LEVEL`); the handler only decides where it goes: to `tracing` (target `ucx`)
//! when the program set a subscriber, else straight to standard error.
//!
//! One message is expected and dropped: creating an endpoint in peer-failure mode to a
//! peer reachable only by transports that cannot report a failure (UCX 1.13's shared
//! memory) fails with an `ERROR ... no peer failure handler` line. memfabric tries that
//! mode first and falls back (see `Worker::set_peer_errors`), so on one host the line
//! would come with every connection. It is dropped only while such an attempt is under
//! way on the calling thread.
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Once;

thread_local! {
    /// An endpoint is being created in peer-failure mode on this thread.
    static TRYING_PEER_MODE: Cell<bool> = const { Cell::new(false) };
}

static INSTALL: Once = Once::new();
/// What the expected refusal says (select.c, UCX 1.13).
const EXPECTED: &[u8] = b"no peer failure handler";

/// Run `f` while a refusal of peer-failure mode is expected on this thread.
pub(crate) fn trying_peer_mode<T>(f: impl FnOnce() -> T) -> T {
    TRYING_PEER_MODE.with(|t| t.set(true));
    let r = f();
    TRYING_PEER_MODE.with(|t| t.set(false));
    r
}

// ucs_log_level_t (ucs/config/types.h).
const LEVEL_FATAL: c_int = 0;
const LEVEL_ERROR: c_int = 1;
const LEVEL_WARN: c_int = 2;
const LEVEL_DIAG: c_int = 3;
const LEVEL_INFO: c_int = 4;
// ucs_log_func_rc_t (ucs/debug/log_def.h).
const RC_STOP: c_int = 0;

/// The handler's C type. `va_list` as a parameter is passed as a pointer on the
/// platforms this is built for (x86-64: the array decays; AArch64: a large struct is
/// passed by reference), and is only handed on to `vsnprintf`.
type LogFn = unsafe extern "C" fn(
    file: *const c_char,
    line: c_uint,
    function: *const c_char,
    level: c_int,
    comp_conf: *const c_void,
    format: *const c_char,
    ap: *mut c_void,
) -> c_int;

extern "C" {
    fn ucs_log_push_handler(handler: LogFn);
    fn vsnprintf(buf: *mut c_char, size: usize, format: *const c_char, ap: *mut c_void) -> c_int;
}

/// Route UCX's log to standard error (or `tracing`), once per process.
pub(crate) fn install() {
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        // SAFETY: `handler` has the C signature UCX calls (see LogFn) and stays valid for
        // the life of the process; pushing a handler is how libucs is meant to be told.
        INSTALL.call_once(|| unsafe { ucs_log_push_handler(handler) });
    }
}

/// Printable ASCII kept; everything else (control characters, ANSI escapes, non-ASCII
/// bytes) as `\xNN`.
pub fn escape(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

unsafe extern "C" fn handler(
    file: *const c_char,
    line: c_uint,
    _function: *const c_char,
    level: c_int,
    _comp_conf: *const c_void,
    format: *const c_char,
    ap: *mut c_void,
) -> c_int {
    let mut buf = [0u8; 2048];
    // SAFETY: format and ap are the message's format and arguments as UCX passes them,
    // consumed once here; vsnprintf writes at most buf.len() bytes, NUL-terminated.
    let n = unsafe { vsnprintf(buf.as_mut_ptr() as *mut c_char, buf.len(), format, ap) };
    if n < 0 {
        return RC_STOP;
    }
    let len = (n as usize).min(buf.len() - 1);
    let msg = &buf[..len];
    let file = if file.is_null() {
        "?".into()
    } else {
        // SAFETY: UCX passes its source file name, a NUL-terminated literal.
        unsafe { CStr::from_ptr(file) }.to_string_lossy()
    };
    let expected = level == LEVEL_ERROR
        && TRYING_PEER_MODE.with(|t| t.get())
        && msg.windows(EXPECTED.len()).any(|w| w == EXPECTED);
    if expected {
        return RC_STOP;
    }
    let text = format!("{file}:{line} {}", escape(msg));
    if tracing::dispatcher::has_been_set() {
        match level {
            LEVEL_FATAL | LEVEL_ERROR => tracing::error!(target: "ucx", "{text}"),
            LEVEL_WARN => tracing::warn!(target: "ucx", "{text}"),
            LEVEL_DIAG | LEVEL_INFO => tracing::info!(target: "ucx", "{text}"),
            _ => tracing::debug!(target: "ucx", "{text}"),
        }
    } else {
        let name = match level {
            LEVEL_FATAL => "FATAL",
            LEVEL_ERROR => "ERROR",
            LEVEL_WARN => "WARN",
            LEVEL_DIAG => "DIAG",
            LEVEL_INFO => "INFO",
            _ => "DEBUG",
        };
        eprintln!("UCX {name} {text}");
    }
    RC_STOP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_keeps_printable_ascii_and_escapes_the_rest() {
        assert_eq!(escape(b"plain text: 42"), "plain text: 42");
        assert_eq!(escape(b"\x1b[31mred\xff\n"), "\\x1b[31mred\\xff\\n");
    }
}
