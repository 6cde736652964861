//! Every operation end to end: over TCP against Debian's memcached and against memfabricd,
//! and over UCX against memfabricd (`ucx://`, under whatever `UCX_TLS` says).

mod common;

use std::thread::sleep;
use std::time::Duration;

use bytes::Bytes;
use common::{Kind, Server};
use memfabric_client::{Client, Config, Error, Op, Reply, StoreStatus};

fn client(servers: &[&Server]) -> Client {
    let list: Vec<String> = servers.iter().map(|s| s.url()).collect();
    Client::new(list.join(",").as_str(), Config::default()).unwrap()
}

/// `mod name { memcached(), memfabricd(), memfabricd_ucx() }`: the same test body against
/// every server kind. `#[ucx(...)]` before a name puts an attribute (an `ignore` naming a
/// known UCX-path bug) on the UCX case only.
macro_rules! against_all {
    ($($(#[ucx($ucx:meta)])? $name:ident => $body:expr;)*) => {$(
        mod $name {
            use super::*;
            #[test]
            fn memcached() {
                ($body)(Kind::Memcached)
            }
            #[test]
            fn memfabricd() {
                ($body)(Kind::Memfabricd)
            }
            #[test]
            $(#[$ucx])?
            fn memfabricd_ucx() {
                ($body)(Kind::MemfabricdUcx)
            }
        }
    )*};
}

against_all! {
    get_of_missing_key_is_none => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        assert_eq!(c.get(b"missing").unwrap(), None);
        assert_eq!(c.gets(b"missing").unwrap(), None);
    };

    set_then_get_returns_value_and_flags => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        c.set(b"k", b"hello", 42, 0).unwrap();
        let v = c.get(b"k").unwrap().unwrap();
        assert_eq!((&v.data[..], v.flags), (&b"hello"[..], 42));
        c.set(b"k", b"again", 0, 0).unwrap();
        assert_eq!(&c.get(b"k").unwrap().unwrap().data[..], b"again");
    };

    get_reports_cas_0_and_gets_the_cas => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        c.set(b"k", b"hello", 0, 0).unwrap();
        assert_eq!(c.get(b"k").unwrap().unwrap().cas, 0);
        assert_ne!(c.gets(b"k").unwrap().unwrap().cas, 0);
    };

    cas_succeeds_once_then_reports_exists => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        c.set(b"k", b"v1", 0, 0).unwrap();
        let cas = c.gets(b"k").unwrap().unwrap().cas;
        assert_ne!(cas, 0);
        match c.cas(b"k", b"v2", 3, 0, cas).unwrap() {
            StoreStatus::Stored { cas: new } => assert_ne!(new, cas),
            s => panic!("{s:?}"),
        }
        assert_eq!(c.cas(b"k", b"v3", 0, 0, cas).unwrap(), StoreStatus::Exists);
        let v = c.gets(b"k").unwrap().unwrap();
        assert_eq!((&v.data[..], v.flags), (&b"v2"[..], 3));
        assert_eq!(c.cas(b"nokey", b"x", 0, 0, cas).unwrap(), StoreStatus::NotFound);
    };

    add_stores_only_missing_keys => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        assert!(c.add(b"k", b"first", 0, 0).unwrap());
        assert!(!c.add(b"k", b"second", 0, 0).unwrap());
        assert_eq!(&c.get(b"k").unwrap().unwrap().data[..], b"first");
    };

    replace_stores_only_existing_keys => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        assert!(!c.replace(b"k", b"x", 0, 0).unwrap());
        assert_eq!(c.get(b"k").unwrap(), None);
        c.set(b"k", b"old", 0, 0).unwrap();
        assert!(c.replace(b"k", b"new", 7, 0).unwrap());
        let v = c.get(b"k").unwrap().unwrap();
        assert_eq!((&v.data[..], v.flags), (&b"new"[..], 7));
    };

    append_and_prepend_need_an_existing_item => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        assert!(!c.append(b"k", b"x").unwrap());
        assert!(!c.prepend(b"k", b"x").unwrap());
        c.set(b"k", b"mid", 9, 0).unwrap();
        assert!(c.append(b"k", b"-end").unwrap());
        assert!(c.prepend(b"k", b"start-").unwrap());
        let v = c.get(b"k").unwrap().unwrap();
        assert_eq!((&v.data[..], v.flags), (&b"start-mid-end"[..], 9));
    };

    delete_reports_whether_the_key_existed => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        assert!(!c.delete(b"k").unwrap());
        c.set(b"k", b"v", 0, 0).unwrap();
        assert!(c.delete(b"k").unwrap());
        assert_eq!(c.get(b"k").unwrap(), None);
    };

    incr_and_decr_count_and_report_missing_and_non_numeric => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        assert_eq!(c.incr(b"n", 1).unwrap(), None);
        assert_eq!(c.decr(b"n", 1).unwrap(), None);
        c.set(b"n", b"10", 0, 0).unwrap();
        assert_eq!(c.incr(b"n", 5).unwrap(), Some(15));
        assert_eq!(c.decr(b"n", 3).unwrap(), Some(12));
        assert_eq!(c.decr(b"n", 100).unwrap(), Some(0));
        c.set(b"big", b"18446744073709551615", 0, 0).unwrap();
        assert_eq!(c.incr(b"big", 2).unwrap(), Some(1));
        c.set(b"text", b"abc", 0, 0).unwrap();
        assert!(matches!(c.incr(b"text", 1), Err(Error::Client(m)) if m.contains("non-numeric")));
        // The error kept the stream in step. (memcached decrements in place and pads with
        // spaces: "12" decremented to "0" reads back as "0 ".)
        assert_eq!(c.get(b"n").unwrap().unwrap().data.trim_ascii_end(), b"0");
    };

    touch_and_gat_change_the_expiry_time => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        assert!(!c.touch(b"missing", 10).unwrap());
        assert_eq!(c.gat(b"missing", 10).unwrap(), None);
        c.set(b"short", b"s", 0, 1).unwrap();
        c.set(b"kept", b"k", 5, 1).unwrap();
        c.set(b"long", b"l", 0, 0).unwrap();
        assert!(c.touch(b"short", 100).unwrap());
        let v = c.gat(b"kept", 100).unwrap().unwrap();
        assert_eq!((&v.data[..], v.flags), (&b"k"[..], 5));
        assert_ne!(v.cas, 0);
        assert!(c.touch(b"long", 1).unwrap());
        sleep(Duration::from_millis(2100));
        assert!(c.get(b"short").unwrap().is_some());
        assert!(c.get(b"kept").unwrap().is_some());
        assert_eq!(c.get(b"long").unwrap(), None);
    };

    flush_all_empties_every_server => |k| {
        let (a, b) = (Server::start(k, &[]), Server::start(k, &[]));
        let mut c = client(&[&a, &b]);
        let keys: Vec<String> = (0..50).map(|i| format!("key{i}")).collect();
        for key in &keys {
            c.set(key.as_bytes(), b"v", 0, 0).unwrap();
        }
        c.flush_all(0).unwrap();
        for key in &keys {
            assert_eq!(c.get(key.as_bytes()).unwrap(), None);
        }
    };

    stats_and_version_come_from_every_server => |k| {
        let (a, b) = (Server::start(k, &[]), Server::start(k, &[]));
        let mut c = client(&[&a, &b]);
        let stats = c.stats(None);
        assert_eq!(stats.len(), 2);
        assert_eq!(stats[0].0, a.name());
        for (_, r) in &stats {
            let r = r.as_ref().unwrap();
            assert!(r.iter().any(|(k, _)| k == "pid"));
            assert!(r.iter().any(|(k, _)| k == "curr_items"));
        }
        let settings = c.stats(Some("settings"));
        let maxbytes = settings[1].1.as_ref().unwrap().iter().find(|(k, _)| k == "maxbytes").cloned();
        assert_eq!(maxbytes, Some(("maxbytes".to_string(), (64u64 << 20).to_string())));
        for (_, v) in c.version() {
            assert!(v.unwrap().starts_with("1."));
        }
        let h = c.submit(Op::Noop);
        assert_eq!(c.wait(h, Duration::from_secs(1)), Ok(Reply::Ok));
    };

    keys_longer_than_250_bytes_fail_before_sending => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        let long = vec![b'x'; 251];
        assert_eq!(c.set(&long, b"v", 0, 0), Err(Error::InvalidKey));
        assert_eq!(c.get(&long), Err(Error::InvalidKey));
        let ok = vec![b'x'; 250];
        c.set(&ok, b"v", 0, 0).unwrap();
        assert_eq!(&c.get(&ok).unwrap().unwrap().data[..], b"v");
    };

    empty_keys_and_keys_with_spaces_or_control_bytes_fail_before_sending => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        for key in [&b""[..], b"has space", b"ctl\x01", b"new\nline"] {
            assert_eq!(c.set(key, b"v", 0, 0), Err(Error::InvalidKey));
            assert_eq!(c.get(key), Err(Error::InvalidKey));
        }
    };

    too_large_values_fail_and_keep_the_connection_in_step => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        let big = vec![b'z'; 2 << 20];
        assert_eq!(c.set(b"big", &big, 0, 0), Err(Error::TooLarge));
        c.set(b"small", b"s", 0, 0).unwrap();
        assert_eq!(&c.get(b"small").unwrap().unwrap().data[..], b"s");
        assert!(!c.is_down(0));
    };

    pipelined_mixed_operations_complete_in_order => |k| {
        let s = Server::start(k, &[]);
        let mut c = client(&[&s]);
        let ops = vec![
            Op::Store { mode: memfabric_client::StoreMode::Set, key: b"a".to_vec(), value: Bytes::from_static(b"1"), flags: 0, exptime: 0, cas: 0 },
            Op::Arith { key: b"a".to_vec(), delta: 1, incr: true },
            Op::Arith { key: b"zz".to_vec(), delta: 1, incr: true },
            Op::Get { key: b"a".to_vec(), cas: false },
            Op::Delete { key: b"a".to_vec() },
            Op::Get { key: b"a".to_vec(), cas: false },
            Op::Stats { group: None },
            Op::Noop,
        ];
        let hs: Vec<_> = ops.into_iter().map(|op| c.submit(op)).collect();
        let rs = c.wait_all(&hs, Duration::from_secs(2));
        assert!(matches!(rs[0], Ok(Reply::Stored(StoreStatus::Stored { .. }))));
        assert_eq!(rs[1], Ok(Reply::Counter(Some(2))));
        assert_eq!(rs[2], Ok(Reply::Counter(None)));
        assert!(matches!(&rs[3], Ok(Reply::Value(Some(v))) if &v.data[..] == b"2"));
        assert_eq!(rs[4], Ok(Reply::Deleted(true)));
        assert_eq!(rs[5], Ok(Reply::Value(None)));
        assert!(matches!(rs[6], Ok(Reply::Stats(_))));
        assert_eq!(rs[7], Ok(Reply::Ok));
    };
}
