//! The load generator end to end against a tiny in-process memcached stand-in on
//! 127.0.0.1: counts and correctness only, never timings.

use memfabric_bench::latency::{self, LatencyConfig};
use memfabric_bench::load::{self, LoadConfig};
use memfabric_bench::transport::TcpConnector;
use memfabric_bench::workload::{KeyDist, KeySpace, OpKind, OpMix, Pattern};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Map = Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>;

/// Speaks just enough of the text protocol (get of one key, set) for the bench. With
/// `corrupt`, every GET answers a value one byte short, which the bench must flag.
fn fake_server(corrupt: bool) -> (SocketAddr, Map) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let map: Map = Arc::default();
    let m = Arc::clone(&map);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let m = Arc::clone(&m);
            std::thread::spawn(move || serve(stream, m, corrupt));
        }
    });
    (addr, map)
}

fn serve(stream: TcpStream, map: Map, corrupt: bool) {
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        let mut out = Vec::new();
        match parts.as_slice() {
            ["get", key] => {
                if let Some(v) = map.lock().unwrap().get(key.as_bytes()) {
                    let v = if corrupt { &v[..v.len() - 1] } else { &v[..] };
                    out.extend_from_slice(format!("VALUE {key} 0 {}\r\n", v.len()).as_bytes());
                    out.extend_from_slice(v);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"END\r\n");
            }
            ["set", key, _flags, _exp, len] => {
                let n: usize = len.parse().unwrap();
                let mut data = vec![0; n + 2];
                r.read_exact(&mut data).unwrap();
                data.truncate(n);
                map.lock().unwrap().insert(key.as_bytes().to_vec(), data);
                out.extend_from_slice(b"STORED\r\n");
            }
            _ => out.extend_from_slice(b"ERROR\r\n"),
        }
        if w.write_all(&out).is_err() {
            return;
        }
    }
}

fn config(n: u64, ops: u64, value_size: usize, dist: KeyDist) -> LoadConfig {
    LoadConfig {
        threads: 2,
        conns_per_thread: 3,
        depth: 4,
        ops: Some(ops),
        duration: Some(Duration::from_secs(60)),
        keys: KeySpace {
            prefix: "t:".into(),
            n,
        },
        dist,
        mix: OpMix::parse("90:10").unwrap(),
        pattern: Pattern::Mix,
        value_size,
        seed: 7,
        progress: false,
        label: "test".into(),
    }
}

#[test]
fn preload_stores_every_key_of_the_key_space_once() {
    let (addr, map) = fake_server(false);
    let keys = KeySpace {
        prefix: "t:".into(),
        n: 1234,
    };
    let p = load::preload(&TcpConnector { addr }, &keys, 100, 5, 8).unwrap();
    assert_eq!(p.stored, 1234);
    let map = map.lock().unwrap();
    assert_eq!(map.len(), 1234);
    assert!((0..1234).all(|i| map.get(&keys.key(i)).is_some_and(|v| v.len() == 100)));
}

#[test]
fn pipelined_run_issues_exactly_the_op_budget_and_every_get_hits() {
    let (addr, _) = fake_server(false);
    let connector = TcpConnector { addr };
    let cfg = config(500, 5000, 4096, KeyDist::Zipfian { theta: 0.99 });
    load::preload(&connector, &cfg.keys, cfg.value_size, 4, 16).unwrap();
    let s = load::run(&connector, &cfg).unwrap();
    assert_eq!(s.ops(), 5000);
    assert_eq!(s.gets + s.sets, 5000);
    assert_eq!(s.hits, s.gets, "all keys were preloaded");
    assert_eq!((s.errors, s.mismatches, s.not_stored), (0, 0, 0));
    assert_eq!(s.stored, s.sets);
    assert_eq!(s.all_hist().len(), 5000);
    // 90:10 within 5 sigma of 5000 draws.
    let f = s.gets as f64 / 5000.0;
    assert!(
        (f - 0.9).abs() < 5.0 * (0.09f64 / 5000.0).sqrt(),
        "get fraction {f}"
    );
}

#[test]
fn gets_of_keys_never_stored_count_as_misses() {
    let (addr, _) = fake_server(false);
    let mut cfg = config(100, 2000, 32, KeyDist::Uniform);
    cfg.mix = OpMix::parse("1:0").unwrap();
    let s = load::run(&TcpConnector { addr }, &cfg).unwrap();
    assert_eq!((s.gets, s.misses, s.hits), (2000, 2000, 0));
}

#[test]
fn truncated_values_are_counted_as_mismatches_not_hits() {
    let (addr, _) = fake_server(true);
    let connector = TcpConnector { addr };
    let mut cfg = config(50, 1000, 64, KeyDist::Uniform);
    cfg.mix = OpMix::parse("1:0").unwrap();
    load::preload(&connector, &cfg.keys, 64, 2, 4).unwrap();
    let s = load::run(&connector, &cfg).unwrap();
    assert_eq!(s.hits, 0);
    assert_eq!(s.mismatches, 1000);
}

#[test]
fn values_larger_than_the_receive_buffer_round_trip() {
    let (addr, _) = fake_server(false);
    let connector = TcpConnector { addr };
    let mut cfg = config(8, 200, 300_000, KeyDist::Uniform);
    cfg.threads = 1;
    load::preload(&connector, &cfg.keys, cfg.value_size, 2, 2).unwrap();
    let s = load::run(&connector, &cfg).unwrap();
    assert_eq!(s.ops(), 200);
    assert_eq!(s.hits, s.gets);
    assert_eq!(s.mismatches, 0);
}

#[test]
fn latency_sweep_reports_one_row_per_op_and_size() {
    let (addr, _) = fake_server(false);
    let cfg = LatencyConfig {
        sizes: vec![1, 32, 4096],
        ops: vec![OpKind::Get, OpKind::Set],
        iterations: 50,
        warmup: 5,
        key_prefix: "lat:".into(),
        server_pid: None,
    };
    let rows = latency::run(&TcpConnector { addr }, &cfg).unwrap();
    let got: Vec<(String, usize, u64)> = rows
        .iter()
        .map(|(r, _)| (r.op.clone(), r.size, r.ops))
        .collect();
    let want: Vec<(String, usize, u64)> = ["get", "set"]
        .iter()
        .flat_map(|op| [1, 32, 4096].map(|s| (op.to_string(), s, 50)))
        .collect();
    assert_eq!(got, want);
    assert!(rows
        .iter()
        .all(|(r, _)| r.transport == "tcp" && r.p50_us <= r.p99_us));
}

#[test]
fn run_against_a_closed_port_fails_with_a_connect_error() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let err = load::run(&TcpConnector { addr }, &config(10, 10, 8, KeyDist::Uniform));
    assert!(err.is_err());
}
