//! UCX status codes as a Rust error.
use std::ffi::CStr;
use std::fmt;

use crate::sys;

/// A UCX error status (always negative), or one of our own (`Protocol`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Error {
    status: sys::ucs_status_t,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn from_status(status: sys::ucs_status_t) -> Error {
        Error { status }
    }

    /// The raw `ucs_status_t`.
    pub fn status(&self) -> i8 {
        self.status
    }

    /// A peer or link failure: the endpoint is unusable.
    pub fn is_peer_failure(&self) -> bool {
        (sys::UCS_ERR_LAST_ENDPOINT_FAILURE..=sys::UCS_ERR_ENDPOINT_TIMEOUT).contains(&self.status)
            || self.status == sys::UCS_ERR_CONNECTION_RESET
            || self.status == sys::UCS_ERR_UNREACHABLE
            || self.status == sys::UCS_ERR_CANCELED
    }

    pub(crate) fn invalid_param() -> Error {
        Error::from_status(sys::UCS_ERR_INVALID_PARAM)
    }
}

/// `Ok(())` for `UCS_OK`, the error otherwise (`UCS_INPROGRESS` is not expected here).
pub(crate) fn check(status: sys::ucs_status_t) -> Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(Error::from_status(status))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: ucs_status_string accepts any status value and returns a pointer to a
        // static NUL-terminated string ("Unknown error" for values it does not know).
        let s = unsafe { CStr::from_ptr(sys::ucs_status_string(self.status)) };
        write!(f, "{} ({})", s.to_string_lossy(), self.status)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

/// What a `*_nbx` call returned: done now, failed now, or a request still in flight.
pub(crate) enum PtrStatus {
    Done,
    Failed(Error),
    Pending(*mut std::ffi::c_void),
}

/// Decode a `ucs_status_ptr_t` as the `UCS_PTR_IS_ERR` / `UCS_PTR_IS_PTR` macros do.
pub(crate) fn ptr_status(p: sys::ucs_status_ptr_t) -> PtrStatus {
    let v = p as usize;
    if v == 0 {
        PtrStatus::Done
    } else if v >= (sys::UCS_ERR_LAST as isize) as usize {
        PtrStatus::Failed(Error::from_status(v as isize as sys::ucs_status_t))
    } else {
        PtrStatus::Pending(p)
    }
}
