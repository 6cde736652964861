//! memcached storage semantics, driven through the public API.
use memfabric_store::{
    ArithOptions, ArithStatus, DeleteStatus, GetOptions, SetMode, Store, StoreConfig, StoreStatus,
};

fn store() -> Store {
    Store::new(StoreConfig {
        memory_limit: 8 << 20,
        // Dead items stay until a test's own lookup finds them (counted as get_expired).
        background_sweeper: false,
        ..StoreConfig::default()
    })
    .unwrap()
}

fn get(s: &Store, k: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    s.get(k.as_bytes(), &GetOptions::default(), &mut out)
        .map(|_| out)
}

fn set(s: &Store, k: &str, v: &str) -> StoreStatus {
    s.store(SetMode::Set, k.as_bytes(), v.as_bytes(), 0, 0, 0)
}

#[test]
fn set_then_get_returns_value_flags_and_cas() {
    let s = store();
    let st = s.store(SetMode::Set, b"k", b"hello", 42, 0, 0);
    let StoreStatus::Stored { cas } = st else {
        panic!("{st:?}")
    };
    let mut out = Vec::new();
    let info = s.get(b"k", &GetOptions::default(), &mut out).unwrap();
    assert_eq!(out, b"hello");
    assert_eq!(info.flags, 42);
    assert_eq!(info.cas, cas);
    assert!(!info.fetched);
    let info2 = s
        .get(b"k", &GetOptions::default(), &mut Vec::new())
        .unwrap();
    assert!(info2.fetched, "second get sees the first fetch");
}

#[test]
fn get_of_missing_key_is_none() {
    assert!(get(&store(), "nope").is_none());
}

#[test]
fn add_only_stores_absent_keys_and_replace_only_present_ones() {
    let s = store();
    assert!(matches!(
        s.store(SetMode::Replace, b"a", b"1", 0, 0, 0),
        StoreStatus::NotStored
    ));
    assert!(matches!(
        s.store(SetMode::Add, b"a", b"1", 0, 0, 0),
        StoreStatus::Stored { .. }
    ));
    assert!(matches!(
        s.store(SetMode::Add, b"a", b"2", 0, 0, 0),
        StoreStatus::NotStored
    ));
    assert!(matches!(
        s.store(SetMode::Replace, b"a", b"3", 0, 0, 0),
        StoreStatus::Stored { .. }
    ));
    assert_eq!(get(&s, "a").unwrap(), b"3");
}

#[test]
fn cas_on_modified_item_returns_exists_and_on_missing_returns_not_found() {
    let s = store();
    assert_eq!(
        s.store(SetMode::Cas, b"c", b"x", 0, 0, 1),
        StoreStatus::NotFound
    );
    let StoreStatus::Stored { cas } = set(&s, "c", "v1") else {
        panic!()
    };
    set(&s, "c", "v2");
    assert_eq!(
        s.store(SetMode::Cas, b"c", b"v3", 0, 0, cas),
        StoreStatus::Exists
    );
    let cas2 = s.peek(b"c").unwrap().cas;
    assert!(matches!(
        s.store(SetMode::Cas, b"c", b"v3", 0, 0, cas2),
        StoreStatus::Stored { .. }
    ));
    assert_eq!(get(&s, "c").unwrap(), b"v3");
    // Binary-style set with a CAS behaves as cas.
    assert_eq!(
        s.store(SetMode::Set, b"c", b"v4", 0, 0, cas2),
        StoreStatus::Exists
    );
}

#[test]
fn append_and_prepend_keep_flags_and_need_an_item() {
    let s = store();
    assert_eq!(
        s.store(SetMode::Append, b"p", b"x", 0, 0, 0),
        StoreStatus::NotStored
    );
    s.store(SetMode::Set, b"p", b"mid", 7, 0, 0);
    s.store(SetMode::Append, b"p", b"-end", 99, 0, 0);
    s.store(SetMode::Prepend, b"p", b"start-", 99, 0, 0);
    let mut out = Vec::new();
    let info = s.get(b"p", &GetOptions::default(), &mut out).unwrap();
    assert_eq!(out, b"start-mid-end");
    assert_eq!(info.flags, 7);
}

#[test]
fn incr_wraps_decr_floors_and_shrinking_numbers_are_space_padded() {
    let s = store();
    let o = ArithOptions::default();
    assert_eq!(s.arith(b"n", true, 1, &o), ArithStatus::NotFound);
    set(&s, "n", "10");
    assert!(matches!(
        s.arith(b"n", false, 1, &o),
        ArithStatus::Value { value: 9, .. }
    ));
    assert_eq!(get(&s, "n").unwrap(), b"9 ");
    assert!(matches!(
        s.arith(b"n", false, 100, &o),
        ArithStatus::Value { value: 0, .. }
    ));
    set(&s, "n", "18446744073709551615");
    assert!(matches!(
        s.arith(b"n", true, 2, &o),
        ArithStatus::Value { value: 1, .. }
    ));
    set(&s, "n", "99");
    assert!(matches!(
        s.arith(b"n", true, 1, &o),
        ArithStatus::Value { value: 100, .. }
    ));
    assert_eq!(get(&s, "n").unwrap(), b"100");
    set(&s, "t", "abc");
    assert_eq!(s.arith(b"t", true, 1, &o), ArithStatus::NonNumeric);
    set(&s, "e", "");
    assert_eq!(s.arith(b"e", true, 1, &o), ArithStatus::NonNumeric);
}

#[test]
fn an_incr_that_fits_keeps_what_the_item_was_and_one_that_grows_does_not() {
    // memcached rewrites a number that fits in place: the same item, still fetched and
    // still stale; a longer number is a new item that knows neither.
    let s = store();
    let o = ArithOptions::default();
    set(&s, "n", "12 34");
    get(&s, "n").unwrap();
    s.transact(b"n", |t| t.set_marks(Some(true), Some(true)));
    assert!(matches!(
        s.arith(b"n", true, 5, &o),
        ArithStatus::Value { value: 17, .. }
    ));
    let info = s.peek(b"n").unwrap();
    assert!(info.fetched && info.stale && info.token_sent, "{info:?}");
    assert_eq!(get(&s, "n").unwrap(), b"17   ");
    assert!(matches!(
        s.arith(b"n", true, 99_983, &o),
        ArithStatus::Value { value: 100_000, .. }
    ));
    let info = s.peek(b"n").unwrap();
    assert!(!info.fetched && !info.stale && !info.token_sent, "{info:?}");
    // In place is not a store; the new item is (memcached's total_items).
    let before = s.stats().total_items;
    s.arith(b"n", false, 1, &o);
    assert_eq!(s.stats().total_items, before);
}

#[test]
fn empty_and_chunked_values_are_not_numbers_whatever_the_cas() {
    // memcached's order: an empty or chunked value is refused before the CAS is compared,
    // and a chunked one even when it reads as a number.
    let s = store();
    let wrong_cas = ArithOptions {
        cas: 999_999,
        create: None,
    };
    set(&s, "e", "");
    assert_eq!(s.arith(b"e", true, 1, &wrong_cas), ArithStatus::NonNumeric);
    let padded = format!("5{}", " ".repeat(600_000));
    set(&s, "c", &padded);
    assert!(s.peek(b"c").unwrap().chunked);
    let o = ArithOptions::default();
    assert_eq!(s.arith(b"c", true, 1, &o), ArithStatus::NonNumeric);
    set(&s, "u", &padded[..1000]);
    assert_eq!(s.arith(b"u", true, 1, &wrong_cas), ArithStatus::Exists);
    assert!(matches!(
        s.arith(b"u", true, 1, &o),
        ArithStatus::Value { value: 6, .. }
    ));
}

#[test]
fn arith_create_initialises_missing_counters() {
    let s = store();
    let o = ArithOptions {
        cas: 0,
        create: Some((5, 0, 0)),
    };
    assert!(matches!(
        s.arith(b"c", true, 3, &o),
        ArithStatus::Value { value: 5, .. }
    ));
    assert!(matches!(
        s.arith(b"c", true, 3, &o),
        ArithStatus::Value { value: 8, .. }
    ));
}

#[test]
fn delete_with_wrong_cas_is_refused() {
    let s = store();
    assert_eq!(s.delete(b"d", 0), DeleteStatus::NotFound);
    let StoreStatus::Stored { cas } = set(&s, "d", "v") else {
        panic!()
    };
    assert_eq!(s.delete(b"d", cas + 1), DeleteStatus::Exists);
    assert_eq!(s.delete(b"d", cas), DeleteStatus::Deleted);
    assert!(get(&s, "d").is_none());
}

#[test]
fn negative_and_past_exptimes_are_already_expired() {
    let s = store();
    let past = s.clock().exptime(-1);
    s.store(SetMode::Set, b"x", b"v", 0, past, 0);
    assert!(get(&s, "x").is_none());
    assert_eq!(s.stats().get_expired, 1);
    let future = s.clock().exptime(100);
    s.store(SetMode::Set, b"y", b"v", 0, future, 0);
    assert!(get(&s, "y").is_some());
    assert!(s.touch(b"y", past));
    assert!(get(&s, "y").is_none());
    assert!(!s.touch(b"y", 0));
}

#[test]
fn gat_updates_exptime_and_returns_value() {
    let s = store();
    set(&s, "g", "val");
    let mut out = Vec::new();
    let opts = GetOptions {
        touch: Some(s.clock().exptime(1000)),
        bump: true,
        ..GetOptions::default()
    };
    let before = s.get(b"g", &opts, &mut out).unwrap();
    assert_eq!(before.exptime, 0);
    assert_eq!(out, b"val");
    assert!(s.peek(b"g").unwrap().exptime > s.clock().now());
}

#[test]
fn flush_all_hides_everything_stored_before_it() {
    let s = store();
    set(&s, "a", "1");
    set(&s, "b", "2");
    s.flush_all(None);
    assert!(get(&s, "a").is_none());
    assert!(get(&s, "b").is_none());
    set(&s, "a", "3");
    assert_eq!(get(&s, "a").unwrap(), b"3");
    // A delayed flush leaves items alone until its time comes.
    s.flush_all(Some(s.clock().now() + 100));
    assert_eq!(get(&s, "a").unwrap(), b"3");
}

#[test]
fn too_large_matches_memcached_accounting() {
    let s = store(); // -I 1m
                     // memcached: 48 + key+1 + value+2 + 8 (cas) must fit in 1 MiB.
    let key = b"0123456789";
    let max_value = (1 << 20) - 48 - 11 - 2 - 8;
    let v = vec![b'x'; max_value];
    assert!(matches!(
        s.store(SetMode::Set, key, &v, 0, 0, 0),
        StoreStatus::Stored { .. }
    ));
    let v = vec![b'x'; max_value + 1];
    assert_eq!(
        s.store(SetMode::Set, key, &v, 0, 0, 0),
        StoreStatus::TooLarge
    );
    // Non-zero flags cost memcached 4 more bytes.
    let v = vec![b'x'; max_value];
    assert_eq!(
        s.store(SetMode::Set, key, &v, 1, 0, 0),
        StoreStatus::TooLarge
    );
}

#[test]
fn values_larger_than_a_page_are_chained_and_read_back_intact() {
    let s = Store::new(StoreConfig {
        memory_limit: 64 << 20,
        item_size_max: 8 << 20,
        ..StoreConfig::default()
    })
    .unwrap();
    let v: Vec<u8> = (0..(3 << 20) + 12345)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    assert!(matches!(
        s.store(SetMode::Set, b"big", &v, 3, 0, 0),
        StoreStatus::Stored { .. }
    ));
    let mut out = Vec::new();
    s.get(b"big", &GetOptions::default(), &mut out).unwrap();
    assert!(out == v, "chained value differs");
    s.store(SetMode::Append, b"big", b"tail", 0, 0, 0);
    out.clear();
    s.get(b"big", &GetOptions::default(), &mut out).unwrap();
    assert_eq!(&out[out.len() - 4..], b"tail");
    assert_eq!(out.len(), v.len() + 4);
    assert_eq!(s.delete(b"big", 0), DeleteStatus::Deleted);
}

#[test]
fn full_memory_evicts_cold_items_and_keeps_hot_ones() {
    let s = Store::new(StoreConfig {
        memory_limit: 4 << 20,
        slab_automove: false,
        ..StoreConfig::default()
    })
    .unwrap();
    let v = vec![b'v'; 1000];
    for i in 0..200 {
        s.store(SetMode::Set, format!("hot{i}").as_bytes(), &v, 0, 0, 0);
    }
    for round in 0..20 {
        for i in 0..200 {
            assert!(
                get(&s, &format!("hot{i}")).is_some(),
                "hot{i} lost in round {round}"
            );
        }
        for i in 0..1000 {
            s.store(
                SetMode::Set,
                format!("cold{round}-{i}").as_bytes(),
                &v,
                0,
                0,
                0,
            );
        }
    }
    assert!(s.stats().evictions > 0);
}

#[test]
fn eviction_off_returns_out_of_memory() {
    let s = Store::new(StoreConfig {
        memory_limit: 2 << 20,
        evict: false,
        slab_automove: false,
        ..StoreConfig::default()
    })
    .unwrap();
    let v = vec![b'v'; 1000];
    let mut oom = false;
    for i in 0..10_000 {
        if s.store(SetMode::Set, format!("k{i}").as_bytes(), &v, 0, 0, 0)
            == StoreStatus::OutOfMemory
        {
            oom = true;
            break;
        }
    }
    assert!(oom);
}

#[test]
fn automove_gives_pages_to_a_class_that_keeps_evicting() {
    let s = Store::new(StoreConfig {
        memory_limit: 8 << 20,
        ..StoreConfig::default()
    })
    .unwrap();
    // Fill memory with small items, then switch to large ones.
    for i in 0..200_000 {
        s.store(
            SetMode::Set,
            format!("s{i}").as_bytes(),
            b"0123456789",
            0,
            0,
            0,
        );
    }
    let big = vec![b'b'; 50_000];
    let held = |s: &Store| {
        (0..200)
            .filter(|i| get(s, &format!("b{i}")).is_some())
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // One page holds ~16 such items; only moved pages let the class hold more.
    while held(&s) <= 48 && std::time::Instant::now() < deadline {
        for i in 0..200 {
            s.store(SetMode::Set, format!("b{i}").as_bytes(), &big, 0, 0, 0);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        s.stats().slabs_moved > 0,
        "no page moved after the workload shift"
    );
    assert!(held(&s) > 48, "only {} large items retained", held(&s));
}

#[test]
fn slabs_reassign_moves_a_page_and_reports_memcached_errors() {
    use memfabric_store::ReassignStatus;
    let s = Store::new(StoreConfig {
        memory_limit: 8 << 20,
        slab_automove: false,
        ..StoreConfig::default()
    })
    .unwrap();
    assert_eq!(s.slabs_reassign(1, 1), ReassignStatus::Same);
    assert_eq!(s.slabs_reassign(1, 99), ReassignStatus::BadClass);
    assert_eq!(s.slabs_reassign(1, 2), ReassignStatus::NoSpare);
    for i in 0..30_000 {
        s.store(SetMode::Set, format!("k{i}").as_bytes(), b"v", 0, 0, 0);
    }
    let class = s.peek(b"k1").unwrap().class_id;
    let pages = |s: &Store, c: u8| {
        s.slab_stats()
            .iter()
            .find(|x| x.id == c)
            .map_or(0, |x| x.total_pages)
    };
    let before = pages(&s, class);
    assert!(before >= 2);
    assert_eq!(s.slabs_reassign(class as i32, 5), ReassignStatus::Ok);
    assert_eq!(pages(&s, class), before - 1);
    assert_eq!(pages(&s, 5), 1);
    assert_eq!(s.stats().slabs_moved, 1);
}

#[test]
fn cachedump_lists_live_items_of_a_class() {
    let s = store();
    set(&s, "alpha", "12345");
    let class = s.peek(b"alpha").unwrap().class_id;
    let dump = s.cachedump(class, 10);
    assert_eq!(dump, vec![(b"alpha".to_vec(), 5, 0)]);
    assert!(s.cachedump(0, 10).is_empty());
}

/// Unlimited, a dump fills memcached's 2 MB reply as its lines are written: it stopped
/// at about 1.2 MB, counting each line as its key plus 40 bytes.
#[test]
fn cachedump_without_a_limit_fills_two_megabytes_of_lines() {
    let s = Store::new(StoreConfig {
        memory_limit: 64 << 20,
        background_sweeper: false,
        ..StoreConfig::default()
    })
    .unwrap();
    for i in 0..120_000 {
        assert!(matches!(
            set(&s, &format!("k{i:06}"), "v"),
            StoreStatus::Stored { .. }
        ));
    }
    let class = s.peek(b"k000000").unwrap().class_id;
    let dump = s.cachedump(class, 0);
    let bytes: usize = dump
        .iter()
        .map(|(k, len, exp)| {
            format!("ITEM {} [{len} b; {exp} s]\r\n", String::from_utf8_lossy(k)).len()
        })
        .sum::<usize>()
        + "END\r\n".len();
    let line = "ITEM k000000 [1 b; 0 s]\r\n".len();
    assert!(bytes <= 2 << 20, "{bytes}");
    assert!(bytes + line + 1 > 2 << 20, "{bytes}: room for another line");
    assert_eq!(s.cachedump(class, 7).len(), 7);
}

#[test]
fn memory_limit_can_grow_to_twice_the_start_and_shrink() {
    let s = store(); // 8 MiB
    assert!(s.set_memory_limit(16 << 20));
    assert_eq!(s.stats().limit_maxbytes, 16 << 20);
    assert!(!s.set_memory_limit(17 << 20));
    assert!(s.set_memory_limit(4 << 20));
}
