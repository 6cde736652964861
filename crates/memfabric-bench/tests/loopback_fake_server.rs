//! The load generator end to end against the in-process memcached stand-in
//! ([`Responder`]) on 127.0.0.1: counts and correctness only, never timings.

use memfabric_bench::latency::{self, LatencyConfig, LatencyOp};
use memfabric_bench::load::{self, LoadConfig};
use memfabric_bench::responder::Responder;
use memfabric_bench::transport::TcpConnector;
use memfabric_bench::workload::{KeyDist, KeySpace, OpMix, Pattern};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

/// The in-process responder (get of one key, set); with `corrupt`, every GET answers a value
/// one byte short, which the bench must flag. Dropped at the end of each test.
fn fake_server(corrupt: bool) -> (SocketAddr, Responder) {
    let r = Responder::start(corrupt).expect("start responder");
    (r.addr, r)
}

fn config(n: u64, ops: u64, value_size: usize, dist: KeyDist) -> LoadConfig {
    LoadConfig {
        threads: 2,
        conns_per_thread: 3,
        depth: 4,
        ops: Some(ops),
        duration: Some(Duration::from_secs(60)),
        keys: KeySpace::new("t:", n),
        dist,
        mix: OpMix::parse("90:10").unwrap(),
        pattern: Pattern::Mix,
        ycsb: None,
        rate: None,
        value_size,
        seed: 7,
        progress: false,
        label: "test".into(),
    }
}

#[test]
fn preload_stores_every_key_of_the_key_space_once() {
    let (addr, map) = fake_server(false);
    let keys = KeySpace::new("t:", 1234);
    let p = load::preload(&TcpConnector::plain(addr), &keys, 100, 5, 8).unwrap();
    assert_eq!(p.stored, 1234);
    let map = map.items.lock().unwrap();
    assert_eq!(map.len(), 1234);
    assert!((0..1234).all(|i| map.get(&keys.key(i)).is_some_and(|v| v.len() == 100)));
}

#[test]
fn pipelined_run_issues_exactly_the_op_budget_and_every_get_hits() {
    let (addr, _server) = fake_server(false);
    let connector = TcpConnector::plain(addr);
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
    let (addr, _server) = fake_server(false);
    let mut cfg = config(100, 2000, 32, KeyDist::Uniform);
    cfg.mix = OpMix::parse("1:0").unwrap();
    let s = load::run(&TcpConnector::plain(addr), &cfg).unwrap();
    assert_eq!((s.gets, s.misses, s.hits), (2000, 2000, 0));
}

#[test]
fn truncated_values_are_counted_as_mismatches_not_hits() {
    let (addr, _server) = fake_server(true);
    let connector = TcpConnector::plain(addr);
    let mut cfg = config(50, 1000, 64, KeyDist::Uniform);
    cfg.mix = OpMix::parse("1:0").unwrap();
    load::preload(&connector, &cfg.keys, 64, 2, 4).unwrap();
    let s = load::run(&connector, &cfg).unwrap();
    assert_eq!(s.hits, 0);
    assert_eq!(s.mismatches, 1000);
}

#[test]
fn values_larger_than_the_receive_buffer_round_trip() {
    let (addr, _server) = fake_server(false);
    let connector = TcpConnector::plain(addr);
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
    let (addr, _server) = fake_server(false);
    let cfg = LatencyConfig {
        sizes: vec![1, 32, 4096],
        ops: vec![LatencyOp::Get, LatencyOp::Set, LatencyOp::MIX_90_10],
        iterations: 50,
        warmup: 5,
        key_prefix: "lat:".into(),
        server_pid: None,
    };
    let rows = latency::run(&TcpConnector::plain(addr), &cfg).unwrap();
    let got: Vec<(String, usize, u64)> = rows
        .iter()
        .map(|(r, _)| (r.op.clone(), r.size, r.ops))
        .collect();
    let want: Vec<(String, usize, u64)> = ["get", "set", "mix"]
        .iter()
        .flat_map(|op| [1, 32, 4096].map(|s| (op.to_string(), s, 50)))
        .collect();
    assert_eq!(got, want);
    assert!(rows
        .iter()
        .all(|(r, _)| r.transport == "tcp" && r.p50_us <= r.p99_us && r.p99_us <= r.p999_us));
}

#[test]
fn run_against_a_closed_port_fails_with_a_connect_error() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let err = load::run(
        &TcpConnector::plain(addr),
        &config(10, 10, 8, KeyDist::Uniform),
    );
    assert!(err.is_err());
}

#[test]
fn every_ycsb_workload_runs_its_op_budget_and_every_read_finds_its_record() {
    use memfabric_bench::workload::TxnKind;
    use memfabric_bench::ycsb::{YcsbSpec, YcsbWorkload};
    for w in YcsbWorkload::ALL {
        let (addr, server) = fake_server(false);
        let connector = TcpConnector::plain(addr);
        let spec = YcsbSpec::standard(w, 300);
        let mut cfg = config(300, 2000, spec.value_size(), KeyDist::Uniform);
        cfg.keys = spec.key_space();
        cfg.ycsb = Some(spec.clone());
        // 3 connections x depth 4 per thread: a record is read only once its insert was
        // answered, so no read races its insert on another connection.
        let p = load::preload(&connector, &cfg.keys, spec.value_size(), 4, 8).unwrap();
        assert_eq!(p.stored, 300, "{w:?} load phase");
        let s = load::run(&connector, &cfg).unwrap();
        assert_eq!(s.ops(), 2000, "{w:?}");
        assert_eq!((s.errors, s.mismatches, s.misses), (0, 0, 0), "{w:?}");
        assert_eq!(s.stored, s.sets, "{w:?}");
        let kinds: u64 = TxnKind::ALL
            .iter()
            .filter_map(|k| s.txn_hist(*k).map(|h| h.len()))
            .sum();
        assert_eq!(kinds, 2000, "{w:?}");
        match w {
            // Scans are many GETs per operation.
            YcsbWorkload::E => assert!(s.gets > 10 * 2000 / 2, "{w:?}: {} gets", s.gets),
            // Every read-modify-write is one GET and one SET.
            YcsbWorkload::F => {
                let rmw = s.txn_hist(TxnKind::ReadModifyWrite).map_or(0, |h| h.len());
                assert_eq!(s.sets, rmw);
                assert_eq!(s.gets, 2000);
            }
            _ => assert_eq!(s.gets + s.sets, 2000, "{w:?}"),
        }
        let inserts = s.txn_hist(TxnKind::Insert).map_or(0, |h| h.len());
        assert_eq!(
            server.len() as u64,
            300 + inserts,
            "{w:?}: inserted records"
        );
    }
}

#[test]
fn open_loop_run_sends_exactly_its_op_budget() {
    let (addr, _server) = fake_server(false);
    let connector = TcpConnector::plain(addr);
    let mut cfg = config(100, 300, 32, KeyDist::Uniform);
    cfg.rate = Some(20_000.0);
    load::preload(&connector, &cfg.keys, 32, 2, 4).unwrap();
    let s = load::run(&connector, &cfg).unwrap();
    assert_eq!(s.ops(), 300);
    assert_eq!(s.hits, s.gets);
    assert_eq!(s.all_hist().len(), 300);
}

#[test]
fn open_loop_run_bounded_by_time_stops_by_itself() {
    let (addr, _server) = fake_server(false);
    let mut cfg = config(100, 0, 32, KeyDist::Uniform);
    cfg.ops = None;
    cfg.duration = Some(Duration::from_millis(300));
    cfg.rate = Some(1000.0);
    cfg.mix = OpMix::parse("0:1").unwrap();
    let s = load::run(&TcpConnector::plain(addr), &cfg).unwrap();
    assert!(s.ops() > 0);
    assert_eq!(s.stored, s.ops());
}
