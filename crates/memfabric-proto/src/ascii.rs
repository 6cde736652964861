//! memcached's classic ascii protocol: line framing, tokenizing, typed requests, replies.
//!
//! Everything here mirrors memcached 1.6.18 (`proto_text.c`, `util.c`) as observed on the
//! real server, quirks included, because clients depend on the exact bytes:
//!
//! - A request line ends at the first `\n`; one `\r` before it is dropped (only when the
//!   line has more than one byte), and the line ends early at a NUL byte (memcached
//!   tokenizes a C string).
//! - Tokens are separated by spaces only (a tab is part of a token). At most 23 tokens are
//!   split off; whatever follows stays unsplit (`Tokens::rest`), which only multigets read.
//! - With no `\n` in the first `max_line` (2048) bytes the connection is closed, unless the
//!   buffer starts (after at most 100 spaces) with `get ` or `gets `: long multigets keep
//!   reading. memcached lets those grow without bound. `parse` closes once the partial
//!   line passes `Limits::max_multiget_line` (8 MiB by default); memfabricd's executor
//!   never lets it get there: it serves a long multiget key by key as it arrives
//!   (`multiget_prefix` finds where its keys start).
//! - Numbers are parsed the way `safe_strtoul`/`safe_strtol`/`safe_strtoull` do with
//!   glibc's `strto*`: leading whitespace and a sign are accepted, the number may be
//!   followed by whitespace and anything after it, 32-bit values are truncated from 64
//!   bits (flags `4294967297` is 1, exptime `2147483648` is negative), a `-` is refused
//!   only when the 64-bit result looks negative.
//! - A storage command's data block is exactly `len + 2` bytes whose last two must be
//!   `\r\n`; otherwise `CLIENT_ERROR bad data chunk` and whatever follows is read as the
//!   next command.
//!
//! `parse` turns bytes into a `Request` (or says it needs more, or that the connection
//! must be closed); `Request::encode` writes the canonical form of a request (clients and
//! tests use it); the `reply` module and the `write_*` helpers build replies.

use std::fmt;

/// Longest key memcached accepts.
pub const KEY_MAX_LEN: usize = 250;
/// memcached's `MAX_TOKENS`: 23 tokens plus the terminal one.
pub const MAX_TOKENS: usize = 24;
/// Bytes without a newline after which a non-multiget connection is closed.
pub const DEFAULT_MAX_LINE: usize = 2048;
/// Our bound on a multiget line still being received (memcached has none). 8 MiB holds
/// more than 30,000 keys of 250 bytes, far beyond what clients batch.
pub const DEFAULT_MAX_MULTIGET_LINE: usize = 8 << 20;
/// memcached's `MAX_VERBOSITY_LEVEL`.
pub const MAX_VERBOSITY_LEVEL: u32 = 2;
/// A long line with more leading spaces than this is not treated as a multiget.
const MULTIGET_MAX_LEADING_SPACES: usize = 100;

/// Framing limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `max_line`: see the module docs.
    pub max_line: usize,
    /// Cap on a multiget line still being received.
    pub max_multiget_line: usize,
    /// Largest item (`-I`). A storage command whose data block alone is larger is refused
    /// at once (`StoreTooLarge`), so its data is discarded instead of buffered. Values a
    /// little smaller may still be too large once the store adds its item header: the
    /// store says so after the data arrived.
    pub item_size_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: DEFAULT_MAX_LINE,
            max_multiget_line: DEFAULT_MAX_MULTIGET_LINE,
            item_size_max: 1 << 20,
        }
    }
}

/// Result of `parse`.
#[derive(Debug, PartialEq)]
pub enum Parse<'a> {
    /// A request, using the first `len` bytes of input (its line and, for a storage
    /// command, its data block; for `StoreTooLarge` only the line).
    Complete { req: Request<'a>, len: usize },
    /// More input is needed: `need` bytes in total when known (a data block), else 0.
    /// The first `scanned` bytes hold no newline: pass it back as `scan_from` on the next
    /// call with the same input plus more, so a long line is scanned once.
    Incomplete { need: usize, scanned: usize },
    /// Close the connection without a reply.
    Close(CloseReason),
}

/// Why `parse` wants the connection closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// No newline within `max_line` bytes and not a multiget.
    LineTooLong,
    /// A multiget line longer than `max_multiget_line`.
    MultigetTooLong,
    /// An HTTP request line (its last token starts with `HTTP/`).
    Http,
}

/// The storage commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreCmd {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

impl StoreCmd {
    pub fn name(self) -> &'static str {
        match self {
            StoreCmd::Set => "set",
            StoreCmd::Add => "add",
            StoreCmd::Replace => "replace",
            StoreCmd::Append => "append",
            StoreCmd::Prepend => "prepend",
            StoreCmd::Cas => "cas",
        }
    }
}

/// Which command a request (or a rejected request) is, for counters and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Get,
    Gets,
    Gat,
    Gats,
    Store(StoreCmd),
    Delete,
    Incr,
    Decr,
    Touch,
    FlushAll,
    Stats,
    Version,
    Verbosity,
    Quit,
    Shutdown,
    CacheMemlimit,
    Slabs,
    LruCrawler,
    Lru,
    Watch,
    RefreshCerts,
    Meta,
    /// Not a command memcached knows (or too few tokens for the one it names).
    Unknown,
}

/// The error replies of the classic protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorReply {
    /// `ERROR`: unknown command or wrong number of tokens.
    Error,
    /// `CLIENT_ERROR bad command line format`
    BadFormat,
    /// `CLIENT_ERROR bad data chunk`
    BadDataChunk,
    /// `CLIENT_ERROR invalid exptime argument`
    InvalidExptime,
    /// `CLIENT_ERROR invalid numeric delta argument`
    InvalidDelta,
    /// `delete` with a hold time other than 0.
    DeleteUsage,
    /// `stats detail` with a bad argument.
    StatsDetailUsage,
    /// `lru_crawler sleep` above one second.
    CrawlerSleepTooLong,
    /// `lru tune` with hot + warm above 80 percent.
    LruPercents,
    /// `lru tune` with a factor not above 0.
    LruFactors,
}

impl ErrorReply {
    /// The reply line, `\r\n` included.
    pub fn as_bytes(self) -> &'static [u8] {
        match self {
            ErrorReply::Error => b"ERROR\r\n",
            ErrorReply::BadFormat => b"CLIENT_ERROR bad command line format\r\n",
            ErrorReply::BadDataChunk => b"CLIENT_ERROR bad data chunk\r\n",
            ErrorReply::InvalidExptime => b"CLIENT_ERROR invalid exptime argument\r\n",
            ErrorReply::InvalidDelta => b"CLIENT_ERROR invalid numeric delta argument\r\n",
            ErrorReply::DeleteUsage => {
                b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
            }
            ErrorReply::StatsDetailUsage => b"CLIENT_ERROR usage: stats detail on|off|dump\r\n",
            ErrorReply::CrawlerSleepTooLong => b"CLIENT_ERROR sleep must be one second or less\r\n",
            ErrorReply::LruPercents => b"ERROR hot and warm pcts must not exceed 80\r\n",
            ErrorReply::LruFactors => b"ERROR hot/warm age factors must be greater than 0\r\n",
        }
    }
}

/// The keys of a retrieval, split lazily (a multiget line can be megabytes long).
#[derive(Clone, Copy)]
pub struct Keys<'a> {
    raw: &'a [u8],
}

impl<'a> Keys<'a> {
    /// Keys separated by spaces in `raw`.
    pub fn new(raw: &'a [u8]) -> Keys<'a> {
        Keys { raw }
    }

    /// The key list's text as it stands in the request line.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    pub fn iter(&self) -> KeyIter<'a> {
        KeyIter { rest: self.raw }
    }

    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }
}

impl PartialEq for Keys<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl fmt::Debug for Keys<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(String::from_utf8_lossy))
            .finish()
    }
}

/// Iterator over `Keys`. Keys may be longer than `KEY_MAX_LEN`: memcached serves the
/// keys before such a key and then fails the whole command, so the executor checks.
#[derive(Clone)]
pub struct KeyIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for KeyIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let (key, tail) = rest.split_at(end);
        self.rest = tail;
        Some(key)
    }
}

/// A storage command with its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreRequest<'a> {
    pub cmd: StoreCmd,
    pub key: &'a [u8],
    pub flags: u32,
    /// Protocol exptime (relative seconds, absolute unix time, or negative = expired).
    pub exptime: i32,
    pub value: &'a [u8],
    /// The CAS unique of `cas` (0 for the other commands).
    pub cas: u64,
    pub noreply: bool,
}

/// `stats` and its subcommands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsRequest<'a> {
    /// `stats`
    General,
    /// `stats reset`
    Reset,
    /// `stats detail on|off|dump`
    Detail(DetailCmd),
    /// `stats cachedump <class> <limit>`: the raw argument tokens, `None` when fewer
    /// than two were given (memcached validates them only when dumping is enabled).
    Cachedump(Option<(&'a [u8], &'a [u8])>),
    /// `stats <group>`: settings, items, slabs, conns, sizes, or anything else.
    Group(&'a [u8]),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetailCmd {
    On,
    Off,
    Dump,
}

/// `slabs automove` settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Automove {
    Level(u32),
    Ratio(f64),
}

/// `lru_crawler` subcommands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LruCrawlerRequest<'a> {
    /// `lru_crawler crawl <classes|all>`
    Crawl(&'a [u8]),
    /// `lru_crawler metadump <classes|all|hash>`
    Metadump(&'a [u8]),
    Tocrawl(u32),
    /// Microseconds.
    Sleep(u32),
    Enable,
    Disable,
}

/// One classic ascii request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Request<'a> {
    /// `get`/`bget` (`cas` false) and `gets` (`cas` true).
    Get {
        keys: Keys<'a>,
        cas: bool,
    },
    /// `gat` and `gats`.
    Gat {
        exptime: i32,
        keys: Keys<'a>,
        cas: bool,
    },
    Store(StoreRequest<'a>),
    /// A storage command whose data block exceeds `Limits::item_size_max`: reply
    /// `SERVER_ERROR object too large for cache` and discard the next `data_len` bytes.
    StoreTooLarge {
        cmd: StoreCmd,
        key: &'a [u8],
        noreply: bool,
        data_len: usize,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    /// `incr` (`incr` true) and `decr`.
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i32,
        noreply: bool,
    },
    /// `flush_all [delay]`; `delay` 0 when absent.
    FlushAll {
        delay: i32,
        noreply: bool,
    },
    Stats(StatsRequest<'a>),
    Version,
    Verbosity {
        level: u32,
        noreply: bool,
    },
    Quit,
    /// `shutdown` (`graceful` false), `shutdown graceful`, or another mode (`None`).
    Shutdown {
        graceful: Option<bool>,
    },
    /// `cache_memlimit <megabytes>`
    CacheMemlimit {
        megabytes: u32,
        noreply: bool,
    },
    /// `slabs reassign <src> <dst>`; `None` when the ids do not parse (memcached checks
    /// whether reassignment is enabled first).
    SlabsReassign {
        classes: Option<(i32, i32)>,
    },
    SlabsAutomove {
        setting: Automove,
        noreply: bool,
    },
    LruCrawler(LruCrawlerRequest<'a>),
    /// `lru tune <hot pct> <warm pct> <hot factor> <warm factor>` (validated).
    LruTune {
        pct_hot: u32,
        pct_warm: u32,
        hot_factor: f64,
        warm_factor: f64,
        noreply: bool,
    },
    /// `lru mode flat|segmented` (`None` for another word).
    LruMode {
        segmented: Option<bool>,
        noreply: bool,
    },
    /// `lru temp_ttl <ttl>` (`None` when it does not parse).
    LruTempTtl {
        ttl: Option<i32>,
        noreply: bool,
    },
    /// `watch [event classes]`
    Watch {
        noreply: bool,
    },
    RefreshCerts,
    /// A meta command (mg ms md ma mn me): the whole line is the meta parser's.
    Meta,
    /// A malformed request: reply `error` unless `noreply`.
    Invalid {
        verb: Verb,
        error: ErrorReply,
        noreply: bool,
    },
}

/// `Request::encode` on something that is not a request a client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an encodable request")]
pub struct NotEncodable;

// ---------------------------------------------------------------------------------------
// Framing

/// Parse the request at the start of `input`. `scan_from` is the `scanned` of the last
/// `Incomplete` on this same input (0 otherwise).
pub fn parse<'a>(input: &'a [u8], limits: &Limits, scan_from: usize) -> Parse<'a> {
    let from = scan_from.min(input.len());
    let nl = match find_newline(&input[from..]) {
        Some(i) => from + i,
        None => return no_newline(input, limits),
    };
    let line_len = nl + 1;
    let line = command_text(&input[..nl]);
    match parse_line(line) {
        Line::Http => Parse::Close(CloseReason::Http),
        Line::Done(req) => Parse::Complete { req, len: line_len },
        Line::Storage(h) => storage(input, line_len, h, limits),
    }
}

/// What memcached does with a buffer holding no newline.
fn no_newline<'a>(input: &'a [u8], limits: &Limits) -> Parse<'a> {
    let incomplete = Parse::Incomplete {
        need: 0,
        scanned: input.len(),
    };
    if input.len() <= limits.max_line {
        return incomplete;
    }
    // Only a large multiget may have a line this long.
    let spaces = input.iter().take_while(|&&b| b == b' ').count();
    let rest = &input[spaces..];
    if spaces > MULTIGET_MAX_LEADING_SPACES
        || !(rest.starts_with(b"get ") || rest.starts_with(b"gets "))
    {
        return Parse::Close(CloseReason::LineTooLong);
    }
    if input.len() > limits.max_multiget_line.max(limits.max_line) {
        return Parse::Close(CloseReason::MultigetTooLong);
    }
    incomplete
}

/// See `pending_store`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingStore<'a> {
    /// The request, with an empty `value`.
    pub req: StoreRequest<'a>,
    /// Bytes of the command line, newline included.
    pub line_len: usize,
    /// Bytes of the value (the data block is this plus `\r\n`).
    pub value_len: usize,
}

/// A `get`/`gets` line too long to buffer whole (see `no_newline`): whether it is `gets`,
/// and how many bytes its leading spaces and verb (with the space after it) take. The
/// key list that follows can be served as it arrives.
pub fn multiget_prefix(input: &[u8]) -> Option<(bool, usize)> {
    let spaces = input.iter().take_while(|&&b| b == b' ').count();
    if spaces > MULTIGET_MAX_LEADING_SPACES {
        return None;
    }
    let rest = &input[spaces..];
    if rest.starts_with(b"get ") {
        Some((false, spaces + 4))
    } else if rest.starts_with(b"gets ") {
        Some((true, spaces + 5))
    } else {
        None
    }
}

/// A storage command whose line is complete but whose data block is not: the request
/// (with an empty value) and the length of its line, so that a server can receive the
/// value straight into item memory instead of buffering it. `None` for anything else
/// (including a value `parse` refuses as too large).
pub fn pending_store<'a>(input: &'a [u8], limits: &Limits) -> Option<PendingStore<'a>> {
    let nl = find_newline(input)?;
    let line_len = nl + 1;
    let Line::Storage(h) = parse_line(command_text(&input[..nl])) else {
        return None;
    };
    let data_len = h.vlen + 2;
    if data_len > limits.item_size_max || input.len() >= line_len + data_len {
        return None;
    }
    let req = StoreRequest {
        cmd: h.cmd,
        key: h.key,
        flags: h.flags,
        exptime: h.exptime,
        value: &[],
        cas: h.cas,
        noreply: h.noreply,
    };
    Some(PendingStore {
        req,
        line_len,
        value_len: h.vlen,
    })
}

fn find_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

/// The command text of a line (without its `\n`): drop one trailing `\r` if the line has
/// more than one byte, then stop at the first NUL, as memcached does.
pub fn command_text(line: &[u8]) -> &[u8] {
    let line = match line {
        [head @ .., b'\r'] if line.len() > 1 => head,
        _ => line,
    };
    match line.iter().position(|&b| b == 0) {
        Some(nul) => &line[..nul],
        None => line,
    }
}

/// A storage command line, waiting for its data block.
struct StoreHeader<'a> {
    cmd: StoreCmd,
    key: &'a [u8],
    flags: u32,
    exptime: i32,
    vlen: usize,
    cas: u64,
    noreply: bool,
}

fn storage<'a>(input: &'a [u8], line_len: usize, h: StoreHeader<'a>, limits: &Limits) -> Parse<'a> {
    let data_len = h.vlen + 2;
    if data_len > limits.item_size_max {
        return Parse::Complete {
            req: Request::StoreTooLarge {
                cmd: h.cmd,
                key: h.key,
                noreply: h.noreply,
                data_len,
            },
            len: line_len,
        };
    }
    let total = line_len + data_len;
    let Some(data) = input.get(line_len..total) else {
        return Parse::Incomplete {
            need: total,
            scanned: 0,
        };
    };
    let req = match data.split_last_chunk::<2>() {
        Some((value, b"\r\n")) => Request::Store(StoreRequest {
            cmd: h.cmd,
            key: h.key,
            flags: h.flags,
            exptime: h.exptime,
            value,
            cas: h.cas,
            noreply: h.noreply,
        }),
        _ => Request::Invalid {
            verb: Verb::Store(h.cmd),
            error: ErrorReply::BadDataChunk,
            noreply: h.noreply,
        },
    };
    Parse::Complete { req, len: total }
}

// ---------------------------------------------------------------------------------------
// Tokenizing

/// A tokenized command line: up to 23 tokens, and the unsplit rest of a longer line.
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a> {
    toks: [&'a [u8]; MAX_TOKENS - 1],
    len: usize,
    rest: Option<&'a [u8]>,
}

impl<'a> Tokens<'a> {
    /// Number of tokens split off (memcached's `ntokens` is this plus one).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Token `i`, or an empty slice past the end (like memcached's terminal token).
    pub fn get(&self, i: usize) -> &'a [u8] {
        if i < self.len {
            self.toks[i]
        } else {
            b""
        }
    }

    /// Text after the 23rd token, if the line had more.
    pub fn rest(&self) -> Option<&'a [u8]> {
        self.rest
    }

    /// memcached's `set_noreply_maybe`: the last token is `noreply`.
    fn noreply(&self) -> bool {
        self.len > 0 && self.toks[self.len - 1] == b"noreply"
    }
}

/// memcached's `tokenize_command`: split on spaces, at most 23 tokens.
pub fn tokenize(line: &[u8]) -> Tokens<'_> {
    let mut t = Tokens {
        toks: [b""; MAX_TOKENS - 1],
        len: 0,
        rest: None,
    };
    let mut start = 0;
    let mut i = 0;
    while i < line.len() {
        if line[i] == b' ' {
            if start != i {
                t.toks[t.len] = &line[start..i];
                t.len += 1;
                if t.len == MAX_TOKENS - 1 {
                    let after = &line[i + 1..];
                    t.rest = (!after.is_empty()).then_some(after);
                    return t;
                }
            }
            start = i + 1;
        }
        i += 1;
    }
    if start < line.len() {
        t.toks[t.len] = &line[start..];
        t.len += 1;
    }
    t
}

// ---------------------------------------------------------------------------------------
// Numbers, as memcached's safe_strto* on glibc

fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// glibc `strtoul`/`strtol` core on a token: (negative, magnitude, end) or None when no
/// digits were found. The magnitude saturates at `u128::MAX` (only compared to 2^64).
fn c_digits(tok: &[u8]) -> Option<(bool, u128, usize)> {
    let mut i = 0;
    while i < tok.len() && c_isspace(tok[i]) {
        i += 1;
    }
    let mut neg = false;
    if let Some(&s @ (b'+' | b'-')) = tok.get(i) {
        neg = s == b'-';
        i += 1;
    }
    let digits_start = i;
    let mut mag: u128 = 0;
    while let Some(&d @ b'0'..=b'9') = tok.get(i) {
        mag = mag.saturating_mul(10).saturating_add(u128::from(d - b'0'));
        i += 1;
    }
    if i == digits_start {
        return None;
    }
    Some((neg, mag, i))
}

/// What follows the number must be the end of the token or whitespace.
fn ends_ok(tok: &[u8], end: usize) -> bool {
    end == tok.len() || c_isspace(tok[end])
}

/// memcached's `safe_strtoull`.
pub fn parse_u64(tok: &[u8]) -> Option<u64> {
    let (neg, mag, end) = c_digits(tok)?;
    if mag > u128::from(u64::MAX) || !ends_ok(tok, end) {
        return None;
    }
    let mut v = mag as u64;
    if neg {
        v = v.wrapping_neg();
    }
    // A '-' is only noticed when the result looks negative as a signed number.
    if (v as i64) < 0 && tok[..end].contains(&b'-') {
        return None;
    }
    Some(v)
}

/// memcached's `safe_strtoul` (64-bit `unsigned long`, truncated to 32 bits).
pub fn parse_u32(tok: &[u8]) -> Option<u32> {
    parse_u64(tok).map(|v| v as u32)
}

/// memcached 1.6.18's `safe_strtol`: a 64-bit `long`, truncated to 32 bits.
pub fn parse_i32(tok: &[u8]) -> Option<i32> {
    let (neg, mag, end) = c_digits(tok)?;
    let limit = if neg { 1u128 << 63 } else { (1u128 << 63) - 1 };
    if mag > limit || !ends_ok(tok, end) {
        return None;
    }
    let v = if neg {
        (mag as u64).wrapping_neg() as i64
    } else {
        mag as i64
    };
    Some(v as i32)
}

/// memcached's `safe_strtod` for decimal numbers, `inf` and `nan` (glibc's hexadecimal
/// floats are not accepted).
pub fn parse_f64(tok: &[u8]) -> Option<f64> {
    let mut i = 0;
    while i < tok.len() && c_isspace(tok[i]) {
        i += 1;
    }
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
            if j > exp_start {
                i = j;
            }
        }
        i
    };
    if !ends_ok(tok, end) {
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

// ---------------------------------------------------------------------------------------
// Commands

enum Line<'a> {
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
fn parse_line(line: &[u8]) -> Line<'_> {
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
        b"refresh_certs" => Line::Done(Request::RefreshCerts),
        // memcached dispatches on the first letter before comparing names: an unknown
        // command starting with one of these letters is a plain ERROR.
        _ if b"gsacidt".contains(&cmd[0]) => unknown(),
        // Only the remaining unknown commands are checked for an HTTP request line.
        // (misbehave and debugtime exist only in debug builds of memcached, extstore only
        // in builds with external storage: unknown here.)
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
        match parse_i32(t.get(1)) {
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
        parse_u32(t.get(2)),
        parse_i32(t.get(3)),
        parse_i32(t.get(4)),
    ) else {
        return invalid(verb, ErrorReply::BadFormat, noreply);
    };
    let cas = if cmd == StoreCmd::Cas {
        match parse_u64(t.get(5)) {
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
    match parse_u64(t.get(2)) {
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
    match parse_i32(t.get(2)) {
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
        match parse_i32(t.get(1)) {
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
    match parse_u32(t.get(1)) {
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
    match parse_u32(t.get(1)) {
        Some(megabytes) => Line::Done(Request::CacheMemlimit { megabytes, noreply }),
        None => invalid(Verb::CacheMemlimit, ErrorReply::Error, noreply),
    }
}

fn slabs<'a>(t: &Tokens<'a>) -> Line<'a> {
    let n = ntokens(t);
    if n == 5 && t.get(1) == b"reassign" {
        let classes = parse_i32(t.get(2)).zip(parse_i32(t.get(3)));
        return Line::Done(Request::SlabsReassign { classes });
    }
    if n >= 4 && t.get(1) == b"automove" {
        let noreply = t.noreply();
        let setting = if t.get(2) == b"ratio" {
            match (n >= 5).then(|| parse_f64(t.get(3))).flatten() {
                Some(r) => Automove::Ratio(r),
                None => return invalid(Verb::Slabs, ErrorReply::Error, noreply),
            }
        } else {
            match parse_u32(t.get(2)) {
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
        (4, b"tocrawl") => match parse_u32(t.get(2)) {
            Some(v) => LruCrawlerRequest::Tocrawl(v),
            None => return invalid(Verb::LruCrawler, ErrorReply::BadFormat, false),
        },
        (4, b"sleep") => match parse_u32(t.get(2)) {
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
            parse_u32(t.get(2)),
            parse_u32(t.get(3)),
            parse_f64(t.get(4)),
            parse_f64(t.get(5)),
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
            ttl: parse_i32(t.get(2)),
            noreply,
        });
    }
    invalid(Verb::Lru, ErrorReply::Error, noreply)
}

// ---------------------------------------------------------------------------------------
// Encoding requests

impl Request<'_> {
    /// Which command this is.
    pub fn verb(&self) -> Verb {
        match self {
            Request::Get { cas: false, .. } => Verb::Get,
            Request::Get { cas: true, .. } => Verb::Gets,
            Request::Gat { cas: false, .. } => Verb::Gat,
            Request::Gat { cas: true, .. } => Verb::Gats,
            Request::Store(s) => Verb::Store(s.cmd),
            Request::StoreTooLarge { cmd, .. } => Verb::Store(*cmd),
            Request::Delete { .. } => Verb::Delete,
            Request::Arith { incr: true, .. } => Verb::Incr,
            Request::Arith { incr: false, .. } => Verb::Decr,
            Request::Touch { .. } => Verb::Touch,
            Request::FlushAll { .. } => Verb::FlushAll,
            Request::Stats(_) => Verb::Stats,
            Request::Version => Verb::Version,
            Request::Verbosity { .. } => Verb::Verbosity,
            Request::Quit => Verb::Quit,
            Request::Shutdown { .. } => Verb::Shutdown,
            Request::CacheMemlimit { .. } => Verb::CacheMemlimit,
            Request::SlabsReassign { .. } | Request::SlabsAutomove { .. } => Verb::Slabs,
            Request::LruCrawler(_) => Verb::LruCrawler,
            Request::LruTune { .. } | Request::LruMode { .. } | Request::LruTempTtl { .. } => {
                Verb::Lru
            }
            Request::Watch { .. } => Verb::Watch,
            Request::RefreshCerts => Verb::RefreshCerts,
            Request::Meta => Verb::Meta,
            Request::Invalid { verb, .. } => *verb,
        }
    }

    /// Append the canonical wire form of this request (data block included). Requests
    /// that only a parser produces (`Invalid`, `StoreTooLarge`, `Meta`) and admin
    /// commands carrying values that do not round-trip are refused.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), NotEncodable> {
        let noreply_suffix = |out: &mut Vec<u8>, noreply: bool| {
            if noreply {
                out.extend_from_slice(b" noreply");
            }
            out.extend_from_slice(b"\r\n");
        };
        match *self {
            Request::Get { keys, cas } => {
                out.extend_from_slice(if cas { b"gets" } else { b"get" });
                push_keys(out, keys);
            }
            Request::Gat { exptime, keys, cas } => {
                out.extend_from_slice(if cas { b"gats " } else { b"gat " });
                push_i64(out, exptime.into());
                push_keys(out, keys);
            }
            Request::Store(s) => {
                out.extend_from_slice(s.cmd.name().as_bytes());
                out.push(b' ');
                out.extend_from_slice(s.key);
                out.push(b' ');
                push_u64(out, s.flags.into());
                out.push(b' ');
                push_i64(out, s.exptime.into());
                out.push(b' ');
                push_u64(out, s.value.len() as u64);
                if s.cmd == StoreCmd::Cas {
                    out.push(b' ');
                    push_u64(out, s.cas);
                }
                noreply_suffix(out, s.noreply);
                out.extend_from_slice(s.value);
                out.extend_from_slice(b"\r\n");
            }
            Request::Delete { key, noreply } => {
                out.extend_from_slice(b"delete ");
                out.extend_from_slice(key);
                noreply_suffix(out, noreply);
            }
            Request::Arith {
                incr,
                key,
                delta,
                noreply,
            } => {
                out.extend_from_slice(if incr { b"incr " } else { b"decr " });
                out.extend_from_slice(key);
                out.push(b' ');
                push_u64(out, delta);
                noreply_suffix(out, noreply);
            }
            Request::Touch {
                key,
                exptime,
                noreply,
            } => {
                out.extend_from_slice(b"touch ");
                out.extend_from_slice(key);
                out.push(b' ');
                push_i64(out, exptime.into());
                noreply_suffix(out, noreply);
            }
            Request::FlushAll { delay, noreply } => {
                out.extend_from_slice(b"flush_all");
                if delay != 0 {
                    out.push(b' ');
                    push_i64(out, delay.into());
                }
                noreply_suffix(out, noreply);
            }
            Request::Stats(s) => {
                out.extend_from_slice(b"stats");
                let sub: &[u8] = match s {
                    StatsRequest::General => b"",
                    StatsRequest::Reset => b" reset",
                    StatsRequest::Detail(DetailCmd::On) => b" detail on",
                    StatsRequest::Detail(DetailCmd::Off) => b" detail off",
                    StatsRequest::Detail(DetailCmd::Dump) => b" detail dump",
                    StatsRequest::Cachedump(None) => b" cachedump",
                    StatsRequest::Cachedump(Some((class, limit))) => {
                        out.extend_from_slice(b" cachedump ");
                        out.extend_from_slice(class);
                        out.push(b' ');
                        limit
                    }
                    StatsRequest::Group(g) => {
                        out.push(b' ');
                        g
                    }
                };
                out.extend_from_slice(sub);
                out.extend_from_slice(b"\r\n");
            }
            Request::Version => out.extend_from_slice(b"version\r\n"),
            Request::Quit => out.extend_from_slice(b"quit\r\n"),
            Request::Verbosity { level, noreply } => {
                out.extend_from_slice(b"verbosity ");
                push_u64(out, level.into());
                noreply_suffix(out, noreply);
            }
            Request::Shutdown { graceful: Some(g) } => out.extend_from_slice(if g {
                &b"shutdown graceful\r\n"[..]
            } else {
                b"shutdown\r\n"
            }),
            Request::CacheMemlimit { megabytes, noreply } => {
                out.extend_from_slice(b"cache_memlimit ");
                push_u64(out, megabytes.into());
                noreply_suffix(out, noreply);
            }
            Request::Watch { noreply } => {
                out.extend_from_slice(b"watch");
                noreply_suffix(out, noreply);
            }
            Request::RefreshCerts => out.extend_from_slice(b"refresh_certs\r\n"),
            _ => return Err(NotEncodable),
        }
        Ok(())
    }
}

fn push_keys(out: &mut Vec<u8>, keys: Keys<'_>) {
    for k in keys.iter() {
        out.push(b' ');
        out.extend_from_slice(k);
    }
    out.extend_from_slice(b"\r\n");
}

// ---------------------------------------------------------------------------------------
// Replies

/// Fixed reply lines.
pub mod reply {
    pub const STORED: &[u8] = b"STORED\r\n";
    pub const NOT_STORED: &[u8] = b"NOT_STORED\r\n";
    pub const EXISTS: &[u8] = b"EXISTS\r\n";
    pub const NOT_FOUND: &[u8] = b"NOT_FOUND\r\n";
    pub const DELETED: &[u8] = b"DELETED\r\n";
    pub const TOUCHED: &[u8] = b"TOUCHED\r\n";
    pub const END: &[u8] = b"END\r\n";
    pub const OK: &[u8] = b"OK\r\n";
    pub const RESET: &[u8] = b"RESET\r\n";
    pub const ERROR: &[u8] = b"ERROR\r\n";
    pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
    pub const OUT_OF_MEMORY_STORING: &[u8] = b"SERVER_ERROR out of memory storing object\r\n";
    /// incr/decr that could not allocate the new value.
    pub const OUT_OF_MEMORY: &[u8] = b"SERVER_ERROR out of memory\r\n";
    pub const NON_NUMERIC: &[u8] =
        b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
    pub const SHUTDOWN_DISABLED: &[u8] = b"ERROR: shutdown not enabled\r\n";
    pub const SHUTDOWN_BAD_MODE: &[u8] = b"CLIENT_ERROR invalid shutdown mode\r\n";
    pub const FLUSH_DISABLED: &[u8] = b"CLIENT_ERROR flush_all not allowed\r\n";
    pub const CACHEDUMP_DISABLED: &[u8] = b"CLIENT_ERROR stats cachedump not allowed\r\n";
    pub const METADUMP_DISABLED: &[u8] = b"ERROR metadump not allowed\r\n";
    pub const WATCH_DISABLED: &[u8] = b"CLIENT_ERROR watch commands not allowed\r\n";
    pub const SLAB_REASSIGN_DISABLED: &[u8] = b"CLIENT_ERROR slab reassignment disabled\r\n";
    pub const CRAWLER_DISABLED: &[u8] = b"CLIENT_ERROR lru crawler disabled\r\n";
    pub const CRAWLER_BADCLASS: &[u8] = b"BADCLASS invalid class id\r\n";
    pub const CRAWLER_START_FAILED: &[u8] = b"ERROR failed to start lru crawler thread\r\n";
    pub const CRAWLER_STOP_FAILED: &[u8] = b"ERROR failed to stop lru crawler thread\r\n";
    pub const MEMLIMIT_TOO_SMALL: &[u8] =
        b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n";
    pub const MEMLIMIT_NOT_MEGABYTES: &[u8] =
        b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n";
    pub const MEMLIMIT_ADJUST_FAILED: &[u8] =
        b"MEMLIMIT_ADJUST_FAILED out of bounds or unable to adjust\r\n";
    /// memcached's `refresh_certs` reply without TLS (its message carries the `\r\n`).
    pub const TLS_NOT_ENABLED: &[u8] = b"Error TLS not enabled\r\n";
}

/// `VALUE <key> <flags> <bytes>[ <cas>]\r\n`
pub fn write_value_header(out: &mut Vec<u8>, key: &[u8], flags: u32, len: usize, cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, flags.into());
    out.push(b' ');
    push_u64(out, len as u64);
    if let Some(c) = cas {
        out.push(b' ');
        push_u64(out, c);
    }
    out.extend_from_slice(b"\r\n");
}

/// `STAT <name> <value>\r\n`
pub fn write_stat(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `VERSION <version>\r\n`
pub fn write_version(out: &mut Vec<u8>, version: &str) {
    out.extend_from_slice(b"VERSION ");
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A number followed by `\r\n` (incr/decr replies).
pub fn write_number_line(out: &mut Vec<u8>, n: u64) {
    push_u64(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Decimal digits of `n`.
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

/// Decimal digits of `n`, with a `-` when negative.
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

    fn lim() -> Limits {
        Limits::default()
    }

    /// Parse a whole input that must hold one complete request.
    fn req(input: &[u8]) -> Request<'_> {
        match parse(input, &lim(), 0) {
            Parse::Complete { req, .. } => req,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(input)),
        }
    }

    fn err(input: &[u8]) -> (ErrorReply, bool) {
        match req(input) {
            Request::Invalid { error, noreply, .. } => (error, noreply),
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(input)),
        }
    }

    fn keys<'a>(r: &Request<'a>) -> Vec<&'a [u8]> {
        match r {
            Request::Get { keys, .. } | Request::Gat { keys, .. } => keys.iter().collect(),
            other => panic!("{other:?}"),
        }
    }

    // --- framing -------------------------------------------------------------------

    #[test]
    fn partial_line_needs_more() {
        assert_eq!(
            parse(b"get fo", &lim(), 0),
            Parse::Incomplete {
                need: 0,
                scanned: 6
            }
        );
    }

    #[test]
    fn bare_newline_and_crlf_both_end_a_line() {
        assert_eq!(keys(&req(b"get a\n")), vec![b"a"]);
        assert_eq!(keys(&req(b"get a\r\n")), vec![b"a"]);
        match parse(b"get a\nget b\r\n", &lim(), 0) {
            Parse::Complete { len, .. } => assert_eq!(len, 6),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_one_carriage_return_is_stripped() {
        assert_eq!(keys(&req(b"get a\r\r\n")), vec![&b"a\r"[..]]);
    }

    #[test]
    fn empty_lines_are_errors() {
        assert_eq!(err(b"\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"\n").0, ErrorReply::Error);
        assert_eq!(err(b"   \r\n").0, ErrorReply::Error);
    }

    #[test]
    fn one_letter_command_is_an_error() {
        assert_eq!(err(b"x\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"m\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn nul_byte_ends_the_command() {
        assert_eq!(keys(&req(b"get a b\0c d\r\n")), vec![&b"a"[..], b"b"]);
    }

    #[test]
    fn leading_spaces_are_skipped() {
        assert_eq!(keys(&req(b"   get  a   b \r\n")), vec![&b"a"[..], b"b"]);
    }

    #[test]
    fn tab_is_not_a_separator() {
        assert_eq!(err(b"get\ta\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn long_line_without_newline_closes() {
        let input = vec![b'a'; 3000];
        assert_eq!(
            parse(&input, &lim(), 0),
            Parse::Close(CloseReason::LineTooLong)
        );
    }

    #[test]
    fn line_of_exactly_max_line_bytes_waits() {
        let input = vec![b'a'; DEFAULT_MAX_LINE];
        assert!(matches!(parse(&input, &lim(), 0), Parse::Incomplete { .. }));
    }

    #[test]
    fn long_multiget_line_keeps_reading() {
        for prefix in [&b"get "[..], b"gets ", b"     get "] {
            let mut input = prefix.to_vec();
            input.extend(b"a ".repeat(1500));
            assert!(
                matches!(parse(&input, &lim(), 0), Parse::Incomplete { need: 0, .. }),
                "{:?}",
                String::from_utf8_lossy(prefix)
            );
        }
    }

    #[test]
    fn long_gat_line_closes() {
        let mut input = b"gat 1 ".to_vec();
        input.extend(b"a ".repeat(1500));
        assert_eq!(
            parse(&input, &lim(), 0),
            Parse::Close(CloseReason::LineTooLong)
        );
    }

    #[test]
    fn long_multiget_after_too_many_spaces_closes() {
        let mut input = vec![b' '; 101];
        input.extend(b"get ");
        input.extend(b"a ".repeat(1500));
        assert_eq!(
            parse(&input, &lim(), 0),
            Parse::Close(CloseReason::LineTooLong)
        );
        let mut input = vec![b' '; 100];
        input.extend(b"get ");
        input.extend(b"a ".repeat(1500));
        assert!(matches!(parse(&input, &lim(), 0), Parse::Incomplete { .. }));
    }

    #[test]
    fn multiget_line_beyond_cap_closes() {
        let limits = Limits {
            max_multiget_line: 10_000,
            ..lim()
        };
        let mut input = b"get ".to_vec();
        input.extend(b"a ".repeat(6000));
        assert_eq!(
            parse(&input, &limits, 0),
            Parse::Close(CloseReason::MultigetTooLong)
        );
    }

    #[test]
    fn long_line_with_newline_is_processed() {
        let mut input = b"get ".to_vec();
        input.extend(b"a ".repeat(3000));
        input.extend(b"\r\n");
        assert_eq!(keys(&req(&input)).len(), 3000);
    }

    #[test]
    fn scan_hint_finds_the_same_newline() {
        let input = b"get abc\r\n";
        let full = parse(input, &lim(), 0);
        assert_eq!(parse(input, &lim(), 5), full);
        // A stale hint beyond the input is clamped.
        assert_eq!(parse(input, &lim(), 100), parse(input, &lim(), input.len()));
    }

    #[test]
    fn http_request_line_closes() {
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n", &lim(), 0),
            Parse::Close(CloseReason::Http)
        );
        assert_eq!(
            parse(b"POST /x HTTP/1.0\r\n", &lim(), 0),
            Parse::Close(CloseReason::Http)
        );
    }

    #[test]
    fn http_is_only_checked_on_the_last_token_of_unknown_commands() {
        assert_eq!(err(b"foo HTTP/1.0 x\r\n").0, ErrorReply::Error);
        // Known first letters answer ERROR without the HTTP check.
        assert_eq!(err(b"sxx / HTTP/1.1\r\n").0, ErrorReply::Error);
        assert_eq!(keys(&req(b"get / HTTP/1.1\r\n")).len(), 2);
    }

    #[test]
    fn unknown_commands_are_errors() {
        for line in [
            &b"GET a\r\n"[..],
            b"foo\r\n",
            b"misbehave\r\n",
            b"debugtime 1\r\n",
            b"extstore item_size 5\r\n",
            b"mx foo\r\n",
            b"sets a\r\n",
            b"gett a\r\n",
        ] {
            assert_eq!(
                err(line),
                (ErrorReply::Error, false),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    // --- tokenizer -----------------------------------------------------------------

    #[test]
    fn tokenizer_stops_after_23_tokens() {
        let line = b"a b c d e f g h i j k l m n o p q r s t u v w x y";
        let t = tokenize(line);
        assert_eq!(t.len(), 23);
        assert_eq!(t.get(22), b"w");
        assert_eq!(t.rest(), Some(&b"x y"[..]));
        assert_eq!(t.get(23), b"");
    }

    #[test]
    fn tokenizer_with_exactly_23_tokens_has_no_rest() {
        let t = tokenize(b"a b c d e f g h i j k l m n o p q r s t u v w");
        assert_eq!(t.len(), 23);
        assert_eq!(t.rest(), None);
        let t = tokenize(b"a b c d e f g h i j k l m n o p q r s t u v w ");
        assert_eq!(t.rest(), None);
    }

    // --- numbers -------------------------------------------------------------------

    #[test]
    fn u32_parsing_follows_safe_strtoul() {
        assert_eq!(parse_u32(b"0"), Some(0));
        assert_eq!(parse_u32(b"-0"), Some(0));
        assert_eq!(parse_u32(b"+12"), Some(12));
        assert_eq!(parse_u32(b"\t12"), Some(12));
        assert_eq!(parse_u32(b"12\tabc"), Some(12));
        assert_eq!(parse_u32(b"12\r"), Some(12));
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), Some(0));
        assert_eq!(parse_u32(b"4294967297"), Some(1));
        assert_eq!(parse_u32(b"18446744073709551615"), Some(u32::MAX));
        assert_eq!(parse_u32(b"-9223372036854775809"), Some(u32::MAX));
        assert_eq!(parse_u32(b"18446744073709551616"), None);
        assert_eq!(parse_u32(b"-1"), None);
        assert_eq!(parse_u32(b"12abc"), None);
        assert_eq!(parse_u32(b"abc"), None);
        assert_eq!(parse_u32(b""), None);
        assert_eq!(parse_u32(b"-"), None);
        assert_eq!(parse_u32(b" "), None);
    }

    #[test]
    fn i32_parsing_truncates_like_memcached_1_6_18() {
        assert_eq!(parse_i32(b"-1"), Some(-1));
        assert_eq!(parse_i32(b"2147483647"), Some(i32::MAX));
        assert_eq!(parse_i32(b"2147483648"), Some(i32::MIN));
        assert_eq!(parse_i32(b"4294967296"), Some(0));
        assert_eq!(parse_i32(b"4294967297"), Some(1));
        assert_eq!(parse_i32(b"-2147483649"), Some(i32::MAX));
        assert_eq!(parse_i32(b"9223372036854775807"), Some(-1));
        assert_eq!(parse_i32(b"-9223372036854775808"), Some(0));
        assert_eq!(parse_i32(b"9223372036854775808"), None);
        assert_eq!(parse_i32(b"-9223372036854775809"), None);
        assert_eq!(parse_i32(b"1x"), None);
    }

    #[test]
    fn u64_parsing_follows_safe_strtoull() {
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(
            parse_u64(b"-9223372036854775809"),
            Some(9223372036854775807)
        );
        assert_eq!(parse_u64(b"00012"), Some(12));
    }

    #[test]
    fn f64_parsing_follows_safe_strtod() {
        assert_eq!(parse_f64(b"0.5"), Some(0.5));
        assert_eq!(parse_f64(b"1e3"), Some(1000.0));
        // strtod stops before a bare "e", which is then trailing garbage.
        assert_eq!(parse_f64(b"1e"), None);
        assert_eq!(parse_f64(b".5"), Some(0.5));
        assert_eq!(parse_f64(b"-2."), Some(-2.0));
        assert_eq!(parse_f64(b"inf"), Some(f64::INFINITY));
        assert!(parse_f64(b"nan").is_some_and(f64::is_nan));
        assert_eq!(parse_f64(b"1e999"), None);
        assert_eq!(parse_f64(b"x"), None);
        assert_eq!(parse_f64(b"."), None);
        assert_eq!(parse_f64(b"1.5x"), None);
    }

    // --- retrieval -----------------------------------------------------------------

    #[test]
    fn get_without_key_is_an_error() {
        assert_eq!(err(b"get\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"get \r\n").0, ErrorReply::Error);
        assert_eq!(err(b"gets\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"gat\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn get_gets_and_bget_parse_their_keys() {
        assert_eq!(
            req(b"get a b\r\n"),
            Request::Get {
                keys: Keys::new(b"a b"),
                cas: false
            }
        );
        assert_eq!(
            req(b"gets a\r\n"),
            Request::Get {
                keys: Keys::new(b"a"),
                cas: true
            }
        );
        assert_eq!(
            req(b"bget a\r\n"),
            Request::Get {
                keys: Keys::new(b"a"),
                cas: false
            }
        );
    }

    #[test]
    fn get_keeps_keys_beyond_the_token_limit() {
        let mut line = b"get".to_vec();
        for i in 0..40 {
            line.extend(format!(" k{i}").as_bytes());
        }
        line.extend(b"\r\n");
        let r = req(&line);
        let k = keys(&r);
        assert_eq!(k.len(), 40);
        assert_eq!(k[39], b"k39");
    }

    #[test]
    fn get_passes_long_keys_to_the_executor() {
        let mut line = b"get a ".to_vec();
        line.extend([b'k'; 251]);
        line.extend(b"\r\n");
        assert_eq!(keys(&req(&line))[1].len(), 251);
    }

    #[test]
    fn gat_parses_exptime_then_keys() {
        assert_eq!(
            req(b"gat 100 a b\r\n"),
            Request::Gat {
                exptime: 100,
                keys: Keys::new(b"a b"),
                cas: false
            }
        );
        assert_eq!(
            req(b"gats -1 a\r\n"),
            Request::Gat {
                exptime: -1,
                keys: Keys::new(b"a"),
                cas: true
            }
        );
    }

    #[test]
    fn gat_without_keys_is_valid() {
        assert!(keys(&req(b"gat 10\r\n")).is_empty());
    }

    #[test]
    fn gat_with_bad_exptime_is_invalid_exptime() {
        assert_eq!(err(b"gat abc a\r\n"), (ErrorReply::InvalidExptime, false));
    }

    // --- storage -------------------------------------------------------------------

    #[test]
    fn set_with_data_block_is_a_store() {
        match parse(b"set k 5 100 3\r\nabc\r\nrest", &lim(), 0) {
            Parse::Complete {
                req: Request::Store(s),
                len,
            } => {
                assert_eq!(len, 20);
                assert_eq!(
                    s,
                    StoreRequest {
                        cmd: StoreCmd::Set,
                        key: b"k",
                        flags: 5,
                        exptime: 100,
                        value: b"abc",
                        cas: 0,
                        noreply: false
                    }
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_storage_command_parses() {
        for (name, cmd) in [
            ("set", StoreCmd::Set),
            ("add", StoreCmd::Add),
            ("replace", StoreCmd::Replace),
            ("append", StoreCmd::Append),
            ("prepend", StoreCmd::Prepend),
        ] {
            let line = format!("{name} k 0 0 1 noreply\r\nx\r\n");
            match req(line.as_bytes()) {
                Request::Store(s) => {
                    assert_eq!(s.cmd, cmd);
                    assert!(s.noreply);
                }
                other => panic!("{other:?}"),
            }
        }
        match req(b"cas k 1 2 1 99\r\nx\r\n") {
            Request::Store(s) => {
                assert_eq!(
                    (s.cmd, s.cas, s.flags, s.exptime),
                    (StoreCmd::Cas, 99, 1, 2)
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn storage_data_block_incomplete_needs_exact_total() {
        assert_eq!(
            parse(b"set k 0 0 10\r\nabc", &lim(), 0),
            Parse::Incomplete {
                need: 14 + 12,
                scanned: 0
            }
        );
        // The final \r\n is part of the block.
        assert_eq!(
            parse(b"set k 0 0 3\r\nabc\r", &lim(), 0),
            Parse::Incomplete {
                need: 13 + 5,
                scanned: 0
            }
        );
    }

    #[test]
    fn zero_length_value_is_valid() {
        match req(b"set k 0 0 0\r\n\r\n") {
            Request::Store(s) => assert!(s.value.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn data_block_without_crlf_is_bad_data_chunk() {
        match parse(b"set a 0 0 3\r\nabcde\r\n", &lim(), 0) {
            Parse::Complete { req, len } => {
                assert_eq!(len, 18);
                assert_eq!(
                    req,
                    Request::Invalid {
                        verb: Verb::Store(StoreCmd::Set),
                        error: ErrorReply::BadDataChunk,
                        noreply: false
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            err(b"set a 0 0 3 noreply\r\nabcde\r\n"),
            (ErrorReply::BadDataChunk, true)
        );
    }

    #[test]
    fn storage_token_count_is_checked() {
        assert_eq!(err(b"set a 0 0\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"set a 0 0 1 noreply extra\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"cas a 0 0 1\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"cas a 0 0 1 2 noreply x\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn set_ignores_an_extra_token_that_is_not_noreply() {
        match req(b"set a 5 0 1 xyz\r\nx\r\n") {
            Request::Store(s) => assert!(!s.noreply && s.flags == 5),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn storage_with_bad_numbers_is_bad_format() {
        for line in [
            &b"set a -1 0 1\r\n"[..],
            b"set a 12abc 0 1\r\n",
            b"set a 18446744073709551616 0 1\r\n",
            b"set a 0 abc 1\r\n",
            b"set a 0 0 -1\r\n",
            b"set a 0 0 abc\r\n",
            b"set a 0 0 2147483646\r\n",
            b"set a 0 0 2147483648\r\n",
            b"set a 0 0 9223372036854775808\r\n",
            b"cas a 0 0 1 abc\r\n",
            b"cas a 0 0 1 -1\r\n",
        ] {
            assert_eq!(
                err(line),
                (ErrorReply::BadFormat, false),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn storage_error_remembers_noreply() {
        assert_eq!(
            err(b"set a 0 0 -1 noreply\r\n"),
            (ErrorReply::BadFormat, true)
        );
        // "noreply" in the cas position sets noreply, then fails to parse as a CAS.
        assert_eq!(
            err(b"cas a 0 0 1 noreply\r\n"),
            (ErrorReply::BadFormat, true)
        );
    }

    #[test]
    fn storage_numbers_truncate_like_memcached() {
        match req(b"set b 4294967297 4294967296 4294967297\r\nx\r\n") {
            Request::Store(s) => {
                assert_eq!((s.flags, s.exptime, s.value), (1, 0, &b"x"[..]))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn storage_key_too_long_is_bad_format() {
        let mut line = b"set ".to_vec();
        line.extend([b'k'; 251]);
        line.extend(b" 0 0 1\r\n");
        assert_eq!(err(&line), (ErrorReply::BadFormat, false));
        let mut line = b"set ".to_vec();
        line.extend([b'k'; 250]);
        line.extend(b" 0 0 1\r\nx\r\n");
        assert!(matches!(req(&line), Request::Store(_)));
    }

    #[test]
    fn oversized_value_is_refused_from_the_line_alone() {
        match parse(b"set a 0 0 2000000 noreply\r\nxx", &lim(), 0) {
            Parse::Complete { req, len } => {
                assert_eq!(len, 27);
                assert_eq!(
                    req,
                    Request::StoreTooLarge {
                        cmd: StoreCmd::Set,
                        key: b"a",
                        noreply: true,
                        data_len: 2_000_002
                    }
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn value_of_exactly_item_size_max_minus_two_waits_for_data() {
        let line = format!("set a 0 0 {}\r\n", (1 << 20) - 2);
        assert!(matches!(
            parse(line.as_bytes(), &lim(), 0),
            Parse::Incomplete { need, .. } if need == line.len() + (1 << 20)
        ));
    }

    // --- other commands ------------------------------------------------------------

    #[test]
    fn delete_parses_and_validates_hold_time() {
        assert_eq!(
            req(b"delete a\r\n"),
            Request::Delete {
                key: b"a",
                noreply: false
            }
        );
        assert_eq!(
            req(b"delete a 0\r\n"),
            Request::Delete {
                key: b"a",
                noreply: false
            }
        );
        assert_eq!(
            req(b"delete a noreply\r\n"),
            Request::Delete {
                key: b"a",
                noreply: true
            }
        );
        assert_eq!(
            req(b"delete a 0 noreply\r\n"),
            Request::Delete {
                key: b"a",
                noreply: true
            }
        );
        assert_eq!(err(b"delete a 1\r\n"), (ErrorReply::DeleteUsage, false));
        assert_eq!(
            err(b"delete a 1 noreply\r\n"),
            (ErrorReply::DeleteUsage, true)
        );
        assert_eq!(err(b"delete a x y\r\n"), (ErrorReply::DeleteUsage, false));
        assert_eq!(err(b"delete a 0 x\r\n"), (ErrorReply::DeleteUsage, false));
        assert_eq!(err(b"delete\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"delete a b c d\r\n").0, ErrorReply::Error);
        let mut line = b"delete ".to_vec();
        line.extend([b'k'; 251]);
        line.extend(b"\r\n");
        assert_eq!(err(&line), (ErrorReply::BadFormat, false));
    }

    #[test]
    fn incr_and_decr_parse_delta() {
        assert_eq!(
            req(b"incr n 5\r\n"),
            Request::Arith {
                incr: true,
                key: b"n",
                delta: 5,
                noreply: false
            }
        );
        assert_eq!(
            req(b"decr n 18446744073709551615 noreply\r\n"),
            Request::Arith {
                incr: false,
                key: b"n",
                delta: u64::MAX,
                noreply: true
            }
        );
        assert_eq!(err(b"incr n abc\r\n"), (ErrorReply::InvalidDelta, false));
        assert_eq!(err(b"incr n -1\r\n"), (ErrorReply::InvalidDelta, false));
        assert_eq!(err(b"incr n\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"incr b 1 noreply x\r\n").0, ErrorReply::Error);
        let mut line = b"incr ".to_vec();
        line.extend([b'k'; 251]);
        line.extend(b" 1 noreply\r\n");
        assert_eq!(err(&line), (ErrorReply::BadFormat, true));
    }

    #[test]
    fn touch_parses_exptime() {
        assert_eq!(
            req(b"touch a 10\r\n"),
            Request::Touch {
                key: b"a",
                exptime: 10,
                noreply: false
            }
        );
        assert_eq!(
            req(b"touch a 10 x\r\n"),
            Request::Touch {
                key: b"a",
                exptime: 10,
                noreply: false
            }
        );
        assert_eq!(err(b"touch a abc\r\n"), (ErrorReply::InvalidExptime, false));
        assert_eq!(
            err(b"touch a abc noreply\r\n"),
            (ErrorReply::InvalidExptime, true)
        );
        assert_eq!(err(b"touch a\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn flush_all_parses_optional_delay() {
        assert_eq!(
            req(b"flush_all\r\n"),
            Request::FlushAll {
                delay: 0,
                noreply: false
            }
        );
        assert_eq!(
            req(b"flush_all noreply\r\n"),
            Request::FlushAll {
                delay: 0,
                noreply: true
            }
        );
        assert_eq!(
            req(b"flush_all 10 noreply\r\n"),
            Request::FlushAll {
                delay: 10,
                noreply: true
            }
        );
        assert_eq!(
            req(b"flush_all 1 2\r\n"),
            Request::FlushAll {
                delay: 1,
                noreply: false
            }
        );
        assert_eq!(
            req(b"flush_all -5\r\n"),
            Request::FlushAll {
                delay: -5,
                noreply: false
            }
        );
        assert_eq!(
            err(b"flush_all abc\r\n"),
            (ErrorReply::InvalidExptime, false)
        );
        assert_eq!(
            err(b"flush_all noreply x\r\n"),
            (ErrorReply::InvalidExptime, false)
        );
        assert_eq!(err(b"flush_all 1 2 3\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn stats_subcommands_parse() {
        assert_eq!(req(b"stats\r\n"), Request::Stats(StatsRequest::General));
        assert_eq!(req(b"stats reset\r\n"), Request::Stats(StatsRequest::Reset));
        assert_eq!(
            req(b"stats items x\r\n"),
            Request::Stats(StatsRequest::Group(b"items"))
        );
        assert_eq!(
            req(b"stats detail on\r\n"),
            Request::Stats(StatsRequest::Detail(DetailCmd::On))
        );
        assert_eq!(
            req(b"stats detail dump\r\n"),
            Request::Stats(StatsRequest::Detail(DetailCmd::Dump))
        );
        assert_eq!(
            err(b"stats detail\r\n"),
            (ErrorReply::StatsDetailUsage, false)
        );
        assert_eq!(
            err(b"stats detail x\r\n"),
            (ErrorReply::StatsDetailUsage, false)
        );
        assert_eq!(
            req(b"stats cachedump 1 1\r\n"),
            Request::Stats(StatsRequest::Cachedump(Some((b"1", b"1"))))
        );
    }

    #[test]
    fn version_quit_and_verbosity_parse() {
        assert_eq!(req(b"version\r\n"), Request::Version);
        assert_eq!(req(b"version x y\r\n"), Request::Version);
        assert_eq!(req(b"quit\r\n"), Request::Quit);
        assert_eq!(
            req(b"verbosity 1\r\n"),
            Request::Verbosity {
                level: 1,
                noreply: false
            }
        );
        assert_eq!(
            req(b"verbosity 1 2\r\n"),
            Request::Verbosity {
                level: 1,
                noreply: false
            }
        );
        assert_eq!(err(b"verbosity abc\r\n"), (ErrorReply::BadFormat, false));
        assert_eq!(err(b"verbosity -1\r\n"), (ErrorReply::BadFormat, false));
        assert_eq!(err(b"verbosity\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"verbosity 1 2 3\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn shutdown_modes_parse() {
        assert_eq!(
            req(b"shutdown\r\n"),
            Request::Shutdown {
                graceful: Some(false)
            }
        );
        assert_eq!(
            req(b"shutdown graceful\r\n"),
            Request::Shutdown {
                graceful: Some(true)
            }
        );
        assert_eq!(req(b"shutdown x\r\n"), Request::Shutdown { graceful: None });
    }

    #[test]
    fn cache_memlimit_parses() {
        assert_eq!(
            req(b"cache_memlimit 100 noreply\r\n"),
            Request::CacheMemlimit {
                megabytes: 100,
                noreply: true
            }
        );
        assert_eq!(err(b"cache_memlimit abc\r\n"), (ErrorReply::Error, false));
        assert_eq!(err(b"cache_memlimit\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn slabs_commands_parse() {
        assert_eq!(
            req(b"slabs reassign 1 2\r\n"),
            Request::SlabsReassign {
                classes: Some((1, 2))
            }
        );
        assert_eq!(
            req(b"slabs reassign a b\r\n"),
            Request::SlabsReassign { classes: None }
        );
        assert_eq!(
            req(b"slabs automove 1\r\n"),
            Request::SlabsAutomove {
                setting: Automove::Level(1),
                noreply: false
            }
        );
        assert_eq!(
            req(b"slabs automove ratio 0.5\r\n"),
            Request::SlabsAutomove {
                setting: Automove::Ratio(0.5),
                noreply: false
            }
        );
        assert_eq!(err(b"slabs automove 3\r\n"), (ErrorReply::Error, false));
        assert_eq!(
            err(b"slabs automove 5 noreply\r\n"),
            (ErrorReply::Error, true)
        );
        assert_eq!(err(b"slabs automove x\r\n"), (ErrorReply::BadFormat, false));
        assert_eq!(err(b"slabs automove ratio\r\n"), (ErrorReply::Error, false));
        assert_eq!(err(b"slabs\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"slabs reassign 1 2 noreply\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn lru_crawler_commands_parse() {
        assert_eq!(
            req(b"lru_crawler crawl all\r\n"),
            Request::LruCrawler(LruCrawlerRequest::Crawl(b"all"))
        );
        assert_eq!(
            req(b"lru_crawler metadump 1\r\n"),
            Request::LruCrawler(LruCrawlerRequest::Metadump(b"1"))
        );
        assert_eq!(
            req(b"lru_crawler sleep 5\r\n"),
            Request::LruCrawler(LruCrawlerRequest::Sleep(5))
        );
        assert_eq!(
            err(b"lru_crawler sleep 2000000\r\n").0,
            ErrorReply::CrawlerSleepTooLong
        );
        assert_eq!(err(b"lru_crawler tocrawl x\r\n").0, ErrorReply::BadFormat);
        assert_eq!(
            req(b"lru_crawler enable\r\n"),
            Request::LruCrawler(LruCrawlerRequest::Enable)
        );
        assert_eq!(err(b"lru_crawler\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"lru_crawler foo\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"lru_crawler metadump\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn lru_commands_parse_and_validate() {
        assert_eq!(
            req(b"lru tune 10 10 0.1 2\r\n"),
            Request::LruTune {
                pct_hot: 10,
                pct_warm: 10,
                hot_factor: 0.1,
                warm_factor: 2.0,
                noreply: false
            }
        );
        assert_eq!(err(b"lru tune 50 50 0.1 2\r\n").0, ErrorReply::LruPercents);
        assert_eq!(err(b"lru tune 10 10 0 2\r\n").0, ErrorReply::LruFactors);
        assert_eq!(err(b"lru tune a 10 1 2\r\n").0, ErrorReply::Error);
        assert_eq!(err(b"lru tune 10 10 1\r\n").0, ErrorReply::Error);
        assert_eq!(
            req(b"lru mode flat\r\n"),
            Request::LruMode {
                segmented: Some(false),
                noreply: false
            }
        );
        assert_eq!(
            req(b"lru temp_ttl x\r\n"),
            Request::LruTempTtl {
                ttl: None,
                noreply: false
            }
        );
        assert_eq!(err(b"lru foo noreply\r\n"), (ErrorReply::Error, true));
        assert_eq!(err(b"lru\r\n").0, ErrorReply::Error);
    }

    #[test]
    fn watch_refresh_certs_and_meta_parse() {
        assert_eq!(req(b"watch\r\n"), Request::Watch { noreply: false });
        assert_eq!(req(b"watch noreply\r\n"), Request::Watch { noreply: true });
        assert_eq!(req(b"refresh_certs\r\n"), Request::RefreshCerts);
        for m in ["mg", "ms", "md", "ma", "mn", "me"] {
            assert_eq!(req(format!("{m} foo\r\n").as_bytes()), Request::Meta);
        }
        assert_eq!(req(b"mn\r\n"), Request::Meta);
    }

    // --- replies -------------------------------------------------------------------

    #[test]
    fn value_header_is_memcached_format() {
        let mut out = Vec::new();
        write_value_header(&mut out, b"k", 5, 3, None);
        write_value_header(&mut out, b"k", 0, 0, Some(18446744073709551615));
        assert_eq!(
            out,
            b"VALUE k 5 3\r\nVALUE k 0 0 18446744073709551615\r\n".to_vec()
        );
    }

    #[test]
    fn numbers_print_in_decimal() {
        let mut out = Vec::new();
        push_u64(&mut out, 0);
        out.push(b' ');
        push_i64(&mut out, i64::MIN);
        out.push(b' ');
        write_number_line(&mut out, 1234567890);
        assert_eq!(out, b"0 -9223372036854775808 1234567890\r\n".to_vec());
    }

    // --- properties ----------------------------------------------------------------

    fn arb_key() -> impl Strategy<Value = Vec<u8>> {
        // Any byte that is not a separator, a line end or NUL.
        prop::collection::vec(
            any::<u8>().prop_filter("separator", |b| !matches!(b, b' ' | b'\n' | b'\r' | 0)),
            1..=KEY_MAX_LEN,
        )
    }

    #[derive(Debug, Clone)]
    enum Owned {
        Get(Vec<Vec<u8>>, bool),
        Gat(i32, Vec<Vec<u8>>, bool),
        Store(StoreCmd, Vec<u8>, u32, i32, Vec<u8>, u64, bool),
        Delete(Vec<u8>, bool),
        Arith(bool, Vec<u8>, u64, bool),
        Touch(Vec<u8>, i32, bool),
        Flush(i32, bool),
        Verbosity(u32, bool),
        Version,
        Quit,
        Stats,
    }

    fn arb_request() -> impl Strategy<Value = Owned> {
        let cmd = prop_oneof![
            Just(StoreCmd::Set),
            Just(StoreCmd::Add),
            Just(StoreCmd::Replace),
            Just(StoreCmd::Append),
            Just(StoreCmd::Prepend),
            Just(StoreCmd::Cas),
        ];
        prop_oneof![
            (prop::collection::vec(arb_key(), 1..40), any::<bool>())
                .prop_map(|(k, c)| Owned::Get(k, c)),
            (
                any::<i32>(),
                prop::collection::vec(arb_key(), 0..5),
                any::<bool>()
            )
                .prop_map(|(e, k, c)| Owned::Gat(e, k, c)),
            (
                cmd,
                arb_key(),
                any::<u32>(),
                any::<i32>(),
                prop::collection::vec(any::<u8>(), 0..64),
                any::<u64>(),
                any::<bool>()
            )
                .prop_map(|(c, k, f, e, v, cas, n)| {
                    let cas = if c == StoreCmd::Cas { cas } else { 0 };
                    Owned::Store(c, k, f, e, v, cas, n)
                }),
            (arb_key(), any::<bool>()).prop_map(|(k, n)| Owned::Delete(k, n)),
            (any::<bool>(), arb_key(), any::<u64>(), any::<bool>())
                .prop_map(|(i, k, d, n)| Owned::Arith(i, k, d, n)),
            (arb_key(), any::<i32>(), any::<bool>()).prop_map(|(k, e, n)| Owned::Touch(k, e, n)),
            (any::<i32>(), any::<bool>()).prop_map(|(d, n)| Owned::Flush(d, n)),
            (any::<u32>(), any::<bool>()).prop_map(|(l, n)| Owned::Verbosity(l, n)),
            Just(Owned::Version),
            Just(Owned::Quit),
            Just(Owned::Stats),
        ]
    }

    fn encode_owned(o: &Owned) -> Vec<u8> {
        let joined = |ks: &Vec<Vec<u8>>| ks.join(&b' ');
        let mut out = Vec::new();
        let (k_get, k_gat);
        let r = match o {
            Owned::Get(ks, cas) => {
                k_get = joined(ks);
                Request::Get {
                    keys: Keys::new(&k_get),
                    cas: *cas,
                }
            }
            Owned::Gat(e, ks, cas) => {
                k_gat = joined(ks);
                Request::Gat {
                    exptime: *e,
                    keys: Keys::new(&k_gat),
                    cas: *cas,
                }
            }
            Owned::Store(cmd, key, flags, exptime, value, cas, noreply) => {
                Request::Store(StoreRequest {
                    cmd: *cmd,
                    key,
                    flags: *flags,
                    exptime: *exptime,
                    value,
                    cas: *cas,
                    noreply: *noreply,
                })
            }
            Owned::Delete(key, noreply) => Request::Delete {
                key,
                noreply: *noreply,
            },
            Owned::Arith(incr, key, delta, noreply) => Request::Arith {
                incr: *incr,
                key,
                delta: *delta,
                noreply: *noreply,
            },
            Owned::Touch(key, exptime, noreply) => Request::Touch {
                key,
                exptime: *exptime,
                noreply: *noreply,
            },
            Owned::Flush(delay, noreply) => Request::FlushAll {
                delay: *delay,
                noreply: *noreply,
            },
            Owned::Verbosity(level, noreply) => Request::Verbosity {
                level: *level,
                noreply: *noreply,
            },
            Owned::Version => Request::Version,
            Owned::Quit => Request::Quit,
            Owned::Stats => Request::Stats(StatsRequest::General),
        };
        r.encode(&mut out).expect("encodable");
        // Re-encoding the parsed request must give the same bytes.
        match parse(&out, &lim(), 0) {
            Parse::Complete { req, len } => {
                assert_eq!(len, out.len());
                assert_eq!(req, r);
            }
            other => panic!("{other:?}"),
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..4096)) {
            match parse(&input, &lim(), 0) {
                Parse::Complete { len, req } => {
                    prop_assert!(len > 0 && len <= input.len());
                    // Whatever parses and is encodable parses back to itself.
                    let mut out = Vec::new();
                    if req.encode(&mut out).is_ok() {
                        if let Parse::Complete { req: again, .. } = parse(&out, &lim(), 0) {
                            prop_assert_eq!(again.verb(), req.verb());
                        }
                    }
                }
                Parse::Incomplete { scanned, .. } => prop_assert!(scanned <= input.len()),
                Parse::Close(_) => {}
            }
        }

        #[test]
        fn command_like_lines_never_panic(
            cmd in prop::sample::select(vec![
                "get", "gets", "gat", "gats", "bget", "set", "add", "replace", "append",
                "prepend", "cas", "incr", "decr", "touch", "delete", "flush_all", "stats",
                "version", "verbosity", "quit", "shutdown", "cache_memlimit", "slabs",
                "lru_crawler", "lru", "watch", "refresh_certs", "mg", "ms",
            ]),
            args in prop::collection::vec(
                prop::sample::select(vec![
                    "0", "1", "-1", "noreply", "a", "reassign", "automove", "ratio", "tune",
                    "mode", "temp_ttl", "crawl", "sleep", "detail", "on", "reset", "2147483648",
                    "18446744073709551616", "", " ", "\t", "\r",
                ]),
                0..30,
            ),
        ) {
            let mut line = cmd.as_bytes().to_vec();
            for a in &args {
                line.push(b' ');
                line.extend(a.as_bytes());
            }
            line.extend(b"\r\nxyz\r\n");
            let _ = parse(&line, &lim(), 0);
        }

        #[test]
        fn encoded_requests_round_trip(r in arb_request()) {
            let _ = encode_owned(&r);
        }

        #[test]
        fn splitting_input_gives_the_same_result(
            r in arb_request(),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = encode_owned(&r);
            let whole = parse(&bytes, &lim(), 0);
            let k = cut.index(bytes.len() + 1);
            let prefix = &bytes[..k];
            match parse(prefix, &lim(), 0) {
                Parse::Incomplete { scanned, .. } => {
                    // Resuming from the hint with the whole input agrees as well.
                    prop_assert_eq!(parse(&bytes, &lim(), scanned), whole);
                }
                // A request complete in a prefix is the same request.
                done => prop_assert_eq!(done, whole),
            }
        }

        #[test]
        fn splitting_pipelined_input_gives_the_same_requests(
            rs in prop::collection::vec(arb_request(), 1..6),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let mut bytes = Vec::new();
            for r in &rs {
                bytes.extend(encode_owned(r));
            }
            // Feed the input in chunks, as a socket would.
            let mut ends: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            ends.push(bytes.len());
            ends.sort_unstable();
            let mut consumed = 0;
            let mut scanned = 0;
            let mut seen = Vec::new();
            for end in ends {
                loop {
                    if consumed >= end {
                        break;
                    }
                    match parse(&bytes[consumed..end], &lim(), scanned) {
                        Parse::Complete { req, len } => {
                            let mut enc = Vec::new();
                            req.encode(&mut enc).expect("encodable");
                            seen.push(enc);
                            consumed += len;
                            scanned = 0;
                        }
                        Parse::Incomplete { scanned: s, .. } => {
                            scanned = s;
                            break;
                        }
                        Parse::Close(c) => prop_assert!(false, "closed: {:?}", c),
                    }
                }
            }
            let expected: Vec<Vec<u8>> = rs.iter().map(encode_owned).collect();
            prop_assert_eq!(seen, expected);
        }
    }
}
