//! Tests of the store internals that cut across its parts.
use std::io;

use crate::arena::tests::TestMemory;
use crate::arena::Memory;
use crate::{SetMode, Store, StoreConfig};

/// A store of `memory_limit` bytes without background threads' work (no sweeper, no
/// automover), so a test sees only its own operations.
fn quiet_store(memory_limit: usize) -> Store {
    Store::new(StoreConfig {
        memory_limit,
        background_sweeper: false,
        slab_automove: false,
        ..StoreConfig::default()
    })
    .unwrap()
}

#[test]
fn compaction_leaves_exactly_the_live_items_queued_after_overwrites() {
    let s = quiet_store(4 << 20);
    for round in 0..2000 {
        for k in 0..100 {
            let v = format!("{round}");
            s.store(
                SetMode::Set,
                format!("k{k}").as_bytes(),
                v.as_bytes(),
                0,
                0,
                0,
            );
        }
    }
    assert_eq!(s.stats().evictions, 0);
    s.inner.compact_queues(true);
    let class = s.slabs.class_for(40 + 3 + 4).unwrap();
    let st = s.slabs.lock(class);
    assert!(!st.pages.is_empty());
    // Exactly the live items are left, each once.
    assert_eq!(st.queue.len(), 100);
}

#[test]
fn compaction_racing_writers_and_evictions_keeps_every_live_item_queued_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = quiet_store(4 << 20);
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let s = &s;
                sc.spawn(move || {
                    let mut x = t + 1;
                    for _ in 0..150_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let key = format!("k{}", x % 60_000);
                        let value = vec![b'v'; (x % 300) as usize];
                        s.store(SetMode::Set, key.as_bytes(), &value, 0, 0, 0);
                    }
                })
            })
            .collect();
        sc.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                s.inner.compact_queues(true);
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    assert!(s.stats().evictions > 0);
    s.inner.compact_queues(true);
    for ci in &s.slabs.classes[1..] {
        let st = s.slabs.lock(ci.id);
        let items = s.slabs.counters[ci.id as usize]
            .items
            .load(Ordering::Relaxed);
        assert_eq!(st.queue.len() as u64, items, "class {}", ci.id);
    }
}

// A store on caller-supplied memory (what UCX-allocated memory is).

#[test]
fn a_store_on_caller_memory_sets_gets_and_evicts_in_that_memory() {
    use crate::{GetOptions, SetMode, Store, StoreConfig, StoreStatus};
    use std::sync::Mutex;
    // Every mapping handed out, as (base, len), to compare with the store's regions.
    let given: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let alloc = |n: usize| -> io::Result<Box<dyn Memory>> {
        let m = TestMemory::new(n)?;
        given.lock().unwrap().push((m.base(), n));
        Ok(Box::new(m))
    };
    let cfg = StoreConfig {
        memory_limit: 2 << 20,
        slab_automove: false,
        ..StoreConfig::default()
    };
    let s = Store::with_memory(cfg, &alloc).unwrap();
    let given = given.lock().unwrap().clone();
    assert_eq!(
        given.len(),
        2,
        "one allocation for the arena, one for the index"
    );
    let (a, alen) = s.arena_region();
    let (i, ilen) = s.index_region();
    assert_eq!((a as usize, alen), given[0]);
    assert_eq!((i as usize, ilen), given[1]);
    let power = s.stats().hash_power_level;
    assert_eq!(ilen, crate::remote::index_len(power));
    // Fill well past the memory limit: eviction keeps working, recent keys are there.
    let value = vec![7u8; 1000];
    for k in 0..10_000u32 {
        let st = s.store(SetMode::Set, format!("key{k}").as_bytes(), &value, 0, 0, 0);
        assert!(matches!(st, StoreStatus::Stored { .. }), "{st:?}");
    }
    assert!(s.stats().evictions > 0);
    let mut out = Vec::new();
    assert!(s
        .get(b"key9999", &GetOptions::default(), &mut out)
        .is_some());
    assert_eq!(out, value);
    let block = s.control_block();
    assert_eq!(&block[..4], b"MMFX");
    drop(s);
}

#[test]
fn the_index_is_cleared_even_if_caller_memory_is_not() {
    use crate::{GetOptions, SetMode, Store, StoreConfig};
    let dirty = |n: usize| -> io::Result<Box<dyn Memory>> {
        let m = TestMemory::new(n)?;
        m.fill(0xa5);
        Ok(Box::new(m))
    };
    let s = Store::with_memory(StoreConfig::default(), &dirty).unwrap();
    assert!(s
        .get(b"k", &GetOptions::default(), &mut Vec::new())
        .is_none());
    s.store(SetMode::Set, b"k", b"v", 0, 0, 0);
    let mut out = Vec::new();
    assert!(s.get(b"k", &GetOptions::default(), &mut out).is_some());
    assert_eq!(out, b"v");
}

#[test]
fn a_store_refuses_caller_memory_that_is_too_small() {
    use crate::{Store, StoreConfig};
    let alloc = |n: usize| -> io::Result<Box<dyn Memory>> { Ok(Box::new(TestMemory::new(n / 2)?)) };
    assert!(Store::with_memory(StoreConfig::default(), &alloc).is_err());
    let failing = |_: usize| -> io::Result<Box<dyn Memory>> {
        Err(io::Error::new(io::ErrorKind::OutOfMemory, "no"))
    };
    assert!(Store::with_memory(StoreConfig::default(), &failing).is_err());
}

#[test]
fn a_checksum_folded_as_the_value_arrives_equals_one_computed_at_the_end() {
    let s = quiet_store(8 << 20);
    // A small value, values of one large chunk, and pieces of every size down to one byte.
    for (len, step) in [(5, 1), (10_000, 333), (400_000, 65_536), (400_000, 7)] {
        let v: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let mut whole = s.alloc(b"key", len, 0, 0).unwrap();
        whole.write(0, &v);
        let mut folded = s.alloc(b"key", len, 0, 0).unwrap();
        let mut at = 0;
        while at < len {
            let n = step.min(len - at);
            folded.write(at, &v[at..at + n]);
            at += n;
            folded.fold_checksum(at);
        }
        assert_eq!(folded.checksum(), whole.checksum(), "len {len} step {step}");
        // Rewriting bytes already folded in starts the checksum again.
        folded.write(1, b"X");
        whole.write(1, b"X");
        assert_eq!(
            folded.checksum(),
            whole.checksum(),
            "len {len} after a rewrite"
        );
    }
}

#[test]
fn only_items_a_remote_reader_can_read_carry_a_checksum() {
    let s = quiet_store(8 << 20);
    for len in [1000, 400_000, 700_000] {
        let v: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let mut item = s.alloc(b"key", len, 0, 0).unwrap();
        item.write(0, &v);
        let chained = !item.chain.is_empty();
        assert_eq!(chained, len > 500_000, "len {len}");
        let expect = if chained {
            0
        } else {
            crc32c::crc32c(&[&b"key"[..], &v].concat())
        };
        assert_eq!(item.checksum(), expect, "len {len}");
    }
}

#[test]
fn the_fast_checksum_continues_exactly_as_crc32c_does() {
    let v: Vec<u8> = (0..300_000u32).map(|i| (i * 13 + 1) as u8).collect();
    for cut in [0, 1, 7, 1023, 1024, 4096, 65_537, 299_999, 300_000] {
        let (a, b) = v.split_at(cut);
        let fast = crate::arena::crc32c_append(crate::arena::crc32c_append(0, a), b);
        assert_eq!(fast, crc32c::crc32c(&v), "cut at {cut}");
    }
}

#[test]
fn a_metadump_in_small_turns_lists_every_live_item_once_and_only_the_asked_classes() {
    let s = quiet_store(16 << 20);
    let mut want = std::collections::BTreeSet::new();
    for k in 0..3000 {
        // Three sizes: three classes.
        let v = vec![b'v'; [1, 300, 3000][k % 3]];
        let key = format!("k:{k}/x");
        s.store(SetMode::Set, key.as_bytes(), &v, 0, 0, 0);
        want.insert(key.replace(':', "%3A").replace('/', "%2F"));
    }
    s.delete(b"k:7/x", 0);
    want.remove("k%3A7%2Fx");
    let mut cur = crate::DumpCursor::new(Vec::new());
    let mut out = Vec::new();
    let mut turns = 0;
    while !s.metadump(&mut cur, &mut out, 4096) {
        turns += 1;
    }
    assert!(turns > 10, "the walk stopped at its budget");
    let text = String::from_utf8(out).unwrap();
    let got: Vec<&str> = text
        .lines()
        .map(|l| l.strip_prefix("key=").unwrap().split(' ').next().unwrap())
        .collect();
    assert_eq!(got.len(), want.len(), "each live item once");
    let got_set: std::collections::BTreeSet<String> = got.iter().map(|k| k.to_string()).collect();
    assert_eq!(got_set, want);
    assert!(text
        .lines()
        .all(|l| l.contains(" exp=-1 la=") && l.contains(" fetch=no cls=")));
    // One class only: its items, nothing else.
    let class = s.slabs.class_for(40 + 6 + 300).unwrap();
    let mut cur = crate::DumpCursor::new(vec![class]);
    let mut out = Vec::new();
    assert!(s.metadump(&mut cur, &mut out, usize::MAX));
    let text = String::from_utf8(out).unwrap();
    let n = text.lines().count();
    assert!(n > 0 && n < want.len());
    let cls = format!(" cls={class} ");
    assert!(text.lines().all(|l| l.contains(&cls)), "{text:.200}");
}

/// `store_found_unless` keeps what the key holds when the judge says so (NotStored, the
/// old value unchanged), stores otherwise, and stores on a missing key without asking;
/// a value received in place is judged the same way. The judge sees the old value whole,
/// however many chunks it spans.
#[test]
fn a_set_unless_keeps_what_the_judge_keeps() {
    use crate::StoreStatus;
    let s = quiet_store(16 << 20);
    let value = |key: &[u8]| {
        let mut out = Vec::new();
        s.get(key, &crate::GetOptions::default(), &mut out)
            .map(|_| out)
    };
    let asked = std::cell::Cell::new(0);
    let judge = |verdict: bool| {
        let asked = &asked;
        move |old: &[&[u8]]| {
            asked.set(asked.get() + 1);
            assert_eq!(old.concat(), b"old".repeat(old.concat().len() / 3));
            verdict
        }
    };
    let stored = |f: crate::Found<StoreStatus>| matches!(f.status, StoreStatus::Stored { .. });
    assert!(stored(s.store_found_unless(
        b"k",
        b"old",
        0,
        0,
        judge(true)
    )));
    assert_eq!(asked.get(), 0, "nothing to judge on a missing key");
    assert_eq!(
        s.store_found_unless(b"k", b"new", 0, 0, judge(true)).status,
        StoreStatus::NotStored
    );
    assert_eq!(value(b"k").as_deref(), Some(&b"old"[..]));
    assert!(stored(s.store_found_unless(b"k", b"new", 0, 0, |_| false)));
    assert_eq!(value(b"k").as_deref(), Some(&b"new"[..]));
    // A chained old value (larger than a chunk), and a value received in place.
    let big = b"old".repeat(300_000);
    assert!(matches!(
        s.store(SetMode::Set, b"big", &big, 0, 0, 0),
        StoreStatus::Stored { .. }
    ));
    let mut pending = s.alloc_pending(b"big", 5, 0, 0).unwrap();
    pending.write(0, b"fresh");
    assert_eq!(
        s.store_pending_unless(pending, judge(true)).status,
        StoreStatus::NotStored
    );
    assert_eq!(value(b"big").map(|v| v.len()), Some(big.len()));
    let mut pending = s.alloc_pending(b"big", 5, 0, 0).unwrap();
    pending.write(0, b"fresh");
    assert!(stored(s.store_pending_unless(pending, judge(false))));
    assert_eq!(value(b"big").as_deref(), Some(&b"fresh"[..]));
}

#[test]
fn sealed_values_are_not_appended_to() {
    let s = Store::new(StoreConfig {
        sealed: Some(|v: &[u8]| v.starts_with(b"SEAL")),
        background_sweeper: false,
        ..StoreConfig::default()
    })
    .unwrap();
    s.store(SetMode::Set, b"sealed", b"SEAL:data", 0, 0, 0);
    s.store(SetMode::Set, b"open", b"data", 0, 0, 0);
    for mode in [SetMode::Append, SetMode::Prepend] {
        assert_eq!(
            s.store(mode, b"sealed", b"+", 0, 0, 0),
            crate::StoreStatus::NotStored
        );
        assert!(matches!(
            s.store(mode, b"open", b"+", 0, 0, 0),
            crate::StoreStatus::Stored { .. }
        ));
    }
    let mut out = Vec::new();
    s.get(b"sealed", &crate::GetOptions::default(), &mut out);
    assert_eq!(out, b"SEAL:data");
    out.clear();
    s.get(b"open", &crate::GetOptions::default(), &mut out);
    assert_eq!(out, b"+data+");
}
