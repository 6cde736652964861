//! Endpoints: connecting to a peer (by socket address, by worker address, or by accepting a
//! connection request), closing, and their failure callback.
use std::any::Any;
use std::ffi::c_void;
use std::net::SocketAddr;
use std::ptr;
use std::rc::{Rc, Weak};

use crate::status::{check, ptr_status, Error, PtrStatus, Result};
use crate::sys;

use super::base::{send_cb, OpCtx, Queue, Worker};
use super::events::{ConnRequest, EpId, Event};
use super::sockaddr::sockaddr_to_storage;

/// Argument of an endpoint's error callback.
pub(super) struct EpArg {
    pub(super) queue: *const Queue,
    pub(super) id: EpId,
}

impl Worker {
    /// Accept a connection request on this worker.
    pub fn accept(&mut self, mut req: ConnRequest) -> Result<Endpoint> {
        let h = std::mem::replace(&mut req.h, ptr::null_mut());
        let mut params = sys::ucp_ep_params_t {
            field_mask: sys::UCP_EP_PARAM_FIELD_CONN_REQUEST as u64,
            conn_request: h,
            ..Default::default()
        };
        self.create_ep(&mut params, true)
    }

    /// Connect to a listener at `addr` (client side of [`Worker::listen`]).
    pub fn connect_sockaddr(&mut self, addr: SocketAddr) -> Result<Endpoint> {
        let (storage, len) = sockaddr_to_storage(addr);
        let mut params = sys::ucp_ep_params_t {
            field_mask: (sys::UCP_EP_PARAM_FIELD_SOCK_ADDR | sys::UCP_EP_PARAM_FIELD_FLAGS) as u64,
            flags: sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
            sockaddr: sys::ucs_sock_addr_t {
                addr: &storage as *const libc::sockaddr_storage as *const sys::sockaddr,
                addrlen: len,
            },
            ..Default::default()
        };
        self.create_ep(&mut params, true)
    }

    /// Connect to a worker by its address (from [`Worker::address`]).
    ///
    /// UCX parses an address without being told its length and aborts the process (an
    /// always-on assertion) on a header it does not know, so an address that comes off the
    /// network is checked first: long enough for a header and a worker id, and of an
    /// address format UCX parses. What lies beyond the header is UCX's to trust (as it
    /// trusts the addresses inside its own wire-up messages); the copy it reads is padded,
    /// so a truncated address is read as zeros rather than past the end.
    pub fn connect_address(&mut self, address: &[u8]) -> Result<Endpoint> {
        if !plausible_worker_address(address) {
            return Err(Error::invalid_param());
        }
        let mut padded = Vec::with_capacity(address.len() + ADDRESS_PAD);
        padded.extend_from_slice(address);
        padded.resize(address.len() + ADDRESS_PAD, 0);
        let mut params = sys::ucp_ep_params_t {
            field_mask: sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as u64,
            address: padded.as_ptr() as *const sys::ucp_address_t,
            ..Default::default()
        };
        let peer = self.peer_errors;
        // UCX copies what it needs from the address during the call.
        self.create_ep(&mut params, peer)
    }

    /// Create an endpoint; with `peer_errors`, with peer error handling and our error
    /// callback.
    fn create_ep(
        &mut self,
        params: &mut sys::ucp_ep_params_t,
        peer_errors: bool,
    ) -> Result<Endpoint> {
        let id = self.next_ep;
        self.next_ep += 1;
        let arg = Box::new(EpArg {
            queue: &*self.queue,
            id,
        });
        params.field_mask |= sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE as u64;
        if peer_errors {
            params.field_mask |= sys::UCP_EP_PARAM_FIELD_ERR_HANDLER as u64;
            params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
            params.err_handler = sys::ucp_err_handler_t {
                cb: Some(ep_error_cb),
                arg: &*arg as *const EpArg as *mut c_void,
            };
        } else {
            params.err_mode = sys::UCP_ERR_HANDLING_MODE_NONE;
        }
        let mut h: sys::ucp_ep_h = ptr::null_mut();
        let w = self.h;
        let mut create = || {
            // SAFETY: the worker is live; params is initialised for every field in
            // field_mask (the caller's sockaddr/address/conn_request outlive this call and
            // UCX copies them); the error callback's arg is a Box that the Endpoint owns
            // and that outlives the UCX endpoint (on close it moves into the close
            // request's state).
            check(unsafe { sys::ucp_ep_create(w, params, &mut h) })
        };
        if peer_errors {
            // On transports that cannot report a peer's failure UCX refuses this mode with
            // an ERROR line the caller expects (it falls back): not logged.
            crate::ucx_log::trying_peer_mode(create)?;
        } else {
            create()?;
        }
        Ok(Endpoint {
            h,
            id,
            arg: Some(arg),
            rkeys: Vec::new(),
            mapped: Vec::new(),
            peer: peer_errors,
            alive: Rc::downgrade(&self.alive),
        })
    }

    /// Close an endpoint. `force`: drop everything in flight at once, completing it with
    /// an error (peer failed) — UCX allows that only for endpoints with peer-failure
    /// handling, others are flushed. Completion is internal; the worker waits for
    /// outstanding closes before it is destroyed.
    pub fn close(&mut self, mut ep: Endpoint, force: bool) {
        let force = force && ep.peer;
        ep.destroy_rkeys();
        let op = Box::new(OpCtx {
            queue: &*self.queue,
            token: 0,
            report: false,
            _header: Vec::new(),
            _iov: Vec::new(),
            buf: Some(Box::new(Rc::clone(&self.closing))),
            _keep: ep.arg.take().map(|a| a as Box<dyn Any>),
        });
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_FLAGS,
            flags: if force {
                sys::UCP_EP_CLOSE_FLAG_FORCE
            } else {
                0
            },
            cb: sys::ucp_request_param_t__bindgen_ty_1 {
                send: Some(send_cb),
            },
            user_data: Box::into_raw(op) as *mut c_void,
            ..Default::default()
        };
        let user_data = param.user_data;
        let h = std::mem::replace(&mut ep.h, ptr::null_mut());
        // SAFETY: h is a live endpoint of this worker, closed exactly once (ep.h is nulled
        // so Endpoint's Drop does nothing); param's callback frees user_data.
        let st = ptr_status(unsafe { sys::ucp_ep_close_nbx(h, &param) });
        match st {
            PtrStatus::Pending(req) => self.closing.borrow_mut().push(req as usize),
            PtrStatus::Done | PtrStatus::Failed(_) => {
                // SAFETY: the request completed inline, so the callback will not run and
                // user_data (from Box::into_raw above) is still ours to free.
                drop(unsafe { Box::from_raw(user_data as *mut OpCtx) });
            }
        }
    }
}

/// Zero bytes after a worker address handed to UCX (see [`Worker::connect_address`]).
pub(super) const ADDRESS_PAD: usize = 256;

/// Whether `a` could be a UCX worker address: a header byte whose low four bits name an
/// address format UCX 1.13 parses (0 = v1, 1 = v2; anything else trips an assertion that
/// aborts the process), then at least the 64-bit worker id.
pub(super) fn plausible_worker_address(a: &[u8]) -> bool {
    const MIN_LEN: usize = 2 + 8;
    a.len() >= MIN_LEN && (a[0] & 0x0f) <= 1
}

/// A connection to a peer worker. Close it with [`Worker::close`]; dropping it without
/// closing force-closes it and leaks the callback state until the process exits.
pub struct Endpoint {
    pub(super) h: sys::ucp_ep_h,
    pub(super) id: EpId,
    pub(super) arg: Option<Box<EpArg>>,
    pub(super) rkeys: Vec<sys::ucp_rkey_h>,
    /// Peer regions mapped into this process (`map_region`), valid while `rkeys` are.
    pub(super) mapped: Vec<Mapped>,
    /// Created with peer-failure handling (UCX allows a force close only then).
    pub(super) peer: bool,
    /// Shared with the worker: an endpoint dropped after its worker has nothing to close
    /// (UCX destroyed it with the worker).
    pub(super) alive: Weak<()>,
}

/// A peer's region as mapped into this process by UCX (`ucp_rkey_ptr`).
pub(super) struct Mapped {
    pub(super) rkey: usize,
    pub(super) base: u64,
    pub(super) len: usize,
    pub(super) ptr: *const u8,
}

impl Endpoint {
    pub fn id(&self) -> EpId {
        self.id
    }

    /// Whether UCX handles peer failure on this endpoint (see `Worker::set_peer_errors`).
    pub fn peer_errors(&self) -> bool {
        self.peer
    }

    /// UCX's own description of this endpoint's lanes and the transports they use
    /// (`ucp_ep_print_info`), e.g. to tell whether RMA is native or emulated.
    pub fn describe(&self) -> String {
        let mut buf: *mut libc::c_char = ptr::null_mut();
        let mut size: libc::size_t = 0;
        // SAFETY: buf/size are out-pointers that stay valid until fclose below.
        let f = unsafe { libc::open_memstream(&mut buf, &mut size) };
        if f.is_null() {
            return String::new();
        }
        // SAFETY: h is a live endpoint; f is an open stream (the C FILE type bindgen
        // names sys::FILE is the same struct as libc's).
        unsafe { sys::ucp_ep_print_info(self.h, f as *mut sys::FILE) };
        // SAFETY: f is open; closing it finalises buf/size. Closed exactly once.
        unsafe { libc::fclose(f) };
        if buf.is_null() {
            return String::new();
        }
        // SAFETY: after fclose, buf holds `size` bytes allocated with malloc by the
        // stream; copied out, then freed exactly once.
        let text = unsafe { std::slice::from_raw_parts(buf as *const u8, size) };
        let out = String::from_utf8_lossy(text).into_owned();
        // SAFETY: buf came from open_memstream's malloc and is not used after this.
        unsafe { libc::free(buf as *mut c_void) };
        out
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if self.h.is_null() || self.alive.strong_count() == 0 {
            // Closed already, or the worker (and with it this endpoint) is gone.
            if let Some(a) = self.arg.take() {
                std::mem::forget(a);
            }
            return;
        }
        self.destroy_rkeys();
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
            flags: if self.peer {
                sys::UCP_EP_CLOSE_FLAG_FORCE
            } else {
                0
            },
            ..Default::default()
        };
        // SAFETY: h is a live endpoint not yet closed (Worker::close nulls it).
        let st = ptr_status(unsafe { sys::ucp_ep_close_nbx(self.h, &param) });
        if let PtrStatus::Pending(req) = st {
            // SAFETY: req is the in-flight close request UCX returned; ucp_request_free on
            // an incomplete request lets UCX release it when it completes.
            unsafe { sys::ucp_request_free(req) };
        }
        // The error callback may still fire during the force close: its argument must
        // outlive the endpoint, so it is leaked deliberately (a few bytes, only on this
        // unusual path).
        if let Some(a) = self.arg.take() {
            std::mem::forget(a);
        }
    }
}

pub(super) unsafe extern "C" fn ep_error_cb(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: arg is the endpoint's EpArg, kept alive until its close completes (or leaked).
    let a = unsafe { &*(arg as *const EpArg) };
    // SAFETY: the queue belongs to the live worker whose progress is calling us.
    unsafe { &*a.queue }.push(Event::EpFailed {
        ep: a.id,
        error: Error::from_status(status),
    });
}
