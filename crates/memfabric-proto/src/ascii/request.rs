//! The typed requests `parse` produces: commands, their arguments and error replies,
//! framing limits and the outcome of a parse.

use super::{Keys, DEFAULT_MAX_LINE, DEFAULT_MAX_MULTIGET_LINE};

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
    Extstore,
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
    pub const fn as_bytes(self) -> &'static [u8] {
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
    /// `refresh_certs [noreply]`: load the TLS certificate files again.
    RefreshCerts {
        noreply: bool,
    },
    /// `extstore <setting> <value>`: change a flash tier setting at run time. memcached
    /// parses the value per setting (and answers OK or ERROR); so does the server.
    Extstore {
        setting: &'a [u8],
        value: &'a [u8],
    },
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
