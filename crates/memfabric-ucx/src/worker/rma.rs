//! One-sided reads (RMA): remote keys unpacked on an endpoint, `get` into a buffer of ours,
//! and peer memory that UCX maps into this process (read directly).
use std::any::Any;
use std::ffi::c_void;
use std::ptr;

use crate::buf::RecvBuf;
use crate::status::{check, ptr_status, Error, Result};
use crate::sys;

use super::base::{posted, send_cb, OpCtx, Worker};
use super::endpoint::{Endpoint, Mapped};
use super::events::{Posted, Token};

impl Worker {
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
}

/// An unpacked remote key, usable on the endpoint that unpacked it.
#[derive(Clone, Copy, Debug)]
pub struct RemoteKey(pub(super) usize);

impl Endpoint {
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

    pub(super) fn destroy_rkeys(&mut self) {
        // The mappings go with the rkeys.
        self.mapped.clear();
        for rk in self.rkeys.drain(..) {
            // SAFETY: each rkey was unpacked on this endpoint and is destroyed once,
            // before the endpoint itself.
            unsafe { sys::ucp_rkey_destroy(rk) };
        }
    }
}
