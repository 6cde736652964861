//! `memfabric-bench hybrid` end to end at tiny sizes: every target is in the JSON, no GET
//! returned another key's value, and memfabricd's flash tier served reads and kept at
//! least as many keys as RAM alone. Only counts are asserted, never a time.
//!
//! The bench starts and stops every server itself (its guards kill them when a target
//! ends, also on an error). Needs memfabricd built next to the bench
//! (`cargo build --release -p memfabric-server`); memcached-ext is measured when
//! /usr/bin/memcached exists.
use std::path::Path;
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_memfabric-bench");
const MEMCACHED: &str = "/usr/bin/memcached";

fn result<'a>(results: &'a [serde_json::Value], target: &str) -> &'a serde_json::Value {
    results
        .iter()
        .find(|r| r["target"] == target)
        .unwrap_or_else(|| panic!("no {target} in {results:?}"))
}

#[test]
fn hybrid_tiny_run_serves_from_flash_and_returns_only_right_values() {
    let dir = std::env::temp_dir().join(format!("mfb-hybrid-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let json = dir.join("hybrid.json");
    let mut targets = vec!["memfabricd", "memfabricd-flash"];
    if Path::new(MEMCACHED).exists() {
        targets.push("memcached-ext");
    }
    let out = Command::new(BENCH)
        .args(["hybrid", "--maxmemory", "8", "--flash", "64"])
        .args(["--valsize", "2000", "--ops", "20000", "--quiet"])
        .args(["--targets", &targets.join(",")])
        .arg("--flash-dir")
        .arg(dir.join("flash"))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run memfabric-bench");
    let text = std::fs::read_to_string(&json);
    let flash_left = std::fs::read_dir(dir.join("flash")).map_or(0, |d| d.count());
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "hybrid failed: {stderr}\n{stdout}");
    assert_eq!(flash_left, 0, "flash files left behind");
    let v: serde_json::Value = serde_json::from_str(&text.expect("json written")).expect("json");
    let results = v["results"]["results"].as_array().expect("results");
    assert_eq!(results.len(), targets.len(), "{results:?}");
    for t in &targets {
        let r = result(results, t);
        assert_eq!(r["wrong_values"], 0, "{t}: {r}");
        assert_eq!(r["gets"], 20000, "{t}: {r}");
    }
    let ram = result(results, "memfabricd");
    let flash = result(results, "memfabricd-flash");
    let reads = flash["flash_reads"].as_u64().expect("flash_reads");
    assert!(reads > 0, "no GET was served from flash: {flash}");
    let hit = |r: &serde_json::Value| r["hit_ratio"].as_f64().expect("hit_ratio");
    assert!(
        hit(flash) >= hit(ram),
        "flash hit ratio {} < RAM-only {}",
        hit(flash),
        hit(ram)
    );
}
