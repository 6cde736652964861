//! The C side of the ABI: libmemcached 1.1.4's structs with their sizes and the offsets of
//! the fields callers read (checked against Debian's headers by `tests/c/differential.c`),
//! its return codes and their `memcached_strerror` texts.

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};

/// `memcached_return_t`, numbered as in `libmemcached-1.0/types/return.h`.
pub type Rc = i32;
pub const SUCCESS: Rc = 0;
pub const FAILURE: Rc = 1;
pub const CONNECTION_FAILURE: Rc = 3;
pub const WRITE_FAILURE: Rc = 5;
pub const UNKNOWN_READ_FAILURE: Rc = 7;
pub const PROTOCOL_ERROR: Rc = 8;
pub const CLIENT_ERROR: Rc = 9;
pub const SERVER_ERROR: Rc = 10;
pub const ERROR: Rc = 11;
pub const DATA_EXISTS: Rc = 12;
pub const NOTSTORED: Rc = 14;
pub const NOTFOUND: Rc = 16;
pub const MEMORY_ALLOCATION_FAILURE: Rc = 17;
pub const SOME_ERRORS: Rc = 19;
pub const NO_SERVERS: Rc = 20;
pub const END: Rc = 21;
pub const NOT_SUPPORTED: Rc = 28;
pub const TIMEOUT: Rc = 31;
pub const BAD_KEY_PROVIDED: Rc = 33;
pub const UNKNOWN_STAT_KEY: Rc = 36;
pub const E2BIG: Rc = 37;
pub const INVALID_ARGUMENTS: Rc = 38;
pub const KEY_TOO_BIG: Rc = 39;
pub const AUTH_FAILURE: Rc = 41;
pub const PARSE_ERROR: Rc = 43;
pub const DEPRECATED: Rc = 45;
pub const IN_PROGRESS: Rc = 46;
pub const SERVER_TEMPORARILY_DISABLED: Rc = 47;
pub const SERVER_MEMORY_ALLOCATION_FAILURE: Rc = 48;
pub const MAXIMUM_RETURN: Rc = 49;

/// `memcached_strerror`'s texts, NUL-terminated so they can be handed out as C strings.
pub const STRERROR: [&str; MAXIMUM_RETURN as usize] = [
    "SUCCESS\0",
    "FAILURE\0",
    "getaddrinfo() or getnameinfo() HOSTNAME LOOKUP FAILURE\0",
    "CONNECTION FAILURE\0",
    "CONNECTION BIND FAILURE\0",
    "WRITE FAILURE\0",
    "READ FAILURE\0",
    "UNKNOWN READ FAILURE\0",
    "PROTOCOL ERROR\0",
    "CLIENT ERROR\0",
    "SERVER ERROR\0",
    "ERROR was returned by server\0",
    "CONNECTION DATA EXISTS\0",
    "CONNECTION DATA DOES NOT EXIST\0",
    "NOT STORED\0",
    "STORED\0",
    "NOT FOUND\0",
    "MEMORY ALLOCATION FAILURE\0",
    "PARTIAL READ\0",
    "SOME ERRORS WERE REPORTED\0",
    "NO SERVERS DEFINED\0",
    "SERVER END\0",
    "SERVER DELETE\0",
    "SERVER VALUE\0",
    "STAT VALUE\0",
    "ITEM VALUE\0",
    "SYSTEM ERROR\0",
    "COULD NOT OPEN UNIX SOCKET\0",
    "ACTION NOT SUPPORTED\0",
    "A KEY LENGTH OF ZERO WAS PROVIDED\0",
    "FETCH WAS NOT COMPLETED\0",
    "A TIMEOUT OCCURRED\0",
    "ACTION QUEUED\0",
    "A BAD KEY WAS PROVIDED/CHARACTERS OUT OF RANGE\0",
    "THE HOST TRANSPORT PROTOCOL DOES NOT MATCH THAT OF THE CLIENT\0",
    "SERVER IS MARKED DEAD\0",
    "ENCOUNTERED AN UNKNOWN STAT KEY\0",
    "ITEM TOO BIG\0",
    "INVALID ARGUMENTS\0",
    "KEY RETURNED FROM SERVER WAS TOO LARGE\0",
    "FAILED TO SEND AUTHENTICATION TO SERVER\0",
    "AUTHENTICATION FAILURE\0",
    "CONTINUE AUTHENTICATION\0",
    "ERROR OCCURED WHILE PARSING\0",
    "USER INITIATED ERROR OCCURED WHILE PARSING\0",
    "DEPRECATED\0",
    "OPERATION IN PROCESS\0",
    "SERVER HAS FAILED AND IS DISABLED UNTIL TIMED RETRY\0",
    "SERVER FAILED TO ALLOCATE OBJECT\0",
];

/// The text of a return code (libmemcached's answer for a code out of range too).
pub fn strerror(rc: Rc) -> &'static str {
    usize::try_from(rc)
        .ok()
        .and_then(|i| STRERROR.get(i))
        .copied()
        .unwrap_or("INVALID memcached_return_t\0")
}

/// `MEMCACHED_MAX_KEY`: 250 bytes and the NUL.
pub const MAX_KEY: usize = 251;

/// `memcached_string_st` (40 bytes): the value buffer of a result.
#[repr(C)]
pub struct McString {
    pub end: *mut c_char,
    pub string: *mut c_char,
    pub current_size: usize,
    pub root: *mut McSt,
    /// Bit 0 `is_allocated`, bit 1 `is_initialized`.
    pub options: u8,
    _pad: [u8; 7],
}

/// `memcached_result_st` (352 bytes). Callers allocate it (`memcached_result_create` on
/// their own memory) and read it through the `memcached_result_*` accessors; the value
/// buffer is `malloc`ed, so it survives a `memcpy` of the struct as libmemcached's does.
#[repr(C)]
pub struct McResult {
    pub item_flags: u32,
    pub item_expiration: libc::time_t,
    pub key_length: usize,
    pub item_cas: u64,
    pub root: *mut McSt,
    pub value: McString,
    pub numeric_value: u64,
    pub count: u64,
    pub item_key: [u8; MAX_KEY],
    /// Bit 0 `is_allocated` (freed by `memcached_result_free`), bit 1 `is_initialized`.
    pub options: u8,
}

/// `memcached_st` (696 bytes). The public fields a C program may read are kept at their
/// offsets and in step with the behaviours (`Pool::sync_public`); everything memfabric
/// needs lives behind `pool`, which sits where libmemcached keeps its callback table.
#[repr(C)]
pub struct McSt {
    pub state: u8,
    /// The behaviour bit-field (`flags` in the header): byte 0 bit 1 is `binary_protocol`.
    pub flags: [u8; 2],
    _pad0: u8,
    pub distribution: u32,
    _hashkit: [u8; 48],
    pub server_info_version: u32,
    pub number_of_hosts: u32,
    pub servers: *mut libc::c_void,
    pub last_disconnected_server: *mut libc::c_void,
    pub snd_timeout: i32,
    pub rcv_timeout: i32,
    pub server_failure_limit: u32,
    pub server_timeout_limit: u32,
    pub io_msg_watermark: u32,
    pub io_bytes_watermark: u32,
    pub io_key_prefetch: u32,
    pub tcp_keepidle: u32,
    pub poll_timeout: i32,
    pub connect_timeout: i32,
    pub retry_timeout: i32,
    pub dead_timeout: i32,
    pub send_size: i32,
    pub recv_size: i32,
    pub user_data: *mut libc::c_void,
    pub query_id: u64,
    pub number_of_replicas: u32,
    _pad1: u32,
    pub result: McResult,
    _ketama_to_callbacks: [u8; 112],
    /// memfabric's state (a `Box<pool::Pool>`, owned by this struct), in the slot of
    /// libmemcached's `callbacks`. Untyped here so the C layout depends on nothing above it.
    pub pool: *mut libc::c_void,
    _sasl_to_configure: [u8; 56],
    /// Bit 0 `is_allocated`: `memcached_free` frees the struct itself.
    pub options: u8,
    _pad2: [u8; 7],
}

/// `memcached_stat_st` (224 bytes), one per server, in an array the caller `free`s.
#[repr(C)]
pub struct McStat {
    pub connection_structures: libc::c_ulong,
    pub curr_connections: libc::c_ulong,
    pub curr_items: libc::c_ulong,
    pub pid: libc::pid_t,
    pub pointer_size: libc::c_ulong,
    pub rusage_system_microseconds: libc::c_ulong,
    pub rusage_system_seconds: libc::c_ulong,
    pub rusage_user_microseconds: libc::c_ulong,
    pub rusage_user_seconds: libc::c_ulong,
    pub threads: libc::c_ulong,
    pub time: libc::c_ulong,
    pub total_connections: libc::c_ulong,
    pub total_items: libc::c_ulong,
    pub uptime: libc::c_ulong,
    pub bytes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub cmd_get: u64,
    pub cmd_set: u64,
    pub evictions: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub limit_maxbytes: u64,
    pub version: [u8; 24],
    pub future: *mut libc::c_void,
    pub root: *mut McSt,
}

// The sizes and offsets of libmemcached 1.1.4 on LP64 (x86_64, aarch64), as Debian's
// headers give them; the C differential test reads the same fields through the headers.
const _: () = {
    assert!(size_of::<McSt>() == 696);
    assert!(size_of::<McResult>() == 352);
    assert!(size_of::<McString>() == 40);
    assert!(size_of::<McStat>() == 224);
    assert!(offset_of!(McSt, distribution) == 4);
    assert!(offset_of!(McSt, number_of_hosts) == 60);
    assert!(offset_of!(McSt, servers) == 64);
    assert!(offset_of!(McSt, snd_timeout) == 80);
    assert!(offset_of!(McSt, rcv_timeout) == 84);
    assert!(offset_of!(McSt, poll_timeout) == 112);
    assert!(offset_of!(McSt, user_data) == 136);
    assert!(offset_of!(McSt, number_of_replicas) == 152);
    assert!(offset_of!(McSt, result) == 160);
    assert!(offset_of!(McSt, pool) == 624);
    assert!(offset_of!(McSt, options) == 688);
    assert!(offset_of!(McResult, value) == 40);
    assert!(offset_of!(McResult, item_key) == 96);
    assert!(offset_of!(McResult, options) == 347);
    assert!(offset_of!(McStat, version) == 184);
    assert!(offset_of!(McStat, root) == 216);
};

pub type MallocFn = unsafe extern "C" fn(*const McSt, usize, *mut c_void) -> *mut c_void;
pub type FreeFn = unsafe extern "C" fn(*const McSt, *mut c_void, *mut c_void);
pub type ReallocFn =
    unsafe extern "C" fn(*const McSt, *mut c_void, usize, *mut c_void) -> *mut c_void;
pub type CallocFn = unsafe extern "C" fn(*const McSt, usize, usize, *mut c_void) -> *mut c_void;

/// A caller's allocator (`memcached_set_memory_allocators`): what libmemcached hands out is
/// allocated with it, so the caller can release it with its own free (PHP does).
#[derive(Clone, Copy)]
pub struct Allocators {
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub realloc: ReallocFn,
    pub calloc: CallocFn,
    pub context: *mut c_void,
}
