//! The io_uring read engine: many lookups in flight at once (records and chained items,
//! in pages on flash and in pages still in memory) get exactly what `pread` gets, every
//! one is answered once, and dropping the engine ends it with nothing lost.
use std::collections::HashMap;
use std::sync::mpsc;

use memfabric_store::flash::uring::{probe, UringReads};
use memfabric_store::{FlashConfig, GetOptions, SetMode, Store, StoreConfig, StoreStatus};

fn value(key: &str, len: usize) -> Vec<u8> {
    let mut v = format!("{key}:").into_bytes();
    while v.len() < len {
        v.extend_from_slice(format!("{}|", v.len()).as_bytes());
    }
    v.truncate(len);
    v
}

#[test]
fn the_io_uring_engine_reads_what_pread_reads_with_many_in_flight() {
    let dir = tempfile::Builder::new()
        .prefix("mf-flash-uring-")
        .tempdir()
        .unwrap();
    let s = Store::new(StoreConfig {
        memory_limit: 16 << 20,
        item_size_max: 4 << 20,
        slab_automove: false,
        background_sweeper: false,
        flash: Some(FlashConfig {
            files: vec![(dir.path().join("flash"), 128 << 20)],
            // Buffers for the whole load: which items reach flash must not depend on
            // how fast the disk takes the writer's pages.
            write_buffers: 96,
            ..FlashConfig::default()
        }),
        ..StoreConfig::default()
    })
    .unwrap();
    let reader = s.flash_reader();
    probe(&reader).expect("io_uring reads work on this machine");
    // Small records, large (chained) ones, small again: several times RAM, and each
    // kind with pages of its own (no automove).
    let mut keys = Vec::new();
    for i in 0..3_000 {
        keys.push((format!("small:{i}"), 1500 + i % 700));
    }
    for i in 0..30 {
        keys.push((format!("large:{i}"), 600_000 + i * 50_021));
    }
    for i in 3_000..20_000 {
        keys.push((format!("small:{i}"), 1500 + i % 700));
    }
    for (k, len) in &keys {
        let st = s.store(SetMode::Set, k.as_bytes(), &value(k, *len), 1, 0, 0);
        assert!(matches!(st, StoreStatus::Stored { .. }), "{k}");
    }
    // Not settled on purpose: the newest pages are still in memory.
    let on_flash: Vec<usize> = (0..keys.len())
        .filter(|&i| {
            let mut out = Vec::new();
            s.get(keys[i].0.as_bytes(), &GetOptions::default(), &mut out)
                .is_none()
                && !s.flash_candidates(keys[i].0.as_bytes()).is_empty()
        })
        .collect();
    assert!(on_flash.len() > 10_000, "{} on flash", on_flash.len());
    let large = on_flash
        .iter()
        .filter(|&&i| keys[i].0.starts_with("large"))
        .count();
    assert!(large >= 10, "{large} large items on flash");
    let (tx, rx) = mpsc::channel();
    let engine = UringReads::start(reader, 16, on_flash.len(), move |i: usize, hit| {
        tx.send((i, hit.map(|h| h.value))).unwrap();
    })
    .unwrap();
    for &i in &on_flash {
        let k = keys[i].0.as_bytes();
        assert!(engine.submit(k.to_vec(), s.flash_candidates(k), i).is_ok());
    }
    let mut got: HashMap<usize, Option<Vec<u8>>> = HashMap::new();
    while got.len() < on_flash.len() {
        let (i, v) = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("every lookup answered");
        assert!(got.insert(i, v).is_none(), "answered twice: {}", keys[i].0);
    }
    let mut hits = 0;
    for &i in &on_flash {
        let (k, len) = &keys[i];
        let want = s.read_flash(k.as_bytes(), &s.flash_candidates(k.as_bytes()));
        let v = got[&i].as_ref();
        assert_eq!(
            v,
            want.as_ref().map(|h| &h.value),
            "{k}: engine and pread differ"
        );
        if let Some(v) = v {
            assert!(*v == value(k, *len), "{k}: wrong value");
            hits += 1;
        }
    }
    // Every key was set once, so a record missing from flash is one that a later SET of
    // another key dropped unread because their buckets and 16-bit tags matched
    // (`Store::transact_replacing`), counted as `overwritten`; 0-1 in a run here.
    let dropped = s.flash_stats().unwrap().overwritten as usize;
    assert!(
        on_flash.len() - hits <= dropped,
        "every item on flash read back: {} of {} missed, {dropped} dropped by tag",
        on_flash.len() - hits,
        on_flash.len()
    );
    assert_eq!(engine.queued.load(std::sync::atomic::Ordering::Relaxed), 0);
    drop(engine);
    assert!(rx.try_recv().is_err());
}
