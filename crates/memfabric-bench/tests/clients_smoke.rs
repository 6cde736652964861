//! `memfabric-bench clients` end to end at a tiny size: every row ran the library it names
//! (the probes check which libmemcached.so.11 was loaded), every GET hit, the JSON and the
//! plot are written. Only counts are asserted, never a time.
//!
//! Needs memfabricd and libmemfabric.so built next to the bench (`cargo build --release`),
//! gcc and libmemcached-dev, Debian's python3-pylibmc and a Python with pymemcache (the
//! project's .venv; scripts/setup.sh installs all of them).
use std::path::Path;
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_memfabric-bench");

#[test]
fn clients_tiny_run_measures_every_library_it_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "no {} (scripts/setup.sh makes it)",
        python.display()
    );
    let dir = std::env::temp_dir().join(format!("mfb-clients-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, png) = (dir.join("clients.json"), dir.join("clients.png"));
    let out = Command::new(BENCH)
        .args([
            "clients",
            "--gets",
            "640",
            "--keys",
            "64",
            "--in-flight",
            "32",
        ])
        .arg("--python")
        .arg(&python)
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&png)
        .output()
        .expect("run memfabric-bench");
    let text = std::fs::read_to_string(&json);
    let plotted = png.exists();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "clients failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(plotted || String::from_utf8_lossy(&out.stderr).contains("plot skipped"));
    let v: serde_json::Value = serde_json::from_str(&text.expect("json written")).unwrap();
    let python_rows = v["python"].as_array().unwrap();
    let c_rows = v["c"].as_array().unwrap();
    assert_eq!(python_rows.len(), 6, "{v}");
    assert_eq!(c_rows.len(), 4, "{v}");
    for r in python_rows.iter().chain(c_rows) {
        assert!(r["p50_us"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    for r in c_rows {
        assert!(r["gets_per_s"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    assert!(
        v["pylibmc_ucx_vs_tcp_p50"]
            .as_f64()
            .is_some_and(f64::is_finite),
        "{v}"
    );
    assert!(
        stdout.contains("pylibmc/libmemfabric -> memfabricd"),
        "{stdout}"
    );
}
