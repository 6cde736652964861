//! The store's counters agree with memcached 1.6.18's after the same operations
//! (each expectation below was measured on Debian's memcached; see docs/store.md,
//! "Counters").
use memfabric_store::{ArithOptions, ArithStatus, GetOptions, SetMode, Store, StoreConfig};

/// No background sweeper: dead items stay linked until the test looks them up or calls
/// `reclaim_dead`, so every count is exact.
fn store(memory: usize) -> Store {
    Store::new(StoreConfig {
        memory_limit: memory,
        background_sweeper: false,
        slab_automove: false,
        ..StoreConfig::default()
    })
    .unwrap()
}

fn set(s: &Store, k: &str, v: &str, exptime: u32) {
    let st = s.store(SetMode::Set, k.as_bytes(), v.as_bytes(), 0, exptime, 0);
    assert!(
        matches!(st, memfabric_store::StoreStatus::Stored { .. }),
        "{st:?}"
    );
}

fn get(s: &Store, k: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    s.get(k.as_bytes(), &GetOptions::default(), &mut out)
        .map(|_| out)
}

/// An absolute exptime in the past: the item is dead as soon as it is stored.
const DEAD: u32 = 1;

#[test]
fn flush_all_lowers_curr_items_and_bytes_once_the_sweeper_has_run() {
    let s = store(64 << 20);
    for i in 0..200_000 {
        set(&s, &format!("key:{i}"), "0123456789", 0);
    }
    assert_eq!(s.stats().curr_items, 200_000);
    s.flush_all(None);
    assert_eq!(s.reclaim_dead(), 200_000);
    let st = s.stats();
    assert_eq!((st.curr_items, st.bytes), (0, 0));
    // memcached's LRU maintainer counts flushed items it pulls as reclaimed (and
    // expired_unfetched when never read); reads found none of them.
    assert_eq!((st.reclaimed, st.expired_unfetched), (200_000, 200_000));
    assert_eq!(
        (st.get_flushed, st.get_expired, st.crawler_reclaimed),
        (0, 0, 0)
    );
    // Refilling counts only the new items.
    for i in 0..1000 {
        set(&s, &format!("key:{i}"), "0123456789", 0);
    }
    assert_eq!(s.stats().curr_items, 1000);
    assert!(s.item_stats().iter().map(|c| c.number).sum::<u64>() == 1000);
}

#[test]
fn a_mass_expiry_is_reclaimed_in_one_sweep_and_live_items_stay() {
    let s = store(64 << 20);
    for i in 0..300_000 {
        set(&s, &format!("e{i}"), "0123456789", DEAD);
    }
    for i in 0..100 {
        set(&s, &format!("p{i}"), "0123456789", 0);
    }
    for i in 0..100 {
        let later = s.clock().exptime(1000);
        set(&s, &format!("t{i}"), "0123456789", later);
    }
    assert_eq!(s.reclaim_dead(), 300_000);
    let st = s.stats();
    assert_eq!(st.curr_items, 200);
    assert_eq!((st.reclaimed, st.expired_unfetched), (300_000, 300_000));
    assert_eq!((st.get_expired, st.crawler_reclaimed), (0, 0));
    // Nothing is due any more: a second pass finds nothing.
    assert_eq!(s.reclaim_dead(), 0);
    assert!(get(&s, "p7").is_some() && get(&s, "t7").is_some());
    assert!(get(&s, "e7").is_none());
    assert_eq!(s.stats().get_expired, 0, "reclaimed items are plain misses");
}

#[test]
fn a_lookup_that_finds_a_dead_item_counts_get_expired_or_get_flushed_not_reclaimed() {
    let s = store(8 << 20);
    set(&s, "x", "v", DEAD);
    assert!(get(&s, "x").is_none());
    let st = s.stats();
    assert_eq!(
        (st.get_expired, st.reclaimed, st.expired_unfetched),
        (1, 0, 0)
    );
    assert_eq!(st.curr_items, 0);

    set(&s, "f1", "v", 0);
    set(&s, "f2", "v", 0);
    set(&s, "f3", "v", 0);
    s.flush_all(None);
    assert!(get(&s, "f1").is_none());
    // memcached looks the key up for a store too, and counts the flushed item it finds.
    set(&s, "f2", "new", 0);
    let st = s.stats();
    assert_eq!((st.get_flushed, st.get_expired), (2, 1));
    assert_eq!((st.reclaimed, st.expired_unfetched), (0, 0));
    // f3 still counts until the sweeper (or a lookup) removes it, as in memcached.
    assert_eq!(st.curr_items, 2);
    assert_eq!(s.reclaim_dead(), 1);
    let st = s.stats();
    assert_eq!(
        (st.curr_items, st.reclaimed, st.expired_unfetched),
        (1, 1, 1)
    );
    assert_eq!(get(&s, "f2").unwrap(), b"new");
}

#[test]
fn incr_in_place_is_not_a_store_but_a_longer_number_is() {
    let s = store(8 << 20);
    set(&s, "z", "9", 0);
    let total = || s.stats().total_items;
    assert_eq!(total(), 1);
    let arith = |incr, delta| match s.arith(b"z", incr, delta, &ArithOptions::default()) {
        ArithStatus::Value { value, .. } => value,
        other => panic!("{other:?}"),
    };
    // 9 -> 10 does not fit in place: memcached links a new item and counts it.
    assert_eq!(arith(true, 1), 10);
    assert_eq!(total(), 2);
    assert_eq!(arith(true, 1), 11);
    assert_eq!(arith(false, 5), 6);
    assert_eq!(total(), 2, "in-place incr/decr are not stores");
    assert_eq!(get(&s, "z").unwrap(), b"6 ");
    // append is a store; touch is not.
    s.store(SetMode::Append, b"z", b"0", 0, 0, 0);
    assert_eq!(total(), 3);
    assert!(s.touch(b"z", 0));
    assert_eq!(total(), 3);
    assert_eq!(s.stats().curr_items, 1);
}

#[test]
fn an_item_stored_on_a_page_swept_before_a_delayed_flush_is_reclaimed_when_it_comes() {
    let s = store(8 << 20);
    let now = s.clock().now();
    // The page is swept before the flush time (its only item expired), and is empty
    // then; an item stored on it afterwards must still be reclaimed at the flush time.
    set(&s, "short", "x", now + 1);
    s.flush_all(Some(now + 3));
    while s.clock().now() <= now + 1 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(s.reclaim_dead(), 1, "the expired item");
    set(&s, "later", "y", 0);
    assert_eq!(s.stats().curr_items, 1);
    // Bounded: the flush time is three seconds away at most.
    while s.clock().now() <= now + 3 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(s.reclaim_dead(), 1, "the item the delayed flush killed");
    assert_eq!(s.stats().curr_items, 0);
    assert_eq!(get(&s, "later"), None);
}
