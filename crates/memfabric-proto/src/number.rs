//! Decimal numbers as memcached reads and writes them: its `safe_strto*` helpers
//! (`util.c`, 1.6.18) on glibc's `strto*`, the one parser for every numeric token of the
//! ascii and meta protocols, and the digits replies carry.
//!
//! A token here is what memcached's tokenizer hands those helpers: the bytes between
//! spaces (a tab or other whitespace inside it belongs to it), NUL-terminated, so a check
//! that runs "to the end of the string" runs to the end of the token. What is accepted,
//! checked against Debian's memcached 1.6.18:
//!
//! - leading C whitespace (space, `\t`, `\n`, `\v`, `\f`, `\r`) is skipped, then at most
//!   one `+` or `-`, then at least one decimal digit (no `0x`: base 10);
//! - after the digits comes the end of the token or a whitespace byte, after which
//!   anything may follow (`5\tx` is 5, `5x` is refused);
//! - a value the C type cannot hold (`ERANGE`) is refused; `long` is 64 bits, so even the
//!   "32-bit" helpers parse 64 bits first;
//! - the unsigned helpers negate a `-` value modulo 2^64 as `strtoull` does (`-1` becomes
//!   `u64::MAX`) and refuse the result only if it is negative as a signed 64-bit number
//!   *and* the token holds a `-` anywhere (memcached's `strchr`): `-0` is 0,
//!   `-9223372036854775809` is 9223372036854775807, `18446744073709551615` is accepted
//!   but `18446744073709551615\t-` is not;
//! - `safe_strtoul` and `safe_strtol` store the 64-bit result in 32 bits: truncated
//!   (flags `4294967297` is 1, exptime `2147483648` is `i32::MIN`).

/// C's `isspace` in the "C" locale.
pub fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The digits `strtoull`/`strtoll` read from `tok`.
struct Scanned {
    negative: bool,
    /// The magnitude, or `None` when it does not fit 64 bits.
    magnitude: Option<u64>,
    /// Index just past the last digit.
    end: usize,
}

/// glibc's `strto*` scan in base 10; `None` when there are no digits (`str == endptr`).
fn scan(tok: &[u8]) -> Option<Scanned> {
    let mut i = tok.iter().take_while(|&&b| c_isspace(b)).count();
    let mut negative = false;
    if let Some(&sign @ (b'+' | b'-')) = tok.get(i) {
        negative = sign == b'-';
        i += 1;
    }
    let digits_start = i;
    let mut magnitude = Some(0u64);
    while let Some(&d @ b'0'..=b'9') = tok.get(i) {
        magnitude = magnitude
            .and_then(|m| m.checked_mul(10))
            .and_then(|m| m.checked_add(u64::from(d - b'0')));
        i += 1;
    }
    (i > digits_start).then_some(Scanned {
        negative,
        magnitude,
        end: i,
    })
}

/// memcached's test on what stops the number: whitespace or the end of the token.
fn ends_number(tok: &[u8], end: usize) -> bool {
    tok.get(end).is_none_or(|&b| c_isspace(b))
}

/// memcached's `safe_strtoull`: an unsigned 64-bit number (see the module docs).
pub fn safe_strtoull(tok: &[u8]) -> Option<u64> {
    let s = scan(tok)?;
    let magnitude = s.magnitude?;
    if !ends_number(tok, s.end) {
        return None;
    }
    let v = if s.negative {
        magnitude.wrapping_neg()
    } else {
        magnitude
    };
    // Only a result that looks negative as a signed number is checked for a sign, and
    // memcached looks for it in the whole token.
    if (v as i64) < 0 && tok.contains(&b'-') {
        return None;
    }
    Some(v)
}

/// memcached's `safe_strtoul`: `safe_strtoull`'s checks on a 64-bit `unsigned long`,
/// stored in 32 bits.
pub fn safe_strtoul(tok: &[u8]) -> Option<u32> {
    safe_strtoull(tok).map(|v| v as u32)
}

/// memcached's `safe_strtoll`: a signed 64-bit number.
pub fn safe_strtoll(tok: &[u8]) -> Option<i64> {
    let s = scan(tok)?;
    let magnitude = s.magnitude?;
    let v = if s.negative {
        // -2^63 is the one magnitude past i64::MAX that fits.
        0i64.checked_sub_unsigned(magnitude)?
    } else {
        i64::try_from(magnitude).ok()?
    };
    ends_number(tok, s.end).then_some(v)
}

/// memcached 1.6.18's `safe_strtol`: a 64-bit `long`, stored in 32 bits.
pub fn safe_strtol(tok: &[u8]) -> Option<i32> {
    safe_strtoll(tok).map(|v| v as i32)
}

/// memcached's `safe_strtod` for decimal numbers, `inf`, `infinity` and `nan` (glibc's
/// hexadecimal floats are not accepted); whitespace and what may follow the number as
/// for the integers.
pub fn safe_strtod(tok: &[u8]) -> Option<f64> {
    let mut i = tok.iter().take_while(|&&b| c_isspace(b)).count();
    let start = i;
    if matches!(tok.get(i), Some(b'+' | b'-')) {
        i += 1;
    }
    let word = |w: &[u8], at: usize| {
        tok.len() >= at + w.len() && tok[at..at + w.len()].eq_ignore_ascii_case(w)
    };
    let end = if word(b"infinity", i) {
        i + 8
    } else if word(b"inf", i) || word(b"nan", i) {
        i + 3
    } else {
        let int_start = i;
        while tok.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let mut digits = i - int_start;
        if tok.get(i) == Some(&b'.') {
            i += 1;
            let frac_start = i;
            while tok.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            digits += i - frac_start;
        }
        if digits == 0 {
            return None;
        }
        if matches!(tok.get(i), Some(b'e' | b'E')) {
            let mut j = i + 1;
            if matches!(tok.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            let exp_start = j;
            while tok.get(j).is_some_and(u8::is_ascii_digit) {
                j += 1;
            }
            // strtod stops before an exponent without digits.
            if j > exp_start {
                i = j;
            }
        }
        i
    };
    if !ends_number(tok, end) {
        return None;
    }
    let text = std::str::from_utf8(&tok[start..end]).ok()?;
    let v: f64 = text.parse().ok()?;
    // strtod reports overflow as ERANGE, which safe_strtod refuses.
    if v.is_infinite() && !text.to_ascii_lowercase().contains("inf") {
        return None;
    }
    Some(v)
}

/// Append the decimal digits of `n`.
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Append the decimal digits of `n`, with a `-` when negative.
pub fn push_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    push_u64(out, n.unsigned_abs());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn strtoull_takes_whitespace_and_a_sign_before_the_digits() {
        assert_eq!(safe_strtoull(b"0"), Some(0));
        assert_eq!(safe_strtoull(b"+5"), Some(5));
        assert_eq!(safe_strtoull(b" 5"), Some(5));
        assert_eq!(safe_strtoull(b"\t\x0b\x0c\r\n5"), Some(5));
        assert_eq!(safe_strtoull(b"00012"), Some(12));
        assert_eq!(safe_strtoull(b"-0"), Some(0));
        assert_eq!(safe_strtoull(b"+-5"), None);
        assert_eq!(safe_strtoull(b"- 5"), None);
        assert_eq!(safe_strtoull(b"0x10"), None);
    }

    #[test]
    fn strtoull_allows_anything_after_whitespace_but_no_garbage() {
        assert_eq!(safe_strtoull(b"5\t"), Some(5));
        assert_eq!(safe_strtoull(b"5\tx"), Some(5));
        assert_eq!(safe_strtoull(b"12\r"), Some(12));
        assert_eq!(safe_strtoull(b"5x"), None);
        assert_eq!(safe_strtoull(b"x"), None);
        assert_eq!(safe_strtoull(b""), None);
        assert_eq!(safe_strtoull(b"-"), None);
        assert_eq!(safe_strtoull(b" "), None);
    }

    #[test]
    fn strtoull_refuses_overflow() {
        assert_eq!(safe_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"-18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"99999999999999999999999"), None);
    }

    #[test]
    fn strtoull_checks_the_sign_only_of_results_negative_as_i64() {
        // strtoull turns -1 into u64::MAX, negative as i64, and the token has a '-'.
        assert_eq!(safe_strtoull(b"-1"), None);
        assert_eq!(
            safe_strtoull(b"-9223372036854775809"),
            Some(9223372036854775807)
        );
        assert_eq!(safe_strtoull(b"-18446744073709551615"), Some(1));
        assert_eq!(safe_strtoull(b"9223372036854775808"), Some(1 << 63));
        // The '-' is looked for in the whole token, past the digits too (strchr).
        assert_eq!(safe_strtoull(b"18446744073709551615\t-x"), None);
        assert_eq!(safe_strtoull(b"9223372036854775808 -"), None);
        assert_eq!(safe_strtoull(b"5\t-x"), Some(5));
    }

    #[test]
    fn strtoul_truncates_to_32_bits() {
        assert_eq!(safe_strtoul(b"4294967295"), Some(u32::MAX));
        assert_eq!(safe_strtoul(b"4294967296"), Some(0));
        assert_eq!(safe_strtoul(b"4294967297"), Some(1));
        assert_eq!(safe_strtoul(b"18446744073709551615"), Some(u32::MAX));
        assert_eq!(safe_strtoul(b"-9223372036854775809"), Some(u32::MAX));
        assert_eq!(safe_strtoul(b"18446744073709551616"), None);
        assert_eq!(safe_strtoul(b"-1"), None);
        assert_eq!(safe_strtoul(b"12abc"), None);
    }

    #[test]
    fn strtoll_is_64_bit_signed() {
        assert_eq!(safe_strtoll(b"-1"), Some(-1));
        assert_eq!(safe_strtoll(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(safe_strtoll(b"9223372036854775808"), None);
        assert_eq!(safe_strtoll(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(safe_strtoll(b"-9223372036854775809"), None);
        assert_eq!(safe_strtoll(b" +7\t-"), Some(7));
        assert_eq!(safe_strtoll(b"7-"), None);
    }

    #[test]
    fn strtol_truncates_to_32_bits_like_memcached_1_6_18() {
        assert_eq!(safe_strtol(b"-1"), Some(-1));
        assert_eq!(safe_strtol(b"2147483647"), Some(i32::MAX));
        assert_eq!(safe_strtol(b"2147483648"), Some(i32::MIN));
        assert_eq!(safe_strtol(b"4294967296"), Some(0));
        assert_eq!(safe_strtol(b"4294967297"), Some(1));
        assert_eq!(safe_strtol(b"4294967306"), Some(10));
        assert_eq!(safe_strtol(b"-2147483649"), Some(i32::MAX));
        assert_eq!(safe_strtol(b"9223372036854775807"), Some(-1));
        assert_eq!(safe_strtol(b"-9223372036854775808"), Some(0));
        assert_eq!(safe_strtol(b"9223372036854775808"), None);
        assert_eq!(safe_strtol(b"-9223372036854775809"), None);
        assert_eq!(safe_strtol(b"1x"), None);
    }

    #[test]
    fn strtod_reads_decimals_inf_and_nan() {
        assert_eq!(safe_strtod(b"0.5"), Some(0.5));
        assert_eq!(safe_strtod(b"1e3"), Some(1000.0));
        // strtod stops before a bare "e", which is then trailing garbage.
        assert_eq!(safe_strtod(b"1e"), None);
        assert_eq!(safe_strtod(b".5"), Some(0.5));
        assert_eq!(safe_strtod(b"-2."), Some(-2.0));
        assert_eq!(safe_strtod(b"inf"), Some(f64::INFINITY));
        assert!(safe_strtod(b"nan").is_some_and(f64::is_nan));
        assert_eq!(safe_strtod(b"1e999"), None);
        assert_eq!(safe_strtod(b"x"), None);
        assert_eq!(safe_strtod(b"."), None);
        assert_eq!(safe_strtod(b"1.5x"), None);
        assert_eq!(safe_strtod(b"1.5\tx"), Some(1.5));
    }

    #[test]
    fn decimal_digits_are_written_without_padding() {
        let mut out = Vec::new();
        push_u64(&mut out, 0);
        out.push(b' ');
        push_u64(&mut out, u64::MAX);
        out.push(b' ');
        push_i64(&mut out, i64::MIN);
        assert_eq!(out, b"0 18446744073709551615 -9223372036854775808");
    }

    proptest! {
        #[test]
        fn written_numbers_read_back(n: u64, m: i64) {
            let mut out = Vec::new();
            push_u64(&mut out, n);
            prop_assert_eq!(safe_strtoull(&out), Some(n));
            out.clear();
            push_i64(&mut out, m);
            prop_assert_eq!(safe_strtoll(&out), Some(m));
        }

        #[test]
        fn unsigned_parses_agree_with_the_signed_scan(tok in "[ \t+-]{0,2}[0-9]{1,21}[ \t-x]{0,2}") {
            // Whatever strtoll accepts without a '-' in the token, strtoull accepts too,
            // with the same bits.
            let tok = tok.as_bytes();
            if let (Some(v), false) = (safe_strtoll(tok), tok.contains(&b'-')) {
                prop_assert_eq!(safe_strtoull(tok), Some(v as u64));
            }
        }
    }
}
