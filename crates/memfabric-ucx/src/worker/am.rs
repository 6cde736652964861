//! Active messages: registering handlers, sending (eager or rendezvous, with or without a
//! reply endpoint), replying, and the receive callback that turns UCX's upcall into an
//! `Event::Am`.
use std::any::Any;
use std::ffi::c_void;
use std::ptr;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use crate::buf::SendBuf;
use crate::status::{check, ptr_status, Error, PtrStatus, Result};
use crate::sys;

use super::base::{dt_contig, posted, send_cb, AmHandlerArg, OpCtx, Worker};
use super::endpoint::Endpoint;
use super::events::{AmData, AmMessage, Event, HeldData, Posted, Proto, RndvData, SendHow, Token};

impl Worker {
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
                        // SAFETY: the request is complete, so UCX no longer uses it; it is
                        // freed exactly once and not touched after.
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
}

pub(super) unsafe extern "C" fn am_recv_cb(
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
