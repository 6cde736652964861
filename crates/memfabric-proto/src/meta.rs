//! meta wire format: the meta commands `mg ms md ma mn me` as memcached 1.6.18 parses
//! them, and the pieces of their replies.
//!
//! A request line is split on spaces (only spaces: a tab is part of a token, as in
//! memcached's tokenizer). Flags are single characters, optionally followed by a token
//! (`T30`, `Oabc`). memcached reads every flag in one pass ("preparse") that rejects
//! duplicates and unknown characters and records the numeric tokens; replies then echo
//! the return flags in the order the client sent them. This module reproduces that pass,
//! including its odd corners, because clients see them:
//!
//! - numbers are parsed by `crate::number` (memcached's `safe_strto*`, shared with
//!   ascii): like C's `strtol`/`strtoul` on a 64-bit machine and then truncated to 32 bits (`T4294967306` is a TTL of 10, `F4294967297` is flags 1);
//! - a flag that fails to parse does not stop the pass: the last error message set wins,
//!   and a bad `F` token sets no message of its own;
//! - `md` and `ma` report every flag error as "invalid or duplicate flag";
//! - base64 keys (`b`) are decoded as memcached's decoder does: characters outside the
//!   alphabet are skipped and decoding stops after the first padded quad.
//!
//! One flag is memfabricd's own: `K` on `ms` ("keep a newer write"; memcached refuses it as
//! an invalid flag, and so does this parser on the other commands). See
//! [`MetaFlags::keep_newer_write`].
//!
//! Which replies are suppressed by `q`, and errors that memcached only notices while
//! building a reply (an over-long opaque in `mg`/`ma`), are the executor's business:
//! the request keeps every flag token, in order, for it.
use std::borrow::Cow;

use base64::Engine as _;

// Re-exported so `meta::` keeps naming everything a meta executor needs. The key length
// limit is checked on the key as sent, before base64 decoding.
pub use crate::number::{push_i64, push_u64, safe_strtol, safe_strtoul, safe_strtoull};
pub use crate::KEY_MAX_LEN;

/// Longest opaque token, counting its leading `O` (memcached's MFLAG_MAX_OPAQUE_LENGTH).
pub const OPAQUE_MAX_LEN: usize = 32;

/// memcached's MFLAG_MAX_OPT_LENGTH: the most tokens a meta line may have, counting the
/// command, the key, `ms`'s length and the tokenizer's empty terminal token.
const MAX_LINE_TOKENS: usize = 20;

/// The most flag tokens any meta command can carry (`mg`/`md`/`ma`: 20 - 3).
pub const MAX_FLAGS: usize = MAX_LINE_TOKENS - 3;

/// Which meta command a line holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaCommand {
    /// `mg`: get.
    Get,
    /// `ms`: set (and add/replace/append/prepend/cas through flags).
    Set,
    /// `md`: delete or invalidate.
    Delete,
    /// `ma`: incr/decr.
    Arith,
    /// `mn`: no-op, answers `MN`.
    Noop,
    /// `me`: debug dump of an item's metadata.
    Debug,
}

/// `ms` modes (the `M` flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreMode {
    /// `MS` or no `M` flag.
    Set,
    /// `ME`.
    Add,
    /// `MR`.
    Replace,
    /// `MA`.
    Append,
    /// `MP`.
    Prepend,
}

/// `ma` modes (the `M` flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithMode {
    /// `MI`, `M+` or no `M` flag.
    Incr,
    /// `MD` or `M-`.
    Decr,
}

/// Why a meta line was rejected. `Display` is the exact line memcached sends (without
/// "\r\n").
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// Not a command (too few tokens, or an unknown `m?` word).
    #[error("ERROR")]
    UnknownCommand,
    #[error("CLIENT_ERROR bad command line format")]
    BadFormat,
    /// `mg` with more than `MAX_FLAGS` flags.
    #[error("CLIENT_ERROR options flags are too long")]
    GetFlagsTooLong,
    /// `ms`, `md`, `ma` with too many flags (memcached's wording differs from `mg`'s).
    #[error("CLIENT_ERROR options flags too long")]
    FlagsTooLong,
    #[error("CLIENT_ERROR duplicate flag")]
    DuplicateFlag,
    #[error("CLIENT_ERROR invalid flag")]
    InvalidFlag,
    /// Every flag error of `md` and `ma`.
    #[error("CLIENT_ERROR invalid or duplicate flag")]
    InvalidOrDuplicateFlag,
    #[error("CLIENT_ERROR error decoding key")]
    KeyDecode,
    #[error("CLIENT_ERROR bad token in command line format")]
    BadToken,
    #[error("CLIENT_ERROR incorrect length for M token")]
    ModeLength,
    #[error("CLIENT_ERROR invalid numeric initial value")]
    BadInitial,
    #[error("CLIENT_ERROR invalid numeric delta value")]
    BadDelta,
    #[error("CLIENT_ERROR invalid mode for ms M token")]
    BadStoreMode,
    #[error("CLIENT_ERROR invalid mode for ma M token")]
    BadArithMode,
    #[error("CLIENT_ERROR opaque token too long")]
    OpaqueTooLong,
}

/// A rejected line and what to do with the data block that may follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub error: MetaError,
    /// `ms` rejected after its length was read: this many bytes (data + "\r\n") follow
    /// the line and must be discarded. 0 otherwise (memcached then reads the data block
    /// as commands).
    pub swallow: usize,
}

impl From<MetaError> for ParseError {
    fn from(error: MetaError) -> Self {
        ParseError { error, swallow: 0 }
    }
}

/// The flags of a meta request: every token in request order (for the return flags),
/// plus the values memcached's preparse extracts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaFlags<'a> {
    tokens: [&'a [u8]; MAX_FLAGS],
    len: usize,
    /// `b`: the key was sent base64-encoded (and is echoed that way by `k`).
    pub base64: bool,
    /// `q`: suppress nominal replies.
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `u`: do not record the access.
    pub no_update: bool,
    /// `I`: invalidate (md: mark stale; ms with `C`: accept an older CAS as stale).
    pub invalidate: bool,
    /// `C`: compare CAS (any value, 0 included, counts as given).
    pub cas: Option<u64>,
    /// `F`: client flags (0 when absent).
    pub client_flags: u32,
    /// `T`: TTL as sent (after memcached's 32-bit truncation; negative = expired).
    pub ttl: Option<i32>,
    /// `N`: vivify on miss with this TTL.
    pub vivify: Option<i32>,
    /// `R`: win a recache when the remaining TTL is below this.
    pub recache: Option<i32>,
    /// `M`: the mode character, validated per command.
    pub mode: Option<u8>,
    /// `D`: arithmetic delta (default 1).
    pub delta: u64,
    /// `J`: initial value of an autovivified counter (default 0).
    pub initial: u64,
    /// `K` (memfabricd's, `ms` only): a plain set of an erasure-coded fragment that must
    /// not replace a fragment of a newer write of the key; refused, the reply is `NS
    /// K<stripe of the write kept>` (docs/resilience.md, the write hole). The UCX path's
    /// `FLAG_KEEP_NEWER_WRITE` over TCP.
    pub keep_newer_write: bool,
}

impl<'a> MetaFlags<'a> {
    fn new() -> Self {
        MetaFlags {
            tokens: [&[]; MAX_FLAGS],
            len: 0,
            base64: false,
            quiet: false,
            value: false,
            no_update: false,
            invalidate: false,
            cas: None,
            client_flags: 0,
            ttl: None,
            vivify: None,
            recache: None,
            mode: None,
            delta: 1,
            initial: 0,
            keep_newer_write: false,
        }
    }

    /// Every flag token, whole (`b"O123"`), in request order. Never empty tokens.
    pub fn tokens(&self) -> &[&'a [u8]] {
        &self.tokens[..self.len]
    }

    /// Whether flag `c` was sent.
    pub fn has(&self, c: u8) -> bool {
        self.tokens().iter().any(|t| t.first() == Some(&c))
    }

    /// Whether some `O` token is longer than memcached accepts.
    pub fn opaque_too_long(&self) -> bool {
        self.tokens()
            .iter()
            .any(|t| t.first() == Some(&b'O') && t.len() > OPAQUE_MAX_LEN)
    }

    /// The `ms` mode.
    pub fn store_mode(&self) -> Result<StoreMode, MetaError> {
        match self.mode {
            None | Some(b'S') => Ok(StoreMode::Set),
            Some(b'E') => Ok(StoreMode::Add),
            Some(b'A') => Ok(StoreMode::Append),
            Some(b'P') => Ok(StoreMode::Prepend),
            Some(b'R') => Ok(StoreMode::Replace),
            Some(_) => Err(MetaError::BadStoreMode),
        }
    }

    /// The `ma` mode.
    pub fn arith_mode(&self) -> Result<ArithMode, MetaError> {
        match self.mode {
            None | Some(b'I') | Some(b'+') => Ok(ArithMode::Incr),
            Some(b'D') | Some(b'-') => Ok(ArithMode::Decr),
            Some(_) => Err(MetaError::BadArithMode),
        }
    }
}

/// One parsed meta request line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest<'a> {
    pub command: MetaCommand,
    /// The key, base64-decoded when `b` was given. Empty for `mn`.
    pub key: Cow<'a, [u8]>,
    /// `ms`: length of the data block that follows the line (without its "\r\n").
    pub data_len: usize,
    pub flags: MetaFlags<'a>,
}

/// The first line of `input`: `(line, consumed)` where `line` has no "\n" (nor the "\r"
/// before it) and is cut at the first NUL byte, as memcached's C string handling does,
/// and `consumed` counts the bytes up to and including the "\n". `None` until a "\n"
/// arrives.
pub fn split_line(input: &[u8]) -> Option<(&[u8], usize)> {
    let nl = input.iter().position(|&b| b == b'\n')?;
    let mut line = &input[..nl];
    // memcached strips the "\r" only from lines longer than one byte.
    if line.len() > 1 && line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    if let Some(nul) = line.iter().position(|&b| b == 0) {
        line = &line[..nul];
    }
    Some((line, nl + 1))
}

/// The line's space-separated tokens: the first `N` of them, and how many there are.
fn tokenize<const N: usize>(line: &[u8]) -> ([&[u8]; N], usize) {
    let mut toks: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    for t in line.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
        if n < N {
            toks[n] = t;
        }
        n += 1;
    }
    (toks, n)
}

/// Whether a line starts with a meta command word (`m` and one more character, then a
/// space or the end), after memcached's skipping of leading spaces.
pub fn is_meta_line(line: &[u8]) -> bool {
    let (toks, n) = tokenize::<1>(line);
    n > 0 && toks[0].len() == 2 && toks[0][0] == b'm'
}

/// Parse one request line (as returned by `split_line`).
pub fn parse(line: &[u8]) -> Result<MetaRequest<'_>, ParseError> {
    // Room for command, key, length and every flag; more tokens than that is an error
    // for every command that looks at its flags.
    const CAP: usize = MAX_LINE_TOKENS;
    let (toks, n) = tokenize::<CAP>(line);
    if n == 0 || toks[0].len() != 2 || toks[0][0] != b'm' {
        return Err(MetaError::UnknownCommand.into());
    }
    // memcached counts the tokenizer's terminal token too.
    let ntokens = n + 1;
    let command = match toks[0][1] {
        b'g' => MetaCommand::Get,
        b's' => MetaCommand::Set,
        b'd' => MetaCommand::Delete,
        b'a' => MetaCommand::Arith,
        b'n' => MetaCommand::Noop,
        b'e' => MetaCommand::Debug,
        _ => return Err(MetaError::UnknownCommand.into()),
    };
    match command {
        MetaCommand::Noop => Ok(MetaRequest {
            command,
            key: Cow::Borrowed(&[]),
            data_len: 0,
            flags: MetaFlags::new(),
        }),
        MetaCommand::Debug => parse_debug(&toks, n),
        MetaCommand::Get | MetaCommand::Delete | MetaCommand::Arith => {
            if n < 2 {
                return Err(MetaError::UnknownCommand.into());
            }
            let raw_key = toks[1];
            if raw_key.len() > KEY_MAX_LEN {
                return Err(MetaError::BadFormat.into());
            }
            if ntokens > MAX_LINE_TOKENS {
                return Err(if command == MetaCommand::Get {
                    MetaError::GetFlagsTooLong
                } else {
                    MetaError::FlagsTooLong
                }
                .into());
            }
            let (key, flags) = match preparse(raw_key, &toks[2..n], false) {
                Ok(v) => v,
                Err(e) if command == MetaCommand::Get => return Err(e.into()),
                Err(_) => return Err(MetaError::InvalidOrDuplicateFlag.into()),
            };
            match command {
                // md checks its opaque before touching the item; mg and ma only while
                // writing the reply (the executor does that).
                MetaCommand::Delete if flags.opaque_too_long() => {
                    return Err(MetaError::OpaqueTooLong.into())
                }
                MetaCommand::Arith => {
                    flags.arith_mode()?;
                }
                _ => {}
            }
            Ok(MetaRequest {
                command,
                key,
                data_len: 0,
                flags,
            })
        }
        MetaCommand::Set => parse_set(&toks, n),
    }
}

fn parse_debug<'a>(toks: &[&'a [u8]], n: usize) -> Result<MetaRequest<'a>, ParseError> {
    if n < 2 || toks[1].len() > KEY_MAX_LEN {
        return Err(MetaError::BadFormat.into());
    }
    let mut flags = MetaFlags::new();
    let key = if n >= 3 && toks[2] == b"b" {
        flags.base64 = true;
        Cow::Owned(decode_base64_key(toks[1]).ok_or(MetaError::BadFormat)?)
    } else {
        Cow::Borrowed(toks[1])
    };
    Ok(MetaRequest {
        command: MetaCommand::Debug,
        key,
        data_len: 0,
        flags,
    })
}

fn parse_set<'a>(toks: &[&'a [u8]], n: usize) -> Result<MetaRequest<'a>, ParseError> {
    if n < 2 {
        return Err(MetaError::UnknownCommand.into());
    }
    let raw_key = toks[1];
    if raw_key.len() > KEY_MAX_LEN || n == 2 {
        return Err(MetaError::BadFormat.into());
    }
    if n + 1 > MAX_LINE_TOKENS {
        return Err(MetaError::FlagsTooLong.into());
    }
    let vlen = safe_strtol(toks[2]).ok_or(MetaError::BadFormat)?;
    if !(0..=i32::MAX - 2).contains(&vlen) {
        return Err(MetaError::BadFormat.into());
    }
    let data_len = vlen as usize;
    // From here on memcached knows the data length and discards the data on error.
    let swallow = |error| ParseError {
        error,
        swallow: data_len + 2,
    };
    let (key, flags) = preparse(raw_key, &toks[3..n], true).map_err(swallow)?;
    // The mode is judged after the opaque, but its error wins.
    flags.store_mode().map_err(swallow)?;
    if flags.opaque_too_long() {
        return Err(swallow(MetaError::OpaqueTooLong));
    }
    Ok(MetaRequest {
        command: MetaCommand::Set,
        key,
        data_len,
        flags,
    })
}

/// memcached's `_meta_flag_preparse`: one pass over the flag tokens. `is_set`: the
/// command is `ms`, the only one that takes memfabricd's `K`.
fn preparse<'a>(
    raw_key: &'a [u8],
    toks: &[&'a [u8]],
    is_set: bool,
) -> Result<(Cow<'a, [u8]>, MetaFlags<'a>), MetaError> {
    let mut f = MetaFlags::new();
    let mut key = Cow::Borrowed(raw_key);
    let mut seen = [false; 128];
    let mut err = MetaError::BadFormat;
    let mut has_error = false;
    for (i, &tok) in toks.iter().enumerate() {
        // Tokens are never empty, so there is a first byte.
        let c = tok.first().copied().unwrap_or(0);
        if c >= 127 || seen[c as usize] {
            return Err(MetaError::DuplicateFlag);
        }
        seen[c as usize] = true;
        if i < MAX_FLAGS {
            f.tokens[i] = tok;
            f.len = i + 1;
        }
        let arg = &tok[1..];
        match c {
            b'b' => {
                f.base64 = true;
                match decode_base64_key(raw_key) {
                    Some(k) => key = Cow::Owned(k),
                    None => {
                        err = MetaError::KeyDecode;
                        has_error = true;
                    }
                }
            }
            b'N' | b'T' | b'R' => match safe_strtol(arg) {
                Some(v) => match c {
                    b'N' => f.vivify = Some(v),
                    b'T' => f.ttl = Some(v),
                    _ => f.recache = Some(v),
                },
                None => {
                    err = MetaError::BadToken;
                    has_error = true;
                }
            },
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' => {}
            b'v' => f.value = true,
            b'u' => f.no_update = true,
            b'q' => f.quiet = true,
            b'F' => match safe_strtoul(arg) {
                Some(v) => f.client_flags = v,
                // memcached sets no message for a bad F: the previous one stands.
                None => has_error = true,
            },
            b'C' => match safe_strtoull(arg) {
                Some(v) => f.cas = Some(v),
                None => {
                    err = MetaError::BadToken;
                    has_error = true;
                }
            },
            b'M' => {
                if tok.len() != 2 {
                    err = MetaError::ModeLength;
                    has_error = true;
                } else {
                    f.mode = Some(tok[1]);
                }
            }
            b'J' => match safe_strtoull(arg) {
                Some(v) => f.initial = v,
                None => {
                    err = MetaError::BadInitial;
                    has_error = true;
                }
            },
            b'D' => match safe_strtoull(arg) {
                Some(v) => f.delta = v,
                None => {
                    err = MetaError::BadDelta;
                    has_error = true;
                }
            },
            b'I' => f.invalidate = true,
            b'K' if is_set => f.keep_newer_write = true,
            _ => return Err(MetaError::InvalidFlag),
        }
    }
    if has_error {
        Err(err)
    } else {
        Ok((key, f))
    }
}

/// memcached's base64 decoder: bytes outside the alphabet are skipped, `=` counts as a
/// zero digit and as padding, the number of digits must be a multiple of four, decoding
/// stops after the first quad holding padding, and an empty result is a failure.
pub fn decode_base64_key(src: &[u8]) -> Option<Vec<u8>> {
    fn digit(b: u8) -> Option<u8> {
        match b {
            b'A'..=b'Z' => Some(b - b'A'),
            b'a'..=b'z' => Some(b - b'a' + 26),
            b'0'..=b'9' => Some(b - b'0' + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            b'=' => Some(0),
            _ => None,
        }
    }
    let count = src.iter().filter(|&&b| digit(b).is_some()).count();
    if count == 0 || count % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(count / 4 * 3);
    let mut block = [0u8; 4];
    let mut n = 0;
    let mut pad = 0;
    for &b in src {
        let Some(d) = digit(b) else { continue };
        if b == b'=' {
            pad += 1;
        }
        block[n] = d;
        n += 1;
        if n == 4 {
            out.push((block[0] << 2) | (block[1] >> 4));
            out.push((block[1] << 4) | (block[2] >> 2));
            out.push((block[2] << 6) | block[3]);
            n = 0;
            if pad > 0 {
                match pad {
                    1 => out.truncate(out.len() - 1),
                    2 => out.truncate(out.len() - 2),
                    _ => return None,
                }
                break;
            }
        }
    }
    if out.is_empty() {
        None
    } else {
        Some(out)
    }
}

// ----- reply pieces -------------------------------------------------------------------

/// `mn`'s reply.
pub const NOOP_REPLY: &[u8] = b"MN\r\n";
/// Reply line codes.
pub const HD: &[u8] = b"HD";
pub const EN: &[u8] = b"EN";
pub const NS: &[u8] = b"NS";
pub const EX: &[u8] = b"EX";
pub const NF: &[u8] = b"NF";
pub const CRLF: &[u8] = b"\r\n";

/// Append an error line.
pub fn push_error(out: &mut Vec<u8>, e: MetaError) {
    use std::io::Write as _;
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{e}\r\n");
}

/// `VA <len>` (the start of a reply carrying a value).
pub fn push_value_header(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(b"VA ");
    push_u64(out, len as u64);
}

/// ` <c><number>` (a return flag with a number).
pub fn push_flag_u64(out: &mut Vec<u8>, c: u8, v: u64) {
    out.push(b' ');
    out.push(c);
    push_u64(out, v);
}

/// ` <c>` (a bare return flag: W, X, Z).
pub fn push_flag(out: &mut Vec<u8>, c: u8) {
    out.push(b' ');
    out.push(c);
}

/// ` t<remaining>`: the remaining TTL as memcached prints it (`-1` for never). `rel`
/// is memcached's 32-bit `exptime - current_time`, which wraps for a past time.
pub fn push_ttl(out: &mut Vec<u8>, rel: Option<u32>) {
    out.extend_from_slice(b" t");
    match rel {
        None => out.extend_from_slice(b"-1"),
        Some(r) => push_u64(out, r as u64),
    }
}

/// ` <opaque token>` (the token already starts with `O`).
pub fn push_opaque(out: &mut Vec<u8>, tok: &[u8]) {
    out.push(b' ');
    out.extend_from_slice(tok);
}

/// ` k<key>`, or ` k<base64 key> b` for a key that was sent in base64.
pub fn push_key(out: &mut Vec<u8>, key: &[u8], base64: bool) {
    out.extend_from_slice(b" k");
    if base64 {
        push_base64(out, key);
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// Standard base64 with padding (what memcached's encoder writes).
pub fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.resize(
        start + base64::encoded_len(bytes.len(), true).unwrap_or(0),
        0,
    );
    match base64::engine::general_purpose::STANDARD.encode_slice(bytes, &mut out[start..]) {
        Ok(n) => out.truncate(start + n),
        Err(_) => out.truncate(start),
    }
}

/// What `me` prints about an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugInfo {
    /// memcached's `current_time - exptime` (negative while live), -1 for never.
    pub exp: i64,
    /// Seconds since the last access.
    pub la: u64,
    pub cas: u64,
    pub fetched: bool,
    pub class_id: u8,
    /// memcached's total item size (header, key, value, suffix).
    pub size: u64,
}

/// `ME <key> exp=.. la=.. cas=.. fetch=yes|no cls=.. size=..\r\n`.
pub fn push_debug(out: &mut Vec<u8>, key: &[u8], base64: bool, d: &DebugInfo) {
    out.extend_from_slice(b"ME ");
    if base64 {
        push_base64(out, key);
    } else {
        out.extend_from_slice(key);
    }
    out.extend_from_slice(b" exp=");
    push_i64(out, d.exp);
    out.extend_from_slice(b" la=");
    push_u64(out, d.la);
    out.extend_from_slice(b" cas=");
    push_u64(out, d.cas);
    out.extend_from_slice(if d.fetched {
        b" fetch=yes".as_slice()
    } else {
        b" fetch=no".as_slice()
    });
    out.extend_from_slice(b" cls=");
    push_u64(out, d.class_id as u64);
    out.extend_from_slice(b" size=");
    push_u64(out, d.size);
    out.extend_from_slice(CRLF);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(line: &str) -> MetaRequest<'_> {
        match parse(line.as_bytes()) {
            Ok(r) => r,
            Err(e) => panic!("{line:?} was rejected: {e:?}"),
        }
    }

    fn err(line: &str) -> MetaError {
        match parse(line.as_bytes()) {
            Ok(r) => panic!("{line:?} was accepted: {r:?}"),
            Err(e) => e.error,
        }
    }

    fn err_swallow(line: &str) -> (MetaError, usize) {
        match parse(line.as_bytes()) {
            Ok(r) => panic!("{line:?} was accepted: {r:?}"),
            Err(e) => (e.error, e.swallow),
        }
    }

    // ----- framing ----------------------------------------------------------------

    #[test]
    fn split_line_strips_crlf_or_lf() {
        assert_eq!(split_line(b"mg a\r\nrest"), Some((&b"mg a"[..], 6)));
        assert_eq!(split_line(b"mg a\nrest"), Some((&b"mg a"[..], 5)));
        assert_eq!(split_line(b"mg a"), None);
    }

    #[test]
    fn split_line_cuts_at_nul_like_a_c_string() {
        assert_eq!(split_line(b"mg a v\0 junk\r\n"), Some((&b"mg a v"[..], 14)));
    }

    #[test]
    fn one_byte_line_keeps_its_cr() {
        assert_eq!(split_line(b"\r\n"), Some((&b"\r"[..], 2)));
    }

    #[test]
    fn meta_lines_are_m_plus_one_character() {
        assert!(is_meta_line(b"mg foo"));
        assert!(is_meta_line(b"  mn"));
        assert!(is_meta_line(b"mx"));
        assert!(!is_meta_line(b"mget foo"));
        assert!(!is_meta_line(b"get foo"));
        assert!(!is_meta_line(b""));
    }

    // ----- commands ---------------------------------------------------------------

    #[test]
    fn mn_ignores_its_arguments() {
        assert_eq!(ok("mn").command, MetaCommand::Noop);
        assert_eq!(ok("mn foo bar").command, MetaCommand::Noop);
    }

    #[test]
    fn unknown_meta_word_is_error() {
        assert_eq!(err("mx foo"), MetaError::UnknownCommand);
        assert_eq!(err("mgg foo"), MetaError::UnknownCommand);
        assert_eq!(err(""), MetaError::UnknownCommand);
    }

    #[test]
    fn command_without_key_is_error() {
        for c in ["mg", "ms", "md", "ma"] {
            assert_eq!(err(c), MetaError::UnknownCommand, "{c}");
        }
    }

    #[test]
    fn me_without_key_is_bad_format() {
        assert_eq!(err("me"), MetaError::BadFormat);
    }

    #[test]
    fn extra_spaces_separate_nothing() {
        let r = ok("  mg   foo   v  t ");
        assert_eq!(&*r.key, b"foo");
        assert_eq!(r.flags.tokens(), &[&b"v"[..], &b"t"[..]]);
    }

    #[test]
    fn tab_is_part_of_a_token() {
        // "foo\tt" is the key; memcached splits only on spaces.
        let r = ok("mg foo\tt");
        assert_eq!(&*r.key, b"foo\tt");
    }

    // ----- keys -------------------------------------------------------------------

    #[test]
    fn key_of_250_bytes_is_accepted_251_is_not() {
        let k250 = "a".repeat(250);
        let k251 = "a".repeat(251);
        assert_eq!(ok(&format!("mg {k250} v")).key.len(), 250);
        for c in ["mg", "md", "ma", "me"] {
            assert_eq!(err(&format!("{c} {k251}")), MetaError::BadFormat, "{c}");
        }
        assert_eq!(
            err_swallow(&format!("ms {k251} 1")),
            (MetaError::BadFormat, 0)
        );
    }

    #[test]
    fn base64_key_is_decoded() {
        let r = ok("mg Zm9v b k v");
        assert_eq!(&*r.key, b"foo");
        assert!(r.flags.base64);
    }

    #[test]
    fn bad_base64_key_is_a_decoding_error() {
        assert_eq!(err("mg Zm9 b"), MetaError::KeyDecode);
        assert_eq!(err("mg Zm9v= b"), MetaError::KeyDecode);
        assert_eq!(err("mg @@@@ b"), MetaError::KeyDecode);
        assert_eq!(err_swallow("ms Zm9 2 b"), (MetaError::KeyDecode, 4));
        assert_eq!(err("md Zm9 b"), MetaError::InvalidOrDuplicateFlag);
        assert_eq!(err("ma Zm9 b"), MetaError::InvalidOrDuplicateFlag);
    }

    #[test]
    fn base64_decoder_is_as_lenient_as_memcacheds() {
        assert_eq!(decode_base64_key(b"Zm9v@").as_deref(), Some(&b"foo"[..]));
        assert_eq!(
            decode_base64_key(b"Zm9vYg==Zm9v").as_deref(),
            Some(&b"foob"[..])
        );
        assert_eq!(decode_base64_key(b"Zg==").as_deref(), Some(&b"f"[..]));
        assert_eq!(
            decode_base64_key(b"Z=9v").as_deref(),
            Some(&[0x64, 0x0f][..])
        );
        assert_eq!(decode_base64_key(b"===="), None);
        assert_eq!(decode_base64_key(b"A==="), None);
        assert_eq!(decode_base64_key(b""), None);
    }

    #[test]
    fn me_decodes_only_when_second_token_is_exactly_b() {
        let r = ok("me Zm9v b");
        assert_eq!(&*r.key, b"foo");
        assert!(r.flags.base64);
        let r = ok("me Zm9v bx");
        assert_eq!(&*r.key, b"Zm9v");
        assert_eq!(err("me foo b"), MetaError::BadFormat);
    }

    // ----- mg flags ---------------------------------------------------------------

    #[test]
    fn mg_bare_return_flags_are_kept_in_order() {
        let r = ok("mg foo s v f t c h l k O123 q u");
        let toks: Vec<&[u8]> = r.flags.tokens().to_vec();
        assert_eq!(
            toks,
            ["s", "v", "f", "t", "c", "h", "l", "k", "O123", "q", "u"]
                .iter()
                .map(|s| s.as_bytes())
                .collect::<Vec<_>>()
        );
        assert!(r.flags.value && r.flags.quiet && r.flags.no_update);
        assert!(r.flags.has(b'k') && !r.flags.has(b'b'));
    }

    #[test]
    fn mg_numeric_flags_are_parsed() {
        let r = ok("mg foo N30 R10 T-1");
        assert_eq!(r.flags.vivify, Some(30));
        assert_eq!(r.flags.recache, Some(10));
        assert_eq!(r.flags.ttl, Some(-1));
    }

    #[test]
    fn ttl_is_truncated_to_32_bits_like_memcached() {
        assert_eq!(ok("mg k T4294967306").flags.ttl, Some(10));
        assert_eq!(ok("mg k T2147483648").flags.ttl, Some(i32::MIN));
    }

    #[test]
    fn bad_numeric_tokens_are_bad_token() {
        assert_eq!(err("mg foo Tabc"), MetaError::BadToken);
        assert_eq!(err("mg foo N"), MetaError::BadToken);
        assert_eq!(err("mg foo R1x"), MetaError::BadToken);
        assert_eq!(err("mg foo T99999999999999999999"), MetaError::BadToken);
    }

    #[test]
    fn unknown_flag_is_invalid_flag() {
        assert_eq!(err("mg foo E5"), MetaError::InvalidFlag);
        assert_eq!(err("mg foo x"), MetaError::InvalidFlag);
        assert_eq!(err("mg foo 1"), MetaError::InvalidFlag);
    }

    #[test]
    fn repeated_flag_is_duplicate() {
        assert_eq!(err("mg foo s s"), MetaError::DuplicateFlag);
        assert_eq!(err("mg foo O1 O2"), MetaError::DuplicateFlag);
        assert_eq!(err("md foo q q"), MetaError::InvalidOrDuplicateFlag);
    }

    #[test]
    fn non_ascii_flag_is_reported_as_duplicate() {
        assert_eq!(err("mg foo \u{7f}"), MetaError::DuplicateFlag);
        assert_eq!(
            parse(b"mg foo \xff").map_err(|e| e.error),
            Err(MetaError::DuplicateFlag)
        );
    }

    #[test]
    fn duplicate_after_bad_token_reports_duplicate() {
        assert_eq!(err("mg foo Tabc s s"), MetaError::DuplicateFlag);
    }

    #[test]
    fn last_error_message_wins() {
        assert_eq!(err("mg foo Tabc Zm"), MetaError::InvalidFlag);
        assert_eq!(err("ma foo Dabc Jabc"), MetaError::InvalidOrDuplicateFlag);
        assert_eq!(err_swallow("ms foo 1 Tabc Fabc").0, MetaError::BadToken);
        assert_eq!(err_swallow("ms foo 1 Fabc").0, MetaError::BadFormat);
        assert_eq!(err_swallow("ms foo 1 Fabc Cx").0, MetaError::BadToken);
    }

    #[test]
    fn seventeen_flags_fit_eighteen_do_not() {
        let f17: Vec<String> = (0..17).map(|i| format!("O{i}")).collect();
        // Duplicate O, but the count is judged first only when over the limit.
        assert_eq!(
            err(&format!("mg k {}", f17.join(" "))),
            MetaError::DuplicateFlag
        );
        let ok17 = "k v s t c f h l u q O1 N1 R1 T1 P L b";
        assert!(parse(format!("mg Zm9v {ok17}").as_bytes()).is_ok());
        assert_eq!(
            err(&format!("mg Zm9v {ok17} I")),
            MetaError::GetFlagsTooLong
        );
        assert_eq!(err(&format!("md Zm9v {ok17} I")), MetaError::FlagsTooLong);
        assert_eq!(err(&format!("ma Zm9v {ok17} I")), MetaError::FlagsTooLong);
    }

    #[test]
    fn ms_allows_sixteen_flags() {
        let f16 = "k s t c f h l u q O1 N1 R1 T1 P L I";
        assert!(parse(format!("ms foo 1 {f16}").as_bytes()).is_ok());
        assert_eq!(
            err_swallow(&format!("ms foo 1 {f16} b")),
            (MetaError::FlagsTooLong, 0)
        );
    }

    // ----- ms ---------------------------------------------------------------------

    #[test]
    fn ms_reads_length_and_flags() {
        let r = ok("ms foo 5 F7 T100 C12 I q k c O9 MA");
        assert_eq!(r.command, MetaCommand::Set);
        assert_eq!(r.data_len, 5);
        assert_eq!(r.flags.client_flags, 7);
        assert_eq!(r.flags.ttl, Some(100));
        assert_eq!(r.flags.cas, Some(12));
        assert!(r.flags.invalidate && r.flags.quiet);
        assert_eq!(r.flags.store_mode(), Ok(StoreMode::Append));
    }

    #[test]
    fn ms_modes_map_to_storage_commands() {
        for (m, want) in [
            ("S", StoreMode::Set),
            ("E", StoreMode::Add),
            ("A", StoreMode::Append),
            ("P", StoreMode::Prepend),
            ("R", StoreMode::Replace),
        ] {
            assert_eq!(ok(&format!("ms k 1 M{m}")).flags.store_mode(), Ok(want));
        }
        assert_eq!(ok("ms k 1").flags.store_mode(), Ok(StoreMode::Set));
    }

    #[test]
    fn ms_without_length_is_bad_format_and_swallows_nothing() {
        assert_eq!(err_swallow("ms foo"), (MetaError::BadFormat, 0));
    }

    #[test]
    fn ms_bad_length_is_bad_format_and_swallows_nothing() {
        assert_eq!(err_swallow("ms foo -1"), (MetaError::BadFormat, 0));
        assert_eq!(err_swallow("ms foo abc"), (MetaError::BadFormat, 0));
        assert_eq!(err_swallow("ms foo S2"), (MetaError::BadFormat, 0));
        assert_eq!(err_swallow("ms foo 2147483646"), (MetaError::BadFormat, 0));
    }

    #[test]
    fn ms_length_is_truncated_to_32_bits() {
        assert_eq!(ok("ms foo 4294967297").data_len, 1);
        assert_eq!(ok("ms foo +1").data_len, 1);
        assert_eq!(ok("ms foo 2147483645").data_len, 2147483645);
    }

    #[test]
    fn ms_flag_errors_swallow_the_data() {
        assert_eq!(err_swallow("ms k 2 Z"), (MetaError::InvalidFlag, 4));
        assert_eq!(err_swallow("ms k 2 F1 F2"), (MetaError::DuplicateFlag, 4));
        assert_eq!(err_swallow("ms k 2 Tabc"), (MetaError::BadToken, 4));
        assert_eq!(err_swallow("ms k 2 Cabc"), (MetaError::BadToken, 4));
        assert_eq!(err_swallow("ms k 2 F-1"), (MetaError::BadFormat, 4));
        assert_eq!(err_swallow("ms k 2 MX"), (MetaError::BadStoreMode, 4));
        assert_eq!(err_swallow("ms k 2 MEE"), (MetaError::ModeLength, 4));
        assert_eq!(err_swallow("ms k 2 M"), (MetaError::ModeLength, 4));
    }

    #[test]
    fn ms_opaque_too_long_swallows_but_bad_mode_wins() {
        let o = format!("O{}", "x".repeat(32));
        assert_eq!(
            err_swallow(&format!("ms k 2 {o}")),
            (MetaError::OpaqueTooLong, 4)
        );
        assert_eq!(
            err_swallow(&format!("ms k 2 {o} MZ")),
            (MetaError::BadStoreMode, 4)
        );
        let o32 = format!("O{}", "x".repeat(31));
        assert!(parse(format!("ms k 2 {o32}").as_bytes()).is_ok());
    }

    #[test]
    fn ms_client_flags_wrap_like_strtoul() {
        assert_eq!(ok("ms k 1 F4294967297").flags.client_flags, 1);
        assert_eq!(
            ok("ms k 1 F18446744073709551615").flags.client_flags,
            u32::MAX
        );
        assert_eq!(
            err_swallow("ms k 1 F18446744073709551616").0,
            MetaError::BadFormat
        );
        assert_eq!(ok("ms k 1 F+7").flags.client_flags, 7);
    }

    #[test]
    fn ms_s_flag_is_not_a_1_6_18_flag() {
        assert_eq!(err_swallow("ms k 2 S2"), (MetaError::InvalidFlag, 4));
    }

    // ----- md ---------------------------------------------------------------------

    #[test]
    fn md_reads_its_flags() {
        let r = ok("md foo C5 I T30 q k O1");
        assert_eq!(r.command, MetaCommand::Delete);
        assert_eq!(r.flags.cas, Some(5));
        assert!(r.flags.invalidate);
        assert_eq!(r.flags.ttl, Some(30));
    }

    #[test]
    fn md_flag_errors_are_invalid_or_duplicate() {
        assert_eq!(err("md foo x"), MetaError::InvalidOrDuplicateFlag);
        assert_eq!(err("md foo Tabc"), MetaError::InvalidOrDuplicateFlag);
        assert_eq!(err("md foo E5"), MetaError::InvalidOrDuplicateFlag);
    }

    #[test]
    fn md_checks_opaque_length_while_parsing() {
        let o = format!("O{}", "x".repeat(32));
        assert_eq!(err(&format!("md k {o}")), MetaError::OpaqueTooLong);
    }

    // ----- ma ---------------------------------------------------------------------

    #[test]
    fn ma_defaults_to_incr_by_one() {
        let r = ok("ma foo");
        assert_eq!(r.flags.delta, 1);
        assert_eq!(r.flags.initial, 0);
        assert_eq!(r.flags.arith_mode(), Ok(ArithMode::Incr));
    }

    #[test]
    fn ma_reads_its_flags() {
        let r = ok("ma foo N30 J42 D18446744073709551615 MD T5 q t c v k O1 C9");
        assert_eq!(r.flags.vivify, Some(30));
        assert_eq!(r.flags.initial, 42);
        assert_eq!(r.flags.delta, u64::MAX);
        assert_eq!(r.flags.arith_mode(), Ok(ArithMode::Decr));
        assert_eq!(r.flags.cas, Some(9));
    }

    #[test]
    fn ma_delta_sign_is_looked_for_in_its_own_token_only() {
        // As memcached 1.6.18: a '-' in another token does not matter, one in the same
        // token (after a tab, which does not split tokens) does.
        assert_eq!(ok("ma k D18446744073709551615 O-x").flags.delta, u64::MAX);
        assert_eq!(
            err("ma k D18446744073709551615\t-x"),
            MetaError::InvalidOrDuplicateFlag
        );
        assert_eq!(ok("ma k D5\t-x").flags.delta, 5);
    }

    #[test]
    fn ma_modes() {
        for (m, want) in [
            ("I", ArithMode::Incr),
            ("+", ArithMode::Incr),
            ("D", ArithMode::Decr),
            ("-", ArithMode::Decr),
        ] {
            assert_eq!(ok(&format!("ma k M{m}")).flags.arith_mode(), Ok(want));
        }
        assert_eq!(err("ma k MX"), MetaError::BadArithMode);
        assert_eq!(err("ma k Mx"), MetaError::BadArithMode);
        assert_eq!(err("ma k MII"), MetaError::InvalidOrDuplicateFlag);
    }

    #[test]
    fn ma_flag_errors_are_invalid_or_duplicate() {
        for l in [
            "ma k Dabc",
            "ma k D-1",
            "ma k Jabc",
            "ma k Nabc",
            "ma k Z",
            "ma k q q",
        ] {
            assert_eq!(err(l), MetaError::InvalidOrDuplicateFlag, "{l}");
        }
    }

    #[test]
    fn ma_opaque_is_judged_by_the_executor() {
        let o = format!("O{}", "x".repeat(32));
        let line = format!("ma k {o}");
        assert!(ok(&line).flags.opaque_too_long());
    }

    // ----- encoders ---------------------------------------------------------------

    #[test]
    fn errors_print_memcacheds_lines() {
        let mut out = Vec::new();
        push_error(&mut out, MetaError::OpaqueTooLong);
        assert_eq!(out, b"CLIENT_ERROR opaque token too long\r\n");
        assert_eq!(MetaError::UnknownCommand.to_string(), "ERROR");
    }

    #[test]
    fn key_flag_is_base64_with_b_suffix_for_binary_keys() {
        let mut out = Vec::new();
        push_key(&mut out, b"foob", true);
        assert_eq!(out, b" kZm9vYg== b");
        out.clear();
        push_key(&mut out, b"foo", false);
        assert_eq!(out, b" kfoo");
    }

    #[test]
    fn reply_pieces_concatenate_into_a_meta_reply() {
        let mut out = Vec::new();
        push_value_header(&mut out, 2);
        push_flag_u64(&mut out, b's', 2);
        push_ttl(&mut out, None);
        push_ttl(&mut out, Some(30));
        push_opaque(&mut out, b"O9");
        push_flag(&mut out, b'W');
        out.extend_from_slice(CRLF);
        assert_eq!(out, b"VA 2 s2 t-1 t30 O9 W\r\n");
    }

    #[test]
    fn debug_line_matches_memcacheds_format() {
        let mut out = Vec::new();
        let d = DebugInfo {
            exp: -9,
            la: 1,
            cas: 1,
            fetched: true,
            class_id: 1,
            size: 61,
        };
        push_debug(&mut out, b"a", false, &d);
        assert_eq!(out, b"ME a exp=-9 la=1 cas=1 fetch=yes cls=1 size=61\r\n");
    }

    #[test]
    fn numbers_print_in_decimal() {
        let mut out = Vec::new();
        push_u64(&mut out, 0);
        out.push(b' ');
        push_u64(&mut out, u64::MAX);
        out.push(b' ');
        push_i64(&mut out, i64::MIN);
        assert_eq!(out, b"0 18446744073709551615 -9223372036854775808");
    }

    // ----- properties -------------------------------------------------------------

    /// Parse everything in `input` line by line (what a framing layer would do).
    fn parse_all(input: &[u8]) -> Vec<Result<MetaRequest<'_>, ParseError>> {
        let mut res = Vec::new();
        let mut at = 0;
        while let Some((line, used)) = split_line(&input[at..]) {
            res.push(parse(line));
            at += used;
        }
        res
    }

    fn meta_line() -> impl Strategy<Value = Vec<u8>> {
        let word = prop::sample::select(vec!["mg", "ms", "md", "ma", "mn", "me", "mx"]);
        let tok = prop::sample::select(vec![
            "foo", "Zm9v", "5", "-1", "b", "c", "f", "h", "k", "l", "q", "s", "t", "u", "v", "O1",
            "N30", "R5", "T0", "Tx", "C3", "F9", "I", "MA", "MD", "ME", "J4", "D2", "E1", "x",
            "  ",
        ]);
        (word, prop::collection::vec(tok, 0..24)).prop_map(|(w, toks)| {
            let mut l = w.as_bytes().to_vec();
            for t in toks {
                l.push(b' ');
                l.extend_from_slice(t.as_bytes());
            }
            l.extend_from_slice(b"\r\n");
            l
        })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&input);
            let _ = parse_all(&input);
            let _ = is_meta_line(&input);
            let _ = decode_base64_key(&input);
        }

        #[test]
        fn meta_like_lines_never_panic(lines in prop::collection::vec(meta_line(), 1..8)) {
            let input: Vec<u8> = lines.concat();
            for req in parse_all(&input).into_iter().flatten() {
                prop_assert!(req.flags.tokens().len() <= MAX_FLAGS);
                prop_assert!(req.key.len() <= KEY_MAX_LEN);
            }
        }

        #[test]
        fn splitting_input_anywhere_gives_the_same_requests(
            lines in prop::collection::vec(meta_line(), 1..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let input: Vec<u8> = lines.concat();
            let whole = parse_all(&input);
            // Feed a prefix, keep what was not used, then append the rest: the framing a
            // connection does when the input arrives in two reads.
            let cut = cut.index(input.len() + 1);
            let mut pending = input[..cut].to_vec();
            let mut got: Vec<String> = Vec::new();
            let drain = |buf: &mut Vec<u8>, got: &mut Vec<String>| {
                let mut at = 0;
                while let Some((line, used)) = split_line(&buf[at..]) {
                    got.push(format!("{:?}", parse(line)));
                    at += used;
                }
                buf.drain(..at);
            };
            drain(&mut pending, &mut got);
            pending.extend_from_slice(&input[cut..]);
            drain(&mut pending, &mut got);
            let want: Vec<String> = whole.iter().map(|r| format!("{r:?}")).collect();
            prop_assert_eq!(got, want);
            prop_assert!(pending.is_empty());
        }

        #[test]
        fn base64_round_trips_through_memcacheds_decoder(
            key in prop::collection::vec(any::<u8>(), 1..187)
        ) {
            let mut enc = Vec::new();
            push_base64(&mut enc, &key);
            prop_assert_eq!(decode_base64_key(&enc), Some(key));
        }

        #[test]
        fn strtoull_agrees_with_rust_on_plain_digits(v in any::<u64>()) {
            prop_assert_eq!(safe_strtoull(v.to_string().as_bytes()), Some(v));
        }

        #[test]
        fn strtol_truncates_like_c(v in any::<i64>()) {
            prop_assert_eq!(safe_strtol(v.to_string().as_bytes()), Some(v as i32));
        }
    }
}
