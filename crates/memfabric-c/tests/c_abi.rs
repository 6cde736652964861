//! The C ABI against the real thing: `tests/c/differential.c`, compiled against Debian's
//! `libmemcached-dev` headers, runs once linked to the real `libmemcached.so.11` and once
//! with libmemfabric loaded in its place (`LD_LIBRARY_PATH` with the SONAME); every line
//! (struct layout, behaviours, placement under every hash, configuration strings, commands
//! in both protocols, the end codes of fetches, misuse, servers down and silent) must be the
//! same, but for the one documented difference: keys with whitespace or control
//! characters, which libmemcached's binary protocol carries and memfabric's transports
//! refuse (docs/c-api.md).
//!
//! Needs gcc and libmemcached-dev (scripts/setup.sh installs both) and the cdylib, which
//! cargo builds with this test.

#[path = "../../memfabric-client/tests/common/mod.rs"]
mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Kind, Server};

/// The lines where libmemfabric differs from libmemcached on purpose.
const KNOWN_DIFFERENCES: [&str; 3] = [
    "memcached_set(m, \"with space\", 10,",
    "memcached_set(m, \"ctl\\x01key\", 7,",
    "get key with space",
];

fn cdylib() -> PathBuf {
    // The test binary is target/<profile>/deps/c_abi-<hash>; cargo puts the cdylib in
    // target/<profile>/ (and in deps/).
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps.parent().unwrap(), deps] {
        let p = dir.join("libmemfabric.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libmemfabric.so not found next to {}", deps.display());
}

/// A directory holding libmemfabric under libmemcached's SONAME.
fn soname_dir(tmp: &Path) -> PathBuf {
    let dir = tmp.join("lib");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(cdylib(), dir.join("libmemcached.so.11")).unwrap();
    dir
}

fn compile(tmp: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/differential.c");
    let exe = tmp.join("differential");
    let out = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lmemcached")
        .output()
        .expect("gcc (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "compiling differential.c against libmemcached-dev failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// A port nothing listens on (connections are refused).
fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn run(exe: &Path, lib: Option<&Path>, transport: &str, args: &[String]) -> String {
    let mut cmd = Command::new(exe);
    cmd.args(args).env_remove("LD_PRELOAD");
    match lib {
        Some(dir) => cmd.env("LD_LIBRARY_PATH", dir),
        None => cmd.env_remove("LD_LIBRARY_PATH"),
    };
    cmd.env("MEMFABRIC_TRANSPORT", transport);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "differential ({}) failed: {}\n{}",
        if lib.is_some() {
            "libmemfabric"
        } else {
            "libmemcached"
        },
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn compare(reference: &str, ours: &str) {
    let r: Vec<&str> = reference.lines().collect();
    let o: Vec<&str> = ours.lines().collect();
    assert_eq!(
        r.len(),
        o.len(),
        "different number of lines:\n--- libmemcached\n{reference}\n--- libmemfabric\n{ours}"
    );
    let mut known = 0;
    let mut wrong = Vec::new();
    for (a, b) in r.iter().zip(&o) {
        if a == b {
            continue;
        }
        if KNOWN_DIFFERENCES
            .iter()
            .any(|k| a.starts_with(k) && b.starts_with(k))
        {
            known += 1;
            continue;
        }
        wrong.push(format!("libmemcached: {a}\nlibmemfabric: {b}"));
    }
    assert!(
        wrong.is_empty(),
        "{} lines differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // The known differences are in the binary-protocol section only, and all present.
    assert_eq!(
        known,
        KNOWN_DIFFERENCES.len(),
        "the known differences changed"
    );
    assert!(
        r.len() > 400,
        "the program stopped early ({} lines)",
        r.len()
    );
}

fn stat(server: &Server, group: &str, name: &str) -> u64 {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::net::TcpStream::connect(server.addr()).unwrap();
    write!(s, "stats {group}\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 || line.starts_with("END") {
            panic!("no {name} in stats {group}");
        }
        let mut parts = line.split_whitespace();
        if parts.nth(1) == Some(name) {
            return parts.next().unwrap().parse().unwrap();
        }
    }
}

#[test]
fn libmemfabric_answers_as_libmemcached_against_memcached() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = compile(tmp.path());
    let lib = soname_dir(tmp.path());
    let silent = TcpListener::bind("127.0.0.1:0").unwrap(); // accepts (backlog), never answers
    let silent_port = silent.local_addr().unwrap().port();
    let server = Server::start(Kind::Memcached, &[]);
    let args = [
        "127.0.0.1".to_string(),
        server.port.to_string(),
        dead_port().to_string(),
        silent_port.to_string(),
    ];
    let reference = run(&exe, None, "tcp", &args);
    let ours = run(&exe, Some(&lib), "auto", &args);
    compare(&reference, &ours);
}

#[test]
fn libmemfabric_over_ucx_answers_as_libmemcached_over_tcp_against_memfabricd() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = compile(tmp.path());
    let lib = soname_dir(tmp.path());
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let server = Server::start(Kind::MemfabricdUcx, &[]);
    let args = [
        "127.0.0.1".to_string(),
        server.port.to_string(),
        dead_port().to_string(),
        silent_port.to_string(),
    ];
    let reference = run(&exe, None, "tcp", &args);
    let before = stat(&server, "fabric", "ucx_total_sessions");
    assert_eq!(before, 0, "libmemcached came over UCX?");
    // MEMFABRIC_TRANSPORT=ucx: a server without UCX would be a connection failure, so
    // equal output means every command went over UCX.
    let ours = run(&exe, Some(&lib), "ucx", &args);
    compare(&reference, &ours);
    assert!(
        stat(&server, "fabric", "ucx_total_sessions") > 0,
        "no UCX session reached memfabricd"
    );
}

/// memfabric.h's example program (examples/nonblocking.c), built as a user would build it
/// (the header, -lmemfabric), against memfabricd over UCX and memcached over TCP.
#[test]
fn the_nonblocking_example_builds_and_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = cdylib();
    let exe = tmp.path().join("nonblocking");
    let out = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-I"])
        .arg(manifest.join("include"))
        .arg(manifest.join("examples/nonblocking.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(lib.parent().unwrap())
        .arg("-lmemfabric")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "building the example failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (kind, transport) in [(Kind::MemfabricdUcx, "UCX"), (Kind::Memcached, "TCP")] {
        let server = Server::start(kind, &[]);
        let out = Command::new(&exe)
            .args(["127.0.0.1", &server.port.to_string()])
            .env("LD_LIBRARY_PATH", lib.parent().unwrap())
            .env_remove("MEMFABRIC_TRANSPORT")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{kind:?}: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("missing key: NOT FOUND"), "{stdout}");
        assert!(
            stdout.contains(&format!(
                "64 of 64 values fetched as stored, server reached over {transport}"
            )),
            "{kind:?}: {stdout}"
        );
    }
}

fn compile_named(tmp: &Path, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = tmp.join(name);
    let out = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lmemcached")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// libmemcached's replicas: the same servers hold each key's copies (modula and weighted
/// ketama, 0-3 replicas, both protocol modes: only the binary one replicates), deletes
/// reach every copy, a miss on the key's own server stays a miss; and with a server dead,
/// its keys are read from the replicas (every one of them, where libmemcached loses the
/// read that finds the server dead), or not at all without replicas, as libmemcached.
#[test]
fn replicas_are_where_libmemcached_puts_them_and_serve_a_dead_servers_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = compile_named(tmp.path(), "replicas");
    let lib = soname_dir(tmp.path());
    let mut servers: Vec<Server> = (0..3)
        .map(|_| Server::start(Kind::Memcached, &[]))
        .collect();
    let ports: Vec<String> = servers.iter().map(|s| s.port.to_string()).collect();
    let mut args = vec!["placement".to_string()];
    args.extend(ports.iter().cloned());
    let reference = run(&exe, None, "tcp", &args);
    let ours = run(&exe, Some(&lib), "auto", &args);
    assert_eq!(reference, ours);
    assert!(
        reference.contains("ketama binary=1 replicas=2: [111]"),
        "{reference}"
    );
    for (dist, reps) in [("0", "1"), ("1", "1"), ("1", "2"), ("1", "0")] {
        let phase = |which: &str| {
            let mut a = vec![which.to_string(), dist.to_string(), reps.to_string()];
            a.extend(ports.iter().cloned());
            a
        };
        let mut outputs = Vec::new();
        for l in [None, Some(lib.as_path())] {
            // Every server empty: copies an earlier phase left on the others (the same
            // keys, with replicas) would serve the dead server's keys in a phase without
            // replicas, whichever library reads (a CI run on 2026-11-28 saw libmemcached
            // and libmemfabric alike find all 12).
            for s in servers.iter_mut() {
                s.restart();
            }
            run(&exe, l, "auto", &phase("write"));
            servers[0].kill();
            outputs.push(run(&exe, l, "auto", &phase("read")));
        }
        let (reference, ours) = (&outputs[0], &outputs[1]);
        if reps == "0" {
            assert_eq!(reference, ours);
            assert!(!ours.contains("mget finds 12"), "{ours}");
        } else {
            assert!(
                ours.ends_with(": 1 1 1 1 1 1 1 1 1 1 1 1 | mget finds 12\n"),
                "dist {dist} replicas {reps}: {ours}\n(libmemcached: {reference})"
            );
        }
    }
}
