#![no_main]
//! libmemfabric's configuration language and server lists on arbitrary bytes, through the
//! C entry points applications call (`memcached()`, `libmemcached_check_configuration`,
//! `memcached_servers_parse`): never a panic or a crash; what parses makes a pool whose
//! servers and behaviours are the ones the parser returned, and frees cleanly.
use std::ffi::CString;

use libfuzzer_sys::fuzz_target;
use memfabric::abi::McSt;
use memfabric::config;
use memfabric::exports::{
    libmemcached_check_configuration, memcached, memcached_behavior_get, memcached_free,
    memcached_server_count, memcached_server_list_count, memcached_server_list_free,
    memcached_servers_parse,
};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = config::parse(&text);
    let mut err = [0 as std::ffi::c_char; 128];
    // SAFETY: `data` is valid for its length; the buffer for its size.
    let rc = unsafe {
        libmemcached_check_configuration(data.as_ptr().cast(), data.len(), err.as_mut_ptr(), err.len())
    };
    let mc: *mut McSt = unsafe { memcached(text.as_ptr().cast(), text.len()) };
    match &parsed {
        Ok(p) => {
            assert!(!mc.is_null());
            assert_eq!(rc, 0);
            // SAFETY: a pool just made.
            unsafe {
                assert_eq!(memcached_server_count(mc) as usize, p.servers.len());
                for &(b, _) in &p.behaviors {
                    let _ = memcached_behavior_get(mc, b);
                }
            }
        }
        Err(_) => assert!(mc.is_null()),
    }
    // SAFETY: NULL or the pool made above.
    unsafe { memcached_free(mc) };
    if let Ok(c) = CString::new(data.to_vec()) {
        // SAFETY: a NUL-terminated string; the list is freed once.
        unsafe {
            let list = memcached_servers_parse(c.as_ptr());
            let _ = memcached_server_list_count(list);
            memcached_server_list_free(list);
        }
    }
});
