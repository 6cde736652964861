//! The index is sized so that it is never what evicts: a store full of its smallest
//! items, even after `cache_memlimit` doubled the limit, loses none of them to a full
//! bucket pair.
use memfabric_store::{GetOptions, SetMode, Store, StoreConfig, StoreStatus};

fn store(memory: usize, hashpower: Option<u8>) -> Store {
    Store::new(StoreConfig {
        memory_limit: memory,
        hashpower,
        background_sweeper: false,
        slab_automove: false,
        ..StoreConfig::default()
    })
    .unwrap()
}

#[test]
fn a_cache_full_of_its_smallest_items_loses_none_to_the_index() {
    let s = store(16 << 20, None);
    // Every chunk of the smallest class (88 bytes) in 16 pages of 1 MiB.
    let per_page = (1 << 20) / 88;
    let n = 16 * per_page;
    for i in 0..n {
        let st = s.store(
            SetMode::Set,
            format!("key:{i}").as_bytes(),
            b"0123456789",
            0,
            0,
            0,
        );
        assert!(matches!(st, StoreStatus::Stored { .. }), "{i}: {st:?}");
    }
    let st = s.stats();
    assert_eq!((st.index_evictions, st.evictions), (0, 0));
    assert_eq!(st.curr_items, n as u64);
    let mut out = Vec::new();
    for i in 0..n {
        out.clear();
        assert!(
            s.get(
                format!("key:{i}").as_bytes(),
                &GetOptions::default(),
                &mut out
            )
            .is_some(),
            "key:{i} lost"
        );
    }
}

#[test]
fn hashpower_is_a_lower_bound() {
    let auto = store(16 << 20, None).stats().hash_power_level;
    assert_eq!(store(16 << 20, Some(4)).stats().hash_power_level, auto);
    assert_eq!(
        store(16 << 20, Some(auto as u8 + 1))
            .stats()
            .hash_power_level,
        auto + 1
    );
}
