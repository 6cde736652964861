//! The flash tier at the store level: items evicted from RAM are found on flash with
//! their exact value; commands that modify a flash item see it; a damaged record reads as
//! a miss; pages are reused oldest first. Values encode their key and version, so a wrong
//! value cannot pass as a right one.
use tempfile::TempDir;

use memfabric_store::{
    ArithOptions, ArithStatus, DeleteStatus, FlashConfig, GetOptions, SetMode, Store, StoreConfig,
    StoreStatus,
};

/// A fresh directory for a test's flash file, removed when dropped.
fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("mf-flash-")
        .tempdir()
        .unwrap()
}

fn store(dir: &TempDir, ram_mb: usize, flash_mb: u64) -> Store {
    store_min(dir, ram_mb, flash_mb, FlashConfig::default().item_min)
}

fn store_min(dir: &TempDir, ram_mb: usize, flash_mb: u64, item_min: usize) -> Store {
    Store::new(StoreConfig {
        memory_limit: ram_mb << 20,
        slab_automove: false,
        background_sweeper: false,
        flash: Some(FlashConfig {
            files: vec![(dir.path().join("flash"), flash_mb << 20)],
            write_buffers: 64,
            item_min,
            ..FlashConfig::default()
        }),
        ..StoreConfig::default()
    })
    .unwrap()
}

/// A value that names its key and version, `len` bytes long.
fn value(key: &str, version: u32, len: usize) -> Vec<u8> {
    let head = format!("{key}@{version}:");
    let mut v = head.into_bytes();
    while v.len() < len {
        v.push(b'a' + (v.len() % 26) as u8);
    }
    v.truncate(len);
    v
}

fn set(s: &Store, key: &str, v: &[u8]) {
    let st = s.store(SetMode::Set, key.as_bytes(), v, 7, 0, 0);
    assert!(matches!(st, StoreStatus::Stored { .. }), "{key}: {st:?}");
}

/// RAM first, then flash, as the server's lookup does.
fn get(s: &Store, key: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    if s.get(key.as_bytes(), &GetOptions::default(), &mut out)
        .is_some()
    {
        return Some(out);
    }
    let cands = s.flash_candidates(key.as_bytes());
    if cands.is_empty() {
        return None;
    }
    s.read_flash(key.as_bytes(), &cands).map(|h| {
        assert_eq!(h.info.flags, 7);
        h.value
    })
}

/// Wait until the writer has written every sealed page (bounded).
fn settle(s: &Store) {
    for _ in 0..500 {
        let st = s.flash_stats().unwrap();
        if st.pages_buffered <= 1 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn key(i: usize) -> String {
    format!("key:{i:06}")
}

#[test]
fn evicted_items_are_served_from_flash_exactly() {
    let dir = temp_dir();
    let s = store(&dir, 4, 64);
    let n = 12_000; // 2 KB values: ~24 MB, six times RAM, within flash
    for i in 0..n {
        set(&s, &key(i), &value(&key(i), 1, 2000));
    }
    settle(&s);
    let (mut hits, mut flash_hits) = (0, 0);
    for i in 0..n {
        let k = key(i);
        let mut out = Vec::new();
        let ram = s
            .get(k.as_bytes(), &GetOptions::default(), &mut out)
            .is_some();
        if let Some(v) = get(&s, &k) {
            assert_eq!(v, value(&k, 1, 2000), "{k}: wrong value");
            hits += 1;
            flash_hits += usize::from(!ram);
        }
    }
    let st = s.flash_stats().unwrap();
    assert!(st.objects_written > 0, "{st:?}");
    // RAM holds under 2,000 of these; every item the writer took is found.
    assert!(
        flash_hits > 0 && hits > 2_000,
        "hits {hits}, flash {flash_hits}, {st:?}"
    );
    assert_eq!(st.badcrc, 0);
}

#[test]
fn commands_see_flash_items_and_replace_them_for_good() {
    let dir = temp_dir();
    let s = store_min(&dir, 4, 32, 32);
    set(&s, "old", &value("old", 1, 1500));
    set(&s, "gone", &value("gone", 1, 1500));
    set(&s, "add", &value("add", 1, 1500));
    set(&s, "app", &value("app", 1, 1500));
    set(&s, "num", b"41");
    // Push them out of RAM (each class fills up on its own: no automove).
    for i in 0..6_000 {
        set(&s, &key(i), &value(&key(i), 1, 1500));
    }
    for i in 0..60_000 {
        set(&s, &format!("n:{i}"), b"xx");
    }
    settle(&s);
    let on_flash = |k: &str| {
        let mut out = Vec::new();
        s.get(k.as_bytes(), &GetOptions::default(), &mut out)
            .is_none()
            && !s.flash_candidates(k.as_bytes()).is_empty()
    };
    for k in ["old", "gone", "add", "app", "num"] {
        assert!(on_flash(k), "{k} not on flash");
    }
    // A new value replaces the flash one.
    set(&s, "old", &value("old", 2, 1500));
    assert_eq!(get(&s, "old"), Some(value("old", 2, 1500)));
    // A delete finds the flash item and removes it.
    assert_eq!(s.delete(b"gone", 0), DeleteStatus::Deleted);
    assert_eq!(get(&s, "gone"), None);
    assert_eq!(s.delete(b"gone", 0), DeleteStatus::NotFound);
    // add sees it exists; append extends it.
    assert!(matches!(
        s.store(SetMode::Add, b"add", b"x", 0, 0, 0),
        StoreStatus::NotStored
    ));
    assert!(matches!(
        s.store(SetMode::Append, b"app", b"+tail", 0, 0, 0),
        StoreStatus::Stored { .. }
    ));
    let mut want = value("app", 1, 1500);
    want.extend_from_slice(b"+tail");
    assert_eq!(get(&s, "app"), Some(want));
    // incr works on a flash item.
    assert!(matches!(
        s.arith(b"num", true, 1, &ArithOptions::default()),
        ArithStatus::Value { value: 42, .. }
    ));
    let st = s.flash_stats().unwrap();
    assert!(st.recached >= 3, "{st:?}");
}

#[test]
fn damaged_records_read_as_misses_never_as_values() {
    let dir = temp_dir();
    let s = store(&dir, 4, 32);
    let n = 6_000;
    for i in 0..n {
        set(&s, &key(i), &value(&key(i), 1, 1500));
    }
    settle(&s);
    // Flip bytes all over the written part of the file.
    let path = dir.path().join("flash");
    let mut bytes = std::fs::read(&path).unwrap();
    let mut i = 4096;
    while i < bytes.len() {
        bytes[i] ^= 0x5a;
        i += 1021;
    }
    std::fs::write(&path, &bytes).unwrap();
    let mut hits = 0;
    for i in 0..n {
        let k = key(i);
        if let Some(v) = get(&s, &k) {
            assert_eq!(v, value(&k, 1, 1500), "{k}: damaged value served");
            hits += 1;
        }
    }
    assert!(hits > 0);
    assert!(s.flash_stats().unwrap().badcrc > 0);
}

#[test]
fn pages_are_reused_oldest_first_and_old_slots_die_with_them() {
    let dir = temp_dir();
    // 8 flash pages: writing 5x that cycles through them several times.
    let s = store(&dir, 4, 8);
    let n = 30_000;
    for i in 0..n {
        set(&s, &key(i), &value(&key(i), 1, 1000));
        if i % 2_000 == 0 {
            settle(&s);
        }
    }
    settle(&s);
    let st = s.flash_stats().unwrap();
    assert!(st.page_reclaims > 0, "{st:?}");
    assert!(st.objects_evicted > 0, "{st:?}");
    let mut newest_hit = 0;
    for i in 0..n {
        let k = key(i);
        if let Some(v) = get(&s, &k) {
            assert_eq!(v, value(&k, 1, 1000), "{k}");
            newest_hit = i;
        }
    }
    // The oldest keys went with the first pages; the newest remain.
    assert!(get(&s, &key(0)).is_none());
    assert!(newest_hit > n - 100);
}

fn reopen(dir: &TempDir, recover: bool) -> Store {
    Store::new(StoreConfig {
        memory_limit: 4 << 20,
        slab_automove: false,
        background_sweeper: false,
        flash: Some(FlashConfig {
            files: vec![(dir.path().join("flash"), 32 << 20)],
            write_buffers: 64,
            recover,
            ..FlashConfig::default()
        }),
        ..StoreConfig::default()
    })
    .unwrap()
}

#[test]
fn a_clean_restart_serves_what_was_on_flash_and_nothing_that_was_replaced() {
    let dir = temp_dir();
    let n = 8_000;
    let mut on_flash = Vec::new();
    {
        let s = reopen(&dir, true);
        for i in 0..n {
            set(&s, &key(i), &value(&key(i), 1, 1500));
        }
        settle(&s);
        for i in 0..n {
            let mut out = Vec::new();
            let k = key(i);
            if s.get(k.as_bytes(), &GetOptions::default(), &mut out)
                .is_none()
                && !s.flash_candidates(k.as_bytes()).is_empty()
            {
                on_flash.push(i);
            }
        }
        assert!(on_flash.len() > 1_000, "{}", on_flash.len());
        // Changes after the items went to flash: a restart must not undo them.
        let (over, del) = (on_flash[0], on_flash[1]);
        set(&s, &key(over), &value(&key(over), 2, 1500));
        assert_eq!(s.delete(key(del).as_bytes(), 0), DeleteStatus::Deleted);
        // Dropping the store is a clean shutdown: it writes what it holds.
    }
    let s = reopen(&dir, true);
    let st = s.flash_stats().unwrap();
    assert!(st.recovered > 0, "{st:?}");
    let mut served = 0;
    for &i in &on_flash {
        let k = key(i);
        if let Some(v) = get(&s, &k) {
            assert_eq!(v, value(&k, 1, 1500), "{k}: not the value it had");
            served += 1;
        }
    }
    assert_eq!(
        get(&s, &key(on_flash[0])),
        None,
        "overwritten value came back"
    );
    assert_eq!(get(&s, &key(on_flash[1])), None, "deleted value came back");
    // All but the two changed ones.
    assert!(
        served + 2 >= on_flash.len() * 99 / 100,
        "{served} of {}",
        on_flash.len()
    );
    // flush_all survives a restart too.
    s.flush_all(None);
    drop(s);
    let s = reopen(&dir, true);
    assert!(on_flash.iter().all(|&i| get(&s, &key(i)).is_none()));
    drop(s);
}

#[test]
fn recovery_off_starts_empty_and_old_pages_never_come_back() {
    let dir = temp_dir();
    {
        let s = reopen(&dir, true);
        for i in 0..8_000 {
            set(&s, &key(i), &value(&key(i), 1, 1500));
        }
    }
    drop(reopen(&dir, false));
    let s = reopen(&dir, true);
    assert_eq!(s.flash_stats().unwrap().recovered, 0);
    assert!((0..8_000).all(|i| get(&s, &key(i)).is_none()));
}

#[test]
fn a_delayed_flush_that_has_passed_kills_items_that_went_to_flash_after_it() {
    let dir = temp_dir();
    let now = {
        let s = reopen(&dir, true);
        let now = s.clock().now();
        set(&s, "early", &value("early", 1, 1500));
        // Dies at now + 2; "early" goes to flash only afterwards.
        s.flush_all(Some(now + 2));
        for i in 0..6_000 {
            set(&s, &key(i), &value(&key(i), 1, 1500));
        }
        settle(&s);
        assert!(!s.flash_candidates(b"early").is_empty(), "not on flash");
        now
    };
    while std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        < now as u64 + 3
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let s = reopen(&dir, true);
    assert_eq!(get(&s, "early"), None, "flushed item came back");
}

#[test]
fn a_set_over_a_flash_item_drops_it_unread_and_it_never_comes_back() {
    let dir = temp_dir();
    let on_flash: Vec<usize>;
    {
        let s = reopen(&dir, true);
        for i in 0..8_000 {
            set(&s, &key(i), &value(&key(i), 1, 1500));
        }
        settle(&s);
        on_flash = (0..8_000)
            .filter(|&i| {
                let mut out = Vec::new();
                s.get(key(i).as_bytes(), &GetOptions::default(), &mut out)
                    .is_none()
                    && !s.flash_candidates(key(i).as_bytes()).is_empty()
            })
            .take(200)
            .collect();
        assert_eq!(on_flash.len(), 200);
        let before = s.flash_stats().unwrap();
        for &i in &on_flash {
            set(&s, &key(i), &value(&key(i), 2, 1500));
        }
        let after = s.flash_stats().unwrap();
        // Not read back: no recache, no read; each old copy dropped.
        assert_eq!(after.recached, before.recached, "{after:?}");
        assert_eq!(after.reads, before.reads, "{after:?}");
        assert!(after.overwritten >= 200, "{after:?}");
        for &i in &on_flash {
            assert_eq!(get(&s, &key(i)), Some(value(&key(i), 2, 1500)));
        }
        // Evict the new values to flash too: only they are found there.
        for i in 10_000..18_000 {
            set(&s, &key(i), &value(&key(i), 1, 1500));
        }
        settle(&s);
        for &i in &on_flash {
            if let Some(v) = get(&s, &key(i)) {
                assert_eq!(v, value(&key(i), 2, 1500), "{}", key(i));
            }
        }
    }
    // Nor after a restart.
    let s = reopen(&dir, true);
    for &i in &on_flash {
        if let Some(v) = get(&s, &key(i)) {
            assert_eq!(v, value(&key(i), 2, 1500), "{} after a restart", key(i));
        }
    }
}

/// Whether `k` is held on flash only (not in RAM, a flash slot with its tag).
fn only_on_flash(s: &Store, k: &str) -> bool {
    let mut out = Vec::new();
    s.get(k.as_bytes(), &GetOptions::default(), &mut out)
        .is_none()
        && !s.flash_candidates(k.as_bytes()).is_empty()
}

/// An item on flash that cannot come back to RAM, because every RAM item of its size is
/// pinned (being sent from) and there is nothing to evict, stays where it is: `add` does
/// not store over it, it reads back exactly, and `delete` removes it. (Bringing it back
/// cleared its flash slot before allocating: the item was lost, and the `add` stored.)
#[test]
fn an_item_that_cannot_come_back_to_ram_stays_on_flash() {
    let dir = temp_dir();
    let s = store_min(&dir, 4, 32, 32);
    // The small class has its page before the large one takes the rest (the `add`'s
    // one-byte value goes there).
    for i in 0..100 {
        set(&s, &format!("n:{i}"), b"xx");
    }
    set(&s, "held", &value("held", 1, 1500));
    // Twice RAM: `held`, never read meanwhile, goes to flash. (Looking whether it is
    // there would read it, and a read item gets a second chance in RAM.)
    let written = 6_000;
    for i in 0..written {
        set(&s, &key(i), &value(&key(i), 1, 1500));
    }
    settle(&s);
    // Pin every item of that size in RAM, then store (and pin) more until the class is
    // full of pinned items: the next one finds nothing to evict.
    let mut pins = Vec::new();
    for i in 0..written {
        let k = key(i);
        let mut out = Vec::new();
        if s.get(k.as_bytes(), &GetOptions::default(), &mut out)
            .is_some()
        {
            if let Some((_, p)) = s.get_pinned(k.as_bytes(), &GetOptions::default()) {
                pins.push(p);
            }
        }
    }
    let mut i = 100_000;
    loop {
        assert!(i < 120_000, "the class never filled up with pinned items");
        let k = key(i);
        match s.store(SetMode::Set, k.as_bytes(), &value(&k, 1, 1500), 7, 0, 0) {
            StoreStatus::Stored { .. } => {
                let (_, p) = s.get_pinned(k.as_bytes(), &GetOptions::default()).unwrap();
                pins.push(p);
            }
            StoreStatus::OutOfMemory => break,
            other => panic!("{k}: {other:?}"),
        }
        i += 1;
    }
    assert!(only_on_flash(&s, "held"), "{:?}", s.flash_stats());
    // It exists: add does not store, and the value is intact on flash.
    assert!(matches!(
        s.store(SetMode::Add, b"held", b"x", 0, 0, 0),
        StoreStatus::NotStored
    ));
    assert_eq!(get(&s, "held"), Some(value("held", 1, 1500)));
    // A delete with another CAS value leaves it; a plain one removes it.
    assert_eq!(s.delete(b"held", 12345), DeleteStatus::Exists);
    assert_eq!(get(&s, "held"), Some(value("held", 1, 1500)));
    assert_eq!(s.delete(b"held", 0), DeleteStatus::Deleted);
    assert_eq!(get(&s, "held"), None);
    // Memory back: the key is free for an add.
    drop(pins);
    assert!(matches!(
        s.store(SetMode::Add, b"held", b"y", 0, 0, 0),
        StoreStatus::Stored { .. }
    ));
    assert_eq!(get(&s, "held").as_deref(), Some(&b"y"[..]));
}
