//! The worker itself: creation on its thread, progress, the event queue its callbacks fill,
//! the wake-up fd, its address, and teardown; plus the per-operation state (`OpCtx`) every
//! asynchronous call hands to UCX and its completion.
use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::ptr;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use crate::context::Context;
use crate::status::{check, Error, PtrStatus, Result};
use crate::sys;

use super::events::{EpId, Event, Posted, Releases, Token};

/// The event queue a worker's callbacks append to.
pub(super) struct Queue {
    pub(super) events: RefCell<VecDeque<Event>>,
}

impl Queue {
    pub(super) fn push(&self, e: Event) {
        self.events.borrow_mut().push_back(e);
    }
}

/// Argument of the AM receive callback for one AM id.
pub(super) struct AmHandlerArg {
    pub(super) queue: *const Queue,
    pub(super) id: u16,
    pub(super) worker: sys::ucp_worker_h,
    pub(super) alive: Weak<()>,
    /// Keep eager data of at least `.1` bytes in UCX's buffer when allowed
    /// (`AmData::Held`).
    pub(super) hold: Option<(Arc<Releases>, usize)>,
}

/// Per-operation state, boxed and passed to UCX as `user_data`, freed by the completion.
pub(super) struct OpCtx {
    pub(super) queue: *const Queue,
    pub(super) token: Token,
    /// Reported as an event; internal operations (endpoint close) are not.
    pub(super) report: bool,
    /// The AM header: UCX 1.13 may read it after `ucp_am_send_nbx` returned.
    pub(super) _header: Vec<u8>,
    /// The iovec describing `buf` when it has several slices.
    pub(super) _iov: Vec<sys::ucp_dt_iov_t>,
    pub(super) buf: Option<Box<dyn Any>>,
    /// Keeps endpoint callback state alive until the endpoint is really closed.
    pub(super) _keep: Option<Box<dyn Any>>,
}

/// In-flight endpoint-close requests: the completion callback removes its own.
pub(super) type Closing = Rc<RefCell<Vec<usize>>>;

/// A UCP worker: one per thread. Not `Send`: UCX workers are created in
/// `UCS_THREAD_MODE_SINGLE` and must stay on the thread that made them.
pub struct Worker {
    pub(super) ctx: Arc<Context>,
    pub(super) h: sys::ucp_worker_h,
    pub(super) queue: Box<Queue>,
    /// Boxed so each argument keeps its address while the Vec grows: UCX holds pointers.
    #[allow(clippy::vec_box)]
    pub(super) am_args: Vec<Box<AmHandlerArg>>,
    /// Endpoint-close requests still in flight, waited for (or released) before the
    /// worker is destroyed.
    pub(super) closing: Closing,
    pub(super) next_ep: EpId,
    pub(super) epoch: u64,
    /// Ask UCX for peer-failure handling on endpoints created by address.
    pub(super) peer_errors: bool,
    /// Buffers of dropped `HeldData` to give back to UCX.
    pub(super) releases: Arc<Releases>,
    /// The only strong reference: descriptors, endpoints and listeners hold weak ones and
    /// check them before touching UCX.
    pub(super) alive: Rc<()>,
    pub(super) _not_send: PhantomData<*mut ()>,
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
        // SAFETY: h is the worker made in `new` and destroyed only in Drop, so it is live
        // for `&mut self`; we are on its thread (Worker is !Send).
        let st = unsafe { sys::ucp_worker_arm(self.h) };
        if st == sys::UCS_ERR_BUSY {
            return Ok(false);
        }
        check(st).map(|()| true)
    }

    /// Wake a thread sleeping on this worker's event fd (callable from this thread only;
    /// other threads use their own wake-up channel).
    pub fn signal(&self) -> Result<()> {
        // SAFETY: h is live until Drop (see `arm`); ucp_worker_signal may be called on the
        // worker's own thread, which is ours (Worker is !Send).
        check(unsafe { sys::ucp_worker_signal(self.h) })
    }

    /// This worker's address, for a peer to connect to with [`Worker::connect_address`].
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len: usize = 0;
        // SAFETY: h is live until Drop (see `arm`); addr/len are out-pointers UCX fills.
        check(unsafe { sys::ucp_worker_get_address(self.h, &mut addr, &mut len) })?;
        // SAFETY: UCX returned a buffer of `len` bytes at addr; we copy it and release it
        // exactly once.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker.
        unsafe { sys::ucp_worker_release_address(self.h, addr) };
        Ok(bytes)
    }

    /// Number of endpoint closes still in progress.
    pub fn closing(&self) -> usize {
        self.closing.borrow().len()
    }

    /// Give up on the endpoint closes still in progress (ones UCX will never finish, such
    /// as the force-close of a shared-memory endpoint whose dead peer left its FIFO
    /// full), so that the worker can be dropped at once: their requests are released and
    /// their small state is left to UCX, which frees it with the worker.
    pub fn abandon_closes(&mut self) {
        for req in self.closing.borrow_mut().drain(..) {
            // SAFETY: req is an in-flight close request returned by ucp_ep_close_nbx and
            // not yet completed (the callback removes completed ones); freeing it only
            // tells UCX we will not wait for it.
            unsafe { sys::ucp_request_free(req as *mut c_void) };
        }
    }

    /// Progress until every endpoint close has finished or `limit` has passed (see
    /// [`Worker::closing`] for what is left). A peer that never answers a flush is
    /// force-closed by UCX's own timeouts; this only bounds how long we wait for that.
    pub fn finish_closes(&mut self, limit: std::time::Duration) {
        let start = std::time::Instant::now();
        while !self.closing.borrow().is_empty() && start.elapsed() < limit {
            // SAFETY: h is live until Drop, and progress runs on the worker's own thread
            // (Worker is !Send), as UCS_THREAD_MODE_SINGLE requires.
            unsafe { sys::ucp_worker_progress(self.h) };
        }
    }
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

/// What a `*_nbx` call that was given the OpCtx at `raw` as its user data did. When it
/// finished inline, UCX will not call the completion callback, so the state (and the
/// buffer it owns) is reclaimed here.
pub(super) fn posted(st: PtrStatus, raw: *mut OpCtx) -> Result<Posted> {
    match st {
        PtrStatus::Pending(_) => Ok(Posted::Pending),
        PtrStatus::Done => {
            // SAFETY: completed inline: the callback will not run; raw (from
            // Box::into_raw by the caller) is ours and reclaimed once.
            let op = unsafe { Box::from_raw(raw) };
            Ok(Posted::Done(op.buf))
        }
        PtrStatus::Failed(e) => {
            // SAFETY: failed inline: the callback will not run either, so raw (from
            // Box::into_raw by the caller) is still ours, reclaimed here once.
            drop(unsafe { Box::from_raw(raw) });
            Err(e)
        }
    }
}

pub(super) fn dt_contig() -> sys::ucp_datatype_t {
    // ucp_dt_make_contig(1): element size 1 shifted over the class bits.
    (1u64 << sys::UCP_DATATYPE_SHIFT) | sys::UCP_DATATYPE_CONTIG as u64
}

pub(super) fn complete(request: *mut c_void, status: sys::ucs_status_t, user_data: *mut c_void) {
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

/// Completion callback of sends, RMA reads and endpoint closes (UCX calls it on the
/// worker's thread, inside progress): `complete` reports and frees the operation.
pub(super) unsafe extern "C" fn send_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    complete(request, status, user_data);
}
