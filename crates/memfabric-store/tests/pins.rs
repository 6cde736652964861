//! Pending items (values received straight into item memory) and pinned items (values
//! sent straight from item memory), through the public API.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memfabric_store::{
    AllocError, DeleteStatus, GetOptions, PendingItem, PinnedItem, SetMode, Store, StoreConfig,
    StoreStatus,
};

fn store_with(memory: usize, evict: bool, item_size_max: usize) -> Store {
    Store::new(StoreConfig {
        memory_limit: memory,
        evict,
        item_size_max,
        slab_automove: false,
        background_sweeper: false,
        ..StoreConfig::default()
    })
    .unwrap()
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(seed.wrapping_mul(97)) as u8
        })
        .collect()
}

fn get(s: &Store, k: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    s.get(k, &GetOptions::default(), &mut out).map(|_| out)
}

fn set(s: &Store, k: &[u8], v: &[u8]) -> StoreStatus {
    s.store(SetMode::Set, k, v, 0, 0, 0)
}

fn stored(st: StoreStatus) -> bool {
    matches!(st, StoreStatus::Stored { .. })
}

fn pinned(s: &Store, k: &[u8]) -> PinnedItem {
    s.get_pinned(k, &GetOptions::default()).expect("hit").1
}

fn value_of(p: &PinnedItem) -> Vec<u8> {
    let mut v = Vec::new();
    p.read_value(&mut v);
    v
}

fn used_chunks(s: &Store) -> u64 {
    s.slab_stats().iter().map(|c| c.used_chunks).sum()
}

/// Segments of a pending item: in order, non-empty, summing to the value length.
fn check_segments(p: &mut PendingItem) -> usize {
    let segs = p.value_segments();
    assert!(segs.iter().all(|&(ptr, len)| !ptr.is_null() && len > 0));
    assert_eq!(segs.iter().map(|s| s.1).sum::<usize>(), p.value_len());
    segs.len()
}

/// Write `v` into `p` in uneven pieces, as a value arriving over several rounds does.
fn write_in_pieces(p: &mut PendingItem, v: &[u8], piece: usize) {
    let mut at = 0;
    while at < v.len() {
        let end = (at + piece).min(v.len());
        p.write(at, &v[at..end]);
        at = end;
    }
}

#[test]
fn pending_item_written_in_pieces_is_stored_and_read_back() {
    let s = store_with(8 << 20, true, 1 << 20);
    let v = pattern(1, 10_000);
    let mut p = s.alloc_pending(b"pk", v.len(), 7, 0).unwrap();
    assert_eq!(p.value_len(), v.len());
    assert_eq!(p.key(), b"pk");
    assert_eq!(check_segments(&mut p), 1, "a normal item is one segment");
    write_in_pieces(&mut p, &v, 333);
    assert!(stored(s.store_pending(SetMode::Set, p, 0)));
    let mut out = Vec::new();
    let info = s.get(b"pk", &GetOptions::default(), &mut out).unwrap();
    assert_eq!(out, v);
    assert_eq!(info.flags, 7);
}

#[test]
fn pending_item_is_filled_and_stored_on_another_thread() {
    let s = store_with(8 << 20, true, 1 << 20);
    let v = pattern(2, 4096);
    let p = s.alloc_pending(b"moved", v.len(), 0, 0).unwrap();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut p = p;
            p.write(0, &v);
            assert!(stored(s.store_pending(SetMode::Set, p, 0)));
        });
    });
    assert_eq!(get(&s, b"moved").unwrap(), v);
}

#[test]
fn store_pending_follows_every_set_mode() {
    let s = store_with(8 << 20, true, 1 << 20);
    let pend = |k: &[u8], v: &[u8]| {
        let mut p = s.alloc_pending(k, v.len(), 0, 0).unwrap();
        p.write(0, v);
        p
    };
    assert_eq!(
        s.store_pending(SetMode::Replace, pend(b"k", b"x"), 0),
        StoreStatus::NotStored
    );
    assert_eq!(
        s.store_pending(SetMode::Append, pend(b"k", b"x"), 0),
        StoreStatus::NotStored
    );
    assert!(stored(s.store_pending(SetMode::Add, pend(b"k", b"mid"), 0)));
    assert_eq!(
        s.store_pending(SetMode::Add, pend(b"k", b"no"), 0),
        StoreStatus::NotStored
    );
    assert!(stored(s.store_pending(
        SetMode::Append,
        pend(b"k", b">>"),
        0
    )));
    assert!(stored(s.store_pending(
        SetMode::Prepend,
        pend(b"k", b"<<"),
        0
    )));
    assert_eq!(get(&s, b"k").unwrap(), b"<<mid>>");
    let cas = s.peek(b"k").unwrap().cas;
    assert_eq!(
        s.store_pending(SetMode::Cas, pend(b"k", b"bad"), cas + 100),
        StoreStatus::Exists
    );
    assert!(stored(s.store_pending(
        SetMode::Cas,
        pend(b"k", b"good"),
        cas
    )));
    assert_eq!(get(&s, b"k").unwrap(), b"good");
    assert_eq!(
        s.store_pending(SetMode::Cas, pend(b"absent", b"v"), 5),
        StoreStatus::NotFound
    );
    // An item of another store is refused, not linked into this one.
    let other = store_with(4 << 20, true, 1 << 20);
    let foreign = other.alloc_pending(b"f", 1, 0, 0).unwrap();
    assert_eq!(
        s.store_pending(SetMode::Set, foreign, 0),
        StoreStatus::NotStored
    );
    assert!(get(&s, b"f").is_none());
    assert_eq!(used_chunks(&other), 0, "the refused item was freed");
}

#[test]
fn pending_alloc_errors_match_alloc() {
    let s = store_with(8 << 20, true, 1 << 20);
    assert_eq!(
        s.alloc_pending(b"k", 2 << 20, 0, 0).err(),
        Some(AllocError::TooLarge)
    );
    assert_eq!(
        s.alloc_pending(b"", 1, 0, 0).err(),
        Some(AllocError::TooLarge)
    );
}

#[test]
fn dropped_pending_items_free_their_memory() {
    // No eviction: a leaked chunk would end in OutOfMemory within a few rounds.
    let s = store_with(6 << 20, false, 4 << 20);
    for i in 0..2000u32 {
        let len = [50_000, 200, 1_500_000][i as usize % 3];
        let mut p = s
            .alloc_pending(format!("k{i}").as_bytes(), len, 0, 0)
            .unwrap_or_else(|e| panic!("round {i}: {e}"));
        if i % 2 == 0 {
            p.write(0, &pattern(i, len));
        }
        // Several alive at once, too.
        let q = s.alloc_pending(b"other", 1000, 0, 0).unwrap();
        drop(p);
        drop(q);
    }
    assert_eq!(used_chunks(&s), 0);
    assert_eq!(s.stats().curr_items, 0);
    assert_eq!(s.stats().outofmemory, 0);
}

#[test]
fn chained_pending_item_spans_several_segments() {
    let s = store_with(16 << 20, true, 4 << 20);
    let v = pattern(3, 3 << 20);
    let mut p = s.alloc_pending(b"big", v.len(), 0, 0).unwrap();
    let n = check_segments(&mut p);
    assert!(n >= 6, "3 MiB over 512 KiB chunks: {n} segments");
    // Pieces that straddle chunk boundaries.
    write_in_pieces(&mut p, &v, 77_777);
    assert!(stored(s.store_pending(SetMode::Set, p, 0)));
    assert_eq!(get(&s, b"big").unwrap(), v);

    let (info, pin) = s.get_pinned(b"big", &GetOptions::default()).unwrap();
    assert_eq!(info.value_len as usize, v.len());
    assert_eq!(pin.value_len(), v.len());
    let segs = pin.value_segments();
    assert_eq!(segs.len(), n);
    assert_eq!(segs.iter().map(|s| s.1).sum::<usize>(), v.len());
    assert_eq!(value_of(&pin), v);
}

#[test]
fn get_pinned_follows_get_rules() {
    let s = store_with(8 << 20, true, 1 << 20);
    assert!(s.get_pinned(b"missing", &GetOptions::default()).is_none());
    assert!(s.get_pinned(b"", &GetOptions::default()).is_none());
    assert!(stored(s.store(SetMode::Set, b"k", b"value", 3, 0, 0)));
    let quiet = GetOptions {
        bump: false,
        touch: None,
        ..GetOptions::default()
    };
    let (info, p) = s.get_pinned(b"k", &quiet).unwrap();
    assert_eq!((info.flags, info.value_len, info.fetched), (3, 5, false));
    assert_eq!(value_of(&p), b"value");
    assert!(!s.get_pinned(b"k", &quiet).unwrap().0.fetched, "no bump");
    let (_, p2) = s.get_pinned(b"k", &GetOptions::default()).unwrap();
    assert!(s.get_pinned(b"k", &quiet).unwrap().0.fetched, "bumped");
    let touch = GetOptions {
        touch: Some(s.clock().now() + 1000),
        bump: true,
        ..GetOptions::default()
    };
    drop(s.get_pinned(b"k", &touch).unwrap());
    assert_eq!(s.peek(b"k").unwrap().exptime, s.clock().now() + 1000);
    s.flush_all(None);
    assert!(s.get_pinned(b"k", &GetOptions::default()).is_none());
    // Flushed while pinned: still readable through the pins.
    assert_eq!(value_of(&p), b"value");
    assert_eq!(value_of(&p2), b"value");
}

#[test]
fn pinned_item_survives_delete_overwrite_and_an_eviction_storm() {
    let s = store_with(2 << 20, true, 1 << 20);
    let v = pattern(4, 100_000);
    assert!(stored(set(&s, b"hot", &v)));
    let p = pinned(&s, b"hot");
    let segs = p.value_segments();
    assert_eq!(s.delete(b"hot", 0), DeleteStatus::Deleted);
    assert!(stored(set(&s, b"hot", &pattern(5, 100_000))));
    for i in 0..2000u32 {
        assert!(stored(set(
            &s,
            format!("storm{i}").as_bytes(),
            &pattern(i, 100_000)
        )));
    }
    assert!(s.stats().evictions > 1000, "{:?}", s.stats());
    assert_eq!(value_of(&p), v);
    assert_eq!(p.value_segments(), segs, "segments are stable while pinned");
    drop(p);
}

#[test]
fn pinned_linked_item_is_not_evicted() {
    let s = store_with(2 << 20, true, 1 << 20);
    let v = pattern(6, 100_000);
    assert!(stored(set(&s, b"keep", &v)));
    let p = pinned(&s, b"keep");
    for i in 0..500u32 {
        assert!(stored(set(
            &s,
            format!("storm{i}").as_bytes(),
            &pattern(i, 100_000)
        )));
    }
    assert_eq!(get(&s, b"keep").unwrap(), v, "the evictor skipped it");
    assert_eq!(value_of(&p), v);
}

#[test]
fn pinned_chained_item_survives_overwrite_and_storm() {
    let s = store_with(8 << 20, true, 4 << 20);
    let v = pattern(7, (2 << 20) + 12_345);
    assert!(stored(set(&s, b"big", &v)));
    let p = pinned(&s, b"big");
    assert!(p.value_segments().len() > 1);
    assert!(stored(set(&s, b"big", &pattern(8, 3 << 20))));
    for i in 0..60u32 {
        set(
            &s,
            format!("storm{i}").as_bytes(),
            &pattern(i, (1 << 20) + 5),
        );
    }
    assert!(s.stats().evictions > 0);
    assert_eq!(value_of(&p), v);
}

/// Fill a no-eviction store with items of one size; returns how many fit.
fn fill(s: &Store, len: usize) -> usize {
    let mut n = 0;
    while stored(set(
        s,
        format!("fill{n}").as_bytes(),
        &pattern(n as u32, len),
    )) {
        n += 1;
    }
    n
}

#[test]
fn memory_of_an_item_freed_while_pinned_returns_after_unpin() {
    let s = store_with(2 << 20, false, 1 << 20);
    let n = fill(&s, 100_000);
    assert!(n > 5);
    let before = used_chunks(&s);
    let p = pinned(&s, b"fill0");
    let p2 = pinned(&s, b"fill0");
    assert_eq!(s.delete(b"fill0", 0), DeleteStatus::Deleted);
    assert_eq!(
        set(&s, b"new", &pattern(9, 100_000)),
        StoreStatus::OutOfMemory,
        "the deleted item's chunk is still pinned"
    );
    assert_eq!(used_chunks(&s), before);
    drop(p);
    assert_eq!(
        set(&s, b"new", &pattern(9, 100_000)),
        StoreStatus::OutOfMemory,
        "one pin is left"
    );
    assert_eq!(value_of(&p2), pattern(0, 100_000));
    drop(p2);
    assert!(
        stored(set(&s, b"new", &pattern(9, 100_000))),
        "freed by the last unpin"
    );
    assert_eq!(used_chunks(&s), before);
    // An unpinned item that was never freed meanwhile is simply left alone.
    drop(pinned(&s, b"fill1"));
    assert_eq!(get(&s, b"fill1").unwrap(), pattern(1, 100_000));
}

#[test]
fn store_fills_again_after_a_pinned_storm() {
    let s = store_with(2 << 20, true, 1 << 20);
    for i in 0..20u32 {
        set(&s, format!("a{i}").as_bytes(), &pattern(i, 100_000));
    }
    let pins: Vec<PinnedItem> = (0..20u32)
        .filter_map(|i| s.get_pinned(format!("a{i}").as_bytes(), &GetOptions::default()))
        .map(|(_, p)| p)
        .collect();
    assert!(!pins.is_empty());
    for i in 0..20u32 {
        s.delete(format!("a{i}").as_bytes(), 0);
    }
    drop(pins);
    for i in 0..200u32 {
        assert!(stored(set(
            &s,
            format!("b{i}").as_bytes(),
            &pattern(i, 100_000)
        )));
    }
    for i in 0..200u32 {
        s.delete(format!("b{i}").as_bytes(), 0);
    }
    assert_eq!(used_chunks(&s), 0, "nothing leaked");
}

#[test]
fn eviction_with_everything_pinned_fails_instead_of_spinning() {
    let s = store_with(2 << 20, true, 1 << 20);
    let mut n = 0u32;
    while s.stats().evictions == 0 {
        assert!(stored(set(
            &s,
            format!("k{n}").as_bytes(),
            &pattern(n, 100_000)
        )));
        n += 1;
    }
    let pins: Vec<PinnedItem> = (0..n)
        .filter_map(|i| s.get_pinned(format!("k{i}").as_bytes(), &GetOptions::default()))
        .map(|(_, p)| p)
        .collect();
    let t = Instant::now();
    assert_eq!(
        set(&s, b"one-more", &pattern(1, 100_000)),
        StoreStatus::OutOfMemory
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    drop(pins);
    assert!(stored(set(&s, b"one-more", &pattern(1, 100_000))));
}

#[test]
fn page_moves_skip_pages_holding_pinned_items() {
    let s = store_with(4 << 20, true, 1 << 20);
    // Three pages of one class (about ten 100 KB items per 1 MiB page).
    for i in 0..30u32 {
        assert!(stored(set(
            &s,
            format!("k{i}").as_bytes(),
            &pattern(i, 100_000)
        )));
    }
    let class = s.peek(b"k0").unwrap().class_id;
    let pages = |s: &Store| {
        s.slab_stats()
            .iter()
            .find(|c| c.id == class)
            .map_or(0, |c| c.total_pages)
    };
    assert!(pages(&s) >= 3, "{}", pages(&s));
    // Pin a (still linked) item in the first page, the one a move would pick first.
    let p = pinned(&s, b"k0");
    let mut moved = 0;
    while pages(&s) > 1 {
        let st = s.slabs_reassign(class as i32, 0);
        if st != memfabric_store::ReassignStatus::Ok {
            break;
        }
        moved += 1;
    }
    assert!(moved >= 1);
    assert_eq!(pages(&s), 1, "every page but the pinned one moved");
    assert_eq!(
        get(&s, b"k0").unwrap(),
        pattern(0, 100_000),
        "not evicted by a move"
    );
    s.delete(b"k0", 0);
    // The moved pages are reused by another class; the pinned bytes stay.
    for i in 0..40u32 {
        set(&s, format!("small{i}").as_bytes(), &pattern(i, 30_000));
    }
    assert_eq!(value_of(&p), pattern(0, 100_000));
    assert_eq!(
        s.slabs_reassign(class as i32, 0),
        memfabric_store::ReassignStatus::NoSpare
    );
    drop(p);
}

#[test]
fn concurrent_pins_with_writers_and_deleters() {
    let s = store_with(4 << 20, true, 1 << 20);
    const KEYS: u32 = 24;
    // Each value is one byte repeated, with a length derived from it: a pinned value is
    // consistent iff every byte equals the first and the length matches.
    let value = |b: u8| vec![b; 20_000 + b as usize * 97];
    let stop = AtomicBool::new(false);
    let pins_taken = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for w in 0..2u32 {
            let (s, stop) = (&s, &stop);
            sc.spawn(move || {
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("k{}", i % KEYS);
                    if i % 7 == 0 {
                        s.delete(k.as_bytes(), 0);
                    } else {
                        let mut p = s
                            .alloc_pending(k.as_bytes(), value(i as u8).len(), 0, 0)
                            .unwrap();
                        p.write(0, &value(i as u8));
                        s.store_pending(SetMode::Set, p, 0);
                    }
                    i = i.wrapping_add(3);
                }
            });
        }
        for r in 0..2u32 {
            let (s, stop, pins_taken) = (&s, &stop, &pins_taken);
            sc.spawn(move || {
                let mut held: Vec<(PinnedItem, Vec<u8>)> = Vec::new();
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("k{}", i % KEYS);
                    if let Some((info, p)) = s.get_pinned(k.as_bytes(), &GetOptions::default()) {
                        let v = value_of(&p);
                        assert_eq!(v.len(), info.value_len as usize);
                        assert_eq!(v, value(v[0]), "torn pinned value");
                        pins_taken.fetch_add(1, Ordering::Relaxed);
                        held.push((p, v));
                    }
                    if held.len() > 4 || i % 5 == 0 {
                        // Hand one over to another thread and release it there.
                        if let Some((p, v)) = held.pop() {
                            std::thread::scope(|t| {
                                t.spawn(move || assert_eq!(value_of(&p), v));
                            });
                        }
                    }
                    for (p, v) in &held {
                        assert_eq!(&value_of(p), v, "pinned bytes changed");
                    }
                    i = i.wrapping_add(1);
                }
            });
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(pins_taken.load(Ordering::Relaxed) > 100);
    for i in 0..KEYS {
        s.delete(format!("k{i}").as_bytes(), 0);
    }
    assert_eq!(used_chunks(&s), 0, "nothing leaked");
    assert_eq!(s.stats().curr_items, 0);
}

#[test]
fn regions_cover_the_mappings() {
    let s = store_with(4 << 20, true, 1 << 20);
    let (a, alen) = s.arena_region();
    let (i, ilen) = s.index_region();
    assert!(!a.is_null() && !i.is_null());
    assert!(alen >= 4 << 20);
    assert_eq!(ilen as u64, s.stats().hash_bytes);
    assert!(stored(set(&s, b"k", &pattern(1, 5000))));
    let p = pinned(&s, b"k");
    for (ptr, len) in p.value_segments() {
        let (lo, hi) = (a as usize, a as usize + alen);
        assert!(ptr as usize >= lo && ptr as usize + len <= hi);
    }
}

#[test]
fn slices_receive_and_send_a_chained_value_in_place() {
    let store = small_store_for_slices();
    let len = 3 * 1024 * 1024 + 17;
    let mut p = store.alloc_pending(b"big-slices", len, 5, 0).unwrap();
    let mut at = 0usize;
    for s in p.value_slices_mut() {
        for b in s.iter_mut() {
            *b = (at % 253) as u8;
            at += 1;
        }
    }
    assert_eq!(at, len, "mutable slices cover the value exactly");
    assert!(matches!(
        store.store_pending(memfabric_store::SetMode::Set, p, 0),
        memfabric_store::StoreStatus::Stored { .. }
    ));
    let (_, pinned) = store
        .get_pinned(b"big-slices", &memfabric_store::GetOptions::default())
        .unwrap();
    let mut n = 0usize;
    for s in pinned.value_slices() {
        for &b in s {
            assert_eq!(b, (n % 253) as u8);
            n += 1;
        }
    }
    assert_eq!(n, len);
}

fn small_store_for_slices() -> memfabric_store::Store {
    memfabric_store::Store::new(memfabric_store::StoreConfig {
        memory_limit: 64 << 20,
        item_size_max: 8 << 20,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn locked_value_slices_are_the_value_in_place() {
    let store = small_store_for_slices();
    assert!(store.with_locked_value(b"nope", |_, _| ()).is_none());
    let small: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    store.store(memfabric_store::SetMode::Set, b"small", &small, 3, 0, 0);
    let big: Vec<u8> = (0..(2 << 20) + 5).map(|i: u32| (i % 241) as u8).collect();
    store.store(memfabric_store::SetMode::Set, b"big", &big, 4, 0, 0);
    for (key, want, flags) in [(&b"small"[..], &small, 3), (&b"big"[..], &big, 4)] {
        let (got, f) = store
            .with_locked_value(key, |info, slices| (slices.concat(), info.flags))
            .unwrap();
        assert_eq!(f, flags);
        assert!(&got == want);
    }
}
