//! `--transport ucx` end to end against a real memfabricd (free ports, `--ucx-port`, killed
//! on drop). Run under each UCX_TLS the CI uses (`posix,cma,self` and `tcp,self`).
//!
//! memfabricd is `$MEMFABRICD` (relative to the workspace root) or
//! `target/{release,debug}/memfabricd`; build it first (`cargo build --release -p
//! memfabric-server`). A missing binary fails the test, it never skips. No test asserts on a
//! timing.

use memfabric_bench::latency::{self, LatencyConfig, LatencyOp};
use memfabric_bench::load::{self, LoadConfig};
use memfabric_bench::server::{ServerProcess, ServerSpec};
use memfabric_bench::ucx::UcxConnector;
use memfabric_bench::workload::{KeyDist, KeySpace, OpMix, Pattern};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn memfabricd() -> PathBuf {
    if let Ok(p) = std::env::var("MEMFABRICD") {
        let p = PathBuf::from(p);
        let p = if p.is_absolute() {
            p
        } else {
            workspace_root().join(p)
        };
        assert!(p.exists(), "MEMFABRICD={} does not exist", p.display());
        return p;
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"));
    for profile in ["release", "debug"] {
        let p = target.join(profile).join("memfabricd");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "memfabricd not found under {}: cargo build --release -p memfabric-server",
        target.display()
    );
}

/// memfabricd with a UCX bootstrap port; the returned process is the drop guard (SIGKILL
/// and reap on drop, also when an assertion fails).
fn start_memfabricd() -> (ServerProcess, SocketAddr) {
    let spec = ServerSpec {
        name: "memfabricd".into(),
        path: memfabricd(),
        threads: 1,
        memory_mb: 64,
        extra_args: Vec::new(),
    };
    let proc = spec.start_with_ucx_port().expect("start memfabricd");
    let ucx_port = proc.ucx_port.expect("started with a UCX port");
    (proc, SocketAddr::from(([127, 0, 0, 1], ucx_port)))
}

#[test]
fn ucx_latency_sweep_reports_every_row() {
    let (srv, ucx) = start_memfabricd();
    let cfg = LatencyConfig {
        sizes: vec![4, 65536],
        ops: vec![LatencyOp::Get, LatencyOp::Set, LatencyOp::MIX_90_10],
        iterations: 50,
        warmup: 5,
        key_prefix: "mfb-ucx-lat:".into(),
        server_pid: Some(srv.pid()),
    };
    let rows = latency::run(&UcxConnector::new(ucx), &cfg).expect("ucx latency run");
    let got: Vec<(&str, &str, usize)> = rows
        .iter()
        .map(|(r, _)| (r.transport.as_str(), r.op.as_str(), r.size))
        .collect();
    assert_eq!(
        got,
        vec![
            ("ucx", "get", 4),
            ("ucx", "get", 65536),
            ("ucx", "set", 4),
            ("ucx", "set", 65536),
            ("ucx", "mix", 4),
            ("ucx", "mix", 65536),
        ]
    );
    for (r, h) in &rows {
        assert_eq!(r.ops, 50, "{r:?}");
        assert_eq!(h.len(), 50, "{r:?}");
        assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us, "{r:?}");
        // CPU time comes in clock ticks: 50 ops may take none.
        let cpu = r.server_cpu_s_per_mop.expect("server pid given");
        assert!(cpu >= 0.0, "{r:?}");
    }
}

#[test]
fn ucx_closed_loop_two_threads_pipelined() {
    let (_srv, ucx) = start_memfabricd();
    let connector = UcxConnector::new(ucx);
    let keys = KeySpace::new("mfb-ucx-load:", 500);
    let p = load::preload(&connector, &keys, 1000, 4, 8).expect("preload");
    assert_eq!(p.stored, 500);
    let cfg = LoadConfig {
        threads: 2,
        conns_per_thread: 2,
        depth: 4,
        ops: Some(4000),
        duration: None,
        keys,
        dist: KeyDist::Uniform,
        mix: OpMix::parse("90:10").unwrap(),
        pattern: Pattern::Mix,
        ycsb: None,
        rate: None,
        value_size: 1000,
        seed: 7,
        progress: false,
        label: "ucx".into(),
    };
    let s = load::run(&connector, &cfg).expect("ucx load run");
    assert_eq!(s.ops(), 4000);
    assert!(s.gets > 0 && s.sets > 0);
    // Every GET hit and its value checked out (key and stamps), every SET stored.
    assert_eq!(s.hits, s.gets);
    assert_eq!(s.mismatches, 0);
    assert_eq!(s.stored, s.sets);
    assert_eq!(s.errors, 0);
}

/// The CLI: `--start-server` with `--transport tcp,ucx` measures both against one memfabricd
/// and writes a JSON row per (transport, op, size) with the server's CPU per Mop.
#[test]
fn cli_latency_tcp_and_ucx_against_one_started_server() {
    let dir = std::env::temp_dir().join(format!("mfb-ucx-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("lat.json");
    let out = Command::new(env!("CARGO_BIN_EXE_memfabric-bench"))
        .args(["latency", "--transport", "tcp,ucx", "--start-server"])
        .arg(memfabricd())
        .args([
            "--memory",
            "64",
            "--sizes",
            "4,65536",
            "--ops",
            "get,set",
            "--iterations",
            "50",
            "--warmup",
            "5",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run memfabric-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("server_cpu_s_per_mop"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "{v}");
    for t in ["tcp", "ucx"] {
        let n = rows.iter().filter(|r| r["transport"] == t).count();
        assert_eq!(n, 4, "{t}: {v}");
    }
    for r in rows {
        assert!(r["p50_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["p99_us"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["ops"].as_u64(), Some(50), "{r}");
        assert!(r["server_cpu_s_per_mop"].as_f64().unwrap() >= 0.0, "{r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn run_bench(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memfabric-bench"))
        .args(args)
        .output()
        .expect("run memfabric-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}\n{stdout}");
    (stdout, stderr)
}

/// `compare` with every section, tiny, against memcached and memfabricd (started on free
/// ports, killed at the end): every target has rows, ratios are to memcached-tcp, and the
/// report goes between the markers of the page without touching the rest.
#[test]
fn cli_compare_all_sections_every_default_target_and_the_report() {
    let dir = std::env::temp_dir().join(format!("mfb-compare-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("c.json");
    let doc = dir.join("bench.md");
    std::fs::write(
        &doc,
        "# Title\nhand-written\n<!-- compare-report:begin -->\nold\n<!-- compare-report:end -->\ntail\n",
    )
    .unwrap();
    let mfd = memfabricd();
    let (stdout, _) = run_bench(&[
        "compare",
        "--memfabricd",
        mfd.to_str().unwrap(),
        "--memory",
        "64",
        "--rounds",
        "2",
        "--latency-sizes",
        "32,65536",
        "--latency-iterations",
        "20",
        "--clients",
        "1,2",
        "--keys",
        "200",
        "--value-size",
        "100",
        "--ops",
        "300",
        "--ycsb",
        "a,e,f",
        "--ycsb-records",
        "200",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
        "--report",
        doc.to_str().unwrap(),
        "--plot-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(stdout.contains("memfabricd-ucx"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = &v["results"];
    let targets = [
        "memcached-tcp",
        "memfabricd-tcp",
        "memfabricd-ucx",
        "memfabricd-onesided",
    ];
    assert_eq!(r["targets"], serde_json::json!(targets));
    // Latency: 2 sizes x 3 ops (get, set, mix) per target.
    assert_eq!(
        r["latency"].as_array().unwrap().len(),
        targets.len() * 2 * 3,
        "{r}"
    );
    // Throughput: one cell per client count; YCSB: one per workload; each with every target.
    for (section, cells) in [("throughput", 2), ("ycsb", 3)] {
        let a = r[section].as_array().unwrap();
        assert_eq!(a.len(), cells, "{section}");
        for cell in a {
            let names: Vec<&str> = cell["totals"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["server"].as_str().unwrap())
                .collect();
            assert_eq!(names, targets, "{section}");
            // One ratio per target other than the reference.
            assert_eq!(
                cell["ratios"].as_array().unwrap().len(),
                targets.len() - 1,
                "{section}"
            );
            for t in cell["totals"].as_array().unwrap() {
                // Two rounds of --ops 300, pooled.
                assert_eq!(t["ops"].as_u64(), Some(600), "{section}: {t}");
                assert_eq!(t["errors"].as_u64(), Some(0), "{section}: {t}");
                assert_eq!(t["mismatches"].as_u64(), Some(0), "{section}: {t}");
                assert!(t["server_cpu_s_per_mop"].as_f64().is_some(), "{t}");
            }
        }
    }
    assert_eq!(r["ycsb_load"].as_array().unwrap().len(), 2);
    assert_eq!(r["ceiling"].as_array().unwrap().len(), 2);
    let md = std::fs::read_to_string(&doc).unwrap();
    assert!(md.starts_with("# Title\nhand-written\n<!-- compare-report:begin -->\n"));
    assert!(md.ends_with("<!-- compare-report:end -->\ntail\n"), "{md}");
    assert!(!md.contains("\nold\n"));
    for needle in [
        "memfabricd-ucx",
        "memfabricd-onesided",
        "YCSB A",
        "read-modify-write",
        "scan",
        "ceiling",
    ] {
        assert!(md.contains(needle), "report lacks {needle}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ycsb` over UCX against memfabricd: load phase, then D (inserts, latest) and E (scans).
#[test]
fn cli_ycsb_over_ucx() {
    let (srv, ucx) = start_memfabricd();
    let dir = std::env::temp_dir().join(format!("mfb-ycsb-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("y.json");
    let ucx_addr = ucx.to_string();
    let pid = srv.pid().to_string();
    let (stdout, _) = run_bench(&[
        "ycsb",
        "--transport",
        "ucx",
        "--server",
        &ucx_addr,
        "--server-pid",
        &pid,
        "--workloads",
        "d,e",
        "--record-count",
        "300",
        "--operation-count",
        "400",
        "--threads",
        "2",
        "--conns",
        "1",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        stdout.contains("insert") && stdout.contains("scan"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["load_phase"]["records"].as_u64(), Some(300));
    for r in v["results"].as_array().unwrap() {
        let s = &r["summary"];
        assert_eq!(s["ops"].as_u64(), Some(400), "{s}");
        assert_eq!(s["misses"].as_u64(), Some(0), "{s}");
        assert_eq!(s["mismatches"].as_u64(), Some(0), "{s}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
