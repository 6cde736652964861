//! Microbenchmark of the lock-free GET's copy: `Store::get` of one key, repeated, for a
//! few value sizes up to the 1 MiB item limit (the copy out of item memory dominates the
//! larger ones). Prints nanoseconds per GET and the copy rate. Single-threaded, so no
//! read ever races a writer: this measures the copy primitive's cost, not retries.
//!
//! `cargo run --release -p memfabric-store --example get_copy [SIZE...]`
use std::time::Instant;

use memfabric_store::{GetOptions, SetMode, Store, StoreConfig};

fn main() {
    let store = Store::new(StoreConfig {
        memory_limit: 64 << 20,
        ..StoreConfig::default()
    })
    .expect("store");
    let opts = GetOptions::default();
    let mut out = Vec::with_capacity(2 << 20);
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("size"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![100, 4096, 16 << 10, 256 << 10, (1 << 20) - 512]
    } else {
        sizes
    };
    for &size in &sizes {
        let key = format!("bench:{size}");
        let value: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        store.store(SetMode::Set, key.as_bytes(), &value, 0, 0, 0);
        // Aim at ~2 GB copied per size (at least 20k GETs) so each line takes ~1 s.
        // GET_COPY_ROUNDS fixes the count instead (for instruction counts under callgrind).
        let rounds = std::env::var("GET_COPY_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(((2usize << 30) / size).clamp(20_000, 2_000_000));
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..rounds {
                out.clear();
                let hit = store.get(key.as_bytes(), &opts, &mut out);
                assert!(hit.is_some());
            }
            best = best.min(t.elapsed().as_secs_f64() / rounds as f64);
        }
        assert_eq!(out, value);
        println!(
            "value {size:>8} B: {:>9.1} ns/get  {:>6.2} GB/s",
            best * 1e9,
            size as f64 / best / 1e9
        );
    }
}
