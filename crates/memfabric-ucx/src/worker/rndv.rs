//! Rendezvous receives: pulling an active message's data that is still at the sender into a
//! buffer of ours.
use std::any::Any;
use std::ffi::c_void;
use std::ptr;

use crate::buf::RecvBuf;
use crate::status::{ptr_status, Error, Result};
use crate::sys;

use super::base::{complete, dt_contig, posted, OpCtx, Worker};
use super::events::{Posted, RndvData, Token};

impl Worker {
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
}

pub(super) unsafe extern "C" fn recv_am_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    _length: usize,
    user_data: *mut c_void,
) {
    complete(request, status, user_data);
}
