//! The UCP context: one per process, shared by every worker.
use std::ptr;
use std::sync::{Arc, Mutex};

use crate::status::{check, Result};
use crate::sys;

/// A UCP application context with the AM, RMA and WAKEUP features. Its configuration
/// comes from the `UCX_*` environment variables (`UCX_TLS`, `UCX_NET_DEVICES`, ...).
pub struct Context {
    pub(crate) h: sys::ucp_context_h,
    /// Serialises worker creation and destruction: workers are created by the threads that
    /// own them, and the context's worker list is not ours to race on.
    pub(crate) workers_lock: Mutex<()>,
}

// SAFETY: UCX (built with --enable-mt, as Debian's is) allows a context to be used from
// several threads once created; the only context-level calls made after creation are
// worker creation/destruction (serialised by `workers_lock`) and memory (un)mapping and
// rkey packing, which UCX protects with the context's own lock.
unsafe impl Send for Context {}
// SAFETY: see `Send`.
unsafe impl Sync for Context {}

impl Context {
    /// Create a context named `name` (shown in UCX's own logs).
    ///
    /// One setting differs from UCX's default unless the environment sets it:
    /// `RNDV_SCHEME=get_zcopy`. The receiver of a rendezvous message *pulls* the data (the
    /// server reads a SET's value into item memory, a client reads a GET's value), so a
    /// sender that dies mid-transfer makes the read fail at once instead of leaving the
    /// receiver waiting for data that never comes. UCX falls back to another scheme where
    /// a transport cannot read remotely.
    pub fn new(name: &str) -> Result<Arc<Context>> {
        Context::create(name, false, None, None, true)
    }

    /// [`Context::new`] for a server: also `PROTO_INDIRECT_ID=on` unless the environment
    /// sets it. Endpoint ids on the wire are then indices, not pointers, whatever the
    /// endpoints' error handling mode: a message naming an endpoint UCX has destroyed
    /// fails its lookup instead of following a dangling pointer. UCX 1.13 destroys the
    /// endpoint it made for a peer when a transfer with that peer fails (a copy from a
    /// client that died) while that peer's rendezvous offers are still queued, and
    /// memfabricd aborted in `ucp_worker_get_ep_by_id`. Not for clients: with indirect ids
    /// UCX asserts, when the worker goes, that no endpoint still has requests (a client
    /// dropped with requests to a dead server aborted).
    ///
    /// `estimated_eps` is UCX's hint of how many endpoints the context will hold
    /// (`estimated_num_eps`): UCX picks transports by it (on InfiniBand, RC for a few
    /// peers, DC or UD when there will be many), unless `UCX_NUM_EPS` overrides it.
    ///
    /// `tls`, when given, replaces `UCX_TLS` for this context only (a server may hold
    /// contexts on different transport sets); with `warn_unavailable` false UCX does not
    /// warn about listed transports this machine lacks (a default list names the scalable
    /// transports of several fabrics, most of them absent on any one machine).
    ///
    /// `rma` false leaves out the RMA feature: a context whose peers never read its
    /// memory one-sidedly (a server's cold tier) then has no RMA lanes in its endpoints,
    /// which makes each of them smaller. Rendezvous still works (UCX moves the data with
    /// active messages where it cannot read remotely).
    pub fn new_server(
        name: &str,
        estimated_eps: usize,
        tls: Option<&str>,
        warn_unavailable: bool,
        rma: bool,
    ) -> Result<Arc<Context>> {
        Context::create(
            name,
            true,
            Some(estimated_eps),
            tls.map(|t| (t, warn_unavailable)),
            rma,
        )
    }

    fn create(
        name: &str,
        indirect_ids: bool,
        estimated_eps: Option<usize>,
        tls: Option<(&str, bool)>,
        rma: bool,
    ) -> Result<Arc<Context>> {
        crate::ucx_log::install();
        let mut config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: NULL env prefix and file name mean "UCX_ from the environment"; config is
        // an out-pointer that UCX fills on success.
        check(unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) })?;
        if std::env::var_os("UCX_RNDV_SCHEME").is_none() {
            // SAFETY: config is live; both strings are NUL-terminated literals. A failure
            // (an option this UCX does not know) leaves UCX's default in place.
            let _ = unsafe {
                sys::ucp_config_modify(config, c"RNDV_SCHEME".as_ptr(), c"get_zcopy".as_ptr())
            };
        }
        if indirect_ids && std::env::var_os("UCX_PROTO_INDIRECT_ID").is_none() {
            // SAFETY: as above.
            let _ = unsafe {
                sys::ucp_config_modify(config, c"PROTO_INDIRECT_ID".as_ptr(), c"on".as_ptr())
            };
        }
        if let Some((list, warn)) = tls {
            let list = std::ffi::CString::new(list).map_err(|_| crate::Error::invalid_param())?;
            // SAFETY: config is live; both strings are NUL-terminated.
            let st = unsafe { sys::ucp_config_modify(config, c"TLS".as_ptr(), list.as_ptr()) };
            if let Err(e) = check(st) {
                // SAFETY: released once, as below.
                unsafe { sys::ucp_config_release(config) };
                return Err(e);
            }
            if !warn {
                // SAFETY: as above. A UCX without the option keeps warning; harmless.
                let _ = unsafe {
                    sys::ucp_config_modify(config, c"WARN_INVALID_CONFIG".as_ptr(), c"n".as_ptr())
                };
            }
        }
        let cname = std::ffi::CString::new(name).unwrap_or_default();
        // Every context is shared by workers of different threads (a server's worker
        // threads; a client process's `Client`s, one per thread): UCX makes the context's
        // own state thread safe (its memory registration cache, which rendezvous transfers
        // use, and the lock `Send`/`Sync` below rely on) only when told so
        // (`mt_workers_shared`, ucp.h); without it that lock does nothing.
        let mut params = sys::ucp_params_t {
            field_mask: (sys::UCP_PARAM_FIELD_FEATURES
                | sys::UCP_PARAM_FIELD_NAME
                | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED) as u64,
            features: (sys::UCP_FEATURE_AM
                | if rma { sys::UCP_FEATURE_RMA } else { 0 }
                | sys::UCP_FEATURE_WAKEUP) as u64,
            name: cname.as_ptr(),
            mt_workers_shared: 1,
            ..Default::default()
        };
        if let Some(n) = estimated_eps {
            params.field_mask |= sys::UCP_PARAM_FIELD_ESTIMATED_NUM_EPS as u64;
            params.estimated_num_eps = n.max(1);
        }
        let mut h: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params is fully initialised for the fields named in field_mask; config is
        // the live configuration read above; h is an out-pointer. ucp_init is a static
        // inline wrapper in the header, so its body (ucp_init_version with the header's API
        // version) is called directly.
        let st = unsafe {
            sys::ucp_init_version(
                sys::UCP_API_MAJOR,
                sys::UCP_API_MINOR,
                &params,
                config,
                &mut h,
            )
        };
        // SAFETY: config came from ucp_config_read and is released exactly once; UCX copied
        // what it needs during ucp_init.
        unsafe { sys::ucp_config_release(config) };
        check(st)?;
        Ok(Arc::new(Context {
            h,
            workers_lock: Mutex::new(()),
        }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every Worker holds an Arc<Context>, so no worker is alive here; h came
        // from ucp_init and is cleaned up once.
        unsafe { sys::ucp_cleanup(self.h) };
    }
}
