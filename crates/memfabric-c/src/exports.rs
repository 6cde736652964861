//! The exported `extern "C"` functions: libmemcached 1.1.4's names and signatures. Each
//! converts the C arguments (NULL accepted where libmemcached accepts it) and calls the
//! safe [`Pool`]. Values handed to the caller are `malloc`ed, as libmemcached's are, so the
//! caller's `free` releases them.

#![allow(clippy::missing_safety_doc)]
#![allow(clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

use memfabric_client::{Op, Reply, StoreMode, Value};

use crate::abi::{
    self, Allocators, CallocFn, FreeFn, MallocFn, McResult, McSt, McStat, Rc, ReallocFn,
};
use crate::config;
use crate::hash::Hash;
use crate::pool::{Pool, TransportChoice};

pub type InstancePtr = *const crate::pool::Instance;
type ServerFn = Option<unsafe extern "C" fn(*const McSt, InstancePtr, *mut c_void) -> Rc>;
type ResultFn = Option<unsafe extern "C" fn(*const McSt, *mut McResult, *mut c_void) -> Rc>;
type CleanupFn = unsafe extern "C" fn(*const McSt) -> Rc;
type CloneFn = unsafe extern "C" fn(*mut McSt, *const McSt) -> Rc;

// ----- helpers ---------------------------------------------------------------------------

/// The pool of a `memcached_st`; None for NULL or a struct not (or no longer) created.
unsafe fn pool<'a>(mc: *const McSt) -> Option<&'a mut Pool> {
    if mc.is_null() {
        return None;
    }
    // SAFETY: the caller passes a memcached_st it created (libmemcached's contract); its
    // `pool` is NULL or the Box<Pool> made by memcached_create, owned by this struct.
    unsafe { (*mc).pool.cast::<Pool>().as_mut() }
}

/// The bytes of a (pointer, length) argument; NULL is empty.
unsafe fn bytes<'a>(p: *const c_char, len: usize) -> &'a [u8] {
    if p.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller promises `len` readable bytes at `p` (the C API's contract).
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

unsafe fn cstr<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL `const char *` argument is a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

unsafe fn set<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: a non-NULL out-parameter points at writable memory of its type.
        unsafe { out.write(v) };
    }
}

/// The allocator memory handed to callers of `mc` comes from: theirs, or the C library's.
#[derive(Clone, Copy)]
struct Alloc {
    mc: *const McSt,
    custom: Option<Allocators>,
}

impl Alloc {
    /// `mc`'s allocator (the C library's for NULL or a freed struct).
    unsafe fn of(mc: *const McSt) -> Alloc {
        // SAFETY: NULL or a created memcached_st.
        let custom = unsafe { pool(mc) }.and_then(|p| p.allocators);
        Alloc { mc, custom }
    }

    fn malloc(self, size: usize) -> *mut c_void {
        match self.custom {
            // SAFETY: the caller's allocator, called as libmemcached calls it.
            Some(a) => unsafe { (a.malloc)(self.mc, size, a.context) },
            // SAFETY: plain malloc.
            None => unsafe { libc::malloc(size) },
        }
    }

    fn calloc(self, n: usize, size: usize) -> *mut c_void {
        match self.custom {
            // SAFETY: the caller's allocator, called as libmemcached calls it.
            Some(a) => unsafe { (a.calloc)(self.mc, n, size, a.context) },
            // SAFETY: plain calloc.
            None => unsafe { libc::calloc(n, size) },
        }
    }

    /// `p` is NULL or came from this allocator.
    unsafe fn realloc(self, p: *mut c_void, size: usize) -> *mut c_void {
        match self.custom {
            // SAFETY: the caller's allocator, on its own memory.
            Some(a) => unsafe { (a.realloc)(self.mc, p, size, a.context) },
            // SAFETY: plain realloc of malloc'd memory.
            None => unsafe { libc::realloc(p, size) },
        }
    }

    /// `p` is NULL or came from this allocator.
    unsafe fn free(self, p: *mut c_void) {
        if p.is_null() {
            return;
        }
        match self.custom {
            // SAFETY: the caller's allocator, on its own memory.
            Some(a) => unsafe { (a.free)(self.mc, p, a.context) },
            // SAFETY: plain free of malloc'd memory.
            None => unsafe { libc::free(p) },
        }
    }

    /// A NUL-terminated copy the caller frees. NULL if out of memory.
    fn copy(self, data: &[u8]) -> *mut c_char {
        let p = self.malloc(data.len() + 1).cast::<u8>();
        if !p.is_null() {
            // SAFETY: `p` has len + 1 bytes.
            unsafe {
                ptr::copy_nonoverlapping(data.as_ptr(), p, data.len());
                *p.add(data.len()) = 0;
            }
        }
        p.cast()
    }
}

/// Mirrors the pool's settings into the public fields of the struct (callers may read
/// them, as the header shows them).
/// `p` is the struct's pool, passed by the caller that holds it (a second reference made
/// here from the struct's pointer would alias the caller's).
unsafe fn sync_public(mc: *mut McSt, p: &Pool) {
    // SAFETY: `mc` is a created memcached_st; the pool is a separate allocation, so this
    // reference does not overlap `p`.
    let m = unsafe { &mut *mc };
    let b = &p.behaviors;
    m.number_of_hosts = p.server_count() as u32;
    m.distribution = b.distribution as u32;
    m.snd_timeout = b.snd_timeout;
    m.rcv_timeout = b.rcv_timeout;
    m.poll_timeout = b.poll_timeout;
    m.connect_timeout = b.connect_timeout;
    m.retry_timeout = b.retry_timeout;
    m.dead_timeout = b.dead_timeout;
    m.send_size = b.send_size;
    m.recv_size = b.recv_size;
    m.number_of_replicas = b.replicas;
    m.server_failure_limit = b.server_failure_limit;
    m.server_timeout_limit = b.server_timeout_limit;
    m.io_msg_watermark = b.io_msg_watermark;
    m.io_bytes_watermark = b.io_bytes_watermark;
    m.io_key_prefetch = b.io_key_prefetch;
    m.tcp_keepidle = b.tcp_keepidle;
    let bit = |on: bool, n: u8| if on { 1u8 << n } else { 0 };
    m.flags[0] = bit(b.auto_eject, 0)
        | bit(b.binary, 1)
        | bit(b.buffer_requests, 2)
        | bit(b.hash_with_namespace, 3)
        | bit(b.no_block, 4)
        | bit(!b.noreply, 5)
        | bit(b.randomize_replica_read, 6)
        | bit(b.support_cas, 7);
    m.flags[1] = bit(b.tcp_nodelay, 0)
        | bit(b.sort_hosts, 1)
        | bit(b.use_udp, 2)
        | bit(b.verify_key, 3)
        | bit(b.tcp_keepalive, 4);
}

// ----- create, free, clone -----------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn memcached_create(ptr: *mut McSt) -> *mut McSt {
    let mc = if ptr.is_null() {
        // SAFETY: McSt is integers and raw pointers: all zeroes is a valid value.
        let b: Box<McSt> = Box::new(unsafe { std::mem::zeroed() });
        let raw = Box::into_raw(b);
        // SAFETY: just allocated.
        unsafe { (*raw).options = 1 };
        raw
    } else {
        // SAFETY: the caller hands us sizeof(memcached_st) bytes to initialise.
        unsafe { ptr::write_bytes(ptr, 0, 1) };
        ptr
    };
    // SAFETY: `mc` is valid and zeroed above.
    unsafe {
        (*mc).pool = Box::into_raw(Box::<Pool>::default()).cast();
        sync_public(mc, &*(*mc).pool.cast::<Pool>());
    }
    mc
}

#[no_mangle]
pub unsafe extern "C" fn memcached_free(ptr: *mut McSt) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: a created memcached_st; its pool pointer is ours (or NULL after a free).
    unsafe {
        let p = (*ptr).pool.cast::<Pool>();
        if p.is_null() {
            return;
        }
        if (*p).cleanup_fn != 0 {
            let f: CleanupFn = std::mem::transmute::<usize, CleanupFn>((*p).cleanup_fn);
            f(ptr);
        }
        (*ptr).pool = ptr::null_mut();
        drop(Box::from_raw(p));
        if (*ptr).options & 1 != 0 {
            drop(Box::from_raw(ptr));
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_clone(dst: *mut McSt, src: *const McSt) -> *mut McSt {
    // SAFETY: `dst` is NULL or caller memory for a memcached_st.
    let mc = unsafe { memcached_create(dst) };
    // SAFETY: `src` is NULL or a created memcached_st.
    if let Some(s) = unsafe { pool(src) } {
        let cloned = s.clone_settings();
        let clone_fn = cloned.clone_fn;
        // SAFETY: `mc` was just created; its pool is replaced by the clone.
        unsafe {
            drop(Box::from_raw((*mc).pool.cast::<Pool>()));
            (*mc).pool = Box::into_raw(Box::new(cloned)).cast();
            (*mc).user_data = (*src).user_data;
            sync_public(mc, &*(*mc).pool.cast::<Pool>());
            if clone_fn != 0 {
                let f: CloneFn = std::mem::transmute::<usize, CloneFn>(clone_fn);
                f(mc, src);
            }
        }
    }
    mc
}

/// `memcached()`: a pool from a configuration string; NULL if it does not parse. A NULL
/// string reads the `LIBMEMCACHED` environment variable.
#[no_mangle]
pub unsafe extern "C" fn memcached(string: *const c_char, length: usize) -> *mut McSt {
    let text = if string.is_null() {
        match std::env::var("LIBMEMCACHED") {
            Ok(t) => t,
            // SAFETY: no configuration: a plain pool.
            Err(_) => return unsafe { memcached_create(ptr::null_mut()) },
        }
    } else {
        // SAFETY: `length` bytes at `string`.
        String::from_utf8_lossy(unsafe { bytes(string, length) }).into_owned()
    };
    let Ok(parsed) = config::parse(&text) else {
        return ptr::null_mut();
    };
    // SAFETY: a new pool, configured below.
    let mc = unsafe { memcached_create(ptr::null_mut()) };
    // SAFETY: just created.
    let p = unsafe { pool(mc) }.expect("created");
    for s in &parsed.servers {
        p.add_server(&s.host, s.port, s.weight);
    }
    for &(b, v) in &parsed.behaviors {
        p.behaviors.set(b, v);
    }
    if let Some(ns) = parsed.namespace {
        p.namespace = CString::new(ns).ok();
    }
    // SAFETY: `mc` is valid.
    unsafe { sync_public(mc, p) };
    mc
}

#[no_mangle]
pub unsafe extern "C" fn libmemcached_check_configuration(
    option_string: *const c_char,
    length: usize,
    error_buffer: *mut c_char,
    error_buffer_size: usize,
) -> Rc {
    // SAFETY: `length` bytes at `option_string`.
    let text = String::from_utf8_lossy(unsafe { bytes(option_string, length) }).into_owned();
    let (rc, msg) = match config::parse(&text) {
        Ok(_) => (abi::SUCCESS, String::new()),
        Err(m) if text.trim().is_empty() => (abi::INVALID_ARGUMENTS, m),
        Err(m) => (abi::PARSE_ERROR, m),
    };
    if !error_buffer.is_null() && error_buffer_size > 0 {
        let n = msg.len().min(error_buffer_size - 1);
        // SAFETY: the caller gave `error_buffer_size` writable bytes.
        unsafe {
            ptr::copy_nonoverlapping(msg.as_ptr(), error_buffer.cast::<u8>(), n);
            *error_buffer.add(n) = 0;
        }
    }
    rc
}

// ----- errors and versions -----------------------------------------------------------------

#[no_mangle]
pub extern "C" fn memcached_strerror(_ptr: *const McSt, rc: Rc) -> *const c_char {
    abi::strerror(rc).as_ptr().cast()
}

#[no_mangle]
pub unsafe extern "C" fn memcached_last_error(ptr: *const McSt) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) } {
        Some(p) => p.last_rc,
        None => abi::INVALID_ARGUMENTS,
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_last_error_message(ptr: *const McSt) -> *const c_char {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) } {
        Some(p) => p.last_message.as_ptr(),
        None => abi::strerror(abi::INVALID_ARGUMENTS).as_ptr().cast(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_last_error_errno(_ptr: *const McSt) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn memcached_lib_version() -> *const c_char {
    c"1.1.4".as_ptr()
}

// ----- behaviours and callbacks ------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn memcached_behavior_set(ptr: *mut McSt, flag: u32, data: u64) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    let rc = p.behaviors.set(flag, data);
    if rc == abi::SUCCESS {
        p.behavior_changed(flag);
        // SAFETY: `ptr` is valid (its pool was found).
        unsafe { sync_public(ptr, p) };
    }
    p.note(rc)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_behavior_get(ptr: *mut McSt, flag: u32) -> u64 {
    // SAFETY: NULL or a created memcached_st.
    // libmemcached answers a NULL struct with the code INVALID_ARGUMENTS as the value.
    unsafe { pool(ptr) }.map_or(abi::INVALID_ARGUMENTS as u64, |p| p.behaviors.get(flag))
}

#[no_mangle]
pub unsafe extern "C" fn memcached_behavior_set_distribution(ptr: *mut McSt, d: u32) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_behavior_set(ptr, 9, d.into()) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_behavior_get_distribution(ptr: *mut McSt) -> u32 {
    // SAFETY: forwarded.
    unsafe { memcached_behavior_get(ptr, 9) as u32 }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_behavior_set_key_hash(ptr: *mut McSt, h: u32) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_behavior_set(ptr, 2, h.into()) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_behavior_get_key_hash(ptr: *mut McSt) -> u32 {
    // SAFETY: forwarded.
    unsafe { memcached_behavior_get(ptr, 2) as u32 }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_behavior_set_distribution_hash(ptr: *mut McSt, h: u32) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_behavior_set(ptr, 17, h.into()) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_behavior_get_distribution_hash(ptr: *mut McSt) -> u32 {
    // SAFETY: forwarded.
    unsafe { memcached_behavior_get(ptr, 17) as u32 }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_callback_set(
    ptr: *mut McSt,
    flag: u32,
    data: *const c_void,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    let rc = match flag {
        0 => {
            // SAFETY: the namespace is a C string or NULL.
            match unsafe { cstr(data.cast()) } {
                None | Some("") => {
                    p.namespace = None;
                    abi::SUCCESS
                }
                Some(ns) if ns.len() > crate::pool::MAX_NAMESPACE => abi::KEY_TOO_BIG,
                Some(ns)
                    if p.behaviors.verify_key && !ns.bytes().all(|b| b > b' ' && b != 0x7f) =>
                {
                    abi::BAD_KEY_PROVIDED
                }
                Some(ns) => {
                    p.namespace = CString::new(ns).ok();
                    abi::SUCCESS
                }
            }
        }
        1 => {
            // SAFETY: `ptr` is valid.
            unsafe { (*ptr).user_data = data.cast_mut() };
            abi::SUCCESS
        }
        2 => {
            p.cleanup_fn = data as usize;
            abi::SUCCESS
        }
        3 => {
            p.clone_fn = data as usize;
            abi::SUCCESS
        }
        // Read-through (GET_FAILURE) and DELETE_TRIGGER are not implemented: refusing
        // them tells the caller, where accepting would silently ignore them.
        7 | 8 => abi::NOT_SUPPORTED,
        _ => abi::FAILURE,
    };
    p.note(rc)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_callback_get(
    ptr: *mut McSt,
    flag: u32,
    error: *mut Rc,
) -> *mut c_void {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null_mut();
    };
    let (rc, v): (Rc, *mut c_void) = match flag {
        0 => match &p.namespace {
            Some(ns) => (abi::SUCCESS, ns.as_ptr().cast_mut().cast()),
            None => (abi::FAILURE, ptr::null_mut()),
        },
        // SAFETY: `ptr` is valid.
        1 => (abi::SUCCESS, unsafe { (*ptr).user_data }),
        2 => (abi::SUCCESS, p.cleanup_fn as *mut c_void),
        3 => (abi::SUCCESS, p.clone_fn as *mut c_void),
        _ => (abi::FAILURE, ptr::null_mut()),
    };
    // SAFETY: out-parameter.
    unsafe { set(error, rc) };
    v
}

#[no_mangle]
pub unsafe extern "C" fn memcached_set_user_data(ptr: *mut McSt, data: *mut c_void) -> *mut c_void {
    if ptr.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: a created memcached_st.
    unsafe { std::mem::replace(&mut (*ptr).user_data, data) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_get_user_data(ptr: *const McSt) -> *mut c_void {
    if ptr.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: a created memcached_st.
    unsafe { (*ptr).user_data }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_set_sasl_auth_data(
    ptr: *mut McSt,
    user: *const c_char,
    pass: *const c_char,
) -> Rc {
    // SAFETY: NULL or a created memcached_st; C strings.
    let (Some(p), Some(u), Some(pw)) = (unsafe { pool(ptr) }, unsafe { cstr(user) }, unsafe {
        cstr(pass)
    }) else {
        return abi::INVALID_ARGUMENTS;
    };
    p.credentials = Some(memfabric_client::Credentials {
        username: u.to_string(),
        password: pw.to_string(),
    });
    p.settings_changed();
    abi::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn memcached_destroy_sasl_auth_data(ptr: *mut McSt) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    if p.credentials.take().is_some() {
        p.settings_changed();
    }
    abi::SUCCESS
}

// ----- servers -----------------------------------------------------------------------------

/// What `memcached_server_list_st` points at for lists this library makes.
pub struct ServerList {
    entries: Vec<config::ServerSpec>,
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_add_with_weight(
    ptr: *mut McSt,
    host: *const c_char,
    port: u16,
    weight: u32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    // SAFETY: C string or NULL (libmemcached takes NULL as localhost).
    let host = unsafe { cstr(host) }.unwrap_or("localhost");
    if host.is_empty() {
        return p.note(abi::INVALID_ARGUMENTS);
    }
    p.add_server(host, port, weight);
    // SAFETY: valid.
    unsafe { sync_public(ptr, p) };
    abi::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_add(
    ptr: *mut McSt,
    host: *const c_char,
    port: u16,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_server_add_with_weight(ptr, host, port, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_add_unix_socket_with_weight(
    ptr: *mut McSt,
    _path: *const c_char,
    _weight: u32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) } {
        Some(p) => p.fail(
            abi::NOT_SUPPORTED,
            "Unix sockets are not supported by libmemfabric",
        ),
        None => abi::INVALID_ARGUMENTS,
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_add_unix_socket(
    ptr: *mut McSt,
    path: *const c_char,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_server_add_unix_socket_with_weight(ptr, path, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_add_udp_with_weight(
    ptr: *mut McSt,
    _host: *const c_char,
    _port: u16,
    _weight: u32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) } {
        Some(p) => p.fail(
            abi::NOT_SUPPORTED,
            "UDP servers are not supported by libmemfabric",
        ),
        None => abi::INVALID_ARGUMENTS,
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_add_udp(
    ptr: *mut McSt,
    host: *const c_char,
    port: u16,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_server_add_udp_with_weight(ptr, host, port, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_count(ptr: *const McSt) -> u32 {
    // SAFETY: NULL or a created memcached_st.
    unsafe { pool(ptr) }.map_or(0, |p| p.server_count() as u32)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_servers_reset(ptr: *mut McSt) {
    // SAFETY: NULL or a created memcached_st.
    if let Some(p) = unsafe { pool(ptr) } {
        p.reset_servers();
        // SAFETY: valid.
        unsafe { sync_public(ptr, p) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_servers_parse(list: *const c_char) -> *mut ServerList {
    // SAFETY: C string or NULL.
    let Some(text) = (unsafe { cstr(list) }) else {
        return ptr::null_mut();
    };
    let mut entries = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        // libmemcached's form: host[:port[:weight]].
        let mut parts = item.splitn(3, ':');
        let host = parts.next().unwrap_or_default().to_string();
        let port = parts
            .next()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .unwrap_or(0) as u16;
        let weight = parts
            .next()
            .and_then(|w| w.trim().parse::<u32>().ok())
            .unwrap_or(0);
        entries.push(config::ServerSpec { host, port, weight });
    }
    Box::into_raw(Box::new(ServerList { entries }))
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_list_free(list: *mut ServerList) {
    if !list.is_null() {
        // SAFETY: made by memcached_servers_parse / memcached_server_list_append.
        drop(unsafe { Box::from_raw(list) });
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_list_count(list: *const ServerList) -> u32 {
    // SAFETY: NULL or one of our lists.
    unsafe { list.as_ref() }.map_or(0, |l| l.entries.len() as u32)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_list_append_with_weight(
    list: *mut ServerList,
    host: *const c_char,
    port: u16,
    weight: u32,
    error: *mut Rc,
) -> *mut ServerList {
    // SAFETY: C string or NULL.
    let host = unsafe { cstr(host) }.unwrap_or("localhost").to_string();
    let list = if list.is_null() {
        Box::into_raw(Box::new(ServerList {
            entries: Vec::new(),
        }))
    } else {
        list
    };
    // SAFETY: one of our lists.
    unsafe {
        (*list)
            .entries
            .push(config::ServerSpec { host, port, weight })
    };
    // SAFETY: out-parameter.
    unsafe { set(error, abi::SUCCESS) };
    list
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_list_append(
    list: *mut ServerList,
    host: *const c_char,
    port: u16,
    error: *mut Rc,
) -> *mut ServerList {
    // SAFETY: forwarded.
    unsafe { memcached_server_list_append_with_weight(list, host, port, 0, error) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_push(ptr: *mut McSt, list: *const ServerList) -> Rc {
    // SAFETY: NULL or a created memcached_st; NULL or one of our lists.
    let (Some(p), Some(l)) = (unsafe { pool(ptr) }, unsafe { list.as_ref() }) else {
        return abi::SUCCESS;
    };
    for s in &l.entries {
        p.add_server(&s.host, s.port, s.weight);
    }
    // SAFETY: valid.
    unsafe { sync_public(ptr, p) };
    abi::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_cursor(
    ptr: *const McSt,
    callbacks: *const ServerFn,
    context: *mut c_void,
    n: u32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    if p.server_count() == 0 {
        return abi::NO_SERVERS;
    }
    let instances: Vec<InstancePtr> = (0..p.server_count())
        .filter_map(|i| p.instance(i).map(|x| x as *const _))
        .collect();
    // As libmemcached: a failing callback skips the rest of that server's callbacks, the
    // other servers are still visited, and the call says SOME ERRORS.
    let mut rc = abi::SUCCESS;
    for inst in instances {
        for k in 0..n as usize {
            // SAFETY: the caller passes `n` callbacks.
            let Some(f) = (unsafe { *callbacks.add(k) }) else {
                continue;
            };
            // SAFETY: a C callback with libmemcached's signature.
            if unsafe { f(ptr, inst, context) } != abi::SUCCESS {
                rc = abi::SOME_ERRORS;
                break;
            }
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_instance_by_position(
    ptr: *const McSt,
    i: u32,
) -> InstancePtr {
    // SAFETY: NULL or a created memcached_st.
    unsafe { pool(ptr) }
        .and_then(|p| p.instance(i as usize).map(|x| x as *const _))
        .unwrap_or(ptr::null())
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_by_key(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    error: *mut Rc,
) -> InstancePtr {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null();
    };
    if p.server_count() == 0 {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::NO_SERVERS) };
        return ptr::null();
    }
    // SAFETY: `key_length` bytes.
    let i = p.place(unsafe { bytes(key, key_length) });
    // SAFETY: out-parameter.
    unsafe { set(error, abi::SUCCESS) };
    p.instance(i).map_or(ptr::null(), |x| x as *const _)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_name(instance: InstancePtr) -> *const c_char {
    // SAFETY: NULL or an instance handed out by this library.
    unsafe { instance.as_ref() }.map_or(ptr::null(), |i| i.hostname.as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_port(instance: InstancePtr) -> u16 {
    // SAFETY: NULL or an instance handed out by this library.
    unsafe { instance.as_ref() }.map_or(0, |i| i.port)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_type(instance: InstancePtr) -> *const c_char {
    // SAFETY: NULL or an instance handed out by this library.
    unsafe { instance.as_ref() }.map_or(ptr::null(), |_| c"TCP".as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_major_version(instance: InstancePtr) -> u8 {
    // SAFETY: NULL or an instance handed out by this library.
    unsafe { instance.as_ref() }.map_or(0, |i| i.version.0)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_minor_version(instance: InstancePtr) -> u8 {
    // SAFETY: NULL or an instance handed out by this library.
    unsafe { instance.as_ref() }.map_or(0, |i| i.version.1)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_micro_version(instance: InstancePtr) -> u8 {
    // SAFETY: NULL or an instance handed out by this library.
    unsafe { instance.as_ref() }.map_or(0, |i| i.version.2)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_error_return(instance: InstancePtr) -> Rc {
    // SAFETY: NULL or an instance handed out by this library.
    unsafe { instance.as_ref() }.map_or(abi::INVALID_ARGUMENTS, |i| i.last_rc)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_error(instance: InstancePtr) -> *const c_char {
    // SAFETY: NULL or an instance handed out by this library.
    unsafe { instance.as_ref() }
        .and_then(|i| i.last_message.as_ref().map(|m| m.as_ptr()))
        .unwrap_or(ptr::null())
}

#[no_mangle]
pub unsafe extern "C" fn memcached_server_get_last_disconnect(_ptr: *const McSt) -> InstancePtr {
    ptr::null()
}

#[no_mangle]
pub unsafe extern "C" fn memcached_quit(ptr: *mut McSt) {
    // SAFETY: NULL or a created memcached_st.
    if let Some(p) = unsafe { pool(ptr) } {
        p.quit();
    }
}

// ----- hashing -----------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn memcached_generate_hash(
    ptr: *const McSt,
    key: *const c_char,
    key_length: usize,
) -> u32 {
    // SAFETY: NULL or a created memcached_st; `key_length` bytes at `key`.
    unsafe { pool(ptr) }.map_or(0, |p| p.place(unsafe { bytes(key, key_length) }) as u32)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_generate_hash_value(
    key: *const c_char,
    key_length: usize,
    hash: u32,
) -> u32 {
    // SAFETY: `key_length` bytes at `key`.
    let k = unsafe { bytes(key, key_length) };
    Hash::from_number(hash.into()).map_or(0, |h| h.hash(k))
}

#[no_mangle]
pub extern "C" fn libmemcached_string_hash(hash: u32) -> *const c_char {
    let names: [&CStr; 13] = [
        c"MEMCACHED_HASH_DEFAULT",
        c"MEMCACHED_HASH_MD5",
        c"MEMCACHED_HASH_CRC",
        c"MEMCACHED_HASH_FNV1_64",
        c"MEMCACHED_HASH_FNV1A_64",
        c"MEMCACHED_HASH_FNV1_32",
        c"MEMCACHED_HASH_FNV1A_32",
        c"MEMCACHED_HASH_HSIEH",
        c"MEMCACHED_HASH_MURMUR",
        c"MEMCACHED_HASH_JENKINS",
        c"MEMCACHED_HASH_MURMUR3",
        c"MEMCACHED_HASH_CUSTOM",
        c"MEMCACHED_HASH_MAX",
    ];
    names
        .get(hash as usize)
        .map_or(c"INVALID memcached_hash_t".as_ptr(), |n| n.as_ptr())
}

// ----- storage -----------------------------------------------------------------------------

unsafe fn store(
    ptr: *mut McSt,
    group: *const c_char,
    group_length: usize,
    key: *const c_char,
    key_length: usize,
    value: *const c_char,
    value_length: usize,
    expiration: libc::time_t,
    flags: u32,
    mode: StoreMode,
    cas: u64,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    // SAFETY: (pointer, length) arguments.
    let (g, k, v) = unsafe {
        (
            bytes(group, group_length),
            bytes(key, key_length),
            bytes(value, value_length),
        )
    };
    let group = (!g.is_empty()).then_some(g);
    p.store(group, k, v, expiration, flags, mode, cas)
}

macro_rules! storage {
    ($name:ident, $by_key:ident, $mode:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            ptr: *mut McSt,
            key: *const c_char,
            key_length: usize,
            value: *const c_char,
            value_length: usize,
            expiration: libc::time_t,
            flags: u32,
        ) -> Rc {
            // SAFETY: forwarded with the caller's arguments.
            unsafe {
                store(
                    ptr,
                    ptr::null(),
                    0,
                    key,
                    key_length,
                    value,
                    value_length,
                    expiration,
                    flags,
                    $mode,
                    0,
                )
            }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $by_key(
            ptr: *mut McSt,
            group_key: *const c_char,
            group_key_length: usize,
            key: *const c_char,
            key_length: usize,
            value: *const c_char,
            value_length: usize,
            expiration: libc::time_t,
            flags: u32,
        ) -> Rc {
            // SAFETY: forwarded with the caller's arguments.
            unsafe {
                store(
                    ptr,
                    group_key,
                    group_key_length,
                    key,
                    key_length,
                    value,
                    value_length,
                    expiration,
                    flags,
                    $mode,
                    0,
                )
            }
        }
    };
}

storage!(memcached_set, memcached_set_by_key, StoreMode::Set);
storage!(memcached_add, memcached_add_by_key, StoreMode::Add);
storage!(
    memcached_replace,
    memcached_replace_by_key,
    StoreMode::Replace
);
storage!(memcached_append, memcached_append_by_key, StoreMode::Append);
storage!(
    memcached_prepend,
    memcached_prepend_by_key,
    StoreMode::Prepend
);

#[no_mangle]
pub unsafe extern "C" fn memcached_cas(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    value: *const c_char,
    value_length: usize,
    expiration: libc::time_t,
    flags: u32,
    cas: u64,
) -> Rc {
    // SAFETY: forwarded with the caller's arguments.
    unsafe {
        store(
            ptr,
            ptr::null(),
            0,
            key,
            key_length,
            value,
            value_length,
            expiration,
            flags,
            StoreMode::Cas,
            cas,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_cas_by_key(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
    value: *const c_char,
    value_length: usize,
    expiration: libc::time_t,
    flags: u32,
    cas: u64,
) -> Rc {
    // SAFETY: forwarded with the caller's arguments.
    unsafe {
        store(
            ptr,
            group_key,
            group_key_length,
            key,
            key_length,
            value,
            value_length,
            expiration,
            flags,
            StoreMode::Cas,
            cas,
        )
    }
}

// ----- reads -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn memcached_get_by_key(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
    value_length: *mut usize,
    flags: *mut u32,
    error: *mut Rc,
) -> *mut c_char {
    // SAFETY: out-parameters, cleared first as libmemcached does.
    unsafe {
        set(value_length, 0);
        set(flags, 0);
    }
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null_mut();
    };
    // SAFETY: (pointer, length) arguments.
    let (g, k) = unsafe { (bytes(group_key, group_key_length), bytes(key, key_length)) };
    match p.get((!g.is_empty()).then_some(g), k) {
        Ok(v) => {
            // SAFETY: out-parameters.
            unsafe {
                set(value_length, v.data.len());
                set(flags, v.flags);
                set(error, abi::SUCCESS);
            }
            // libmemcached hands out NULL for an empty value (with SUCCESS).
            if v.data.is_empty() {
                ptr::null_mut()
            } else {
                // SAFETY: `ptr` is a created memcached_st.
                unsafe { Alloc::of(ptr) }.copy(&v.data)
            }
        }
        Err(rc) => {
            // SAFETY: out-parameter.
            unsafe { set(error, rc) };
            ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_get(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    value_length: *mut usize,
    flags: *mut u32,
    error: *mut Rc,
) -> *mut c_char {
    // SAFETY: forwarded.
    unsafe {
        memcached_get_by_key(
            ptr,
            ptr::null(),
            0,
            key,
            key_length,
            value_length,
            flags,
            error,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_mget_by_key(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    keys: *const *const c_char,
    key_length: *const usize,
    number_of_keys: usize,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    if number_of_keys > 0 && (keys.is_null() || key_length.is_null()) {
        // libmemcached checks for servers first, then finds no key it can send.
        let rc = if p.server_count() == 0 {
            abi::NO_SERVERS
        } else {
            abi::BAD_KEY_PROVIDED
        };
        return p.fail(rc, "NULL keys");
    }
    let list: Vec<&[u8]> = (0..number_of_keys)
        // SAFETY: the caller passes `number_of_keys` keys and lengths.
        .map(|i| unsafe { bytes(*keys.add(i), *key_length.add(i)) })
        .collect();
    // SAFETY: (pointer, length).
    let g = unsafe { bytes(group_key, group_key_length) };
    p.mget((!g.is_empty()).then_some(g), &list)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_mget(
    ptr: *mut McSt,
    keys: *const *const c_char,
    key_length: *const usize,
    number_of_keys: usize,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_mget_by_key(ptr, ptr::null(), 0, keys, key_length, number_of_keys) }
}

/// Fills a result with a fetched item (its old value buffer is reused or freed).
unsafe fn fill_result(r: *mut McResult, root: *mut McSt, key: &[u8], v: &Value) -> bool {
    // SAFETY: `r` is an initialised result.
    let r = unsafe { &mut *r };
    let n = key.len().min(abi::MAX_KEY - 1);
    r.item_key[..n].copy_from_slice(&key[..n]);
    r.item_key[n] = 0;
    r.key_length = n;
    r.item_flags = v.flags;
    r.item_cas = v.cas;
    r.root = root;
    r.count += 1;
    // SAFETY: the buffer is NULL or ours (malloc); realloc keeps or moves it.
    let buf = unsafe { Alloc::of(root).realloc(r.value.string.cast(), v.data.len() + 1) }
        .cast::<c_char>();
    if buf.is_null() {
        return false;
    }
    // SAFETY: `buf` has len + 1 bytes.
    unsafe {
        ptr::copy_nonoverlapping(v.data.as_ptr(), buf.cast::<u8>(), v.data.len());
        *buf.add(v.data.len()) = 0;
    }
    r.value.string = buf;
    // SAFETY: within the buffer.
    r.value.end = unsafe { buf.add(v.data.len()) };
    r.value.current_size = v.data.len() + 1;
    r.value.options |= 2;
    true
}

#[no_mangle]
pub unsafe extern "C" fn memcached_fetch_result(
    ptr: *mut McSt,
    result: *mut McResult,
    error: *mut Rc,
) -> *mut McResult {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null_mut();
    };
    let Some(f) = p.next_result() else {
        let rc = p.end_of_results(!result.is_null());
        // SAFETY: NULL or a result of the caller's; libmemcached frees one it allocated
        // (`memcached_result_create(memc, NULL)`) at the end, since the loop that passed it
        // gets NULL back and cannot.
        unsafe {
            if !result.is_null() && (*result).options & 1 != 0 {
                memcached_result_free(result);
            }
            set(error, rc);
        }
        return ptr::null_mut();
    };
    let r = if result.is_null() {
        // SAFETY: a new result owned by the caller (memcached_result_free).
        unsafe { memcached_result_create(ptr, ptr::null_mut()) }
    } else {
        result
    };
    if r.is_null() {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::MEMORY_ALLOCATION_FAILURE) };
        return ptr::null_mut();
    }
    // SAFETY: `r` is an initialised result.
    let ok = unsafe { fill_result(r, ptr, &f.key, &f.value) };
    // SAFETY: out-parameter.
    unsafe {
        set(
            error,
            if ok {
                abi::SUCCESS
            } else {
                abi::MEMORY_ALLOCATION_FAILURE
            },
        )
    };
    r
}

#[no_mangle]
pub unsafe extern "C" fn memcached_fetch(
    ptr: *mut McSt,
    key: *mut c_char,
    key_length: *mut usize,
    value_length: *mut usize,
    flags: *mut u32,
    error: *mut Rc,
) -> *mut c_char {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null_mut();
    };
    let Some(f) = p.next_result() else {
        let rc = p.end_of_results(true);
        // SAFETY: out-parameters.
        unsafe {
            set(value_length, 0);
            set(error, rc);
        }
        return ptr::null_mut();
    };
    if !key.is_null() {
        let n = f.key.len().min(abi::MAX_KEY - 1);
        // SAFETY: libmemcached's contract: `key` has MEMCACHED_MAX_KEY bytes.
        unsafe {
            ptr::copy_nonoverlapping(f.key.as_ptr(), key.cast::<u8>(), n);
            *key.add(n) = 0;
        }
    }
    // SAFETY: out-parameters.
    unsafe {
        set(key_length, f.key.len());
        set(value_length, f.value.data.len());
        set(flags, f.value.flags);
        set(error, abi::SUCCESS);
    }
    if f.value.data.is_empty() {
        ptr::null_mut()
    } else {
        // SAFETY: `ptr` is a created memcached_st.
        unsafe { Alloc::of(ptr) }.copy(&f.value.data)
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_fetch_execute(
    ptr: *mut McSt,
    callbacks: *const ResultFn,
    context: *mut c_void,
    n: u32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    let mut items = Vec::new();
    while let Some(f) = p.next_result() {
        items.push(f);
    }
    p.end_of_results(true);
    if items.is_empty() {
        return abi::NOTFOUND;
    }
    // As libmemcached: a failing callback skips the rest of that item's callbacks, the
    // other items are still handed over, and the call says SOME ERRORS.
    let mut rc = abi::SUCCESS;
    for f in items {
        // SAFETY: a result on our stack, freed below.
        let mut r: McResult = unsafe { std::mem::zeroed() };
        // SAFETY: `r` is zeroed (a valid empty result).
        unsafe { fill_result(&mut r, ptr, &f.key, &f.value) };
        for k in 0..n as usize {
            // SAFETY: the caller passes `n` callbacks.
            if let Some(cb) = unsafe { *callbacks.add(k) } {
                // SAFETY: a C callback with libmemcached's signature.
                if unsafe { cb(ptr, &mut r, context) } != abi::SUCCESS {
                    rc = abi::SOME_ERRORS;
                    break;
                }
            }
        }
        // SAFETY: the buffer was allocated by fill_result with `ptr`'s allocator.
        unsafe { Alloc::of(ptr).free(r.value.string.cast()) };
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn memcached_exist_by_key(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    // SAFETY: (pointer, length) arguments.
    let (g, k) = unsafe { (bytes(group_key, group_key_length), bytes(key, key_length)) };
    match p.get((!g.is_empty()).then_some(g), k) {
        Ok(_) => abi::SUCCESS,
        Err(rc) => rc,
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_exist(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_exist_by_key(ptr, ptr::null(), 0, key, key_length) }
}

// ----- results -----------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn memcached_result_create(
    ptr: *const McSt,
    result: *mut McResult,
) -> *mut McResult {
    let (r, allocated) = if result.is_null() {
        // SAFETY: calloc gives zeroed memory of the struct's size (freed by result_free).
        let r = unsafe { Alloc::of(ptr) }
            .calloc(1, std::mem::size_of::<McResult>())
            .cast::<McResult>();
        if r.is_null() {
            return r;
        }
        (r, true)
    } else {
        // SAFETY: caller memory of sizeof(memcached_result_st), possibly uninitialised.
        unsafe { ptr::write_bytes(result, 0, 1) };
        (result, false)
    };
    // SAFETY: `r` is zeroed, valid memory.
    unsafe {
        (*r).root = ptr.cast_mut();
        (*r).value.root = ptr.cast_mut();
        (*r).options = 2 | u8::from(allocated);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_free(result: *mut McResult) {
    if result.is_null() {
        return;
    }
    // SAFETY: a result made by memcached_result_create; its buffer is ours.
    unsafe {
        let alloc = Alloc::of((*result).root);
        alloc.free((*result).value.string.cast());
        (*result).value.string = ptr::null_mut();
        (*result).value.end = ptr::null_mut();
        (*result).value.current_size = 0;
        if (*result).options & 1 != 0 {
            alloc.free(result.cast());
        } else {
            (*result).options = 0;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_reset(result: *mut McResult) {
    // SAFETY: NULL or an initialised result.
    if let Some(r) = unsafe { result.as_mut() } {
        r.key_length = 0;
        r.item_flags = 0;
        r.item_cas = 0;
        r.item_expiration = 0;
        r.value.end = r.value.string;
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_key_value(result: *const McResult) -> *const c_char {
    // SAFETY: NULL or an initialised result.
    unsafe { result.as_ref() }.map_or(ptr::null(), |r| r.item_key.as_ptr().cast())
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_key_length(result: *const McResult) -> usize {
    // SAFETY: NULL or an initialised result.
    unsafe { result.as_ref() }.map_or(0, |r| r.key_length)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_value(result: *const McResult) -> *const c_char {
    // SAFETY: NULL or an initialised result.
    match unsafe { result.as_ref() } {
        Some(r) if !r.value.string.is_null() => r.value.string,
        _ => c"".as_ptr(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_take_value(result: *mut McResult) -> *mut c_char {
    // SAFETY: NULL or an initialised result; the buffer passes to the caller.
    match unsafe { result.as_mut() } {
        Some(r) => {
            let s = r.value.string;
            r.value.string = ptr::null_mut();
            r.value.end = ptr::null_mut();
            r.value.current_size = 0;
            s
        }
        None => ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_length(result: *const McResult) -> usize {
    // SAFETY: NULL or an initialised result; `end` and `string` bound its value.
    match unsafe { result.as_ref() } {
        // SAFETY: `end` points into the buffer `string` starts.
        Some(r) if !r.value.string.is_null() => unsafe {
            r.value.end.offset_from(r.value.string) as usize
        },
        _ => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_flags(result: *const McResult) -> u32 {
    // SAFETY: NULL or an initialised result.
    unsafe { result.as_ref() }.map_or(0, |r| r.item_flags)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_cas(result: *const McResult) -> u64 {
    // SAFETY: NULL or an initialised result.
    unsafe { result.as_ref() }.map_or(0, |r| r.item_cas)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_expiration(result: *const McResult) -> libc::time_t {
    // SAFETY: NULL or an initialised result.
    unsafe { result.as_ref() }.map_or(0, |r| r.item_expiration)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_set_flags(result: *mut McResult, flags: u32) {
    // SAFETY: NULL or an initialised result.
    if let Some(r) = unsafe { result.as_mut() } {
        r.item_flags = flags;
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_set_expiration(result: *mut McResult, t: libc::time_t) {
    // SAFETY: NULL or an initialised result.
    if let Some(r) = unsafe { result.as_mut() } {
        r.item_expiration = t;
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_result_set_value(
    result: *mut McResult,
    value: *const c_char,
    length: usize,
) -> Rc {
    // SAFETY: NULL or an initialised result; `length` bytes at `value`.
    let Some(r) = (unsafe { result.as_mut() }) else {
        return abi::INVALID_ARGUMENTS;
    };
    // SAFETY: (pointer, length).
    let data = unsafe { bytes(value, length) };
    // libmemcached appends to the value (a GET_FAILURE callback may build it in pieces).
    let mut whole = Vec::with_capacity(length + 64);
    if !r.value.string.is_null() {
        // SAFETY: the result's value buffer, `end - string` bytes.
        whole.extend_from_slice(unsafe {
            std::slice::from_raw_parts(
                r.value.string.cast::<u8>(),
                r.value.end.offset_from(r.value.string) as usize,
            )
        });
    }
    whole.extend_from_slice(data);
    let v = Value {
        data: bytes::Bytes::from(whole),
        flags: r.item_flags,
        cas: r.item_cas,
    };
    let key = r.item_key[..r.key_length].to_vec();
    let root = r.root;
    r.count = r.count.saturating_sub(1);
    // SAFETY: `r` is an initialised result.
    if unsafe { fill_result(r, root, &key, &v) } {
        abi::SUCCESS
    } else {
        abi::MEMORY_ALLOCATION_FAILURE
    }
}

// ----- delete, touch, arithmetic ------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn memcached_delete_by_key(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
    expiration: libc::time_t,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    // SAFETY: (pointer, length) arguments.
    let (g, k) = unsafe { (bytes(group_key, group_key_length), bytes(key, key_length)) };
    p.delete((!g.is_empty()).then_some(g), k, expiration)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_delete(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    expiration: libc::time_t,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_delete_by_key(ptr, ptr::null(), 0, key, key_length, expiration) }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_touch_by_key(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
    expiration: libc::time_t,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    // SAFETY: (pointer, length) arguments.
    let (g, k) = unsafe { (bytes(group_key, group_key_length), bytes(key, key_length)) };
    p.touch((!g.is_empty()).then_some(g), k, expiration)
}

#[no_mangle]
pub unsafe extern "C" fn memcached_touch(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    expiration: libc::time_t,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_touch_by_key(ptr, ptr::null(), 0, key, key_length, expiration) }
}

unsafe fn arith(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
    offset: u64,
    value: *mut u64,
    incr: bool,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    // SAFETY: (pointer, length) arguments.
    let (g, k) = unsafe { (bytes(group_key, group_key_length), bytes(key, key_length)) };
    // libmemcached's value when there is none (a failure, or NOREPLY): UINT64_MAX.
    match p.arith((!g.is_empty()).then_some(g), k, offset, incr) {
        Ok(v) => {
            // SAFETY: out-parameter.
            unsafe { set(value, v.unwrap_or(u64::MAX)) };
            abi::SUCCESS
        }
        Err(rc) => {
            // SAFETY: out-parameter.
            unsafe { set(value, u64::MAX) };
            rc
        }
    }
}

macro_rules! arithmetic {
    ($name:ident, $by_key:ident, $incr:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            ptr: *mut McSt,
            key: *const c_char,
            key_length: usize,
            offset: u32,
            value: *mut u64,
        ) -> Rc {
            // SAFETY: forwarded.
            unsafe {
                arith(
                    ptr,
                    ptr::null(),
                    0,
                    key,
                    key_length,
                    offset.into(),
                    value,
                    $incr,
                )
            }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $by_key(
            ptr: *mut McSt,
            group_key: *const c_char,
            group_key_length: usize,
            key: *const c_char,
            key_length: usize,
            offset: u64,
            value: *mut u64,
        ) -> Rc {
            // SAFETY: forwarded.
            unsafe {
                arith(
                    ptr,
                    group_key,
                    group_key_length,
                    key,
                    key_length,
                    offset,
                    value,
                    $incr,
                )
            }
        }
    };
}

arithmetic!(memcached_increment, memcached_increment_by_key, true);
arithmetic!(memcached_decrement, memcached_decrement_by_key, false);

/// incr/decr that creates the counter with `initial` when it is missing (libmemcached
/// does this in the binary protocol only; the text protocol answers NOT_SUPPORTED).
unsafe fn arith_initial(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
    offset: u64,
    initial: u64,
    expiration: libc::time_t,
    value: *mut u64,
    incr: bool,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    if p.server_count() == 0 {
        return p.fail(abi::NO_SERVERS, "");
    }
    if !p.behaviors.binary {
        // libmemcached's answer in the text protocol.
        return p.fail(
            abi::INVALID_ARGUMENTS,
            "increment with an initial value needs the binary protocol",
        );
    }
    // SAFETY: (pointer, length) arguments.
    let (g, k) = unsafe { (bytes(group_key, group_key_length), bytes(key, key_length)) };
    let group = (!g.is_empty()).then_some(g);
    match p.arith(group, k, offset, incr) {
        Ok(v) => {
            // SAFETY: out-parameter.
            unsafe { set(value, v.unwrap_or(0)) };
            abi::SUCCESS
        }
        // MEMCACHED_EXPIRATION_NOT_ADD: do not create it.
        Err(abi::NOTFOUND) if expiration as u32 == u32::MAX => abi::NOTFOUND,
        Err(abi::NOTFOUND) => {
            let text = initial.to_string();
            match p.store(group, k, text.as_bytes(), expiration, 0, StoreMode::Add, 0) {
                abi::SUCCESS => {
                    // SAFETY: out-parameter.
                    unsafe { set(value, initial) };
                    abi::SUCCESS
                }
                // Created meanwhile by someone else: count on it.
                abi::DATA_EXISTS | abi::NOTSTORED => match p.arith(group, k, offset, incr) {
                    Ok(v) => {
                        // SAFETY: out-parameter.
                        unsafe { set(value, v.unwrap_or(0)) };
                        abi::SUCCESS
                    }
                    Err(rc) => rc,
                },
                rc => rc,
            }
        }
        Err(rc) => rc,
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_increment_with_initial(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    offset: u64,
    initial: u64,
    expiration: libc::time_t,
    value: *mut u64,
) -> Rc {
    // SAFETY: forwarded.
    unsafe {
        arith_initial(
            ptr,
            ptr::null(),
            0,
            key,
            key_length,
            offset,
            initial,
            expiration,
            value,
            true,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_decrement_with_initial(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    offset: u64,
    initial: u64,
    expiration: libc::time_t,
    value: *mut u64,
) -> Rc {
    // SAFETY: forwarded.
    unsafe {
        arith_initial(
            ptr,
            ptr::null(),
            0,
            key,
            key_length,
            offset,
            initial,
            expiration,
            value,
            false,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_increment_with_initial_by_key(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
    offset: u64,
    initial: u64,
    expiration: libc::time_t,
    value: *mut u64,
) -> Rc {
    // SAFETY: forwarded.
    unsafe {
        arith_initial(
            ptr,
            group_key,
            group_key_length,
            key,
            key_length,
            offset,
            initial,
            expiration,
            value,
            true,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_decrement_with_initial_by_key(
    ptr: *mut McSt,
    group_key: *const c_char,
    group_key_length: usize,
    key: *const c_char,
    key_length: usize,
    offset: u64,
    initial: u64,
    expiration: libc::time_t,
    value: *mut u64,
) -> Rc {
    // SAFETY: forwarded.
    unsafe {
        arith_initial(
            ptr,
            group_key,
            group_key_length,
            key,
            key_length,
            offset,
            initial,
            expiration,
            value,
            false,
        )
    }
}

// ----- server-wide commands -----------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn memcached_flush(ptr: *mut McSt, expiration: libc::time_t) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    p.each_server(
        &Op::FlushAll {
            delay: expiration.max(0) as u32,
        },
        false,
        |_, _, _| {},
    )
}

#[no_mangle]
pub unsafe extern "C" fn memcached_flush_buffers(ptr: *mut McSt) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    // Requests sent without waiting (NOREPLY, replicas' copies) are answered by now.
    p.drain_unanswered();
    abi::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn memcached_version(ptr: *mut McSt) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    p.each_server(&Op::Version, false, |p, i, reply| {
        if let Reply::Version(v) = reply {
            let mut n = v
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|x| x.parse::<u8>().ok());
            let version = (
                n.next().unwrap_or(0),
                n.next().unwrap_or(0),
                n.next().unwrap_or(0),
            );
            if let Some(inst) = p.instance_mut(i) {
                inst.version = version;
            }
        }
    })
}

// ----- statistics --------------------------------------------------------------------------

/// The keys `memcached_stat_get_keys` lists, in libmemcached's order.
const STAT_KEYS: [&CStr; 22] = [
    c"pid",
    c"uptime",
    c"time",
    c"version",
    c"pointer_size",
    c"rusage_user",
    c"rusage_system",
    c"curr_items",
    c"total_items",
    c"bytes",
    c"curr_connections",
    c"total_connections",
    c"connection_structures",
    c"cmd_get",
    c"cmd_set",
    c"get_hits",
    c"get_misses",
    c"evictions",
    c"bytes_read",
    c"bytes_written",
    c"limit_maxbytes",
    c"threads",
];

fn fill_stat(st: &mut McStat, stats: &[(String, String)]) {
    for (name, value) in stats {
        let n = || value.parse::<u64>().unwrap_or(0);
        let rusage = || {
            let (s, us) = value.split_once('.').unwrap_or((value, "0"));
            (
                s.parse::<u64>().unwrap_or(0),
                us.parse::<u64>().unwrap_or(0),
            )
        };
        match name.as_str() {
            "pid" => st.pid = value.parse().unwrap_or(0),
            "uptime" => st.uptime = n(),
            "time" => st.time = n(),
            "version" => {
                let b = value.as_bytes();
                let k = b.len().min(st.version.len() - 1);
                st.version[..k].copy_from_slice(&b[..k]);
                st.version[k] = 0;
            }
            "pointer_size" => st.pointer_size = n(),
            "rusage_user" => (st.rusage_user_seconds, st.rusage_user_microseconds) = rusage(),
            "rusage_system" => (st.rusage_system_seconds, st.rusage_system_microseconds) = rusage(),
            "curr_items" => st.curr_items = n(),
            "total_items" => st.total_items = n(),
            "bytes" => st.bytes = n(),
            "curr_connections" => st.curr_connections = n(),
            "total_connections" => st.total_connections = n(),
            "connection_structures" => st.connection_structures = n(),
            "cmd_get" => st.cmd_get = n(),
            "cmd_set" => st.cmd_set = n(),
            "get_hits" => st.get_hits = n(),
            "get_misses" => st.get_misses = n(),
            "evictions" => st.evictions = n(),
            "bytes_read" => st.bytes_read = n(),
            "bytes_written" => st.bytes_written = n(),
            "limit_maxbytes" => st.limit_maxbytes = n(),
            "threads" => st.threads = n(),
            _ => {}
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_stat(
    ptr: *mut McSt,
    args: *mut c_char,
    error: *mut Rc,
) -> *mut McStat {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null_mut();
    };
    let n = p.server_count();
    if n == 0 {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::NO_SERVERS) };
        return ptr::null_mut();
    }
    // SAFETY: calloc of n structs (zeroes are valid); the caller frees it.
    let stats = unsafe { Alloc::of(ptr) }
        .calloc(n, std::mem::size_of::<McStat>())
        .cast::<McStat>();
    if stats.is_null() {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::MEMORY_ALLOCATION_FAILURE) };
        return stats;
    }
    for i in 0..n {
        // SAFETY: within the array just allocated.
        unsafe { (*stats.add(i)).root = ptr };
    }
    // SAFETY: C string or NULL.
    let group = unsafe { cstr(args) }
        .filter(|g| !g.is_empty())
        .map(str::to_string);
    let rc = p.each_server(&Op::Stats { group }, true, |_, i, reply| {
        if let Reply::Stats(list) = reply {
            // SAFETY: `i` < n, inside the array.
            let st = unsafe { &mut *stats.add(i) };
            st.root = ptr;
            fill_stat(st, &list);
        }
    });
    // SAFETY: out-parameter.
    unsafe { set(error, rc) };
    stats
}

#[no_mangle]
pub unsafe extern "C" fn memcached_stat_free(_ptr: *const McSt, stat: *mut McStat) {
    if stat.is_null() {
        return;
    }
    // SAFETY: an array from memcached_stat, made with its `root`'s allocator (libmemcached
    // ignores the first argument, which callers often pass as NULL).
    unsafe { Alloc::of((*stat).root).free(stat.cast()) };
}

#[no_mangle]
pub unsafe extern "C" fn memcached_stat_get_keys(
    ptr: *mut McSt,
    _stat: *mut McStat,
    error: *mut Rc,
) -> *mut *mut c_char {
    let n = STAT_KEYS.len() + 1;
    // SAFETY: calloc of n pointers; the strings are static (the caller frees the array only).
    let list = unsafe { Alloc::of(ptr) }
        .calloc(n, std::mem::size_of::<*mut c_char>())
        .cast::<*mut c_char>();
    if list.is_null() {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::MEMORY_ALLOCATION_FAILURE) };
        return list;
    }
    for (i, k) in STAT_KEYS.iter().enumerate() {
        // SAFETY: within the array.
        unsafe { *list.add(i) = k.as_ptr().cast_mut() };
    }
    // SAFETY: out-parameter.
    unsafe { set(error, abi::SUCCESS) };
    list
}

#[no_mangle]
pub unsafe extern "C" fn memcached_stat_get_value(
    ptr: *const McSt,
    stat: *const McStat,
    key: *const c_char,
    error: *mut Rc,
) -> *mut c_char {
    // SAFETY: NULL or one struct of a memcached_stat array; C string.
    let (Some(st), Some(key)) = (unsafe { stat.as_ref() }, unsafe { cstr(key) }) else {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null_mut();
    };
    let v = match key {
        "pid" => st.pid.to_string(),
        "uptime" => st.uptime.to_string(),
        "time" => st.time.to_string(),
        "version" => {
            let end = st
                .version
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(st.version.len());
            String::from_utf8_lossy(&st.version[..end]).into_owned()
        }
        "pointer_size" => st.pointer_size.to_string(),
        "rusage_user" => format!("{}.{}", st.rusage_user_seconds, st.rusage_user_microseconds),
        "rusage_system" => format!(
            "{}.{}",
            st.rusage_system_seconds, st.rusage_system_microseconds
        ),
        "curr_items" => st.curr_items.to_string(),
        "total_items" => st.total_items.to_string(),
        "bytes" => st.bytes.to_string(),
        "curr_connections" => st.curr_connections.to_string(),
        "total_connections" => st.total_connections.to_string(),
        "connection_structures" => st.connection_structures.to_string(),
        "cmd_get" => st.cmd_get.to_string(),
        "cmd_set" => st.cmd_set.to_string(),
        "get_hits" => st.get_hits.to_string(),
        "get_misses" => st.get_misses.to_string(),
        "evictions" => st.evictions.to_string(),
        "bytes_read" => st.bytes_read.to_string(),
        "bytes_written" => st.bytes_written.to_string(),
        "limit_maxbytes" => st.limit_maxbytes.to_string(),
        "threads" => st.threads.to_string(),
        _ => {
            // SAFETY: out-parameter.
            unsafe { set(error, abi::INVALID_ARGUMENTS) };
            return ptr::null_mut();
        }
    };
    // SAFETY: out-parameter.
    unsafe { set(error, abi::SUCCESS) };
    // libmemcached hands this one out with plain malloc ("the caller free()s it").
    let _ = ptr;
    // SAFETY: NULL: the C library's allocator.
    unsafe { Alloc::of(ptr::null()) }.copy(v.as_bytes())
}

/// Which transport `memcached_st`'s server `i` uses: 1 UCX, 0 TCP, -1 not connected yet.
/// memfabric's own addition (declared in memfabric.h), for tests and diagnostics.
#[no_mangle]
pub unsafe extern "C" fn memfabric_server_over_ucx(ptr: *const McSt, i: u32) -> c_int {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) }.and_then(|p| p.over_ucx(i as usize)) {
        Some(true) => 1,
        Some(false) => 0,
        None => -1,
    }
}

/// The transport choice in effect (`MEMFABRIC_TRANSPORT`): 0 tcp, 1 ucx, 2 auto.
#[no_mangle]
pub unsafe extern "C" fn memfabric_transport(ptr: *const McSt) -> c_int {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) }.map(|p| p.transport) {
        Some(TransportChoice::Tcp) => 0,
        Some(TransportChoice::Ucx) => 1,
        _ => 2,
    }
}

type StatFn = Option<
    unsafe extern "C" fn(
        InstancePtr,
        *const c_char,
        usize,
        *const c_char,
        usize,
        *mut c_void,
    ) -> Rc,
>;

/// Every statistic of every server (group `args`), one call of `func` per line.
#[no_mangle]
pub unsafe extern "C" fn memcached_stat_execute(
    ptr: *mut McSt,
    args: *const c_char,
    func: StatFn,
    context: *mut c_void,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let (Some(p), Some(func)) = (unsafe { pool(ptr) }, func) else {
        return abi::INVALID_ARGUMENTS;
    };
    // SAFETY: C string or NULL.
    let group = unsafe { cstr(args) }
        .filter(|g| !g.is_empty())
        .map(str::to_string);
    let rc = p.each_server(&Op::Stats { group }, true, |p, i, reply| {
        let (Reply::Stats(list), Some(inst)) = (reply, p.instance(i)) else {
            return;
        };
        for (k, v) in list {
            // SAFETY: a C callback with libmemcached's signature; the strings live across it.
            // libmemcached hands every line over whatever the callback answers.
            let _ = unsafe {
                func(
                    inst,
                    k.as_ptr().cast(),
                    k.len(),
                    v.as_ptr().cast(),
                    v.len(),
                    context,
                )
            };
        }
    });
    rc
}

/// `memcached_analysis_st`.
#[repr(C)]
pub struct McAnalysis {
    pub root: *mut McSt,
    pub average_item_size: u32,
    pub longest_uptime: u32,
    pub least_free_server: u32,
    pub most_consumed_server: u32,
    pub oldest_server: u32,
    pub pool_hit_ratio: f64,
    pub most_used_bytes: u64,
    pub least_remaining_bytes: u64,
}

/// libmemcached's summary of a `memcached_stat` array: the server with the fewest bytes
/// left, the one using the most, the longest running, the average item size and the
/// pool's hit ratio (in percent).
#[no_mangle]
pub unsafe extern "C" fn memcached_analyze(
    ptr: *mut McSt,
    stat: *mut McStat,
    error: *mut Rc,
) -> *mut McAnalysis {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null_mut();
    };
    let n = p.server_count();
    if stat.is_null() || n == 0 {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::INVALID_ARGUMENTS) };
        return ptr::null_mut();
    }
    // SAFETY: `stat` is memcached_stat's array of one struct per server.
    let stats = unsafe { std::slice::from_raw_parts(stat, n) };
    let mut a = McAnalysis {
        root: ptr,
        average_item_size: 0,
        longest_uptime: 0,
        least_free_server: 0,
        most_consumed_server: 0,
        oldest_server: 0,
        pool_hit_ratio: 0.0,
        most_used_bytes: 0,
        least_remaining_bytes: u64::MAX,
    };
    let (mut items, mut bytes_total, mut hits, mut gets) = (0u64, 0u64, 0u64, 0u64);
    for (i, s) in stats.iter().enumerate() {
        if s.bytes > a.most_used_bytes {
            a.most_used_bytes = s.bytes;
            a.most_consumed_server = i as u32;
        }
        let remaining = s.limit_maxbytes.saturating_sub(s.bytes);
        if remaining < a.least_remaining_bytes {
            a.least_remaining_bytes = remaining;
            a.least_free_server = i as u32;
        }
        if s.uptime > u64::from(a.longest_uptime) {
            a.longest_uptime = s.uptime as u32;
            a.oldest_server = i as u32;
        }
        items += s.curr_items;
        bytes_total += s.bytes;
        hits += s.get_hits;
        gets += s.cmd_get;
    }
    if let Some(avg) = bytes_total.checked_div(items) {
        a.average_item_size = avg as u32;
    }
    if gets > 0 {
        a.pool_hit_ratio = hits as f64 / gets as f64 * 100.0;
    }
    // SAFETY: malloc of one struct, written whole; the caller frees it (memcached_analyze_free or free).
    let out = unsafe { Alloc::of(ptr) }
        .malloc(std::mem::size_of::<McAnalysis>())
        .cast::<McAnalysis>();
    if out.is_null() {
        // SAFETY: out-parameter.
        unsafe { set(error, abi::MEMORY_ALLOCATION_FAILURE) };
        return out;
    }
    // SAFETY: `out` is valid for one struct.
    unsafe {
        out.write(a);
        set(error, abi::SUCCESS);
    }
    out
}

#[no_mangle]
pub unsafe extern "C" fn memcached_analyze_free(a: *mut McAnalysis) {
    if a.is_null() {
        return;
    }
    // SAFETY: from memcached_analyze, made with its root's allocator.
    unsafe { Alloc::of((*a).root).free(a.cast()) };
}

/// `memcached_dump` walks a server's slabs with `stats cachedump`, which memfabricd does
/// not serve: refused, so a caller knows rather than seeing an empty cache.
#[no_mangle]
pub unsafe extern "C" fn memcached_dump(
    ptr: *mut McSt,
    _callbacks: *const c_void,
    _context: *mut c_void,
    _n: u32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) } {
        Some(p) => p.fail(
            abi::NOT_SUPPORTED,
            "memcached_dump (stats cachedump) is not supported by libmemfabric",
        ),
        None => abi::INVALID_ARGUMENTS,
    }
}

#[no_mangle]
pub unsafe extern "C" fn memcached_set_memory_allocators(
    ptr: *mut McSt,
    mem_malloc: Option<MallocFn>,
    mem_free: Option<FreeFn>,
    mem_realloc: Option<ReallocFn>,
    mem_calloc: Option<CallocFn>,
    context: *mut c_void,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    match (mem_malloc, mem_free, mem_realloc, mem_calloc) {
        (None, None, None, None) => p.allocators = None,
        (Some(malloc), Some(free), Some(realloc), Some(calloc)) => {
            p.allocators = Some(Allocators {
                malloc,
                free,
                realloc,
                calloc,
                context,
            })
        }
        _ => return p.fail(abi::INVALID_ARGUMENTS, "all four allocators, or none"),
    }
    abi::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn memcached_get_memory_allocators(
    ptr: *const McSt,
    mem_malloc: *mut Option<MallocFn>,
    mem_free: *mut Option<FreeFn>,
    mem_realloc: *mut Option<ReallocFn>,
    mem_calloc: *mut Option<CallocFn>,
) {
    // SAFETY: NULL or a created memcached_st.
    let a = unsafe { pool(ptr) }.and_then(|p| p.allocators);
    // Without the caller's, the C library's (as libmemcached answers: callers wrap them).
    // SAFETY: out-parameters.
    unsafe {
        set(
            mem_malloc,
            Some(a.map_or(default_malloc as MallocFn, |a| a.malloc)),
        );
        set(mem_free, Some(a.map_or(default_free as FreeFn, |a| a.free)));
        set(
            mem_realloc,
            Some(a.map_or(default_realloc as ReallocFn, |a| a.realloc)),
        );
        set(
            mem_calloc,
            Some(a.map_or(default_calloc as CallocFn, |a| a.calloc)),
        );
    }
}

unsafe extern "C" fn default_malloc(_: *const McSt, size: usize, _: *mut c_void) -> *mut c_void {
    // SAFETY: plain malloc.
    unsafe { libc::malloc(size) }
}

unsafe extern "C" fn default_free(_: *const McSt, mem: *mut c_void, _: *mut c_void) {
    // SAFETY: the caller frees memory of the C library's allocator.
    unsafe { libc::free(mem) }
}

unsafe extern "C" fn default_realloc(
    _: *const McSt,
    mem: *mut c_void,
    size: usize,
    _: *mut c_void,
) -> *mut c_void {
    // SAFETY: realloc of the C library's memory.
    unsafe { libc::realloc(mem, size) }
}

unsafe extern "C" fn default_calloc(
    _: *const McSt,
    n: usize,
    size: usize,
    _: *mut c_void,
) -> *mut c_void {
    // SAFETY: plain calloc.
    unsafe { libc::calloc(n, size) }
}

/// libmemcached's value encryption (AES with a key of the caller's): not implemented, so
/// refused; storing values in clear while the caller believes them encrypted would be
/// worse.
#[no_mangle]
pub unsafe extern "C" fn memcached_set_encoding_key(
    ptr: *mut McSt,
    _key: *const c_char,
    _len: usize,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) } {
        Some(p) => p.fail(
            abi::NOT_SUPPORTED,
            "memcached_set_encoding_key (value encryption) is not supported by libmemfabric",
        ),
        None => abi::INVALID_ARGUMENTS,
    }
}

/// Virtual buckets (`memcached_bucket_set` maps): not implemented, refused.
#[no_mangle]
pub unsafe extern "C" fn memcached_bucket_set(
    ptr: *mut McSt,
    _host_map: *const u32,
    _forward_map: *const u32,
    _buckets: u32,
    _replicas: u32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    match unsafe { pool(ptr) } {
        Some(p) => p.fail(
            abi::NOT_SUPPORTED,
            "memcached_bucket_set (virtual buckets) is not supported by libmemfabric",
        ),
        None => abi::INVALID_ARGUMENTS,
    }
}

// ----- memfabric.h: non-blocking requests ----------------------------------------------------

use crate::commands::{Command, Outcome, Request, RequestState};

/// A request object for the non-blocking calls, tied to `ptr` (NULL if `ptr` is NULL).
#[no_mangle]
pub unsafe extern "C" fn memcached_request_create(ptr: *mut McSt) -> *mut Request {
    // SAFETY: NULL or a created memcached_st.
    if unsafe { pool(ptr) }.is_none() {
        return ptr::null_mut();
    }
    Box::into_raw(Box::new(Request {
        owner: ptr as usize,
        state: RequestState::Idle,
    }))
}

/// Frees a request; one still in flight is abandoned first (its pool must still exist).
#[no_mangle]
pub unsafe extern "C" fn memcached_request_free(req: *mut Request) {
    if req.is_null() {
        return;
    }
    // SAFETY: a request made by memcached_request_create, freed once.
    let r = unsafe { Box::from_raw(req) };
    if let RequestState::InFlight {
        server,
        handle,
        kind,
    } = r.state
    {
        // SAFETY: the owner outlives its requests (memfabric.h's contract).
        if let Some(p) = unsafe { pool(r.owner as *const McSt) } {
            let _ = p.poll(server, handle, kind, Some(std::time::Duration::ZERO));
        }
    }
}

/// The request behind `req` if it belongs to `ptr`'s pool and is not in flight.
unsafe fn idle_request<'a>(
    ptr: *mut McSt,
    req: *mut Request,
) -> Result<(&'a mut Pool, &'a mut Request), Rc> {
    // SAFETY: NULL or a created memcached_st; NULL or one of our requests.
    let (Some(p), Some(r)) = (unsafe { pool(ptr) }, unsafe { req.as_mut() }) else {
        return Err(abi::INVALID_ARGUMENTS);
    };
    if r.owner != ptr as usize {
        return Err(p.fail(
            abi::INVALID_ARGUMENTS,
            "the request belongs to another memcached_st",
        ));
    }
    if matches!(r.state, RequestState::InFlight { .. }) {
        return Err(p.fail(abi::IN_PROGRESS, "the request is still in flight"));
    }
    Ok((p, r))
}

unsafe fn start(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    cmd: Command<'_>,
    req: *mut Request,
) -> Rc {
    // SAFETY: forwarded.
    let (p, r) = match unsafe { idle_request(ptr, req) } {
        Ok(x) => x,
        Err(rc) => return rc,
    };
    // SAFETY: (pointer, length).
    let k = unsafe { bytes(key, key_length) };
    match p.start(None, k, cmd) {
        Ok((server, handle, kind)) => {
            r.state = RequestState::InFlight {
                server,
                handle,
                kind,
            };
            abi::SUCCESS
        }
        Err(rc) => {
            r.state = RequestState::Done(Outcome::rc(rc));
            rc
        }
    }
}

/// Stores `value` under `key` without waiting for the answer (`memcached_test`/`wait`
/// give it). The value is copied before this returns, so the buffer may be reused at once
/// (the same as `memcached_bset`).
#[no_mangle]
pub unsafe extern "C" fn memcached_iset(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    value: *const c_char,
    value_length: usize,
    expiration: libc::time_t,
    flags: u32,
    req: *mut Request,
) -> Rc {
    // SAFETY: (pointer, length) of the caller's value.
    let v = unsafe { bytes(value, value_length) };
    let cmd = Command::Store {
        mode: StoreMode::Set,
        value: v,
        exptime: expiration,
        flags,
        cas: 0,
    };
    // SAFETY: forwarded.
    unsafe { start(ptr, key, key_length, cmd, req) }
}

/// `memcached_iset` that returns once the caller's buffer may be reused.
#[no_mangle]
pub unsafe extern "C" fn memcached_bset(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    value: *const c_char,
    value_length: usize,
    expiration: libc::time_t,
    flags: u32,
    req: *mut Request,
) -> Rc {
    // SAFETY: forwarded.
    unsafe {
        memcached_iset(
            ptr,
            key,
            key_length,
            value,
            value_length,
            expiration,
            flags,
            req,
        )
    }
}

/// Fetches `key` without waiting; the value is read from the request once it completes
/// (`memcached_request_value`).
#[no_mangle]
pub unsafe extern "C" fn memcached_iget(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    req: *mut Request,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { start(ptr, key, key_length, Command::Get, req) }
}

/// `memcached_iget` that returns once the key buffer may be reused (the key is copied by
/// both).
#[no_mangle]
pub unsafe extern "C" fn memcached_bget(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    req: *mut Request,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { start(ptr, key, key_length, Command::Get, req) }
}

/// Deletes `key` without waiting.
#[no_mangle]
pub unsafe extern "C" fn memcached_idelete(
    ptr: *mut McSt,
    key: *const c_char,
    key_length: usize,
    req: *mut Request,
) -> Rc {
    // SAFETY: forwarded.
    unsafe { start(ptr, key, key_length, Command::Delete { expiration: 0 }, req) }
}

/// Progress: a request in flight after `wait` (None: without waiting) is finished if it
/// can be. Its code, or IN_PROGRESS.
unsafe fn progress(ptr: *mut McSt, req: *mut Request, wait: Option<std::time::Duration>) -> Rc {
    // SAFETY: NULL or a created memcached_st; NULL or one of our requests.
    let (Some(p), Some(r)) = (unsafe { pool(ptr) }, unsafe { req.as_mut() }) else {
        return abi::INVALID_ARGUMENTS;
    };
    if r.owner != ptr as usize {
        return abi::INVALID_ARGUMENTS;
    }
    match &r.state {
        RequestState::Idle => abi::INVALID_ARGUMENTS,
        RequestState::Done(o) => o.rc,
        &RequestState::InFlight {
            server,
            handle,
            kind,
        } => match p.poll(server, handle, kind, wait) {
            Some(o) => {
                let rc = o.rc;
                r.state = RequestState::Done(o);
                rc
            }
            None => abi::IN_PROGRESS,
        },
    }
}

/// The request's code if it has completed (SUCCESS, NOTFOUND, ...), IN_PROGRESS if not;
/// never waits.
#[no_mangle]
pub unsafe extern "C" fn memcached_test(ptr: *mut McSt, req: *mut Request) -> Rc {
    // SAFETY: forwarded.
    unsafe { progress(ptr, req, None) }
}

/// Waits for the request at most `timeout_ms` milliseconds (negative: the pool's poll
/// timeout). TIMEOUT if it did not complete in time: it is then abandoned.
#[no_mangle]
pub unsafe extern "C" fn memcached_wait_for(
    ptr: *mut McSt,
    req: *mut Request,
    timeout_ms: i32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    let t = if timeout_ms < 0 {
        p.client_config().timeout
    } else {
        std::time::Duration::from_millis(timeout_ms as u64)
    };
    // SAFETY: forwarded.
    unsafe { progress(ptr, req, Some(t)) }
}

/// Waits for the request at most the pool's poll timeout (MEMCACHED_BEHAVIOR_POLL_TIMEOUT).
#[no_mangle]
pub unsafe extern "C" fn memcached_wait(ptr: *mut McSt, req: *mut Request) -> Rc {
    // SAFETY: forwarded.
    unsafe { memcached_wait_for(ptr, req, -1) }
}

/// Waits for `n` requests, at most `timeout_ms` in all (negative: the pool's poll
/// timeout). SUCCESS once every one has completed (each has its own code), TIMEOUT if some
/// did not in time (those are abandoned).
#[no_mangle]
pub unsafe extern "C" fn memcached_wait_all(
    ptr: *mut McSt,
    reqs: *const *mut Request,
    n: usize,
    timeout_ms: i32,
) -> Rc {
    // SAFETY: NULL or a created memcached_st.
    let Some(p) = (unsafe { pool(ptr) }) else {
        return abi::INVALID_ARGUMENTS;
    };
    if n > 0 && reqs.is_null() {
        return abi::INVALID_ARGUMENTS;
    }
    let total = if timeout_ms < 0 {
        p.client_config().timeout
    } else {
        std::time::Duration::from_millis(timeout_ms as u64)
    };
    let deadline = std::time::Instant::now() + total;
    let mut rc = abi::SUCCESS;
    for i in 0..n {
        // SAFETY: the caller passes `n` request pointers.
        let req = unsafe { *reqs.add(i) };
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // SAFETY: forwarded.
        match unsafe { progress(ptr, req, Some(left)) } {
            abi::TIMEOUT => rc = abi::TIMEOUT,
            abi::INVALID_ARGUMENTS => return abi::INVALID_ARGUMENTS,
            _ => {}
        }
    }
    rc
}

/// The request's code: IN_PROGRESS while in flight, INVALID_ARGUMENTS if never issued.
#[no_mangle]
pub unsafe extern "C" fn memcached_request_status(req: *const Request) -> Rc {
    // SAFETY: NULL or one of our requests.
    match unsafe { req.as_ref() }.map(|r| &r.state) {
        Some(RequestState::Done(o)) => o.rc,
        Some(RequestState::InFlight { .. }) => abi::IN_PROGRESS,
        _ => abi::INVALID_ARGUMENTS,
    }
}

/// A completed get's value (not NUL-terminated; NULL on a miss or before completion),
/// valid until the request is reused or freed.
#[no_mangle]
pub unsafe extern "C" fn memcached_request_value(
    req: *const Request,
    value_length: *mut usize,
    flags: *mut u32,
) -> *const c_char {
    // SAFETY: NULL or one of our requests.
    let v = match unsafe { req.as_ref() }.map(|r| &r.state) {
        Some(RequestState::Done(Outcome { value: Some(v), .. })) => v,
        _ => {
            // SAFETY: out-parameters.
            unsafe {
                set(value_length, 0);
                set(flags, 0);
            }
            return ptr::null();
        }
    };
    // SAFETY: out-parameters.
    unsafe {
        set(value_length, v.data.len());
        set(flags, v.flags);
    }
    v.data.as_ptr().cast()
}

/// A completed get's CAS value (0 otherwise).
#[no_mangle]
pub unsafe extern "C" fn memcached_request_cas(req: *const Request) -> u64 {
    // SAFETY: NULL or one of our requests.
    match unsafe { req.as_ref() }.map(|r| &r.state) {
        Some(RequestState::Done(Outcome { value: Some(v), .. })) => v.cas,
        _ => 0,
    }
}
