//! Property test: any sequence of operations leaves the store agreeing with a plain map
//! (memory is large enough that nothing is evicted).
use std::collections::HashMap;

use memfabric_store::{
    ArithOptions, ArithStatus, DeleteStatus, GetOptions, SetMode, Store, StoreConfig, StoreStatus,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Set(u8, Vec<u8>),
    Add(u8, Vec<u8>),
    Replace(u8, Vec<u8>),
    Append(u8, Vec<u8>),
    Prepend(u8, Vec<u8>),
    Delete(u8),
    Incr(u8, u64),
    Decr(u8, u64),
    Get(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..8;
    // Numbers also with what C's strtoull takes or stops at around them.
    let around = proptest::sample::select(vec![
        "", " ", "\t", "\n", "\x0b", "\x0c", "\r", "+", "-", "++", " -", "\0", "\0-", "x", "x-",
        "0x",
    ]);
    let val = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40),
        (0u64..1000).prop_map(|n| n.to_string().into_bytes()),
        (around.clone(), any::<u64>(), around)
            .prop_map(|(before, n, after)| { format!("{before}{n}{after}").into_bytes() }),
    ];
    prop_oneof![
        (key.clone(), val.clone()).prop_map(|(k, v)| Op::Set(k, v)),
        (key.clone(), val.clone()).prop_map(|(k, v)| Op::Add(k, v)),
        (key.clone(), val.clone()).prop_map(|(k, v)| Op::Replace(k, v)),
        (key.clone(), val.clone()).prop_map(|(k, v)| Op::Append(k, v)),
        (key.clone(), val).prop_map(|(k, v)| Op::Prepend(k, v)),
        key.clone().prop_map(Op::Delete),
        (key.clone(), any::<u64>()).prop_map(|(k, d)| Op::Incr(k, d)),
        (key.clone(), 0u64..2000).prop_map(|(k, d)| Op::Decr(k, d)),
        key.prop_map(Op::Get),
    ]
}

/// memcached's `safe_strtoull` on a value as memcached keeps it (followed by "\r\n",
/// read as a C string: NUL ends it): C's `strtoull(…, 10)` — leading white space, one
/// optional sign, digits, a `-` negating with wrap-around — then the number must end at
/// white space or the string's end, must not overflow, and a result that is negative as
/// a signed number is refused if the string holds a `-` anywhere (`strchr`). Checked
/// against memcached 1.6.18: "\t0" is 0, "+5" 5, "-0" 0, "-18446744073709551615" 1,
/// "5\0x" 5, "9223372036854775808\0-" 2^63; "-5", "++5", "0x5", " ",
/// "18446744073709551615 -" are not numbers.
fn model_number(v: &[u8]) -> Option<u64> {
    let s: Vec<u8> = v
        .iter()
        .copied()
        .chain(*b"\r\n")
        .take_while(|&b| b != 0)
        .collect();
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let mut i = s.iter().take_while(|&&b| space(b)).count();
    let negative = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits = s[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let mut n: u64 = 0;
    for &d in &s[i..i + digits] {
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if s.get(i + digits).is_some_and(|&b| !space(b)) {
        return None;
    }
    if negative {
        n = n.wrapping_neg();
    }
    if (n as i64) < 0 && s.contains(&b'-') {
        return None;
    }
    Some(n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn store_agrees_with_a_map(ops in proptest::collection::vec(op(), 1..60)) {
        let s = Store::new(StoreConfig { memory_limit: 4 << 20, ..StoreConfig::default() }).unwrap();
        let mut m: HashMap<u8, Vec<u8>> = HashMap::new();
        for op in ops {
            match op {
                Op::Set(k, v) => {
                    let stored = matches!(s.store(SetMode::Set, &[b'k', k], &v, 0, 0, 0), StoreStatus::Stored { .. });
                    prop_assert!(stored);
                    m.insert(k, v);
                }
                Op::Add(k, v) => {
                    let r = s.store(SetMode::Add, &[b'k', k], &v, 0, 0, 0);
                    prop_assert_eq!(matches!(r, StoreStatus::Stored { .. }), !m.contains_key(&k));
                    m.entry(k).or_insert(v);
                }
                Op::Replace(k, v) => {
                    let r = s.store(SetMode::Replace, &[b'k', k], &v, 0, 0, 0);
                    prop_assert_eq!(matches!(r, StoreStatus::Stored { .. }), m.contains_key(&k));
                    if let Some(e) = m.get_mut(&k) { *e = v; }
                }
                Op::Append(k, v) => {
                    s.store(SetMode::Append, &[b'k', k], &v, 0, 0, 0);
                    if let Some(e) = m.get_mut(&k) { e.extend_from_slice(&v); }
                }
                Op::Prepend(k, v) => {
                    s.store(SetMode::Prepend, &[b'k', k], &v, 0, 0, 0);
                    if let Some(e) = m.get_mut(&k) { let mut n = v.clone(); n.extend_from_slice(e); *e = n; }
                }
                Op::Delete(k) => {
                    let r = s.delete(&[b'k', k], 0);
                    prop_assert_eq!(r == DeleteStatus::Deleted, m.remove(&k).is_some());
                }
                Op::Incr(k, d) | Op::Decr(k, d) => {
                    let incr = matches!(op, Op::Incr(..));
                    let r = s.arith(&[b'k', k], incr, d, &ArithOptions::default());
                    match m.get_mut(&k) {
                        None => prop_assert_eq!(r, ArithStatus::NotFound),
                        Some(e) => match model_number(e) {
                            None => prop_assert_eq!(r, ArithStatus::NonNumeric),
                            Some(n) => {
                                let new = if incr { n.wrapping_add(d) } else { n.saturating_sub(d) };
                                let ArithStatus::Value { value, .. } = r else { return Err(TestCaseError::fail(format!("{r:?}"))) };
                                prop_assert_eq!(value, new);
                                let mut digits = new.to_string().into_bytes();
                                if digits.len() < e.len() { digits.resize(e.len(), b' '); }
                                *e = digits;
                            }
                        },
                    }
                }
                Op::Get(k) => {
                    let mut out = Vec::new();
                    let r = s.get(&[b'k', k], &GetOptions::default(), &mut out);
                    prop_assert_eq!(r.map(|_| out), m.get(&k).cloned());
                }
            }
        }
    }
}
