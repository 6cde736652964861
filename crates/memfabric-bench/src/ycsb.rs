//! YCSB's core workloads A-F, adapted to a cache.
//!
//! What is YCSB's (`site.ycsb.workloads.CoreWorkload` and its `workloads/workload[a-f]`
//! files): the operation proportions, the request distributions (zipfian, latest, uniform),
//! the record layout (10 fields x 100 bytes, so 1000-byte values), key names `user` +
//! `fnvhash64(key number)` (hashed insert order), a load phase that inserts `recordcount`
//! records and a run phase of `operationcount` operations.
//!
//! What changes for a cache:
//! * A record is one value of `fieldcount x fieldlength` bytes; an UPDATE (YCSB writes one
//!   field by default) replaces the whole value with one SET.
//! * E's SCAN (a range read in key order, which a hash-indexed cache cannot do) becomes a
//!   short multi-get: GETs of `1..=maxscanlength` consecutive key numbers starting at a key
//!   drawn from the request distribution, sent together on one connection; its latency is
//!   until the last reply.
//! * F's READ-MODIFY-WRITE is a GET, then a SET of the same key once the GET is answered.
//! * Zipfian requests are YCSB's scrambled zipfian: a zipfian (theta 0.99) rank, spread over
//!   the key space by `fnvhash64(rank) % count`. The rank comes from the exact sampler
//!   ([`Zipfian`]) over the records that exist, where YCSB draws from its approximation over
//!   10^10 items.
//! * Inserts with several client threads: thread `t` of `T` inserts key numbers
//!   `recordcount + t, recordcount + t + T, ...`, and each thread reads the records of the
//!   load phase plus those of its own inserts that have been answered (YCSB's acknowledged
//!   counter, per thread), so every key it asks for exists. YCSB shares one insert counter
//!   between threads; that would make the request stream depend on timing across threads.

use crate::rng::Rng;
use crate::workload::{
    ycsb_fnvhash64, Action, KeyNaming, KeySpace, Txn, TxnKind, TxnSource, WorkloadError, Zipfian,
};
use serde::Serialize;

/// YCSB's default `zipfianconstant`.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The six core workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum YcsbWorkload {
    A,
    B,
    C,
    D,
    E,
    F,
}

impl YcsbWorkload {
    pub const ALL: [YcsbWorkload; 6] = [
        YcsbWorkload::A,
        YcsbWorkload::B,
        YcsbWorkload::C,
        YcsbWorkload::D,
        YcsbWorkload::E,
        YcsbWorkload::F,
    ];

    /// "a".."f" (case-insensitive).
    pub fn parse(s: &str) -> Result<Self, WorkloadError> {
        let t = s.trim();
        Self::ALL
            .into_iter()
            .find(|w| t.len() == 1 && t.eq_ignore_ascii_case(&w.letter().to_string()))
            .ok_or_else(|| WorkloadError::BadYcsbWorkload(s.to_string()))
    }

    /// 'A'..'F'.
    pub fn letter(self) -> char {
        char::from(b'A' + self as u8)
    }

    /// The operation proportions of YCSB's `workloads/workload[a-f]` files.
    pub fn proportions(self) -> Proportions {
        // read, update, insert, scan, read-modify-write; one row per workload A..F.
        const TABLE: [[f64; 5]; 6] = [
            [0.5, 0.5, 0.0, 0.0, 0.0],
            [0.95, 0.05, 0.0, 0.0, 0.0],
            [1.0, 0.0, 0.0, 0.0, 0.0],
            [0.95, 0.0, 0.05, 0.0, 0.0],
            [0.0, 0.0, 0.05, 0.95, 0.0],
            [0.5, 0.0, 0.0, 0.0, 0.5],
        ];
        let [read, update, insert, scan, read_modify_write] = TABLE[self as usize];
        Proportions {
            read,
            update,
            insert,
            scan,
            read_modify_write,
        }
    }

    /// The request distribution of the workload file: latest for D, zipfian otherwise.
    pub fn request_distribution(self) -> RequestDist {
        match self {
            YcsbWorkload::D => RequestDist::Latest,
            _ => RequestDist::Zipfian,
        }
    }
}

/// Which record an operation touches (YCSB's `requestdistribution`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestDist {
    Uniform,
    /// Scrambled zipfian: popular records spread over the key space.
    Zipfian,
    /// Zipfian over recency: the newest insert is the most popular record.
    Latest,
}

/// Fractions of each operation; they sum to 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Proportions {
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub read_modify_write: f64,
}

/// One YCSB workload with its parameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct YcsbSpec {
    pub workload: YcsbWorkload,
    /// Records inserted by the load phase (`recordcount`).
    pub record_count: u64,
    /// `fieldcount` x `fieldlength` bytes per record.
    pub field_count: usize,
    pub field_length: usize,
    /// Longest scan (`maxscanlength`); lengths are uniform in `1..=max`.
    pub max_scan_length: u64,
    pub request_dist: RequestDist,
    /// Zipfian exponent of the zipfian and latest distributions.
    pub theta: f64,
}

impl YcsbSpec {
    /// YCSB's defaults for `workload`: 10 fields of 100 bytes, scans up to 100 records,
    /// the workload's own request distribution.
    pub fn standard(workload: YcsbWorkload, record_count: u64) -> Self {
        YcsbSpec {
            workload,
            record_count,
            field_count: 10,
            field_length: 100,
            max_scan_length: 100,
            request_dist: workload.request_distribution(),
            theta: ZIPFIAN_CONSTANT,
        }
    }

    /// Bytes of one record's value.
    pub fn value_size(&self) -> usize {
        self.field_count * self.field_length
    }

    /// The records of the load phase: `user<fnvhash64(n)>` for `n` in `0..recordcount`.
    pub fn key_space(&self) -> KeySpace {
        KeySpace {
            prefix: "user".into(),
            n: self.record_count,
            naming: KeyNaming::YcsbHashed,
        }
    }

    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.record_count == 0 {
            return Err(WorkloadError::EmptyKeySpace);
        }
        if !self.theta.is_finite() || self.theta <= 0.0 {
            return Err(WorkloadError::BadTheta(self.theta));
        }
        if self.max_scan_length == 0 {
            return Err(WorkloadError::BadScanLength);
        }
        Ok(())
    }
}

/// The operation stream of one client thread of a YCSB run phase.
#[derive(Clone, Debug)]
pub struct YcsbSource {
    spec: YcsbSpec,
    /// Cumulative proportions, in the order read, update, insert, scan, rmw.
    cumulative: [f64; 5],
    thread: u64,
    threads: u64,
    /// Inserts this thread has sent so far.
    inserts_sent: u64,
    /// Inserts `0..inserts_acked` have all been answered: only those records are read
    /// (YCSB's `AcknowledgedCounterGenerator`), so a read never races its record's insert
    /// on another connection.
    inserts_acked: u64,
    /// Answered inserts above `inserts_acked` (answers arrive out of order across
    /// connections).
    acked_ahead: std::collections::BTreeSet<u64>,
    /// Zipfian over `zipf_n` ranks, rebuilt when the number of known records changes
    /// (cheap: a few logarithms).
    zipf: Option<(u64, Zipfian)>,
}

impl YcsbSource {
    /// Thread `thread` of `threads`.
    pub fn new(spec: &YcsbSpec, thread: usize, threads: usize) -> Result<Self, WorkloadError> {
        spec.validate()?;
        let p = spec.workload.proportions();
        let mut acc = 0.0;
        let cumulative = [p.read, p.update, p.insert, p.scan, p.read_modify_write].map(|x| {
            acc += x;
            acc
        });
        Ok(YcsbSource {
            spec: spec.clone(),
            cumulative,
            thread: thread as u64,
            threads: threads.max(1) as u64,
            inserts_sent: 0,
            inserts_acked: 0,
            acked_ahead: std::collections::BTreeSet::new(),
            zipf: None,
        })
    }

    /// Records this thread may ask for: the load phase's and its own answered inserts.
    pub fn known_records(&self) -> u64 {
        self.spec.record_count + self.inserts_acked
    }

    /// The key number of this thread's `index`-th known record (load phase first, then its
    /// inserts in insert order).
    pub fn key_of_index(&self, index: u64) -> u64 {
        let rc = self.spec.record_count;
        if index < rc {
            index
        } else {
            rc + (index - rc) * self.threads + self.thread
        }
    }

    fn zipf_rank(&mut self, n: u64, rng: &mut Rng) -> u64 {
        let stale = self.zipf.as_ref().is_none_or(|(zn, _)| *zn != n);
        if stale {
            // n >= record_count >= 1 and theta was validated, so this cannot fail; keep
            // the old sampler (a rank that is still valid) if it somehow did.
            if let Ok(z) = Zipfian::new(n, self.spec.theta) {
                self.zipf = Some((n, z));
            }
        }
        match &self.zipf {
            Some((zn, z)) => z.sample(rng).min(*zn),
            None => 1,
        }
    }

    /// Index (into the known records) of the record an operation touches.
    pub fn choose_index(&mut self, rng: &mut Rng) -> u64 {
        let n = self.known_records();
        match self.spec.request_dist {
            RequestDist::Uniform => rng.below(n),
            RequestDist::Zipfian => ycsb_fnvhash64(self.zipf_rank(n, rng) - 1) % n,
            // Rank 1 is the newest record.
            RequestDist::Latest => n - self.zipf_rank(n, rng),
        }
    }

    /// Key number of the record an operation touches.
    pub fn choose_key(&mut self, rng: &mut Rng) -> u64 {
        let index = self.choose_index(rng);
        self.key_of_index(index)
    }

    fn next_insert(&mut self) -> u64 {
        let key = self.key_of_index(self.spec.record_count + self.inserts_sent);
        self.inserts_sent += 1;
        key
    }

    /// The insert of key number `key` (one of this thread's) was answered.
    pub fn insert_answered(&mut self, key: u64) {
        let rc = self.spec.record_count;
        let Some(n) = key.checked_sub(rc + self.thread) else {
            return;
        };
        if n % self.threads != 0 {
            return;
        }
        let ordinal = n / self.threads;
        if ordinal < self.inserts_acked || ordinal >= self.inserts_sent {
            return;
        }
        self.acked_ahead.insert(ordinal);
        while self.acked_ahead.remove(&self.inserts_acked) {
            self.inserts_acked += 1;
        }
    }
}

impl TxnSource for YcsbSource {
    fn completed(&mut self, kind: TxnKind, first_key: u64) {
        if kind == TxnKind::Insert {
            self.insert_answered(first_key);
        }
    }

    fn next_txn(&mut self, rng: &mut Rng) -> Txn {
        let u = rng.next_f64() * self.cumulative[4];
        let which = self.cumulative.iter().position(|&c| u < c).unwrap_or(0);
        match which {
            1 => Txn {
                kind: TxnKind::Update,
                action: Action::Set(self.choose_key(rng)),
            },
            2 => Txn {
                kind: TxnKind::Insert,
                action: Action::Set(self.next_insert()),
            },
            3 => {
                let start = self.choose_index(rng);
                let len = 1 + rng.below(self.spec.max_scan_length);
                let end = (start + len).min(self.known_records());
                Txn {
                    kind: TxnKind::Scan,
                    action: Action::MultiGet((start..end).map(|i| self.key_of_index(i)).collect()),
                }
            }
            4 => Txn {
                kind: TxnKind::ReadModifyWrite,
                action: Action::GetThenSet(self.choose_key(rng)),
            },
            _ => Txn {
                kind: TxnKind::Read,
                action: Action::Get(self.choose_key(rng)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_letters_parse_both_cases() {
        assert_eq!(YcsbWorkload::parse("a"), Ok(YcsbWorkload::A));
        assert_eq!(YcsbWorkload::parse("F"), Ok(YcsbWorkload::F));
        assert!(YcsbWorkload::parse("g").is_err());
    }

    #[test]
    fn proportions_sum_to_one() {
        for w in YcsbWorkload::ALL {
            let p = w.proportions();
            let sum = p.read + p.update + p.insert + p.scan + p.read_modify_write;
            assert!((sum - 1.0).abs() < 1e-12, "{w:?}");
        }
    }

    #[test]
    fn zero_records_or_scan_length_are_refused() {
        let mut s = YcsbSpec::standard(YcsbWorkload::E, 0);
        assert!(YcsbSource::new(&s, 0, 1).is_err());
        s.record_count = 10;
        s.max_scan_length = 0;
        assert!(YcsbSource::new(&s, 0, 1).is_err());
    }
}
