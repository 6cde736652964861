//! `memfabric-bench compare` finds the memfabricd built next to it from any directory, and
//! says which binary it runs. The server it starts listens on a free 127.0.0.1 port and is
//! killed by the bench when the run ends.
//!
//! Needs memfabricd built in the same profile as this test's memfabric-bench
//! (`cargo build --release -p memfabric-server`): a missing binary fails, never skips.
use std::path::PathBuf;
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_memfabric-bench");

#[test]
fn compare_run_from_another_directory_uses_the_memfabricd_next_to_the_bench() {
    let bench_dir = PathBuf::from(BENCH)
        .parent()
        .expect("bench has a directory")
        .to_path_buf();
    let expected = bench_dir.join("memfabricd");
    assert!(
        expected.exists(),
        "{} missing: cargo build --release -p memfabric-server",
        expected.display()
    );
    // A directory with no target/ below it, and a PATH without memfabricd: only the
    // bench's own directory can supply it.
    let cwd = std::env::temp_dir().join(format!("mfb-compare-cwd-{}", std::process::id()));
    std::fs::create_dir_all(&cwd).expect("scratch dir");
    let out = Command::new(BENCH)
        .current_dir(&cwd)
        .env("PATH", "/usr/bin:/bin")
        .args([
            "compare",
            "--targets",
            "memfabricd-tcp",
            "--sections",
            "latency",
        ])
        .args(["--latency-sizes", "1", "--latency-ops", "get"])
        .args([
            "--latency-iterations",
            "20",
            "--rounds",
            "1",
            "--poll-us",
            "0",
        ])
        .output()
        .expect("run memfabric-bench");
    let _ = std::fs::remove_dir(&cwd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "compare failed: {stderr}\n{stdout}");
    let said = format!(
        "compare: memfabricd is {} (next to memfabric-bench)",
        expected.display()
    );
    assert!(stderr.contains(&said), "expected {said:?} in: {stderr}");
    assert!(
        stdout.contains(&format!("candidate: {} ", expected.display())),
        "{stdout}"
    );
    assert!(stdout.contains("memfabricd-tcp"), "{stdout}");
}
