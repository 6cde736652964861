//! The YCSB generators and the open-loop schedule: assertions on generated sequences and
//! computed send times, never on timings.

use memfabric_bench::load::OpenLoopSchedule;
use memfabric_bench::rng::Rng;
use memfabric_bench::workload::{Action, Txn, TxnKind, TxnSource, Zipfian};
use memfabric_bench::ycsb::{RequestDist, YcsbSource, YcsbSpec, YcsbWorkload};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The next operation, its insert (if it is one) answered at once, as a client with one
/// request in flight sees it.
fn next_answered(source: &mut YcsbSource, rng: &mut Rng) -> Txn {
    let t = source.next_txn(rng);
    source.completed(t.kind, t.action.first_key());
    t
}

fn draw(source: &mut YcsbSource, n: usize, seed: u64) -> Vec<Txn> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| next_answered(source, &mut rng)).collect()
}

/// Within 5 standard deviations of a binomial proportion.
fn assert_fraction(got: usize, n: usize, p: f64, what: &str) {
    let f = got as f64 / n as f64;
    let sigma = (p * (1.0 - p) / n as f64).sqrt();
    assert!(
        (f - p).abs() <= 5.0 * sigma + 1e-12,
        "{what}: {f} vs expected {p}"
    );
}

#[test]
fn every_workload_draws_its_operations_in_ycsbs_proportions() {
    let n = 100_000;
    for w in YcsbWorkload::ALL {
        let spec = YcsbSpec::standard(w, 10_000);
        let mut src = YcsbSource::new(&spec, 0, 1).unwrap();
        let txns = draw(&mut src, n, 11);
        let count = |k: TxnKind| txns.iter().filter(|t| t.kind == k).count();
        let p = w.proportions();
        for (kind, want) in [
            (TxnKind::Read, p.read),
            (TxnKind::Update, p.update),
            (TxnKind::Insert, p.insert),
            (TxnKind::Scan, p.scan),
            (TxnKind::ReadModifyWrite, p.read_modify_write),
        ] {
            assert_fraction(count(kind), n, want, &format!("{w:?} {kind:?}"));
        }
        // Only YCSB's five kinds appear.
        assert_eq!(
            count(TxnKind::Get) + count(TxnKind::Set),
            0,
            "{w:?} drew plain get/set"
        );
    }
}

#[test]
fn the_proportions_are_the_workload_files_own() {
    let p = |w: YcsbWorkload| {
        let p = w.proportions();
        [p.read, p.update, p.insert, p.scan, p.read_modify_write]
    };
    assert_eq!(p(YcsbWorkload::A), [0.5, 0.5, 0.0, 0.0, 0.0]);
    assert_eq!(p(YcsbWorkload::B), [0.95, 0.05, 0.0, 0.0, 0.0]);
    assert_eq!(p(YcsbWorkload::C), [1.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(p(YcsbWorkload::D), [0.95, 0.0, 0.05, 0.0, 0.0]);
    assert_eq!(p(YcsbWorkload::E), [0.0, 0.0, 0.05, 0.95, 0.0]);
    assert_eq!(p(YcsbWorkload::F), [0.5, 0.0, 0.0, 0.0, 0.5]);
    assert_eq!(YcsbWorkload::D.request_distribution(), RequestDist::Latest);
    assert_eq!(YcsbWorkload::A.request_distribution(), RequestDist::Zipfian);
}

#[test]
fn records_are_ten_fields_of_100_bytes_named_user_and_fnv_hash() {
    let spec = YcsbSpec::standard(YcsbWorkload::A, 1000);
    assert_eq!(spec.value_size(), 1000);
    let ks = spec.key_space();
    assert_eq!(ks.n, 1000);
    // YCSB's first keys (fnvhash64 of 0, 1, 2): the names seen in every YCSB log.
    assert_eq!(ks.key(0), b"user6284781860667377211".to_vec());
    assert_eq!(ks.key(1), b"user8517097267634966620".to_vec());
    assert_eq!(ks.key(2), b"user1820151046732198393".to_vec());
    let names: HashSet<Vec<u8>> = (0..100_000).map(|i| ks.key(i)).collect();
    assert_eq!(names.len(), 100_000);
    assert!(names
        .iter()
        .all(|k| k.len() <= 250 && k.starts_with(b"user")));
}

/// The keys an operation touches.
fn keys_of(t: &Txn) -> Vec<u64> {
    match &t.action {
        Action::Get(k) | Action::Set(k) | Action::GetThenSet(k) => vec![*k],
        Action::MultiGet(ks) => ks.clone(),
    }
}

#[test]
fn latest_distribution_reads_recent_inserts_most() {
    let rc = 1000;
    let spec = YcsbSpec::standard(YcsbWorkload::D, rc);
    let mut src = YcsbSource::new(&spec, 0, 1).unwrap();
    let mut rng = Rng::new(5);
    let (mut reads, mut newest, mut recent_tenth) = (0usize, 0usize, 0usize);
    let mut last_insert = rc - 1;
    for _ in 0..50_000 {
        let known = src.known_records();
        let t = next_answered(&mut src, &mut rng);
        match (t.kind, &t.action) {
            (TxnKind::Insert, Action::Set(k)) => {
                assert_eq!(*k, last_insert + 1, "single thread inserts in sequence");
                last_insert = *k;
            }
            (TxnKind::Read, Action::Get(k)) => {
                reads += 1;
                assert!(*k <= last_insert, "read of a record not inserted yet");
                newest += usize::from(*k == last_insert);
                // One thread: key numbers are indices, newest last.
                recent_tenth += usize::from(*k >= known - known / 10);
            }
            other => panic!("D drew {other:?}"),
        }
    }
    let (newest, recent_tenth) = (
        newest as f64 / reads as f64,
        recent_tenth as f64 / reads as f64,
    );
    // The newest record is rank 1 of a zipfian over ~1000-3500 records: p = 1/H(n, 0.99),
    // between 0.11 and 0.13; uniform would give under 0.001.
    assert!((0.09..0.16).contains(&newest), "newest record: {newest}");
    // The newest tenth of the records carries ~70% of the reads (uniform: 10%).
    assert!(recent_tenth > 0.6, "newest tenth: {recent_tenth}");

    // The same workload with uniform requests does not favour recent records.
    let mut uniform = spec.clone();
    uniform.request_dist = RequestDist::Uniform;
    let mut src = YcsbSource::new(&uniform, 0, 1).unwrap();
    let mut rng = Rng::new(5);
    let mut recent = 0usize;
    let mut reads = 0usize;
    for _ in 0..50_000 {
        let known = src.known_records();
        let t = next_answered(&mut src, &mut rng);
        if let (TxnKind::Read, Action::Get(k)) = (t.kind, &t.action) {
            reads += 1;
            recent += usize::from(*k >= known - known / 10);
        }
    }
    assert_fraction(recent, reads, 0.1, "uniform, newest tenth");
}

#[test]
fn zipfian_requests_hit_scattered_hot_records_at_zipfian_rates() {
    let rc = 10_000;
    let spec = YcsbSpec::standard(YcsbWorkload::C, rc);
    let mut src = YcsbSource::new(&spec, 0, 1).unwrap();
    let txns = draw(&mut src, 200_000, 8);
    let mut freq: HashMap<u64, usize> = HashMap::new();
    for t in &txns {
        for k in keys_of(t) {
            assert!(k < rc);
            *freq.entry(k).or_default() += 1;
        }
    }
    let mut by_count: Vec<(usize, u64)> = freq.iter().map(|(k, c)| (*c, *k)).collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    // The hottest record gets rank 1's probability (plus whatever ranks hash onto it).
    let p1 = Zipfian::new(rc, 0.99).unwrap().pmf(1);
    let top = by_count[0].0 as f64 / txns.len() as f64;
    assert!(
        top >= p1 * 0.9 && top < p1 * 1.5,
        "hottest {top} vs pmf(1) {p1}"
    );
    // Scrambled: the ten hottest records are not the ten first key numbers.
    let hot: HashSet<u64> = by_count[..10].iter().map(|x| x.1).collect();
    assert!(hot.iter().filter(|k| **k < 10).count() <= 2, "{hot:?}");
}

#[test]
fn scans_are_runs_of_consecutive_existing_records_of_1_to_100() {
    let rc = 5000;
    let spec = YcsbSpec::standard(YcsbWorkload::E, rc);
    let mut src = YcsbSource::new(&spec, 0, 1).unwrap();
    let mut rng = Rng::new(3);
    let mut lens = Vec::new();
    for _ in 0..20_000 {
        let known = src.known_records();
        let t = next_answered(&mut src, &mut rng);
        if let (TxnKind::Scan, Action::MultiGet(ks)) = (t.kind, &t.action) {
            assert!((1..=100).contains(&ks.len()), "{}", ks.len());
            assert!(ks.windows(2).all(|w| w[1] == w[0] + 1), "{ks:?}");
            assert!(ks.iter().all(|k| *k < known));
            lens.push(ks.len());
        }
    }
    // Lengths uniform in 1..=100, except that scans starting near the newest record are
    // cut short there: the mean is a little under 50.5.
    let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
    assert!((45.0..51.5).contains(&mean), "mean scan length {mean}");
}

#[test]
fn read_modify_write_reads_then_writes_one_key() {
    let spec = YcsbSpec::standard(YcsbWorkload::F, 1000);
    let mut src = YcsbSource::new(&spec, 0, 1).unwrap();
    let txns = draw(&mut src, 1000, 2);
    for t in &txns {
        match (t.kind, &t.action) {
            (TxnKind::ReadModifyWrite, Action::GetThenSet(k)) | (TxnKind::Read, Action::Get(k)) => {
                assert!(*k < 1000)
            }
            other => panic!("F drew {other:?}"),
        }
    }
}

#[test]
fn threads_insert_disjoint_keys_and_read_only_what_exists_for_them() {
    let rc = 100;
    let threads = 3;
    let spec = YcsbSpec::standard(YcsbWorkload::D, rc);
    let mut all_inserts = HashSet::new();
    for t in 0..threads {
        let mut src = YcsbSource::new(&spec, t, threads).unwrap();
        let mut rng = Rng::new(t as u64);
        let mut mine = HashSet::new();
        for _ in 0..5000 {
            let txn = next_answered(&mut src, &mut rng);
            match (txn.kind, &txn.action) {
                (TxnKind::Insert, Action::Set(k)) => {
                    assert!(*k >= rc);
                    assert_eq!((*k - rc) % threads as u64, t as u64);
                    assert!(all_inserts.insert(*k), "key {k} inserted twice");
                    mine.insert(*k);
                }
                (TxnKind::Read, Action::Get(k)) => {
                    assert!(*k < rc || mine.contains(k), "thread {t} read {k}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn same_seed_same_stream() {
    let spec = YcsbSpec::standard(YcsbWorkload::E, 1000);
    let a = draw(&mut YcsbSource::new(&spec, 0, 1).unwrap(), 2000, 4);
    let b = draw(&mut YcsbSource::new(&spec, 0, 1).unwrap(), 2000, 4);
    let c = draw(&mut YcsbSource::new(&spec, 0, 1).unwrap(), 2000, 5);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn open_loop_sends_follow_the_rate_and_threads_interleave_evenly() {
    // 4 threads at 1000 ops/s in total: each thread every 4 ms, offset by 1 ms from the
    // previous one, so that together there is one send per millisecond.
    let threads = 4;
    let mut all: Vec<Duration> = Vec::new();
    for t in 0..threads {
        let s = OpenLoopSchedule::new(1000.0, t, threads).unwrap();
        let mine: Vec<Duration> = (0..250).map(|i| s.due(i)).collect();
        assert_eq!(mine[0], Duration::from_millis(t as u64));
        for w in mine.windows(2) {
            let gap = (w[1] - w[0]).as_secs_f64();
            assert!((gap - 0.004).abs() < 1e-9, "thread {t}: gap {gap}");
        }
        all.extend(mine);
    }
    all.sort();
    for (i, d) in all.iter().enumerate() {
        let want = i as f64 * 0.001;
        assert!((d.as_secs_f64() - want).abs() < 1e-9, "send {i} at {d:?}");
    }
    // Within the first second: exactly the rate.
    assert_eq!(
        all.iter().filter(|d| **d < Duration::from_secs(1)).count(),
        1000
    );
}

#[test]
fn open_loop_refuses_a_rate_that_is_not_positive() {
    for r in [0.0, -5.0, f64::NAN, f64::INFINITY] {
        assert!(OpenLoopSchedule::new(r, 0, 1).is_err(), "{r}");
    }
    // A single thread at 50k ops/s: every 20 us.
    let s = OpenLoopSchedule::new(50_000.0, 0, 1).unwrap();
    assert_eq!(s.due(0), Duration::ZERO);
    assert!((s.due(50_000).as_secs_f64() - 1.0).abs() < 1e-9);
}

#[test]
fn inserts_are_read_only_once_answered_and_in_order() {
    let rc = 50;
    let spec = YcsbSpec::standard(YcsbWorkload::D, rc);
    let mut src = YcsbSource::new(&spec, 1, 2).unwrap();
    let mut rng = Rng::new(9);
    let mut unanswered = Vec::new();
    // Send inserts without answering them: reads stay on the loaded records.
    while unanswered.len() < 3 {
        let t = src.next_txn(&mut rng);
        match (t.kind, &t.action) {
            (TxnKind::Insert, Action::Set(k)) => unanswered.push(*k),
            (TxnKind::Read, Action::Get(k)) => assert!(*k < rc, "read of unanswered {k}"),
            other => panic!("{other:?}"),
        }
    }
    // Thread 1 of 2 inserts rc+1, rc+3, rc+5.
    assert_eq!(unanswered, vec![rc + 1, rc + 3, rc + 5]);
    assert_eq!(src.known_records(), rc);
    // Answers out of order: the second alone does not make anything readable.
    src.completed(TxnKind::Insert, rc + 3);
    assert_eq!(src.known_records(), rc);
    src.completed(TxnKind::Insert, rc + 1);
    assert_eq!(src.known_records(), rc + 2);
    // Another thread's key or a read does not count.
    src.completed(TxnKind::Insert, rc + 2);
    src.completed(TxnKind::Read, rc + 5);
    assert_eq!(src.known_records(), rc + 2);
    src.completed(TxnKind::Insert, rc + 5);
    assert_eq!(src.known_records(), rc + 3);
    assert_eq!(src.key_of_index(rc + 2), rc + 5);
}
