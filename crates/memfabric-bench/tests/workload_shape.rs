//! The shape of generated workloads: assertions on generated sequences only, never on
//! timings. Seeds are fixed, so these are deterministic; the tolerances are wide enough
//! (4-5 sigma, or chi-square at p = 0.001) that a different seed would pass too.

use memfabric_bench::rng::Rng;
use memfabric_bench::workload::{
    KeyChooser, KeyDist, KeySpace, OpKind, OpMix, OpSequence, Pattern, Zipfian,
};
use std::collections::HashSet;

fn counts(chooser: &KeyChooser, n: u64, draws: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    let mut c = vec![0u64; n as usize];
    for _ in 0..draws {
        let k = chooser.next(&mut rng);
        assert!(k < n, "key index {k} outside 0..{n}");
        c[k as usize] += 1;
    }
    c
}

/// Exact zipf probabilities of ranks 1..=n.
fn zipf_pmf(n: u64, theta: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-theta)).collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(|x| x / total).collect()
}

/// Chi-square of observed counts against expected probabilities, over log2-spaced rank
/// buckets ([1], [2,3], [4,7], ...) so that every bucket expects many samples.
fn chi_square_log_buckets(obs: &[u64], pmf: &[f64], draws: u64) -> (f64, usize) {
    let mut chi = 0.0;
    let mut buckets = 0;
    let mut lo = 0usize;
    while lo < obs.len() {
        let hi = ((lo + 1) * 2 - 1).min(obs.len());
        let o: u64 = obs[lo..hi].iter().sum();
        let e: f64 = pmf[lo..hi].iter().sum::<f64>() * draws as f64;
        chi += (o as f64 - e).powi(2) / e;
        buckets += 1;
        lo = hi;
    }
    (chi, buckets - 1)
}

/// Upper 0.1% critical value of chi-square with `df` degrees of freedom (Wilson-Hilferty).
fn chi_square_critical_001(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.090; // standard normal 99.9th percentile
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

fn assert_zipf_shape(n: u64, theta: f64, draws: u64, seed: u64) {
    let chooser = KeyChooser::new(n, KeyDist::Zipfian { theta }).unwrap();
    let obs = counts(&chooser, n, draws, seed);
    let pmf = zipf_pmf(n, theta);

    // The hottest ranks, one by one, within 5 sigma of their exact expectation.
    for k in 0..10 {
        let e = pmf[k] * draws as f64;
        let sigma = (e * (1.0 - pmf[k])).sqrt();
        let o = obs[k] as f64;
        assert!(
            (o - e).abs() < 5.0 * sigma,
            "n={n} theta={theta}: rank {} seen {o}, expected {e:.0} +- {sigma:.0}",
            k + 1
        );
    }
    // The whole distribution, bucketed.
    let (chi, df) = chi_square_log_buckets(&obs, &pmf, draws);
    let crit = chi_square_critical_001(df);
    assert!(
        chi < crit,
        "n={n} theta={theta}: chi-square {chi:.1} >= {crit:.1} (df {df})"
    );
}

#[test]
fn zipfian_099_matches_exact_probabilities_rank_by_rank_and_in_buckets() {
    assert_zipf_shape(1000, 0.99, 1_000_000, 11);
}

#[test]
fn zipfian_over_default_key_space_matches_exact_probabilities() {
    assert_zipf_shape(100_000, 0.99, 2_000_000, 12);
}

#[test]
fn zipfian_shape_holds_for_other_exponents() {
    assert_zipf_shape(1000, 0.5, 500_000, 13);
    assert_zipf_shape(1000, 1.0, 500_000, 14);
    assert_zipf_shape(1000, 1.5, 500_000, 15);
}

#[test]
fn zipfian_frequency_falls_with_rank_at_slope_theta_on_log_log_axes() {
    // Least-squares slope of log(count) against log(rank) over ranks 1..=100, where every
    // rank has thousands of samples.
    let n = 10_000;
    let chooser = KeyChooser::new(n, KeyDist::Zipfian { theta: 0.99 }).unwrap();
    let obs = counts(&chooser, n, 2_000_000, 21);
    let pts: Vec<(f64, f64)> = (0..100)
        .map(|k| (((k + 1) as f64).ln(), (obs[k] as f64).ln()))
        .collect();
    let m = pts.len() as f64;
    let (sx, sy) = pts.iter().fold((0.0, 0.0), |(a, b), p| (a + p.0, b + p.1));
    let (mx, my) = (sx / m, sy / m);
    let cov: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let var: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let slope = cov / var;
    assert!((slope + 0.99).abs() < 0.03, "slope {slope}");
}

#[test]
fn zipfian_reaches_the_coldest_rank() {
    // Rank n of 100 must come up: a generator that never reaches the tail is wrong.
    let z = Zipfian::new(100, 0.99).unwrap();
    let mut rng = Rng::new(3);
    let mut seen = HashSet::new();
    for _ in 0..100_000 {
        seen.insert(z.sample(&mut rng));
    }
    assert_eq!(seen.len(), 100);
    assert!(seen.iter().all(|&k| (1..=100).contains(&k)));
}

#[test]
fn zipfian_of_one_key_always_returns_it() {
    let c = KeyChooser::new(1, KeyDist::Zipfian { theta: 0.99 }).unwrap();
    let mut rng = Rng::new(5);
    assert!((0..1000).all(|_| c.next(&mut rng) == 0));
}

#[test]
fn uniform_draws_cover_the_key_space_evenly() {
    let n = 1000;
    let draws = 200_000;
    let chooser = KeyChooser::new(n, KeyDist::Uniform).unwrap();
    let obs = counts(&chooser, n, draws, 31);
    assert!(obs.iter().all(|&c| c > 0), "some key never drawn");
    let e = draws as f64 / n as f64;
    let chi: f64 = obs.iter().map(|&o| (o as f64 - e).powi(2) / e).sum();
    let crit = chi_square_critical_001(n as usize - 1);
    assert!(chi < crit, "chi-square {chi:.1} >= {crit:.1}");
}

#[test]
fn op_mix_90_10_issues_nine_gets_per_set() {
    let mix = OpMix::parse("90:10").unwrap();
    let mut rng = Rng::new(41);
    let draws = 200_000u64;
    let gets = (0..draws)
        .filter(|_| mix.next(&mut rng) == OpKind::Get)
        .count() as f64;
    let p = 0.9;
    let sigma = (p * (1.0 - p) / draws as f64).sqrt();
    let got = gets / draws as f64;
    assert!((got - p).abs() < 5.0 * sigma, "get fraction {got}");
    assert!((mix.get_fraction() - 0.9).abs() < 1e-12);
}

#[test]
fn op_mix_extremes_are_pure() {
    let mut rng = Rng::new(42);
    let all_get = OpMix::parse("1:0").unwrap();
    let all_set = OpMix::parse("0:7").unwrap();
    assert!((0..10_000).all(|_| all_get.next(&mut rng) == OpKind::Get));
    assert!((0..10_000).all(|_| all_set.next(&mut rng) == OpKind::Set));
}

#[test]
fn op_mix_50_50_is_balanced() {
    let mix = OpMix::parse("50:50").unwrap();
    let mut rng = Rng::new(43);
    let draws = 100_000u64;
    let sets = (0..draws)
        .filter(|_| mix.next(&mut rng) == OpKind::Set)
        .count() as f64;
    let sigma = (0.25 / draws as f64).sqrt();
    assert!((sets / draws as f64 - 0.5).abs() < 5.0 * sigma);
}

#[test]
fn preload_ranges_cover_every_key_exactly_once() {
    for (n, parts) in [(100_000u64, 8u64), (10, 3), (5, 8), (1, 1), (7, 7)] {
        let ks = KeySpace::new("k:", n);
        let mut seen = vec![0u32; n as usize];
        for p in 0..parts {
            for id in ks.preload_range(p, parts) {
                seen[id as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "n={n} parts={parts}");
    }
}

#[test]
fn every_key_index_has_a_distinct_name() {
    let ks = KeySpace::new("mfb:", 100_000);
    let names: HashSet<Vec<u8>> = (0..ks.n).map(|i| ks.key(i)).collect();
    assert_eq!(names.len(), 100_000);
    assert!(names.iter().all(|k| k.len() == 14 && k.len() <= 250));
}

#[test]
fn same_seed_gives_both_servers_the_same_request_stream() {
    let chooser = KeyChooser::new(100_000, KeyDist::Zipfian { theta: 0.99 }).unwrap();
    let mix = OpMix::parse("90:10").unwrap();
    let stream = |seed| {
        let mut rng = Rng::new(seed);
        (0..1000)
            .map(|_| (mix.next(&mut rng), chooser.next(&mut rng)))
            .collect::<Vec<_>>()
    };
    assert_eq!(stream(9), stream(9));
    assert_ne!(stream(9), stream(10));
}

fn ops_of(pattern: Pattern, n: usize) -> Vec<OpKind> {
    let mut seq = OpSequence::new(pattern, OpMix::parse("90:10").unwrap());
    let mut rng = Rng::new(3);
    (0..n).map(|_| seq.next(&mut rng)).collect()
}

#[test]
fn interleaved_pattern_alternates_set_and_get() {
    let ops = ops_of(Pattern::Interleaved, 1000);
    assert_eq!(
        &ops[..4],
        &[OpKind::Set, OpKind::Get, OpKind::Set, OpKind::Get]
    );
    for (i, op) in ops.iter().enumerate() {
        let want = if i % 2 == 0 { OpKind::Set } else { OpKind::Get };
        assert_eq!(*op, want, "op {i}");
    }
    let sets = ops.iter().filter(|o| **o == OpKind::Set).count();
    assert_eq!(sets, 500);
}

#[test]
fn non_interleaved_pattern_is_10_sets_then_90_gets_repeating() {
    let ops = ops_of(Pattern::NonInterleaved, 1000);
    for cycle in ops.chunks(100) {
        assert_eq!(cycle.len(), 100);
        assert!(cycle[..10].iter().all(|o| *o == OpKind::Set), "{cycle:?}");
        assert!(cycle[10..].iter().all(|o| *o == OpKind::Get), "{cycle:?}");
    }
    // Runs: exactly one set run and one get run per cycle.
    let switches = ops.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(switches, 2 * 10 - 1);
}

#[test]
fn mix_pattern_draws_from_the_mix() {
    let ops = ops_of(Pattern::Mix, 100_000);
    let gets = ops.iter().filter(|o| **o == OpKind::Get).count() as f64 / 1e5;
    assert!((gets - 0.9).abs() < 5.0 * (0.09f64 / 1e5).sqrt(), "{gets}");
    // Random, not a fixed cycle: both kinds appear in every long window but not in a
    // fixed order.
    assert_ne!(ops[..100], ops_of(Pattern::NonInterleaved, 100)[..]);
}
