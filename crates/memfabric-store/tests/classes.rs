//! The slab class the store reports for what a command touched (memcached's per-class
//! `stats slabs` counters are kept by the server from these).
use memfabric_store::{
    ArithOptions, ArithStatus, DeleteStatus, Found, SetMode, Store, StoreConfig, StoreStatus,
};

fn store() -> Store {
    Store::new(StoreConfig {
        memory_limit: 64 << 20,
        ..StoreConfig::default()
    })
    .unwrap()
}

fn class_of(s: &Store, key: &[u8]) -> u8 {
    s.peek(key).expect("stored").class_id
}

#[test]
fn item_class_is_the_class_a_stored_item_of_that_shape_lands_in() {
    let s = store();
    let sizes = [
        0usize,
        1,
        10,
        40,
        41,
        100,
        1000,
        5000,
        20_000,
        200_000,
        600_000,
        1 << 20,
    ];
    for key_len in [1usize, 30, 250] {
        for &len in &sizes {
            let key = vec![b'k'; key_len];
            let value = vec![b'v'; len];
            let st = s.store(SetMode::Set, &key, &value, 7, 0, 0);
            if st == StoreStatus::TooLarge {
                // Past `-I`: no class question to answer.
                assert!(len >= (1 << 20) - 300, "{len}");
                continue;
            }
            assert!(matches!(st, StoreStatus::Stored { .. }), "{st:?}");
            assert_eq!(
                s.item_class(key_len, len),
                Some(class_of(&s, &key)),
                "key {key_len} value {len}"
            );
        }
    }
}

#[test]
fn found_reports_the_class_of_the_item_that_was_under_the_key() {
    let s = store();
    let small = s.item_class(1, 2).unwrap();
    let big = s.item_class(1, 5000).unwrap();
    assert_ne!(small, big);
    s.store(SetMode::Set, b"n", b"10", 0, 0, 0);
    s.store(SetMode::Set, b"b", &[b'x'; 5000], 0, 0, 0);

    let r = s.arith_found(b"n", true, 5, &ArithOptions::default());
    assert!(matches!(r.status, ArithStatus::Value { value: 15, .. }));
    assert_eq!(r.class_id, Some(small));
    assert_eq!(
        s.arith_found(b"none", true, 1, &ArithOptions::default()),
        Found {
            status: ArithStatus::NotFound,
            class_id: None
        }
    );

    assert_eq!(s.touch_found(b"b", 0), Some(big));
    assert_eq!(s.touch_found(b"none", 0), None);

    // A CAS hit or mismatch is counted against the old item's class, not the new one's.
    let cas = s.peek(b"b").unwrap().cas;
    let bad = s.store_found(SetMode::Cas, b"b", b"tiny", 0, 0, cas + 1);
    assert_eq!(bad.status, StoreStatus::Exists);
    assert_eq!(bad.class_id, Some(big));
    let good = s.store_found(SetMode::Cas, b"b", b"tiny", 0, 0, cas);
    assert!(matches!(good.status, StoreStatus::Stored { .. }));
    assert_eq!(good.class_id, Some(big));
    assert_eq!(class_of(&s, b"b"), small);
    let app = s.store_found(SetMode::Append, b"b", b"!", 0, 0, 0);
    assert!(matches!(app.status, StoreStatus::Stored { .. }));
    assert_eq!(app.class_id, Some(small));

    let d = s.delete_found(b"b", 0);
    assert_eq!(d.status, DeleteStatus::Deleted);
    assert_eq!(d.class_id, Some(small));
    assert_eq!(s.delete_found(b"b", 0).class_id, None);
}
