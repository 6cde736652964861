//! What a worker hands out: events, incoming active messages and their data (eager, held in
//! UCX's buffers, or rendezvous descriptors), and connection requests.
use std::any::Any;
use std::ffi::c_void;
use std::net::SocketAddr;
use std::rc::Weak;
use std::sync::Arc;

use crate::status::{Error, Result};
use crate::sys;

use super::sockaddr::sockaddr_from_storage;

/// The caller's name for an asynchronous operation; handed back in [`Event::Done`].
pub type Token = u64;

/// Our name for an endpoint, reported with its failure.
pub type EpId = u64;

/// How an active message's data travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// Data copied with the header into the receiver's bounce buffers.
    Eager,
    /// Rendezvous: the receiver is told the size and pulls the data where it wants it.
    Rndv,
}

/// How to send an active message.
#[derive(Clone, Copy, Debug)]
pub struct SendHow {
    /// Forced per send: the eager/rendezvous boundary is the caller's, not UCX's.
    pub proto: Proto,
    /// Attach the sender's endpoint so the receiver can answer on it.
    pub reply: bool,
}

/// What posting an asynchronous operation did.
pub enum Posted {
    /// Finished at once: no `Event::Done` follows; here is the buffer back.
    Done(Option<Box<dyn Any>>),
    /// In flight: an `Event::Done` with the token (and the buffer) follows.
    Pending,
}

/// What progress produced.
pub enum Event {
    /// An active message arrived.
    Am(AmMessage),
    /// An asynchronous operation finished; `buf` is the buffer it owned (if any), as its
    /// concrete type (downcast it).
    Done {
        token: Token,
        result: Result<()>,
        buf: Option<Box<dyn Any>>,
    },
    /// An endpoint created with error handling failed (peer gone, link down, timeout).
    EpFailed { ep: EpId, error: Error },
    /// A client connected to one of this worker's listeners.
    ConnRequest(ConnRequest),
}

/// An incoming active message.
pub struct AmMessage {
    pub id: u16,
    pub header: Vec<u8>,
    pub data: AmData,
    /// The sender's endpoint when the sender asked for one (`reply` on send), valid until
    /// the next `progress` (checked by `Worker::reply`).
    pub(super) reply_ep: sys::ucp_ep_h,
    pub(super) epoch: u64,
}

impl AmMessage {
    pub fn has_reply_ep(&self) -> bool {
        !self.reply_ep.is_null()
    }
}

/// The data part of an active message.
pub enum AmData {
    None,
    /// Data that came with the header (copied out of UCX's buffers).
    Eager(Vec<u8>),
    /// Data that came with the header, left in UCX's receive buffer (handlers registered
    /// with `hold`, when the transport allows it): no copy.
    Held(HeldData),
    /// Rendezvous data still at the sender: receive it with [`Worker::recv_rndv`] or drop it.
    Rndv(RndvData),
}

/// A rendezvous descriptor. Dropping it without receiving tells the sender to give up
/// (`ucp_am_data_release`).
pub struct RndvData {
    pub(super) desc: *mut c_void,
    pub(super) len: usize,
    pub(super) worker: sys::ucp_worker_h,
    pub(super) alive: Weak<()>,
}

impl RndvData {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Let go of the descriptor without giving it back to UCX, for one whose sender's
    /// endpoint UCX has failed and destroyed (a transfer on an endpoint without peer
    /// error handling failed): receiving or releasing it looks that endpoint up, which
    /// aborts the process in UCX 1.13 (`ucp_worker_get_ep_by_id` asserts). Its buffer
    /// stays allocated until the worker is destroyed.
    pub fn abandon(mut self) {
        self.desc = std::ptr::null_mut();
    }
}

impl Drop for RndvData {
    fn drop(&mut self) {
        // A descriptor that outlived its worker has nothing left to release.
        if self.desc.is_null() || self.alive.strong_count() == 0 {
            return;
        }
        // SAFETY: desc is a rendezvous descriptor this worker's AM callback kept (by
        // returning UCS_INPROGRESS) and that was neither received nor released: `recv_rndv`
        // nulls it. The worker is still alive (it holds the only strong Rc).
        unsafe { sys::ucp_am_data_release(self.worker, self.desc) };
    }
}

/// Eager data kept in UCX's receive buffer. It may move to and be dropped on any thread:
/// dropping it only queues the buffer, and the worker hands it back to UCX
/// (`ucp_am_data_release`) on its own thread at the next `progress`.
pub struct HeldData {
    pub(super) data: *mut c_void,
    pub(super) len: usize,
    pub(super) releases: Arc<Releases>,
}

/// Buffers given back by dropped `HeldData`, waiting for the worker's thread.
#[derive(Default)]
pub(super) struct Releases {
    pub(super) queue: std::sync::Mutex<Vec<usize>>,
    pub(super) outstanding: std::sync::atomic::AtomicUsize,
}

// SAFETY: HeldData only reads its buffer, which UCX does not touch or free until
// ucp_am_data_release; that call is made by the owning worker's thread, and only after
// this value was dropped (its Drop queues the buffer). A worker dropped while buffers are
// still held is leaked instead of destroyed (Worker's Drop), so the memory stays valid.
unsafe impl Send for HeldData {}
// SAFETY: see Send; shared access is read-only.
unsafe impl Sync for HeldData {}

impl AsRef<[u8]> for HeldData {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: UCX handed us `len` readable bytes at `data` and keeps them until the
        // release that this value's Drop triggers (see the Send impl).
        unsafe { std::slice::from_raw_parts(self.data as *const u8, self.len) }
    }
}

impl Drop for HeldData {
    fn drop(&mut self) {
        self.releases
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.data as usize);
    }
}

/// A pending connection on a listener: accept it on this worker or drop it (reject).
pub struct ConnRequest {
    pub(super) h: sys::ucp_conn_request_h,
    pub(super) listener: sys::ucp_listener_h,
    pub(super) alive: Weak<()>,
}

impl ConnRequest {
    /// The client's address, when UCX can tell.
    pub fn client_addr(&self) -> Option<SocketAddr> {
        let mut attr = sys::ucp_conn_request_attr_t {
            field_mask: sys::UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR as u64,
            ..Default::default()
        };
        // SAFETY: h is a live connection request (not yet accepted or rejected: those
        // consume self); attr is a valid out-structure.
        let st = unsafe { sys::ucp_conn_request_query(self.h, &mut attr) };
        if st != sys::UCS_OK {
            return None;
        }
        sockaddr_from_storage(&attr.client_address as *const _ as *const libc::sockaddr_storage)
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if self.h.is_null() || self.alive.strong_count() == 0 {
            return;
        }
        // SAFETY: an unaccepted request on a live listener (accept nulls h); rejecting
        // frees it.
        unsafe { sys::ucp_listener_reject(self.listener, self.h) };
    }
}
