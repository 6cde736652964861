//! `memfabric-bench scale` end to end with a few dozen clients in its three modes: every
//! client connects, no request fails (through the churn between tiers too), the hybrid
//! server puts no more than `--hot` sessions on its hot tier, and after every client
//! process is killed with SIGKILL the server gives back its descriptors (back to the
//! baseline) and, in the dedicated and hybrid modes, its memory (RSS within 10% of the
//! baseline). Only counts and sizes are asserted, never a time; the reclaim is watched
//! for a bounded while.
//!
//! Needs memfabricd built next to the bench (`cargo build --release -p memfabric-server`).
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_memfabric-bench");

#[test]
fn scale_small_run_connects_everyone_fails_nothing_and_reclaims_after_sigkill() {
    let dir = std::env::temp_dir().join(format!("mfb-scale-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let json = dir.join("scale.json");
    let out = Command::new(BENCH)
        .args([
            "scale",
            "--clients",
            "48",
            "--hot",
            "3",
            "--duration",
            "1.5",
        ])
        .args(["--churn-every", "0.5", "--per-process", "16", "--quiet"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run memfabric-bench");
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "scale failed: {stderr}\n{stdout}");
    let v: serde_json::Value = serde_json::from_str(&text.expect("json written")).expect("json");
    assert!(
        v["ucx"].as_str().is_some_and(|u| u.contains("libucp")),
        "{}",
        v["ucx"]
    );
    let results = v["results"].as_array().expect("results");
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["mode"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["dedicated", "cold", "hybrid"]);
    for r in results {
        let name = &r["mode"]["name"];
        assert_eq!(r["connected"], 48, "{name}: {r}");
        assert_eq!(
            r["connect_failures"], 0,
            "{name}: {}",
            r["first_connect_error"]
        );
        assert_eq!(r["failures"], 0, "{name}: {}", r["first_failure"]);
        assert_eq!(r["misses"], 0, "{name}");
        assert!(
            r["hot_full"]["ops"].as_u64().unwrap_or(0) > 0,
            "{name}: no hot GET"
        );
        assert!(
            r["cold_full"]["ops"].as_u64().unwrap_or(0) > 0,
            "{name}: no cold GET"
        );
        let last = &r["milestones"]
            .as_array()
            .expect("milestones")
            .last()
            .cloned();
        let last = last.as_ref().expect("a milestone");
        assert_eq!(last["clients"], 48, "{name}");
        assert_eq!(last["sessions"], 48, "{name}: {last}");
        if name == "hybrid" {
            assert_eq!(last["hot_sessions"], 3, "{name}: {last}");
            assert_eq!(last["cold_sessions"], 45, "{name}: {last}");
        }
        // Reclaimed after SIGKILL of every client (sampled for 5 s).
        let base = &r["baseline"];
        let end = &r["teardown"].as_array().expect("teardown").last().cloned();
        let end = &end.as_ref().expect("a teardown sample")[1];
        let (fds0, fds1) = (base["fds"].as_u64().unwrap(), end["fds"].as_u64().unwrap());
        assert!(
            fds1 <= fds0,
            "{name}: {fds1} descriptors after the kill, {fds0} before"
        );
        // Memory: for the configurations memfabricd is meant to run in (a latency tier
        // alone, or the hybrid). The TCP-only reference keeps what UCX's TCP transport
        // took under load (docs/scaling.md, "What is left").
        if name != "cold" {
            let rss0 = base["rss_kb"].as_u64().unwrap();
            let rss1 = end["rss_kb"].as_u64().unwrap();
            assert!(
                rss1 as f64 <= rss0 as f64 * 1.1,
                "{name}: RSS {rss1} KiB after the kill, {rss0} KiB before"
            );
        }
    }
}
