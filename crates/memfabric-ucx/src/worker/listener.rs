//! Listeners: a socket address that accepts connections, and the callback that queues each
//! request as an `Event::ConnRequest`.
use std::ffi::c_void;
use std::net::SocketAddr;
use std::ptr;
use std::rc::{Rc, Weak};

use crate::status::{check, Error, Result};
use crate::sys;

use super::base::{Queue, Worker};
use super::events::{ConnRequest, Event};
use super::sockaddr::{sockaddr_from_storage, sockaddr_to_storage};

/// Argument of a listener's connection callback.
pub(super) struct ListenerArg {
    pub(super) queue: *const Queue,
    pub(super) listener: sys::ucp_listener_h,
    pub(super) alive: Weak<()>,
}

impl Worker {
    /// Listen on `addr` (port 0 picks one); connection requests arrive as events.
    pub fn listen(&mut self, addr: SocketAddr) -> Result<Listener> {
        let (storage, len) = sockaddr_to_storage(addr);
        let mut arg = Box::new(ListenerArg {
            queue: &*self.queue,
            listener: ptr::null_mut(),
            alive: Rc::downgrade(&self.alive),
        });
        let params = sys::ucp_listener_params_t {
            field_mask: (sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR
                | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER) as u64,
            sockaddr: sys::ucs_sock_addr_t {
                addr: &storage as *const libc::sockaddr_storage as *const sys::sockaddr,
                addrlen: len,
            },
            conn_handler: sys::ucp_listener_conn_handler_t {
                cb: Some(conn_request_cb),
                arg: &mut *arg as *mut ListenerArg as *mut c_void,
            },
            ..Default::default()
        };
        let mut h: sys::ucp_listener_h = ptr::null_mut();
        // SAFETY: h (worker) is live; the sockaddr points at `storage`, alive for the call
        // (UCX copies it); the callback arg is a Box owned by the returned Listener, which
        // destroys the UCX listener before dropping it.
        check(unsafe { sys::ucp_listener_create(self.h, &params, &mut h) })?;
        arg.listener = h;
        Ok(Listener { h, arg })
    }
}

/// A listening socket address (server side of the connection establishment).
pub struct Listener {
    pub(super) h: sys::ucp_listener_h,
    pub(super) arg: Box<ListenerArg>,
}

impl Listener {
    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        let mut attr = sys::ucp_listener_attr_t {
            field_mask: sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR as u64,
            ..Default::default()
        };
        // SAFETY: h is a live listener; attr is a valid out-structure.
        check(unsafe { sys::ucp_listener_query(self.h, &mut attr) })?;
        sockaddr_from_storage(&attr.sockaddr as *const _ as *const libc::sockaddr_storage)
            .ok_or_else(Error::invalid_param)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if self.arg.alive.strong_count() == 0 {
            return; // destroyed with its worker
        }
        // SAFETY: h came from ucp_listener_create and is destroyed once, on the worker's
        // thread (Listener is !Send through its raw pointer).
        unsafe { sys::ucp_listener_destroy(self.h) };
    }
}

pub(super) unsafe extern "C" fn conn_request_cb(
    conn_request: sys::ucp_conn_request_h,
    arg: *mut c_void,
) {
    // SAFETY: arg is the Listener's ListenerArg, alive while the UCX listener exists.
    let a = unsafe { &*(arg as *const ListenerArg) };
    // SAFETY: a.queue points at the worker's boxed Queue, which outlives its listeners'
    // callbacks (they run inside that worker's progress, on its thread).
    unsafe { &*a.queue }.push(Event::ConnRequest(ConnRequest {
        h: conn_request,
        listener: a.listener,
        alive: Weak::clone(&a.alive),
    }));
}
