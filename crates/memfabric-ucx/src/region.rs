//! Registered memory: a region of ours registered with UCX (or allocated by UCX) and its
//! packed remote key; `Context` and `Worker` hand them out.
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use crate::context::Context;
use crate::status::{check, Error, Result};
use crate::sys;
use crate::worker::Worker;

impl Worker {
    /// Register `len` bytes at `addr` with UCX, for zero-copy sends/receives and remote
    /// reads. The memory must stay mapped while the region lives (the caller's arena is a
    /// mapping that is never moved or unmapped before the server exits).
    pub fn mem_map(&self, addr: *mut u8, len: usize) -> Result<MemRegion> {
        MemRegion::new(self.context(), addr, len)
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
        // SAFETY: buf came from the successful ucp_rkey_pack above and is released once,
        // after the copy; nothing refers to it afterwards.
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

impl Context {
    /// Let UCX allocate and register `len` zero-filled bytes (see `MemRegion::allocate`):
    /// memory that same-host peers can map directly.
    pub fn mem_alloc(self: &Arc<Self>, len: usize) -> Result<AllocatedRegion> {
        MemRegion::allocate(self, len)
    }

    /// Register `len` bytes at `addr` with UCX (see `Worker::mem_map`). The memory must
    /// stay mapped while the region lives.
    pub fn mem_map(self: &Arc<Self>, addr: *mut u8, len: usize) -> Result<MemRegion> {
        MemRegion::new(self, addr, len)
    }
}
