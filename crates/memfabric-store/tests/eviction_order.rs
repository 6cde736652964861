//! Within a slab class, items that are never read are evicted oldest first (memcached's
//! LRU order); an item that was read gets one second chance. Exact survivors, no timing.
use memfabric_store::{DeleteStatus, GetOptions, SetMode, Store, StoreConfig, StoreStatus};

/// Four 1 MiB pages, no automove (a page moving between classes would change the
/// capacity), no sweeper.
fn store() -> Store {
    Store::new(StoreConfig {
        memory_limit: 4 << 20,
        slab_automove: false,
        background_sweeper: false,
        ..StoreConfig::default()
    })
    .unwrap()
}

/// 100-byte values and 8-byte keys (`key`): every item is in the 184-byte class.
const VALUE: &[u8] = &[b'v'; 100];
/// Items of that class in four pages.
const CAPACITY: usize = 4 * ((1 << 20) / 184);

fn key(prefix: &str, i: usize) -> String {
    format!("{prefix}{i:07}")
}

fn set(s: &Store, k: &str) {
    let st = s.store(SetMode::Set, k.as_bytes(), VALUE, 0, 0, 0);
    assert!(matches!(st, StoreStatus::Stored { .. }), "{k}: {st:?}");
}

fn present(s: &Store, k: &str) -> bool {
    // Peek: looking must not count as an access.
    s.peek(k.as_bytes()).is_some()
}

fn survivors(s: &Store, prefix: &str, n: usize) -> Vec<usize> {
    (0..n).filter(|i| present(s, &key(prefix, *i))).collect()
}

#[test]
fn never_read_items_are_evicted_oldest_first() {
    let s = store();
    let n = 3 * CAPACITY + 123;
    for i in 0..n {
        set(&s, &key("a", i));
    }
    assert_eq!(s.stats().curr_items as usize, CAPACITY);
    assert_eq!(survivors(&s, "a", n), (n - CAPACITY..n).collect::<Vec<_>>());
}

#[test]
fn items_stored_in_reused_free_chunks_do_not_jump_the_queue() {
    let s = store();
    for i in 0..CAPACITY {
        set(&s, &key("a", i));
    }
    assert_eq!(s.stats().evictions, 0);
    // Free 100 chunks in the middle; 100 newer items take them.
    let mid = CAPACITY / 2;
    for i in mid..mid + 100 {
        assert_eq!(s.delete(key("a", i).as_bytes(), 0), DeleteStatus::Deleted);
    }
    for i in 0..100 {
        set(&s, &key("b", i));
    }
    // Now evict mid + 100 items: the oldest are a0..a(mid-1), then a(mid+100)...
    for i in 0..mid + 100 {
        set(&s, &key("c", i));
    }
    assert_eq!(s.stats().evictions as usize, mid + 100);
    let expect_a: Vec<usize> = (mid + 200..CAPACITY).collect();
    assert_eq!(survivors(&s, "a", CAPACITY), expect_a);
    assert_eq!(survivors(&s, "b", 100), (0..100).collect::<Vec<_>>());
    assert_eq!(survivors(&s, "c", mid + 100).len(), mid + 100);
}

#[test]
fn a_read_item_gets_a_second_chance_and_unread_ones_do_not() {
    let s = store();
    for i in 0..CAPACITY {
        set(&s, &key("a", i));
    }
    let mut out = Vec::new();
    for i in 0..10 {
        out.clear();
        assert!(s
            .get(key("a", i).as_bytes(), &GetOptions::default(), &mut out)
            .is_some());
    }
    let evict = CAPACITY / 2;
    for i in 0..evict {
        set(&s, &key("c", i));
    }
    let mut expect: Vec<usize> = (0..10).collect();
    expect.extend(10 + evict..CAPACITY);
    assert_eq!(survivors(&s, "a", CAPACITY), expect);
}
