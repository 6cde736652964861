//! A UCP worker and everything that hangs off it: endpoints, listeners, active messages,
//! RMA reads, registered memory and the wake-up fd.
//!
//! Callbacks from UCX run inside `ucp_worker_progress` on the owning thread. Each one only
//! appends an [`Event`] to the worker's queue (reached through a boxed, address-stable
//! `Queue` passed as the callback's argument); the owner then [`Worker::drain`]s the queue.
use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use crate::buf::{RecvBuf, SendBuf};
use crate::context::Context;
use crate::status::{check, ptr_status, Error, PtrStatus, Result};
use crate::sys;

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
    reply_ep: sys::ucp_ep_h,
    epoch: u64,
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
    desc: *mut c_void,
    len: usize,
    worker: sys::ucp_worker_h,
    alive: Weak<()>,
}

impl RndvData {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
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
    data: *mut c_void,
    len: usize,
    releases: Arc<Releases>,
}

/// Buffers given back by dropped `HeldData`, waiting for the worker's thread.
#[derive(Default)]
struct Releases {
    queue: std::sync::Mutex<Vec<usize>>,
    outstanding: std::sync::atomic::AtomicUsize,
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
    h: sys::ucp_conn_request_h,
    listener: sys::ucp_listener_h,
    alive: Weak<()>,
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

/// The event queue a worker's callbacks append to.
struct Queue {
    events: RefCell<VecDeque<Event>>,
}

impl Queue {
    fn push(&self, e: Event) {
        self.events.borrow_mut().push_back(e);
    }
}

/// Argument of the AM receive callback for one AM id.
struct AmHandlerArg {
    queue: *const Queue,
    id: u16,
    worker: sys::ucp_worker_h,
    alive: Weak<()>,
    /// Keep eager data of at least `.1` bytes in UCX's buffer when allowed
    /// (`AmData::Held`).
    hold: Option<(Arc<Releases>, usize)>,
}

/// Argument of an endpoint's error callback.
struct EpArg {
    queue: *const Queue,
    id: EpId,
}

/// Argument of a listener's connection callback.
struct ListenerArg {
    queue: *const Queue,
    listener: sys::ucp_listener_h,
    alive: Weak<()>,
}

/// Per-operation state, boxed and passed to UCX as `user_data`, freed by the completion.
struct OpCtx {
    queue: *const Queue,
    token: Token,
    /// Reported as an event; internal operations (endpoint close) are not.
    report: bool,
    /// The AM header: UCX 1.13 may read it after `ucp_am_send_nbx` returned.
    _header: Vec<u8>,
    /// The iovec describing `buf` when it has several slices.
    _iov: Vec<sys::ucp_dt_iov_t>,
    buf: Option<Box<dyn Any>>,
    /// Keeps endpoint callback state alive until the endpoint is really closed.
    _keep: Option<Box<dyn Any>>,
}

/// In-flight endpoint-close requests: the completion callback removes its own.
type Closing = Rc<RefCell<Vec<usize>>>;

/// A UCP worker: one per thread. Not `Send`: UCX workers are created in
/// `UCS_THREAD_MODE_SINGLE` and must stay on the thread that made them.
pub struct Worker {
    ctx: Arc<Context>,
    h: sys::ucp_worker_h,
    queue: Box<Queue>,
    /// Boxed so each argument keeps its address while the Vec grows: UCX holds pointers.
    #[allow(clippy::vec_box)]
    am_args: Vec<Box<AmHandlerArg>>,
    /// Endpoint-close requests still in flight, waited for (or released) before the
    /// worker is destroyed.
    closing: Closing,
    next_ep: EpId,
    epoch: u64,
    /// Ask UCX for peer-failure handling on endpoints created by address.
    peer_errors: bool,
    /// Buffers of dropped `HeldData` to give back to UCX.
    releases: Arc<Releases>,
    /// The only strong reference: descriptors, endpoints and listeners hold weak ones and
    /// check them before touching UCX.
    alive: Rc<()>,
    _not_send: PhantomData<*mut ()>,
}

impl Worker {
    /// Create a worker on the calling thread.
    pub fn new(ctx: &Arc<Context>) -> Result<Worker> {
        let params = sys::ucp_worker_params_t {
            field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::UCS_THREAD_MODE_SINGLE,
            ..Default::default()
        };
        let mut h: sys::ucp_worker_h = ptr::null_mut();
        let _g = ctx.workers_lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: ctx.h is a live context; params is initialised for THREAD_MODE; h is an
        // out-pointer.
        check(unsafe { sys::ucp_worker_create(ctx.h, &params, &mut h) })?;
        Ok(Worker {
            ctx: Arc::clone(ctx),
            h,
            queue: Box::new(Queue {
                events: RefCell::new(VecDeque::new()),
            }),
            am_args: Vec::new(),
            closing: Rc::new(RefCell::new(Vec::new())),
            next_ep: 1,
            epoch: 0,
            peer_errors: false,
            releases: Arc::new(Releases::default()),
            alive: Rc::new(()),
            _not_send: PhantomData,
        })
    }

    /// Whether endpoints created by address ([`Worker::connect_address`]) ask UCX for
    /// peer-failure handling (`UCP_ERR_HANDLING_MODE_PEER`, reported as
    /// [`Event::EpFailed`]). Off by default: UCX 1.13's shared-memory transports (posix,
    /// sysv, self) cannot handle peer failure, so with `UCX_TLS=posix,cma,self` such an
    /// endpoint has no usable lane. Callers that turn it off detect a dead peer themselves
    /// (memfabric watches the bootstrap TCP connection and times requests out). Endpoints
    /// made through a listener always ask for it: UCX's connection manager needs it.
    pub fn set_peer_errors(&mut self, on: bool) {
        self.peer_errors = on;
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Run UCX's progress engine once; returns how many events UCX processed. Afterwards
    /// call [`Worker::drain`].
    pub fn progress(&mut self) -> u32 {
        self.epoch += 1;
        self.release_held();
        // SAFETY: h is live and used only from this thread (Worker is !Send).
        unsafe { sys::ucp_worker_progress(self.h) }
    }

    /// Hand buffers of dropped `HeldData` back to UCX.
    fn release_held(&mut self) {
        use std::sync::atomic::Ordering;
        if self.releases.outstanding.load(Ordering::Relaxed) == 0 {
            return;
        }
        let done = std::mem::take(
            &mut *self
                .releases
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for d in &done {
            // SAFETY: d is a data pointer an AM callback of this worker kept (returning
            // UCS_INPROGRESS with UCP_AM_RECV_ATTR_FLAG_DATA); its HeldData was dropped,
            // so nothing reads it; released exactly once (the queue is drained).
            unsafe { sys::ucp_am_data_release(self.h, *d as *mut c_void) };
        }
        self.releases
            .outstanding
            .fetch_sub(done.len(), Ordering::Relaxed);
    }

    /// Whether events are waiting in the queue.
    pub fn has_events(&self) -> bool {
        !self.queue.events.borrow().is_empty()
    }

    /// Move everything the callbacks queued to the end of `out`, keeping both queues'
    /// capacity (no allocation per progress round).
    pub fn drain_into(&mut self, out: &mut VecDeque<Event>) {
        let mut q = self.queue.events.borrow_mut();
        for mut e in q.drain(..) {
            if let Event::Am(m) = &mut e {
                if m.epoch == u64::MAX {
                    m.epoch = self.epoch;
                }
            }
            out.push_back(e);
        }
    }

    /// Take everything the callbacks queued.
    pub fn drain(&mut self) -> VecDeque<Event> {
        let mut events = std::mem::take(&mut *self.queue.events.borrow_mut());
        for e in events.iter_mut() {
            if let Event::Am(m) = e {
                if m.epoch == u64::MAX {
                    m.epoch = self.epoch;
                }
            }
        }
        events
    }

    /// The fd that becomes readable when this worker has something to progress (after
    /// [`Worker::arm`] returned `true`).
    pub fn event_fd(&self) -> Result<RawFd> {
        let mut fd: libc::c_int = -1;
        // SAFETY: h is live; fd is an out-pointer. The context has UCP_FEATURE_WAKEUP.
        check(unsafe { sys::ucp_worker_get_efd(self.h, &mut fd) })?;
        Ok(fd)
    }

    /// Arm the event fd before sleeping on it. `Ok(false)`: events are pending right now,
    /// progress instead of sleeping.
    pub fn arm(&mut self) -> Result<bool> {
        if self.has_events() {
            return Ok(false);
        }
        // SAFETY: h is live.
        let st = unsafe { sys::ucp_worker_arm(self.h) };
        if st == sys::UCS_ERR_BUSY {
            return Ok(false);
        }
        check(st).map(|()| true)
    }

    /// Wake a thread sleeping on this worker's event fd (callable from this thread only;
    /// other threads use their own wake-up channel).
    pub fn signal(&self) -> Result<()> {
        // SAFETY: h is live.
        check(unsafe { sys::ucp_worker_signal(self.h) })
    }

    /// This worker's address, for a peer to connect to with [`Worker::connect_address`].
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len: usize = 0;
        // SAFETY: h is live; addr/len are out-pointers.
        check(unsafe { sys::ucp_worker_get_address(self.h, &mut addr, &mut len) })?;
        // SAFETY: UCX returned a buffer of `len` bytes at addr; we copy it and release it
        // exactly once.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker.
        unsafe { sys::ucp_worker_release_address(self.h, addr) };
        Ok(bytes)
    }

    /// Deliver active messages with id `id` as [`Event::Am`].
    pub fn set_am_handler(&mut self, id: u16) -> Result<()> {
        self.register_am_handler(id, None)
    }

    /// Like `set_am_handler`, but eager data of at least `min_len` bytes is left in UCX's
    /// receive buffer when the transport allows it (`AmData::Held`), saving a copy (and
    /// the reader a pass over memory another core just wrote). Smaller data is cheaper
    /// to copy than to hold. Held buffers are UCX's: do not keep very many for long.
    pub fn set_am_handler_holding(&mut self, id: u16, min_len: usize) -> Result<()> {
        self.register_am_handler(id, Some(min_len))
    }

    fn register_am_handler(&mut self, id: u16, hold: Option<usize>) -> Result<()> {
        let arg = Box::new(AmHandlerArg {
            queue: &*self.queue,
            id,
            worker: self.h,
            alive: Rc::downgrade(&self.alive),
            hold: hold.map(|min| (Arc::clone(&self.releases), min)),
        });
        let params = sys::ucp_am_handler_param_t {
            field_mask: (sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG) as u64,
            id: id as u32,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(am_recv_cb),
            arg: &*arg as *const AmHandlerArg as *mut c_void,
        };
        // SAFETY: h is live; arg points into a Box kept in self.am_args for the worker's
        // lifetime (handlers are never unregistered before the worker is destroyed).
        check(unsafe { sys::ucp_worker_set_am_recv_handler(self.h, &params) })?;
        self.am_args.push(arg);
        Ok(())
    }

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

    /// Send active message `id` with `header` and `data` on `ep`. `reply`: let the
    /// receiver answer through the sender's endpoint. Completion (the buffers may be
    /// reused) arrives as `Event::Done { token, buf: Some(data) }` unless the send finished
    /// at once (`Posted::Done`).
    pub fn am_send(
        &mut self,
        ep: &Endpoint,
        id: u16,
        header: Vec<u8>,
        data: Option<Box<dyn SendBuf>>,
        how: SendHow,
        token: Token,
    ) -> Result<Posted> {
        self.am_send_raw(ep.h, id, header, data, how, token)
    }

    /// Send an eager active message only if UCX can complete it at once (the common case
    /// for small messages on an idle endpoint): no allocation, the buffers are only
    /// borrowed. `Ok(false)`: UCX could not take it right now; send it with
    /// [`Worker::am_send`] instead.
    pub fn am_send_now(
        &mut self,
        ep: &Endpoint,
        id: u16,
        header: &[u8],
        data: &[u8],
        reply: bool,
    ) -> Result<bool> {
        if ep.h.is_null() {
            return Err(Error::invalid_param());
        }
        let mut flags = sys::UCP_AM_SEND_FLAG_EAGER;
        if reply {
            flags |= sys::UCP_AM_SEND_FLAG_REPLY;
        }
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS
                | sys::UCP_OP_ATTR_FIELD_DATATYPE
                | sys::UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL,
            flags,
            datatype: dt_contig(),
            ..Default::default()
        };
        // SAFETY: ep.h is a live endpoint of this worker; header and data are borrowed for
        // the call only, which is enough: FORCE_IMM_CMPL makes UCX either complete the
        // send before returning (done with both buffers) or refuse it with
        // UCS_ERR_NO_RESOURCE. The unexpected in-flight case is waited out below.
        let st = ptr_status(unsafe {
            sys::ucp_am_send_nbx(
                ep.h,
                id as u32,
                header.as_ptr() as *const c_void,
                header.len(),
                data.as_ptr() as *const c_void,
                data.len(),
                &param,
            )
        });
        match st {
            PtrStatus::Done => Ok(true),
            PtrStatus::Failed(e) if e.status() == sys::UCS_ERR_NO_RESOURCE => Ok(false),
            PtrStatus::Failed(e) => Err(e),
            PtrStatus::Pending(req) => {
                // Not expected with FORCE_IMM_CMPL; if a UCX version does it anyway, the
                // borrowed buffers must outlive the send: wait for it here.
                loop {
                    // SAFETY: req is the live request just returned; checked, then freed
                    // once complete.
                    let s = unsafe { sys::ucp_request_check_status(req) };
                    if s != sys::UCS_INPROGRESS {
                        // SAFETY: complete; released exactly once.
                        unsafe { sys::ucp_request_free(req) };
                        return check(s).map(|()| true);
                    }
                    self.progress();
                }
            }
        }
    }

    /// Answer `msg` through the endpoint its sender attached (`reply` on its send). Only
    /// valid before the next `progress`.
    pub fn reply(&mut self, msg: &AmMessage, id: u16, header: Vec<u8>, token: Token) -> Result<()> {
        if msg.reply_ep.is_null() || msg.epoch != self.epoch {
            return Err(Error::invalid_param());
        }
        let how = SendHow {
            proto: Proto::Eager,
            reply: false,
        };
        self.am_send_raw(msg.reply_ep, id, header, None, how, token)
            .map(|_| ())
    }

    fn am_send_raw(
        &mut self,
        ep: sys::ucp_ep_h,
        id: u16,
        header: Vec<u8>,
        data: Option<Box<dyn SendBuf>>,
        how: SendHow,
        token: Token,
    ) -> Result<Posted> {
        if ep.is_null() {
            return Err(Error::invalid_param());
        }
        let (iov, buffer, count, datatype) = match &data {
            None => (Vec::new(), ptr::null(), 0, dt_contig()),
            Some(d) => {
                let s = d.slices();
                if s.len() == 1 {
                    (
                        Vec::new(),
                        s[0].as_ptr() as *const c_void,
                        s[0].len(),
                        dt_contig(),
                    )
                } else {
                    let iov: Vec<sys::ucp_dt_iov_t> = s
                        .iter()
                        .map(|x| sys::ucp_dt_iov_t {
                            buffer: x.as_ptr() as *mut c_void,
                            length: x.len(),
                        })
                        .collect();
                    let n = iov.len();
                    (iov, ptr::null(), n, sys::UCP_DATATYPE_IOV as u64)
                }
            }
        };
        let mut flags = match how.proto {
            Proto::Eager => sys::UCP_AM_SEND_FLAG_EAGER,
            Proto::Rndv => sys::UCP_AM_SEND_FLAG_RNDV,
        };
        if how.reply {
            flags |= sys::UCP_AM_SEND_FLAG_REPLY;
        }
        let mut op = Box::new(OpCtx {
            queue: &*self.queue,
            token,
            report: true,
            _header: header,
            _iov: iov,
            buf: None,
            _keep: None,
        });
        let buffer = if op._iov.is_empty() {
            buffer
        } else {
            op._iov.as_ptr() as *const c_void
        };
        let (hdr_ptr, hdr_len) = (op._header.as_ptr(), op._header.len());
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_FLAGS
                | sys::UCP_OP_ATTR_FIELD_DATATYPE,
            flags,
            cb: sys::ucp_request_param_t__bindgen_ty_1 {
                send: Some(send_cb),
            },
            datatype,
            ..Default::default()
        };
        // The data box moves into the op state before UCX sees its pointers: the slices
        // point into the boxed value's heap memory, which does not move with the box.
        op.buf = data.map(|d| d as Box<dyn Any>);
        let raw = Box::into_raw(op);
        let param = sys::ucp_request_param_t {
            user_data: raw as *mut c_void,
            ..param
        };
        // SAFETY: ep is a live endpoint of this worker (an Endpoint we own, or a reply ep
        // checked against the current progress epoch). header and data (and the iovec)
        // are owned by the OpCtx at `raw`, which lives until the callback frees it or we
        // free it below when the send completed inline.
        let st = ptr_status(unsafe {
            sys::ucp_am_send_nbx(
                ep,
                id as u32,
                hdr_ptr as *const c_void,
                hdr_len,
                buffer,
                count,
                &param,
            )
        });
        posted(st, raw)
    }

    /// Receive rendezvous data into `target` (its slices, in order, must add up to at
    /// least the data length). Completion: `Event::Done { token, buf: Some(target) }`, or
    /// `Posted::Done(Some(target))` when it finished at once.
    pub fn recv_rndv(
        &mut self,
        mut data: RndvData,
        mut target: Box<dyn RecvBuf>,
        token: Token,
    ) -> Result<Posted> {
        let len = data.len;
        let slices = target.slices_mut();
        let total: usize = slices.iter().map(|s| s.len()).sum();
        if total < len {
            return Err(Error::invalid_param());
        }
        // Describe exactly `len` bytes.
        let mut iov = Vec::with_capacity(slices.len());
        let mut left = len;
        for s in slices {
            if left == 0 {
                break;
            }
            let take = s.len().min(left);
            iov.push(sys::ucp_dt_iov_t {
                buffer: s.as_mut_ptr() as *mut c_void,
                length: take,
            });
            left -= take;
        }
        let desc = std::mem::replace(&mut data.desc, ptr::null_mut());
        let mut op = Box::new(OpCtx {
            queue: &*self.queue,
            token,
            report: true,
            _header: Vec::new(),
            _iov: iov,
            buf: None,
            _keep: None,
        });
        let (buffer, count, datatype) = if op._iov.len() == 1 {
            (op._iov[0].buffer, op._iov[0].length, dt_contig())
        } else {
            (
                op._iov.as_mut_ptr() as *mut c_void,
                op._iov.len(),
                sys::UCP_DATATYPE_IOV as u64,
            )
        };
        op.buf = Some(target as Box<dyn Any>);
        let raw = Box::into_raw(op);
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_DATATYPE,
            cb: sys::ucp_request_param_t__bindgen_ty_1 {
                recv_am: Some(recv_am_cb),
            },
            datatype,
            user_data: raw as *mut c_void,
            ..Default::default()
        };
        // SAFETY: desc is a rendezvous descriptor kept by our AM callback and not yet
        // received or released (we took it out of `data`, so its Drop will not release it);
        // buffer/iovec point into `target`, owned with the iovec by the OpCtx at raw until
        // completion.
        let st =
            ptr_status(unsafe { sys::ucp_am_recv_data_nbx(self.h, desc, buffer, count, &param) });
        posted(st, raw)
    }

    /// RMA-read `target.len()` bytes at `remote_addr` (covered by `rkey`) from the peer of
    /// `ep`. Completion: `Event::Done { token, buf: Some(target) }`.
    pub fn get(
        &mut self,
        ep: &Endpoint,
        remote_addr: u64,
        rkey: RemoteKey,
        mut target: Box<dyn RecvBuf>,
        token: Token,
    ) -> Result<Posted> {
        let Some(&rk) = ep.rkeys.get(rkey.0) else {
            return Err(Error::invalid_param());
        };
        let mut slices = target.slices_mut();
        if slices.len() != 1 {
            return Err(Error::invalid_param());
        }
        let (buffer, count) = (slices[0].as_mut_ptr() as *mut c_void, slices[0].len());
        let mut op = Box::new(OpCtx {
            queue: &*self.queue,
            token,
            report: true,
            _header: Vec::new(),
            _iov: Vec::new(),
            buf: None,
            _keep: None,
        });
        op.buf = Some(target as Box<dyn Any>);
        let raw = Box::into_raw(op);
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA,
            cb: sys::ucp_request_param_t__bindgen_ty_1 {
                send: Some(send_cb),
            },
            user_data: raw as *mut c_void,
            ..Default::default()
        };
        // SAFETY: ep.h is live; rk was unpacked on this endpoint and is destroyed only
        // when the endpoint closes; the local buffer belongs to the OpCtx at raw until
        // completion. UCX validates the remote range against the rkey.
        let st =
            ptr_status(unsafe { sys::ucp_get_nbx(ep.h, buffer, count, remote_addr, rk, &param) });
        posted(st, raw)
    }

    /// Register `len` bytes at `addr` with UCX, for zero-copy sends/receives and remote
    /// reads. The memory must stay mapped while the region lives (the caller's arena is a
    /// mapping that is never moved or unmapped before the server exits).
    pub fn mem_map(&self, addr: *mut u8, len: usize) -> Result<MemRegion> {
        MemRegion::new(&self.ctx, addr, len)
    }

    /// Number of endpoint closes still in progress.
    pub fn closing(&self) -> usize {
        self.closing.borrow().len()
    }

    /// Progress until every endpoint close has finished or `limit` has passed (see
    /// [`Worker::closing`] for what is left). A peer that never answers a flush is
    /// force-closed by UCX's own timeouts; this only bounds how long we wait for that.
    pub fn finish_closes(&mut self, limit: std::time::Duration) {
        let start = std::time::Instant::now();
        while !self.closing.borrow().is_empty() && start.elapsed() < limit {
            // SAFETY: h is live for as long as self.
            unsafe { sys::ucp_worker_progress(self.h) };
        }
    }
}

/// Zero bytes after a worker address handed to UCX (see [`Worker::connect_address`]).
const ADDRESS_PAD: usize = 256;

/// Whether `a` could be a UCX worker address: a header byte whose low four bits name an
/// address format UCX 1.13 parses (0 = v1, 1 = v2; anything else trips an assertion that
/// aborts the process), then at least the 64-bit worker id.
fn plausible_worker_address(a: &[u8]) -> bool {
    const MIN_LEN: usize = 2 + 8;
    a.len() >= MIN_LEN && (a[0] & 0x0f) <= 1
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Let endpoint closes finish (bounded: we stop waiting after ~2 s regardless).
        self.finish_closes(std::time::Duration::from_secs(2));
        // Closes that did not finish (a peer that never answers the flush): release the
        // requests so UCX may destroy them with the worker; their callbacks will not run
        // and their small state is leaked.
        for req in self.closing.borrow_mut().drain(..) {
            // SAFETY: req is an in-flight close request returned by ucp_ep_close_nbx and
            // not yet completed (the callback removes completed ones).
            unsafe { sys::ucp_request_free(req as *mut c_void) };
        }
        // Events still queued may own descriptors that must be released while the worker
        // lives.
        self.queue.events.borrow_mut().clear();
        self.release_held();
        if self
            .releases
            .outstanding
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
        {
            // Someone still reads data in this worker's buffers: keep the worker (and the
            // context) alive for the rest of the process rather than free that memory.
            tracing::warn!("UCX worker dropped while received data is still held: leaking it");
            std::mem::forget(Arc::clone(&self.ctx));
            return;
        }
        let _g = self
            .ctx
            .workers_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // SAFETY: h came from ucp_worker_create and is destroyed once; after this no
        // callback can run, so the queue and handler args (dropped after) are unused.
        unsafe { sys::ucp_worker_destroy(self.h) };
    }
}

/// A listening socket address (server side of the connection establishment).
pub struct Listener {
    h: sys::ucp_listener_h,
    arg: Box<ListenerArg>,
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

/// A connection to a peer worker. Close it with [`Worker::close`]; dropping it without
/// closing force-closes it and leaks the callback state until the process exits.
pub struct Endpoint {
    h: sys::ucp_ep_h,
    id: EpId,
    arg: Option<Box<EpArg>>,
    rkeys: Vec<sys::ucp_rkey_h>,
    /// Peer regions mapped into this process (`map_region`), valid while `rkeys` are.
    mapped: Vec<Mapped>,
    /// Created with peer-failure handling (UCX allows a force close only then).
    peer: bool,
    /// Shared with the worker: an endpoint dropped after its worker has nothing to close
    /// (UCX destroyed it with the worker).
    alive: Weak<()>,
}

/// A peer's region as mapped into this process by UCX (`ucp_rkey_ptr`).
struct Mapped {
    rkey: usize,
    base: u64,
    len: usize,
    ptr: *const u8,
}

/// An unpacked remote key, usable on the endpoint that unpacked it.
#[derive(Clone, Copy, Debug)]
pub struct RemoteKey(usize);

impl Endpoint {
    pub fn id(&self) -> EpId {
        self.id
    }

    /// Whether UCX handles peer failure on this endpoint (see `Worker::set_peer_errors`).
    pub fn peer_errors(&self) -> bool {
        self.peer
    }

    /// Unpack a peer's packed rkey (from [`MemRegion::pack_rkey`]) for RMA reads.
    pub fn unpack_rkey(&mut self, packed: &[u8]) -> Result<RemoteKey> {
        if packed.is_empty() {
            return Err(Error::invalid_param());
        }
        let mut rk: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: h is live; packed is a buffer of rkey bytes for the call's duration
        // (UCX validates the format); rk is an out-pointer.
        check(unsafe {
            sys::ucp_ep_rkey_unpack(self.h, packed.as_ptr() as *const c_void, &mut rk)
        })?;
        self.rkeys.push(rk);
        Ok(RemoteKey(self.rkeys.len() - 1))
    }

    /// Whether the memory behind `rkey` at `remote_addr` is directly mapped into this
    /// process (`ucp_rkey_ptr`): true for a peer on the same host whose region UCX
    /// allocated in shared memory. RMA reads there are plain memory copies.
    pub fn rkey_is_mapped(&self, rkey: RemoteKey, remote_addr: u64) -> bool {
        self.mapped_ptr(rkey, remote_addr).is_some()
    }

    fn mapped_ptr(&self, rkey: RemoteKey, remote_addr: u64) -> Option<*const u8> {
        let &rk = self.rkeys.get(rkey.0)?;
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: rk was unpacked on this endpoint and is still live; p is an
        // out-pointer; UCX only reports whether (and where) the memory is mapped here.
        let st = unsafe { sys::ucp_rkey_ptr(rk, remote_addr, &mut p) };
        (st == sys::UCS_OK && !p.is_null()).then_some(p as *const u8)
    }

    /// Map the peer's region `[base, base+len)` behind `rkey` for [`Endpoint::read_mapped`]:
    /// true when UCX maps the whole range into this process as one piece (same-host
    /// shared memory), false otherwise (reads then need `Worker::get`).
    pub fn map_region(&mut self, rkey: RemoteKey, base: u64, len: usize) -> bool {
        let Some(last) = base.checked_add(len.saturating_sub(1) as u64) else {
            return false;
        };
        let (Some(first), Some(end)) = (self.mapped_ptr(rkey, base), self.mapped_ptr(rkey, last))
        else {
            return false;
        };
        // One contiguous mapping: the last byte is where the first one plus the length says.
        if len == 0 || (end as usize).wrapping_sub(first as usize) != len - 1 {
            return false;
        }
        self.mapped.push(Mapped {
            rkey: rkey.0,
            base,
            len,
            ptr: first,
        });
        true
    }

    /// An RMA read without UCX's request machinery, from a region mapped with
    /// [`Endpoint::map_region`]: copies `dst.len()` bytes at `remote_addr` and returns
    /// true, or returns false (nothing copied) when the range is not inside such a region.
    /// Like an RDMA read, the copy may observe the peer's concurrent writes half done:
    /// callers validate what they read (seqlocks, checksums).
    pub fn read_mapped(&self, rkey: RemoteKey, remote_addr: u64, dst: &mut [u8]) -> bool {
        let Some(m) = self.mapped.iter().find(|m| m.rkey == rkey.0) else {
            return false;
        };
        let Some(off) = remote_addr.checked_sub(m.base) else {
            return false;
        };
        if off
            .checked_add(dst.len() as u64)
            .is_none_or(|end| end > m.len as u64)
        {
            return false;
        }
        // SAFETY (pointer arithmetic): off + dst.len() <= m.len, checked above.
        let src = m.ptr.wrapping_add(off as usize);
        let mut i = 0;
        if (src as usize).is_multiple_of(8) {
            let mut words = dst.chunks_exact_mut(8);
            for w in &mut words {
                // SAFETY: [src, src+dst.len()) lies inside the mapped region (checked
                // above), which stays mapped while this endpoint (and so the rkey) lives;
                // src+i is 8-aligned. The peer may be writing it: a volatile read assumes
                // nothing about the contents, and the caller validates them.
                let v = unsafe { ptr::read_volatile(src.add(i) as *const u64) };
                w.copy_from_slice(&v.to_ne_bytes());
                i += 8;
            }
        }
        for b in &mut dst[i..] {
            // SAFETY: as above, one byte inside the checked range.
            *b = unsafe { ptr::read_volatile(src.add(i)) };
            i += 1;
        }
        true
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

    fn destroy_rkeys(&mut self) {
        // The mappings go with the rkeys.
        self.mapped.clear();
        for rk in self.rkeys.drain(..) {
            // SAFETY: each rkey was unpacked on this endpoint and is destroyed once,
            // before the endpoint itself.
            unsafe { sys::ucp_rkey_destroy(rk) };
        }
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

/// Memory registered with UCX (`ucp_mem_map`).
pub struct MemRegion {
    ctx: Arc<Context>,
    memh: sys::ucp_mem_h,
    addr: *mut u8,
    len: usize,
}

// SAFETY: a memory handle is a context-level object; UCX locks the context for
// mem_map/unmap/rkey_pack, so the handle may be shared with and dropped by any thread.
unsafe impl Send for MemRegion {}
// SAFETY: see Send; the only &self operation is rkey packing, which UCX serialises.
unsafe impl Sync for MemRegion {}

impl MemRegion {
    /// Let UCX allocate `len` bytes and register them (`UCP_MEM_MAP_ALLOCATE`). UCX picks
    /// the allocator by `UCX_ALLOC_PRIO` (shared-memory segments first by default), so
    /// peers on the same host can read the region without a system call per read
    /// (`ucp_rkey_ptr` works on it), which registered private memory cannot offer.
    /// The memory is zero-filled and freed when the region is dropped.
    pub(crate) fn allocate(ctx: &Arc<Context>, len: usize) -> Result<AllocatedRegion> {
        if len == 0 {
            return Err(Error::invalid_param());
        }
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH | sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS)
                as u64,
            length: len,
            flags: sys::UCP_MEM_MAP_ALLOCATE,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: ctx is live; with ALLOCATE and no address UCX chooses the memory;
        // memh is an out-pointer.
        check(unsafe { sys::ucp_mem_map(ctx.h, &params, &mut memh) })?;
        let mut attr = sys::ucp_mem_attr_t {
            field_mask: (sys::UCP_MEM_ATTR_FIELD_ADDRESS | sys::UCP_MEM_ATTR_FIELD_LENGTH) as u64,
            ..Default::default()
        };
        // SAFETY: memh was just mapped on ctx; attr is a valid out-struct whose
        // field_mask names the fields to fill.
        let st = unsafe { sys::ucp_mem_query(memh, &mut attr) };
        if let Err(e) = check(st) {
            // SAFETY: memh came from ucp_mem_map above and is unmapped once.
            unsafe { sys::ucp_mem_unmap(ctx.h, memh) };
            return Err(e);
        }
        let region = MemRegion {
            ctx: Arc::clone(ctx),
            memh,
            addr: attr.address as *mut u8,
            len: attr.length,
        };
        if region.addr.is_null() || region.len < len {
            return Err(Error::invalid_param());
        }
        Ok(AllocatedRegion(region))
    }

    pub(crate) fn new(ctx: &Arc<Context>, addr: *mut u8, len: usize) -> Result<MemRegion> {
        if addr.is_null() || len == 0 {
            return Err(Error::invalid_param());
        }
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH)
                as u64,
            address: addr as *mut c_void,
            length: len,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: ctx is live; the caller guarantees [addr, addr+len) is mapped for the
        // region's lifetime (documented on Worker::mem_map); memh is an out-pointer.
        check(unsafe { sys::ucp_mem_map(ctx.h, &params, &mut memh) })?;
        Ok(MemRegion {
            ctx: Arc::clone(ctx),
            memh,
            addr,
            len,
        })
    }

    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    /// The region's first byte (a region made by [`Context::mem_alloc`] owns its memory
    /// until dropped).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The packed remote key a peer needs to read this region.
    pub fn pack_rkey(&self) -> Result<Vec<u8>> {
        let mut buf: *mut c_void = ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: ctx and memh are live; buf/size are out-pointers.
        check(unsafe { sys::ucp_rkey_pack(self.ctx.h, self.memh, &mut buf, &mut size) })?;
        // SAFETY: UCX returned `size` bytes at buf; copied, then released once.
        let v = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: buf came from ucp_rkey_pack.
        unsafe { sys::ucp_rkey_buffer_release(buf) };
        Ok(v)
    }
}

// SAFETY: a region made by `Context::mem_alloc` (the only kind memfabricd hands to the
// store) owns `len` bytes at `addr` that UCX allocated zero-filled and page-aligned (shared
// memory segments or mmap), mapped read-write until `ucp_mem_unmap` in Drop; nothing else
// in the process uses them, and the region never moves. The store checks the alignment
// and the length of what it is given (`Arena::from_memory`).
#[cfg(feature = "store-memory")]
unsafe impl memfabric_store::Memory for AllocatedRegion {
    fn base(&self) -> *mut u8 {
        self.0.addr
    }
    fn len(&self) -> usize {
        self.0.len
    }
}

/// A registered region whose memory UCX allocated and that owns it (from
/// [`Context::mem_alloc`]); everything else is as for [`MemRegion`].
pub struct AllocatedRegion(MemRegion);

impl std::ops::Deref for AllocatedRegion {
    type Target = MemRegion;
    fn deref(&self) -> &MemRegion {
        &self.0
    }
}

impl Drop for MemRegion {
    fn drop(&mut self) {
        // SAFETY: memh came from ucp_mem_map on ctx and is unmapped once.
        unsafe { sys::ucp_mem_unmap(self.ctx.h, self.memh) };
    }
}

/// What a `*_nbx` call that was given the OpCtx at `raw` as its user data did. When it
/// finished inline, UCX will not call the completion callback, so the state (and the
/// buffer it owns) is reclaimed here.
fn posted(st: PtrStatus, raw: *mut OpCtx) -> Result<Posted> {
    match st {
        PtrStatus::Pending(_) => Ok(Posted::Pending),
        PtrStatus::Done => {
            // SAFETY: completed inline: the callback will not run; raw (from
            // Box::into_raw by the caller) is ours and reclaimed once.
            let op = unsafe { Box::from_raw(raw) };
            Ok(Posted::Done(op.buf))
        }
        PtrStatus::Failed(e) => {
            // SAFETY: failed inline: as above.
            drop(unsafe { Box::from_raw(raw) });
            Err(e)
        }
    }
}

fn dt_contig() -> sys::ucp_datatype_t {
    // ucp_dt_make_contig(1): element size 1 shifted over the class bits.
    (1u64 << sys::UCP_DATATYPE_SHIFT) | sys::UCP_DATATYPE_CONTIG as u64
}

fn sockaddr_to_storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid (AF_UNSPEC) value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn sockaddr_from_storage(s: *const libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: s points at a sockaddr_storage filled by UCX; we read the family first and
    // then reinterpret as the matching sockaddr type, which fits inside the storage.
    unsafe {
        match (*s).ss_family as i32 {
            libc::AF_INET => {
                let a = &*(s as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
            }
            libc::AF_INET6 => {
                let a = &*(s as *const libc::sockaddr_in6);
                let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
                Some(SocketAddr::from((ip, u16::from_be(a.sin6_port))))
            }
            _ => None,
        }
    }
}

// ---- callbacks (run inside ucp_worker_progress on the worker's thread) ----

unsafe extern "C" fn am_recv_cb(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the AmHandlerArg registered with this handler, alive as long as the
    // worker; its queue pointer targets the worker's boxed Queue.
    let a = unsafe { &*(arg as *const AmHandlerArg) };
    // SAFETY: UCX passes a valid param for the duration of the callback.
    let p = unsafe { &*param };
    let hdr = if header_length == 0 || header.is_null() {
        Vec::new()
    } else {
        // SAFETY: UCX guarantees header_length readable bytes at header during the call.
        unsafe { std::slice::from_raw_parts(header as *const u8, header_length) }.to_vec()
    };
    let mut keep = false;
    let body = if p.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV as u64 != 0 {
        keep = true;
        AmData::Rndv(RndvData {
            desc: data,
            len: length,
            worker: a.worker,
            alive: Weak::clone(&a.alive),
        })
    } else if length == 0 || data.is_null() {
        AmData::None
    } else if let (Some((rel, _)), true) = (
        a.hold.as_ref(),
        p.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_DATA as u64 != 0
            && a.hold.as_ref().is_some_and(|(_, min)| length >= *min),
    ) {
        keep = true;
        rel.outstanding
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        AmData::Held(HeldData {
            data,
            len: length,
            releases: Arc::clone(rel),
        })
    } else {
        // SAFETY: eager data: `length` readable bytes at data during the call.
        AmData::Eager(unsafe { std::slice::from_raw_parts(data as *const u8, length) }.to_vec())
    };
    let reply_ep = if p.recv_attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP as u64 != 0 {
        p.reply_ep
    } else {
        ptr::null_mut()
    };
    // SAFETY: the queue outlives the worker's callbacks (see AmHandlerArg).
    let q = unsafe { &*a.queue };
    // The epoch (when the reply endpoint stops being valid) is stamped by `drain`.
    q.push(Event::Am(AmMessage {
        id: a.id,
        header: hdr,
        data: body,
        reply_ep,
        epoch: u64::MAX,
    }));
    if keep {
        sys::UCS_INPROGRESS
    } else {
        sys::UCS_OK
    }
}

unsafe extern "C" fn send_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    complete(request, status, user_data);
}

unsafe extern "C" fn recv_am_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    _length: usize,
    user_data: *mut c_void,
) {
    complete(request, status, user_data);
}

fn complete(request: *mut c_void, status: sys::ucs_status_t, user_data: *mut c_void) {
    // SAFETY: user_data is the OpCtx leaked with Box::into_raw when the operation was
    // posted; UCX calls the completion callback exactly once, so it is reclaimed once.
    let op = unsafe { Box::from_raw(user_data as *mut OpCtx) };
    // SAFETY: request is the request UCX allocated for this operation; it is complete and
    // freed once.
    unsafe { sys::ucp_request_free(request) };
    if !op.report {
        if let Some(b) = op.buf {
            if let Ok(closing) = b.downcast::<Closing>() {
                closing.borrow_mut().retain(|&r| r != request as usize);
            }
        }
        return;
    }
    let result = if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(Error::from_status(status))
    };
    let OpCtx {
        queue, token, buf, ..
    } = *op;
    // SAFETY: the queue is the worker's boxed Queue; the worker is alive because only its
    // progress runs callbacks.
    unsafe { &*queue }.push(Event::Done { token, result, buf });
}

unsafe extern "C" fn ep_error_cb(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: arg is the endpoint's EpArg, kept alive until its close completes (or leaked).
    let a = unsafe { &*(arg as *const EpArg) };
    // SAFETY: the queue belongs to the live worker whose progress is calling us.
    unsafe { &*a.queue }.push(Event::EpFailed {
        ep: a.id,
        error: Error::from_status(status),
    });
}

unsafe extern "C" fn conn_request_cb(conn_request: sys::ucp_conn_request_h, arg: *mut c_void) {
    // SAFETY: arg is the Listener's ListenerArg, alive while the UCX listener exists.
    let a = unsafe { &*(arg as *const ListenerArg) };
    // SAFETY: the queue belongs to the live worker.
    unsafe { &*a.queue }.push(Event::ConnRequest(ConnRequest {
        h: conn_request,
        listener: a.listener,
        alive: Weak::clone(&a.alive),
    }));
}
