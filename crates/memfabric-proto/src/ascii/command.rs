//! Command parsing: one tokenized line to a typed request, command by command, with
//! memcached's token-count checks and error replies.

use super::tokens::{tokenize, Tokens};
use super::*;
use crate::number::{safe_strtod, safe_strtol, safe_strtoul, safe_strtoull};

/// A storage command line, waiting for its data block.
pub(super) struct StoreHeader<'a> {
    pub(super) cmd: StoreCmd,
    pub(super) key: &'a [u8],
    pub(super) flags: u32,
    pub(super) exptime: i32,
    pub(super) vlen: usize,
    pub(super) cas: u64,
    pub(super) noreply: bool,
}

pub(super) enum Line<'a> {
    Done(Request<'a>),
    Storage(StoreHeader<'a>),
    /// An HTTP request line: memcached closes the connection.
    Http,
}

fn invalid<'a>(verb: Verb, error: ErrorReply, noreply: bool) -> Line<'a> {
    Line::Done(Request::Invalid {
        verb,
        error,
        noreply,
    })
}

fn unknown<'a>() -> Line<'a> {
    invalid(Verb::Unknown, ErrorReply::Error, false)
}

/// memcached's `WANT_TOKENS`-style checks are on `ntokens` = tokens + 1.
fn ntokens(t: &Tokens<'_>) -> usize {
    t.len() + 1
}

/// Parse one command line (without its newline; see `command_text`). A storage command
/// is returned as a header: `parse` reads its data block.
pub(super) fn parse_line(line: &[u8]) -> Line<'_> {
    let t = tokenize(line);
    let n = ntokens(&t);
    let cmd = t.get(0);
    if n < 2 || cmd.len() < 2 {
        return unknown();
    }
    if cmd[0] == b'm' && cmd.len() == 2 {
        return match cmd[1] {
            b'g' | b's' | b'd' | b'n' | b'a' | b'e' => Line::Done(Request::Meta),
            _ => unknown(),
        };
    }
    match cmd {
        b"get" | b"gets" | b"gat" | b"gats" | b"bget" => retrieval(line, &t),
        b"set" => update(&t, StoreCmd::Set),
        b"add" => update(&t, StoreCmd::Add),
        b"replace" => update(&t, StoreCmd::Replace),
        b"append" => update(&t, StoreCmd::Append),
        b"prepend" => update(&t, StoreCmd::Prepend),
        b"cas" => update(&t, StoreCmd::Cas),
        b"incr" => arith(&t, true),
        b"decr" => arith(&t, false),
        b"touch" => touch(&t),
        b"delete" => delete(&t),
        b"flush_all" => flush_all(&t),
        b"stats" => Line::Done(stats(&t)),
        b"version" => Line::Done(Request::Version),
        b"quit" => Line::Done(Request::Quit),
        b"verbosity" => verbosity(&t),
        b"shutdown" => Line::Done(Request::Shutdown {
            graceful: match (n, t.get(1)) {
                (2, _) => Some(false),
                (3, b"graceful") => Some(true),
                _ => None,
            },
        }),
        b"cache_memlimit" => cache_memlimit(&t),
        b"slabs" => slabs(&t),
        b"lru_crawler" => lru_crawler(&t),
        b"lru" => lru(&t),
        b"watch" => Line::Done(Request::Watch {
            noreply: t.noreply(),
        }),
        b"refresh_certs" => Line::Done(Request::RefreshCerts {
            noreply: t.noreply(),
        }),
        // memcached built with extstore (Debian's) takes these with or without a flash
        // tier: a setting and a value (more tokens are ignored), else ERROR.
        b"extstore" if ntokens(&t) >= 4 => Line::Done(Request::Extstore {
            setting: t.get(1),
            value: t.get(2),
        }),
        b"extstore" => unknown(),
        // memcached dispatches on the first letter before comparing names: an unknown
        // command starting with one of these letters is a plain ERROR.
        _ if b"gsacidt".contains(&cmd[0]) => unknown(),
        // Only the remaining unknown commands are checked for an HTTP request line.
        // (misbehave and debugtime exist only in debug builds of memcached.)
        _ if t.get(t.len() - 1).starts_with(b"HTTP/") => Line::Http,
        _ => unknown(),
    }
}

/// get, gets, gat, gats, bget.
fn retrieval<'a>(line: &'a [u8], t: &Tokens<'a>) -> Line<'a> {
    let cmd = t.get(0);
    if ntokens(t) < 3 {
        return unknown();
    }
    let touch = cmd == b"gat" || cmd == b"gats";
    let cas = cmd == b"gets" || cmd == b"gats";
    let first_key = if touch { 2 } else { 1 };
    let keys = Keys::new(skip_tokens(line, first_key));
    if touch {
        match safe_strtol(t.get(1)) {
            Some(exptime) => Line::Done(Request::Gat { exptime, keys, cas }),
            None => invalid(
                if cas { Verb::Gats } else { Verb::Gat },
                ErrorReply::InvalidExptime,
                false,
            ),
        }
    } else {
        Line::Done(Request::Get { keys, cas })
    }
}

/// The text of `line` after its first `n` space-separated tokens.
fn skip_tokens(line: &[u8], n: usize) -> &[u8] {
    let mut rest = line;
    for _ in 0..n {
        let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
        rest = &rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        rest = &rest[end..];
    }
    rest
}

/// set, add, replace, append, prepend, cas.
fn update<'a>(t: &Tokens<'a>, cmd: StoreCmd) -> Line<'a> {
    let n = ntokens(t);
    let ok_tokens = if cmd == StoreCmd::Cas {
        n == 7 || n == 8
    } else {
        n == 6 || n == 7
    };
    if !ok_tokens {
        return unknown();
    }
    let noreply = t.noreply();
    let verb = Verb::Store(cmd);
    let key = t.get(1);
    if key.len() > KEY_MAX_LEN {
        return invalid(verb, ErrorReply::BadFormat, noreply);
    }
    let (Some(flags), Some(exptime), Some(vlen)) = (
        safe_strtoul(t.get(2)),
        safe_strtol(t.get(3)),
        safe_strtol(t.get(4)),
    ) else {
        return invalid(verb, ErrorReply::BadFormat, noreply);
    };
    let cas = if cmd == StoreCmd::Cas {
        match safe_strtoull(t.get(5)) {
            Some(c) => c,
            None => return invalid(verb, ErrorReply::BadFormat, noreply),
        }
    } else {
        0
    };
    if !(0..=i32::MAX - 2).contains(&vlen) {
        return invalid(verb, ErrorReply::BadFormat, noreply);
    }
    Line::Storage(StoreHeader {
        cmd,
        key,
        flags,
        exptime,
        vlen: vlen as usize,
        cas,
        noreply,
    })
}

fn arith<'a>(t: &Tokens<'a>, incr: bool) -> Line<'a> {
    let n = ntokens(t);
    if n != 4 && n != 5 {
        return unknown();
    }
    let verb = if incr { Verb::Incr } else { Verb::Decr };
    let noreply = t.noreply();
    let key = t.get(1);
    if key.len() > KEY_MAX_LEN {
        return invalid(verb, ErrorReply::BadFormat, noreply);
    }
    match safe_strtoull(t.get(2)) {
        Some(delta) => Line::Done(Request::Arith {
            incr,
            key,
            delta,
            noreply,
        }),
        None => invalid(verb, ErrorReply::InvalidDelta, noreply),
    }
}

fn touch<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    if n != 4 && n != 5 {
        return unknown();
    }
    let noreply = t.noreply();
    let key = t.get(1);
    if key.len() > KEY_MAX_LEN {
        return invalid(Verb::Touch, ErrorReply::BadFormat, noreply);
    }
    match safe_strtol(t.get(2)) {
        Some(exptime) => Line::Done(Request::Touch {
            key,
            exptime,
            noreply,
        }),
        None => invalid(Verb::Touch, ErrorReply::InvalidExptime, noreply),
    }
}

fn delete<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    if !(3..=5).contains(&n) {
        return unknown();
    }
    let mut noreply = false;
    if n > 3 {
        // memcached still accepts the pre-1.4 hold time, but only "0".
        let hold_is_zero = t.get(2) == b"0";
        noreply = t.noreply();
        let valid = (n == 4 && (hold_is_zero || noreply)) || (n == 5 && hold_is_zero && noreply);
        if !valid {
            return invalid(Verb::Delete, ErrorReply::DeleteUsage, noreply);
        }
    }
    let key = t.get(1);
    if key.len() > KEY_MAX_LEN {
        return invalid(Verb::Delete, ErrorReply::BadFormat, noreply);
    }
    Line::Done(Request::Delete { key, noreply })
}

fn flush_all<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    if !(2..=4).contains(&n) {
        return unknown();
    }
    let noreply = t.noreply();
    let mut delay = 0;
    if n != if noreply { 3 } else { 2 } {
        match safe_strtol(t.get(1)) {
            Some(d) => delay = d,
            None => return invalid(Verb::FlushAll, ErrorReply::InvalidExptime, noreply),
        }
    }
    Line::Done(Request::FlushAll { delay, noreply })
}

fn stats<'a>(t: &Tokens<'a>) -> Request<'a> {
    if ntokens(t) == 2 {
        return Request::Stats(StatsRequest::General);
    }
    Request::Stats(match t.get(1) {
        b"reset" => StatsRequest::Reset,
        b"detail" => {
            // memcached only reads the argument when there are at least 4 tokens.
            let arg = if ntokens(t) < 4 { &b""[..] } else { t.get(2) };
            match arg {
                b"on" => StatsRequest::Detail(DetailCmd::On),
                b"off" => StatsRequest::Detail(DetailCmd::Off),
                b"dump" => StatsRequest::Detail(DetailCmd::Dump),
                _ => {
                    return Request::Invalid {
                        verb: Verb::Stats,
                        error: ErrorReply::StatsDetailUsage,
                        noreply: false,
                    }
                }
            }
        }
        b"cachedump" => StatsRequest::Cachedump((ntokens(t) >= 5).then(|| (t.get(2), t.get(3)))),
        group => StatsRequest::Group(group),
    })
}

fn verbosity<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    if n != 3 && n != 4 {
        return unknown();
    }
    let noreply = t.noreply();
    match safe_strtoul(t.get(1)) {
        Some(level) => Line::Done(Request::Verbosity { level, noreply }),
        None => invalid(Verb::Verbosity, ErrorReply::BadFormat, noreply),
    }
}

fn cache_memlimit<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    if n != 3 && n != 4 {
        return unknown();
    }
    let noreply = t.noreply();
    match safe_strtoul(t.get(1)) {
        Some(megabytes) => Line::Done(Request::CacheMemlimit { megabytes, noreply }),
        None => invalid(Verb::CacheMemlimit, ErrorReply::Error, noreply),
    }
}

fn slabs<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    if n == 5 && t.get(1) == b"reassign" {
        let classes = safe_strtol(t.get(2)).zip(safe_strtol(t.get(3)));
        return Line::Done(Request::SlabsReassign { classes });
    }
    if n >= 4 && t.get(1) == b"automove" {
        let noreply = t.noreply();
        let setting = if t.get(2) == b"ratio" {
            match (n >= 5).then(|| safe_strtod(t.get(3))).flatten() {
                Some(r) => Automove::Ratio(r),
                None => return invalid(Verb::Slabs, ErrorReply::Error, noreply),
            }
        } else {
            match safe_strtoul(t.get(2)) {
                Some(level @ 0..=2) => Automove::Level(level),
                Some(_) => return invalid(Verb::Slabs, ErrorReply::Error, noreply),
                None => return invalid(Verb::Slabs, ErrorReply::BadFormat, noreply),
            }
        };
        return Line::Done(Request::SlabsAutomove { setting, noreply });
    }
    invalid(Verb::Slabs, ErrorReply::Error, false)
}

fn lru_crawler<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    let sub = t.get(1);
    let req = match (n, sub) {
        (4, b"crawl") => LruCrawlerRequest::Crawl(t.get(2)),
        (4, b"metadump") => LruCrawlerRequest::Metadump(t.get(2)),
        (4, b"tocrawl") => match safe_strtoul(t.get(2)) {
            Some(v) => LruCrawlerRequest::Tocrawl(v),
            None => return invalid(Verb::LruCrawler, ErrorReply::BadFormat, false),
        },
        (4, b"sleep") => match safe_strtoul(t.get(2)) {
            Some(v) if v > 1_000_000 => {
                return invalid(Verb::LruCrawler, ErrorReply::CrawlerSleepTooLong, false)
            }
            Some(v) => LruCrawlerRequest::Sleep(v),
            None => return invalid(Verb::LruCrawler, ErrorReply::BadFormat, false),
        },
        (3, b"enable") => LruCrawlerRequest::Enable,
        (3, b"disable") => LruCrawlerRequest::Disable,
        _ => return invalid(Verb::LruCrawler, ErrorReply::Error, false),
    };
    Line::Done(Request::LruCrawler(req))
}

fn lru<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    if n < 3 {
        return unknown();
    }
    let noreply = t.noreply();
    let sub = t.get(1);
    if sub == b"tune" && n >= 7 {
        let parsed = (
            safe_strtoul(t.get(2)),
            safe_strtoul(t.get(3)),
            safe_strtod(t.get(4)),
            safe_strtod(t.get(5)),
        );
        let (Some(pct_hot), Some(pct_warm), Some(hot_factor), Some(warm_factor)) = parsed else {
            return invalid(Verb::Lru, ErrorReply::Error, noreply);
        };
        // memcached adds the two as 32-bit unsigned numbers.
        if pct_hot.wrapping_add(pct_warm) > 80 {
            return invalid(Verb::Lru, ErrorReply::LruPercents, noreply);
        }
        // Written so that NaN factors are refused as well.
        if !(warm_factor > 0.0 && hot_factor > 0.0) {
            return invalid(Verb::Lru, ErrorReply::LruFactors, noreply);
        }
        return Line::Done(Request::LruTune {
            pct_hot,
            pct_warm,
            hot_factor,
            warm_factor,
            noreply,
        });
    }
    if sub == b"mode" && n >= 4 {
        let segmented = match t.get(2) {
            b"flat" => Some(false),
            b"segmented" => Some(true),
            _ => None,
        };
        return Line::Done(Request::LruMode { segmented, noreply });
    }
    if sub == b"temp_ttl" && n >= 4 {
        return Line::Done(Request::LruTempTtl {
            ttl: safe_strtol(t.get(2)),
            noreply,
        });
    }
    invalid(Verb::Lru, ErrorReply::Error, noreply)
}
