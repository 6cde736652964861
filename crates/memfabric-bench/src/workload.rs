//! What the load generator asks for: which key, which operation, which value.
//!
//! Everything here is pure and deterministic given a seed, so the tests check the shape of
//! generated sequences (never timings), and both servers of a comparison see the same
//! stream of requests.

use crate::rng::Rng;
use thiserror::Error;

/// Invalid workload parameters.
#[derive(Debug, Error, PartialEq)]
pub enum WorkloadError {
    #[error("key space must hold at least one key")]
    EmptyKeySpace,
    #[error("zipfian theta must be finite and > 0, got {0}")]
    BadTheta(f64),
    #[error("op mix must look like GET:SET with non-negative integers, not all zero; got {0:?}")]
    BadMix(String),
    #[error("unknown YCSB workload {0:?} (a, b, c, d, e or f)")]
    BadYcsbWorkload(String),
    #[error("YCSB maximum scan length must be at least 1")]
    BadScanLength,
}

/// How keys are drawn from the key space.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeyDist {
    /// Every key equally likely.
    Uniform,
    /// Key rank `k` (1-based) drawn with probability proportional to `k^-theta`.
    Zipfian { theta: f64 },
}

/// Zipfian sampler over ranks `1..=n` with exponent `theta`, by rejection-inversion
/// (Hörmann & Derflinger, "Rejection-inversion to generate variates from monotone discrete
/// distributions", 1996).
///
/// Why this one: it is exact (unlike the YCSB/Gray et al. approximation, which is exact only
/// for the two hottest ranks), needs O(1) memory and setup (no O(n) zeta sum or CDF table),
/// and costs about one log and one exp per draw; rejections are rare (well under 1%).
#[derive(Clone, Debug)]
pub struct Zipfian {
    n: f64,
    theta: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

impl Zipfian {
    /// Sampler over `1..=n`.
    pub fn new(n: u64, theta: f64) -> Result<Self, WorkloadError> {
        if n == 0 {
            return Err(WorkloadError::EmptyKeySpace);
        }
        if !theta.is_finite() || theta <= 0.0 {
            return Err(WorkloadError::BadTheta(theta));
        }
        let nf = n as f64;
        let mut z = Zipfian {
            n: nf,
            theta,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(nf + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    /// Draw a rank in `1..=n`; rank 1 is the most popular.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            // u is uniform in (h_integral_x1, h_integral_n]; inverting H maps it onto the
            // continuous envelope of the pmf, and the acceptance test below trims the
            // envelope to the exact discrete distribution.
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.s || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// Probability of rank `k` under the exact distribution (for tests and reports):
    /// `k^-theta / H(n, theta)`. O(n): not for the hot path.
    pub fn pmf(&self, k: u64) -> f64 {
        let norm: f64 = (1..=self.n as u64)
            .map(|i| (i as f64).powf(-self.theta))
            .sum();
        (k as f64).powf(-self.theta) / norm
    }

    /// `h(x) = x^-theta`, the unnormalised density.
    fn h(&self, x: f64) -> f64 {
        (-self.theta * x.ln()).exp()
    }

    /// `H(x) = (x^(1-theta) - 1) / (1 - theta)`, an antiderivative of h, written so it stays
    /// accurate when theta is close to 1 (where it tends to ln x).
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.theta) * log_x) * log_x
    }

    /// The inverse of `H`.
    fn h_integral_inverse(&self, x: f64) -> f64 {
        let mut t = x * (1.0 - self.theta);
        if t < -1.0 {
            // Rounding can push t just below -1, where log1p is undefined.
            t = -1.0;
        }
        (helper1(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, with its Taylor series near 0 to avoid 0/0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, with its Taylor series near 0 to avoid 0/0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

/// Draws key indices in `0..n` with a given distribution.
#[derive(Clone, Debug)]
pub enum KeyChooser {
    Uniform { n: u64 },
    Zipfian(Zipfian),
}

impl KeyChooser {
    pub fn new(n: u64, dist: KeyDist) -> Result<Self, WorkloadError> {
        if n == 0 {
            return Err(WorkloadError::EmptyKeySpace);
        }
        Ok(match dist {
            KeyDist::Uniform => KeyChooser::Uniform { n },
            KeyDist::Zipfian { theta } => KeyChooser::Zipfian(Zipfian::new(n, theta)?),
        })
    }

    /// A key index in `0..n`. Under zipfian, index 0 is the hottest key: the server hashes
    /// key names anyway, so hot keys need no scrambling to spread over its index.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match self {
            KeyChooser::Uniform { n } => rng.below(*n),
            KeyChooser::Zipfian(z) => z.sample(rng) - 1,
        }
    }
}

/// One operation of the closed loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Get,
    Set,
}

/// The get:set mix, e.g. 90:10.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpMix {
    pub gets: u32,
    pub sets: u32,
}

impl OpMix {
    /// Parse `"90:10"` (gets:sets).
    pub fn parse(s: &str) -> Result<Self, WorkloadError> {
        let bad = || WorkloadError::BadMix(s.to_string());
        let (g, st) = s.split_once(':').ok_or_else(bad)?;
        let gets: u32 = g.trim().parse().map_err(|_| bad())?;
        let sets: u32 = st.trim().parse().map_err(|_| bad())?;
        if gets == 0 && sets == 0 {
            return Err(bad());
        }
        Ok(OpMix { gets, sets })
    }

    /// Fraction of operations that are gets.
    pub fn get_fraction(&self) -> f64 {
        f64::from(self.gets) / (f64::from(self.gets) + f64::from(self.sets))
    }

    /// Draw the next operation.
    pub fn next(&self, rng: &mut Rng) -> OpKind {
        let total = u64::from(self.gets) + u64::from(self.sets);
        if rng.below(total) < u64::from(self.gets) {
            OpKind::Get
        } else {
            OpKind::Set
        }
    }
}

impl std::fmt::Display for OpMix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.gets, self.sets)
    }
}

/// The order in which operations come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Each op drawn at random from the get:set [`OpMix`].
    Mix,
    /// set, get, set, get, ...: the seeds' interleaved 50:50 pattern.
    Interleaved,
    /// 10 sets, then 90 gets, repeating: the seeds' non-interleaved 10:90 pattern.
    NonInterleaved,
}

/// Length of one [`Pattern::NonInterleaved`] cycle and the sets at its start.
pub const NON_INTERLEAVED_CYCLE: u64 = 100;
pub const NON_INTERLEAVED_SETS: u64 = 10;

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Mix => "mix",
            Pattern::Interleaved => "interleaved",
            Pattern::NonInterleaved => "non-interleaved",
        }
    }
}

/// The operation stream of one client thread: a [`Pattern`] with its position.
#[derive(Clone, Debug)]
pub struct OpSequence {
    pattern: Pattern,
    mix: OpMix,
    i: u64,
}

impl OpSequence {
    /// `mix` is used by [`Pattern::Mix`] only.
    pub fn new(pattern: Pattern, mix: OpMix) -> Self {
        OpSequence { pattern, mix, i: 0 }
    }

    /// The next operation. The fixed patterns consume no randomness, so the key sequence of
    /// a seed is the same whatever the pattern.
    pub fn next(&mut self, rng: &mut Rng) -> OpKind {
        let i = self.i;
        self.i += 1;
        match self.pattern {
            Pattern::Mix => self.mix.next(rng),
            Pattern::Interleaved => {
                if i.is_multiple_of(2) {
                    OpKind::Set
                } else {
                    OpKind::Get
                }
            }
            Pattern::NonInterleaved => {
                if i % NON_INTERLEAVED_CYCLE < NON_INTERLEAVED_SETS {
                    OpKind::Set
                } else {
                    OpKind::Get
                }
            }
        }
    }
}

/// The kinds of operation a workload reports latencies for. A kind is what the user asked
/// for (a YCSB read-modify-write), which may take more than one request on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TxnKind {
    Get,
    Set,
    /// YCSB READ: one GET.
    Read,
    /// YCSB UPDATE: one SET of an existing record (a cache replaces the whole value).
    Update,
    /// YCSB INSERT: one SET of a new record.
    Insert,
    /// YCSB SCAN, as a cache can do it: GETs of consecutive key ids, sent together.
    Scan,
    /// YCSB READ-MODIFY-WRITE: GET, then SET of the same key once the GET is answered.
    ReadModifyWrite,
}

impl TxnKind {
    pub const ALL: [TxnKind; 7] = [
        TxnKind::Get,
        TxnKind::Set,
        TxnKind::Read,
        TxnKind::Update,
        TxnKind::Insert,
        TxnKind::Scan,
        TxnKind::ReadModifyWrite,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TxnKind::Get => "get",
            TxnKind::Set => "set",
            TxnKind::Read => "read",
            TxnKind::Update => "update",
            TxnKind::Insert => "insert",
            TxnKind::Scan => "scan",
            TxnKind::ReadModifyWrite => "read-modify-write",
        }
    }

    /// Position in [`ALL`](Self::ALL), for per-kind arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The requests one operation needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Get(u64),
    Set(u64),
    /// GETs of these key ids, submitted together on one connection.
    MultiGet(Vec<u64>),
    /// GET, then (after its reply) SET of the same key id.
    GetThenSet(u64),
}

/// One operation of a workload: what it is called and what it sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Txn {
    pub kind: TxnKind,
    pub action: Action,
}

/// Where a client thread takes its operations from, in order.
pub trait TxnSource {
    fn next_txn(&mut self, rng: &mut Rng) -> Txn;
    /// An operation of kind `kind` whose first key was `first_key` has been answered (YCSB
    /// reads only inserted records whose insert was answered).
    fn completed(&mut self, _kind: TxnKind, _first_key: u64) {}
}

impl Action {
    /// The first key the action touches.
    pub fn first_key(&self) -> u64 {
        match self {
            Action::Get(k) | Action::Set(k) | Action::GetThenSet(k) => *k,
            Action::MultiGet(keys) => keys.first().copied().unwrap_or(0),
        }
    }
}

/// The get/set workloads: an [`OpSequence`] for the op and a [`KeyChooser`] for the key.
pub struct GetSetSource<'a> {
    ops: OpSequence,
    chooser: &'a KeyChooser,
}

impl<'a> GetSetSource<'a> {
    pub fn new(pattern: Pattern, mix: OpMix, chooser: &'a KeyChooser) -> Self {
        GetSetSource {
            ops: OpSequence::new(pattern, mix),
            chooser,
        }
    }
}

impl TxnSource for GetSetSource<'_> {
    fn next_txn(&mut self, rng: &mut Rng) -> Txn {
        // Op first, then key: the order the load loop has always drawn them in, so a seed
        // gives the same stream as before.
        let op = self.ops.next(rng);
        let key = self.chooser.next(rng);
        match op {
            OpKind::Get => Txn {
                kind: TxnKind::Get,
                action: Action::Get(key),
            },
            OpKind::Set => Txn {
                kind: TxnKind::Set,
                action: Action::Set(key),
            },
        }
    }
}

/// How a key id becomes a key name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyNaming {
    /// `<prefix><id as 10 decimal digits>`, fixed width so every request of a run has the
    /// same size.
    #[default]
    FixedWidth,
    /// YCSB's hashed insert order: `<prefix><fnvhash64(id) in decimal>` (YCSB's
    /// `CoreWorkload.buildKeyName` with `insertorder=hashed`, prefix `user`).
    YcsbHashed,
}

/// The key names of a run: ids `0..n`, named by `naming`.
#[derive(Clone, Debug)]
pub struct KeySpace {
    pub prefix: String,
    pub n: u64,
    pub naming: KeyNaming,
}

impl KeySpace {
    /// Fixed-width names `<prefix><10 digits>` for ids `0..n`.
    pub fn new(prefix: &str, n: u64) -> Self {
        KeySpace {
            prefix: prefix.to_string(),
            n,
            naming: KeyNaming::FixedWidth,
        }
    }

    /// Append the name of key `id` to `out`.
    pub fn write_key(&self, id: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(self.prefix.as_bytes());
        match self.naming {
            KeyNaming::FixedWidth => {
                let mut digits = [b'0'; 10];
                let mut v = id;
                for d in digits.iter_mut().rev() {
                    *d = b'0' + (v % 10) as u8;
                    v /= 10;
                }
                out.extend_from_slice(&digits);
            }
            KeyNaming::YcsbHashed => {
                // Decimal without allocating: at most 19 digits for a non-negative i64.
                let mut digits = [0u8; 20];
                let mut v = ycsb_fnvhash64(id);
                let mut at = digits.len();
                loop {
                    at -= 1;
                    digits[at] = b'0' + (v % 10) as u8;
                    v /= 10;
                    if v == 0 {
                        break;
                    }
                }
                out.extend_from_slice(&digits[at..]);
            }
        }
    }

    /// The key name of `id` as a fresh vector.
    pub fn key(&self, id: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.prefix.len() + 10);
        self.write_key(id, &mut v);
        v
    }

    /// The contiguous share of the key space that worker `part` of `parts` preloads. The
    /// shares are disjoint and together cover `0..n` exactly once.
    pub fn preload_range(&self, part: u64, parts: u64) -> std::ops::Range<u64> {
        if parts == 0 || part >= parts {
            return 0..0;
        }
        let per = self.n / parts;
        let extra = self.n % parts;
        // The first `extra` parts take one key more.
        let start = part * per + part.min(extra);
        let len = per + u64::from(part < extra);
        start..start + len
    }
}

/// Values carry the id of their key so a GET reply can be checked: a server that returns
/// the wrong item or a truncated one is caught as a mismatch, not counted as a hit.
#[derive(Clone, Debug)]
pub struct ValueMaker {
    template: Vec<u8>,
}

/// Bytes of the id stamp at each end of a value.
const STAMP: usize = 16;

impl ValueMaker {
    /// Values of exactly `size` bytes.
    pub fn new(size: usize) -> Self {
        // Printable filler so replies are readable when debugging with nc.
        let template = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
        ValueMaker { template }
    }

    pub fn size(&self) -> usize {
        self.template.len()
    }

    /// The value for key `id`, written into `out` (cleared first).
    pub fn fill(&self, id: u64, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.template);
        let stamp = stamp(id);
        let n = out.len();
        if n >= STAMP {
            out[..STAMP].copy_from_slice(&stamp);
        }
        if n >= 2 * STAMP {
            out[n - STAMP..].copy_from_slice(&stamp);
        }
    }

    /// Whether `data` is what [`fill`](Self::fill) writes for `id`: right length and stamps
    /// (the filler in between is not compared, to keep the client cheap).
    pub fn check(&self, id: u64, data: &[u8]) -> bool {
        let n = self.template.len();
        if data.len() != n {
            return false;
        }
        let stamp = stamp(id);
        if n >= STAMP && data.get(..STAMP) != Some(&stamp[..]) {
            return false;
        }
        if n >= 2 * STAMP && data.get(n - STAMP..) != Some(&stamp[..]) {
            return false;
        }
        if n < STAMP {
            return data == &self.template[..];
        }
        true
    }
}

/// YCSB's `Utils.fnvhash64(long)`: FNV-1a over the 8 octets of `val` (lowest first), then
/// `Math.abs`. (Java's abs leaves `Long.MIN_VALUE` negative where this gives 2^63: one hash
/// value in 2^64, which no benchmark's key ids reach in practice.)
pub fn ycsb_fnvhash64(val: u64) -> u64 {
    const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
    const FNV_PRIME_64: u64 = 1_099_511_628_211;
    let mut hash = FNV_OFFSET_BASIS_64;
    let mut v = val;
    for _ in 0..8 {
        hash ^= v & 0xff;
        hash = hash.wrapping_mul(FNV_PRIME_64);
        v >>= 8;
    }
    (hash as i64).unsigned_abs()
}

fn stamp(id: u64) -> [u8; STAMP] {
    let mut s = [0u8; STAMP];
    let hex = b"0123456789abcdef";
    for (i, b) in s.iter_mut().enumerate() {
        *b = hex[((id >> (60 - 4 * i)) & 0xf) as usize];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_mix_parses_gets_colon_sets() {
        assert_eq!(OpMix::parse("90:10"), Ok(OpMix { gets: 90, sets: 10 }));
        assert!(OpMix::parse("90").is_err());
        assert!(OpMix::parse("0:0").is_err());
        assert!(OpMix::parse("-1:3").is_err());
    }

    #[test]
    fn keys_are_fixed_width() {
        let ks = KeySpace::new("k:", 10);
        assert_eq!(ks.key(7), b"k:0000000007".to_vec());
        assert_eq!(ks.key(4_294_967_295).len(), 12);
    }

    #[test]
    fn value_round_trips_through_check_for_all_sizes() {
        for size in [0usize, 1, 15, 16, 31, 32, 33, 4096] {
            let vm = ValueMaker::new(size);
            let mut v = Vec::new();
            vm.fill(12345, &mut v);
            assert_eq!(v.len(), size);
            assert!(vm.check(12345, &v), "size {size}");
        }
    }

    #[test]
    fn value_of_another_key_or_length_fails_check() {
        let vm = ValueMaker::new(64);
        let mut v = Vec::new();
        vm.fill(1, &mut v);
        assert!(!vm.check(2, &v));
        assert!(!vm.check(1, &v[..63]));
    }

    #[test]
    fn zipfian_rejects_bad_parameters() {
        assert_eq!(
            Zipfian::new(0, 0.99).err(),
            Some(WorkloadError::EmptyKeySpace)
        );
        assert!(Zipfian::new(10, 0.0).is_err());
        assert!(Zipfian::new(10, f64::NAN).is_err());
    }
}
