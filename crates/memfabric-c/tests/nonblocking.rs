//! memfabric.h's non-blocking requests through the exported C functions: many in flight
//! on UCX and TCP, every code a caller can meet (in progress, a miss, a reused request
//! still in flight, a request of another pool, a silent server's timeout, a request freed
//! in flight) and no wait that is not bounded.

#[path = "../../memfabric-client/tests/common/mod.rs"]
mod common;

use std::ffi::CString;
use std::net::TcpListener;
use std::ptr;

use common::{Kind, Server};
use memfabric::abi::{self, McSt};
use memfabric::exports::*;

struct Pool(*mut McSt);

impl Pool {
    fn new(port: u16) -> Pool {
        // SAFETY: a fresh pool with one server; freed on drop.
        unsafe {
            let mc = memcached_create(ptr::null_mut());
            let host = CString::new("127.0.0.1").unwrap();
            assert_eq!(memcached_server_add(mc, host.as_ptr(), port), abi::SUCCESS);
            memcached_behavior_set(mc, 8, 2000); // POLL_TIMEOUT
            Pool(mc)
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: created in new.
        unsafe { memcached_free(self.0) };
    }
}

fn value(req: *const memfabric::commands::Request) -> Option<Vec<u8>> {
    let mut len = 0usize;
    let mut flags = 0u32;
    // SAFETY: a request of ours; the value is copied before the request is reused.
    unsafe {
        let v = memcached_request_value(req, &mut len, &mut flags);
        (!v.is_null()).then(|| std::slice::from_raw_parts(v.cast::<u8>(), len).to_vec())
    }
}

fn many_in_flight(kind: Kind) {
    let server = Server::start(kind, &[]);
    let pool = Pool::new(server.port);
    let n = 256;
    // SAFETY: requests of `pool`, freed at the end; keys and values outlive the calls.
    unsafe {
        let reqs: Vec<_> = (0..n).map(|_| memcached_request_create(pool.0)).collect();
        for (i, &r) in reqs.iter().enumerate() {
            let k = format!("k{i}");
            let v = format!("v{i}");
            let rc = memcached_iset(
                pool.0,
                k.as_ptr().cast(),
                k.len(),
                v.as_ptr().cast(),
                v.len(),
                0,
                i as u32,
                r,
            );
            assert_eq!(rc, abi::SUCCESS);
        }
        assert_eq!(
            memcached_wait_all(pool.0, reqs.as_ptr(), n, 5000),
            abi::SUCCESS
        );
        for &r in &reqs {
            assert_eq!(memcached_request_status(r), abi::SUCCESS);
        }
        for (i, &r) in reqs.iter().enumerate() {
            // Every other key is missing.
            let k = if i % 2 == 0 {
                format!("k{i}")
            } else {
                format!("nope{i}")
            };
            assert_eq!(
                memcached_bget(pool.0, k.as_ptr().cast(), k.len(), r),
                abi::SUCCESS
            );
        }
        // A request still in flight cannot be issued again.
        let k = "k0";
        let rc = memcached_iget(pool.0, k.as_ptr().cast(), k.len(), reqs[n - 1]);
        assert!(
            rc == abi::IN_PROGRESS || memcached_request_status(reqs[n - 1]) != abi::IN_PROGRESS
        );
        assert_eq!(
            memcached_wait_all(pool.0, reqs.as_ptr(), n, 5000),
            abi::SUCCESS
        );
        for (i, &r) in reqs.iter().enumerate() {
            if i % 2 == 0 {
                assert_eq!(memcached_test(pool.0, r), abi::SUCCESS);
                assert_eq!(value(r), Some(format!("v{i}").into_bytes()));
                assert_ne!(memcached_request_cas(r), 0);
            } else {
                assert_eq!(memcached_test(pool.0, r), abi::NOTFOUND);
                assert_eq!(value(r), None);
            }
        }
        // Delete, then the key is gone.
        assert_eq!(
            memcached_idelete(pool.0, c"k0".as_ptr(), 2, reqs[0]),
            abi::SUCCESS
        );
        assert_eq!(memcached_wait(pool.0, reqs[0]), abi::SUCCESS);
        assert_eq!(
            memcached_iget(pool.0, c"k0".as_ptr(), 2, reqs[0]),
            abi::SUCCESS
        );
        assert_eq!(memcached_wait(pool.0, reqs[0]), abi::NOTFOUND);
        // A bad key is refused at issue, and the request says why.
        assert_eq!(
            memcached_iget(pool.0, c"a b".as_ptr(), 3, reqs[1]),
            abi::BAD_KEY_PROVIDED
        );
        assert_eq!(memcached_request_status(reqs[1]), abi::BAD_KEY_PROVIDED);
        // Freed in flight: abandoned, and the pool goes on.
        assert_eq!(
            memcached_iget(pool.0, c"k2".as_ptr(), 2, reqs[2]),
            abi::SUCCESS
        );
        memcached_request_free(reqs[2]);
        assert_eq!(
            memcached_iget(pool.0, c"k4".as_ptr(), 2, reqs[3]),
            abi::SUCCESS
        );
        assert_eq!(memcached_wait(pool.0, reqs[3]), abi::SUCCESS);
        for (i, r) in reqs.into_iter().enumerate() {
            if i != 2 {
                memcached_request_free(r);
            }
        }
    }
    if kind == Kind::MemfabricdUcx {
        // SAFETY: the pool's first server.
        assert_eq!(unsafe { memfabric_server_over_ucx(pool.0, 0) }, 1);
    }
}

#[test]
fn many_requests_in_flight_over_ucx() {
    many_in_flight(Kind::MemfabricdUcx);
}

#[test]
fn many_requests_in_flight_over_tcp() {
    many_in_flight(Kind::Memcached);
}

#[test]
fn misuse_is_answered_not_crashed_on() {
    let server = Server::start(Kind::Memcached, &[]);
    let a = Pool::new(server.port);
    let b = Pool::new(server.port);
    // SAFETY: requests of `a`, used with `b` on purpose; NULLs on purpose.
    unsafe {
        assert!(memcached_request_create(ptr::null_mut()).is_null());
        memcached_request_free(ptr::null_mut());
        let r = memcached_request_create(a.0);
        assert_eq!(
            memcached_test(a.0, r),
            abi::INVALID_ARGUMENTS,
            "never issued"
        );
        assert_eq!(
            memcached_iget(b.0, c"k".as_ptr(), 1, r),
            abi::INVALID_ARGUMENTS,
            "another pool's"
        );
        assert_eq!(
            memcached_iget(a.0, c"k".as_ptr(), 1, ptr::null_mut()),
            abi::INVALID_ARGUMENTS
        );
        assert_eq!(memcached_wait(a.0, ptr::null_mut()), abi::INVALID_ARGUMENTS);
        assert_eq!(
            memcached_wait_all(a.0, ptr::null(), 3, 10),
            abi::INVALID_ARGUMENTS
        );
        assert_eq!(memcached_wait_all(a.0, ptr::null(), 0, 10), abi::SUCCESS);
        assert_eq!(
            memcached_request_status(ptr::null()),
            abi::INVALID_ARGUMENTS
        );
        assert!(memcached_request_value(ptr::null(), ptr::null_mut(), ptr::null_mut()).is_null());
        memcached_request_free(r);
    }
}

#[test]
fn a_stopped_server_times_out_within_the_wait() {
    let server = Server::start(Kind::Memcached, &[]);
    let pool = Pool::new(server.port);
    // SAFETY: a request of `pool`.
    unsafe {
        let r = memcached_request_create(pool.0);
        // Connected (and the transport chosen) while the server answers...
        assert_eq!(memcached_iget(pool.0, c"k".as_ptr(), 1, r), abi::SUCCESS);
        assert_eq!(memcached_wait(pool.0, r), abi::NOTFOUND);
        // ...then it stops answering.
        server.signal("STOP");
        assert_eq!(memcached_iget(pool.0, c"k".as_ptr(), 1, r), abi::SUCCESS);
        assert_eq!(memcached_test(pool.0, r), abi::IN_PROGRESS);
        assert_eq!(memcached_wait_for(pool.0, r, 100), abi::TIMEOUT);
        assert_eq!(memcached_request_status(r), abi::TIMEOUT);
        server.signal("CONT");
        memcached_request_free(r);
    }
}

#[test]
fn a_silent_server_fails_at_issue_or_wait_never_hangs() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap(); // accepts (backlog), never answers
    let pool = Pool::new(silent.local_addr().unwrap().port());
    // SAFETY: a request of `pool`.
    unsafe {
        memcached_behavior_set(pool.0, 8, 300); // POLL_TIMEOUT
        let r = memcached_request_create(pool.0);
        // Choosing the transport asks the server (stats fabric) first: no answer is a
        // timeout at issue (MEMFABRIC_TRANSPORT=tcp would connect without asking).
        let rc = memcached_iget(pool.0, c"k".as_ptr(), 1, r);
        if rc == abi::SUCCESS {
            assert_eq!(memcached_wait(pool.0, r), abi::TIMEOUT);
        } else {
            assert_eq!(rc, abi::TIMEOUT);
            assert_eq!(memcached_request_status(r), abi::TIMEOUT);
        }
        memcached_request_free(r);
    }
}
