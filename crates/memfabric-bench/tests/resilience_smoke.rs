//! `memfabric-bench resilience` end to end, small: on loopback and with every server in a
//! network namespace behind a shaped link (`--link-rate`), over TCP and over UCX (its TCP
//! transport, which the shaped links carry). Asserted: the run completes, every section
//! has its rows, the memory ratios are those of the codes (RS(4,2) stores ~1.5x, three
//! copies ~3x: these are byte counts, not times), the report says how the servers were
//! linked and how much CPU time the host's hypervisor took meanwhile. No latency or rate
//! is asserted.
//!
//! Needs memfabricd built next to the bench (`cargo build --release -p memfabric-server`);
//! the shaped run needs root, `ip` and `tc` (`MEMFABRIC_SKIP_NETNS=1` skips it, loudly).
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_memfabric-bench");

fn run(args: &[&str], ucx_tls: &str) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!(
        "mfb-resilience-smoke-{}-{}",
        std::process::id(),
        args.len()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let json = dir.join("resilience.json");
    let out = Command::new(BENCH)
        .arg("resilience")
        .args(args)
        .args(["--sizes", "4096,65536", "--memory-sizes", "65536"])
        .args(["--iterations", "40", "--bytes-per-point", "2000000"])
        .args(["--window", "8", "--memory", "256", "--degraded-rounds", "2"])
        .args(["--quiet", "--json"])
        .arg(&json)
        .env("UCX_TLS", ucx_tls)
        .output()
        .expect("run memfabric-bench");
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "resilience {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text.expect("json written")).expect("json");
    check_sections(&v, &stdout);
    v
}

fn check_sections(v: &serde_json::Value, stdout: &str) {
    assert!(
        v["steal_share"]
            .as_f64()
            .is_some_and(|x| (0.0..=1.0).contains(&x)),
        "{}",
        v["steal_share"]
    );
    for row in v["memory"].as_array().expect("memory rows") {
        let ratio = row["ratio"].as_f64().expect("ratio");
        let expected = if row["pool"] == "Ec" { 1.5 } else { 3.0 };
        assert!(
            (expected * 0.95..=expected * 1.1).contains(&ratio),
            "{row}\n{stdout}"
        );
    }
    let transports: Vec<&str> = v["crossovers"]
        .as_array()
        .expect("crossovers")
        .iter()
        .filter_map(|c| c["transport"].as_str())
        .collect();
    // Two sizes x two pools x two ops per transport.
    assert_eq!(
        v["latency"].as_array().expect("latency").len(),
        8 * transports.len() / 2,
        "{stdout}"
    );
    for row in v["latency"].as_array().unwrap() {
        assert!(row["p50_us"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        assert_eq!(
            row["encode_share"].is_null(),
            !(row["pool"] == "Ec" && row["op"] == "set"),
            "{row}"
        );
    }
    assert_eq!(
        v["pipeline"].as_array().expect("pipeline").len(),
        transports.len(),
        "{stdout}"
    );
    // Two rounds: the killed servers were started again in between and found by the
    // second round's pool; the row is one of the rounds, whole.
    for d in v["degraded"].as_array().expect("degraded") {
        assert_eq!(d["killed"], 2, "{d}");
        let rounds: Vec<f64> = d["round_ratios"]
            .as_array()
            .expect("round_ratios")
            .iter()
            .map(|x| x.as_f64().expect("a ratio"))
            .collect();
        assert_eq!(rounds.len(), 2, "{d}");
        let ratio = d["ratio"].as_f64().unwrap();
        let of_row = d["degraded_p99_us"].as_f64().unwrap() / d["healthy_p99_us"].as_f64().unwrap();
        assert!((ratio - of_row).abs() < 1e-6 * ratio, "{d}");
        assert!(
            rounds.iter().any(|r| (r - ratio).abs() < 1e-6 * ratio),
            "{d}"
        );
    }
}

#[test]
fn on_loopback_the_codes_store_what_they_should() {
    let v = run(&["--transport", "tcp"], "posix,cma,self");
    assert!(v["link_rate"].is_null(), "{}", v["link_rate"]);
}

#[test]
fn behind_shaped_links_both_transports_run_and_the_rate_is_reported() {
    if memfabric_cluster::skip_netns_tests() {
        return;
    }
    let v = run(
        &["--transport", "tcp,ucx", "--link-rate", "2gbit"],
        "tcp,self",
    );
    assert_eq!(v["link_rate"], "2gbit");
}

#[test]
fn arguments_that_would_hang_or_measure_nothing_are_refused() {
    for args in [
        ["--window", "0"],
        ["--iterations", "0"],
        // 255 + 1 copies wrapped to "0-way replication"; six servers hold at most six.
        ["--replicas", "255"],
        ["--replicas", "6"],
        ["--memory-sizes", "0"],
        ["--memory", "0"],
        // The pipelined and degraded runs would measure values that are not coded.
        ["--ec-threshold", "100000"],
    ] {
        let out = Command::new(BENCH)
            .arg("resilience")
            .args(args)
            .output()
            .expect("run memfabric-bench");
        assert!(!out.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(args[0]), "{args:?}: {stderr}");
    }
}

#[test]
fn shared_memory_would_bypass_the_links_so_it_is_refused() {
    let out = Command::new(BENCH)
        .args(["resilience", "--transport", "ucx", "--link-rate", "1gbit"])
        .env("UCX_TLS", "posix,cma,self")
        .output()
        .expect("run memfabric-bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("UCX_TLS=tcp,self"), "{stderr}");
}
