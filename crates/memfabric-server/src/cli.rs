//! Command line: memcached 1.6's flags, mapped onto `Settings`.
//!
//! Every flag and `-o` option memcached 1.6.18 accepts falls in one of three groups:
//!
//! * honoured: it does here what it does in memcached;
//! * accepted, changing nothing: a tuning knob of a mechanism memfabric does not have
//!   (segmented LRU, watch logging, ...), where nothing a client can observe depends on it.
//!   `docs/ARCHITECTURE.md` ("Limits and deliberate differences") says why for each;
//! * refused: a feature memfabric lacks whose absence a user could not see but would rely
//!   on (restartable memory files, TLS and SASL variants it lacks):
//!   the server does not start, and says which flag and why, rather than run without it.
//!
//! An unknown `-o` option stops the server with memcached's `Illegal suboption` message.
use clap::{ArgAction, Parser};

use crate::settings::{ProtocolChoice, Settings};

/// memfabricd: a memcached-compatible cache daemon.
#[derive(Parser, Debug)]
#[command(
    name = "memfabricd",
    version,
    about,
    disable_help_flag = true,
    // As with getopt, a flag given twice takes its last value.
    args_override_self = true
)]
pub struct Args {
    /// TCP port to listen on (default: 11211, 0 = off, -1 = any free port: see
    /// MEMCACHED_PORT_FILENAME)
    #[arg(
        short = 'p',
        long = "port",
        value_name = "num",
        default_value = "11211",
        value_parser = c_atoi,
        allow_hyphen_values = true
    )]
    pub port: i32,
    /// UDP port to listen on (default: 0, off; -1 = any free port)
    #[arg(
        short = 'U',
        long = "udp-port",
        value_name = "num",
        default_value = "0",
        value_parser = c_atoi,
        allow_hyphen_values = true
    )]
    pub udp_port: i32,
    /// UNIX socket to listen on (disables network support)
    #[arg(short = 's', long = "unix-socket", value_name = "file")]
    pub unix_socket: Option<String>,
    /// access mask for UNIX socket, in octal (default: 700)
    #[arg(
        short = 'a',
        long = "unix-mask",
        value_name = "mask",
        default_value = "700"
    )]
    pub unix_mask: String,
    /// enable ascii "shutdown" command
    #[arg(short = 'A', long = "enable-shutdown")]
    pub enable_shutdown: bool,
    /// interface to listen on (default: INADDR_ANY); comma list, may repeat; addr or addr:port
    #[arg(short = 'l', long = "listen", value_name = "addr", action = ArgAction::Append)]
    pub listen: Vec<String>,
    /// run as a daemon
    #[arg(short = 'd', long = "daemon")]
    pub daemon: bool,
    /// maximize core file limit
    #[arg(short = 'r', long = "enable-coredumps")]
    pub enable_coredumps: bool,
    /// assume identity of <username> (only when run as root)
    #[arg(short = 'u', long = "user", value_name = "user")]
    pub user: Option<String>,
    /// item memory in megabytes (default: 64)
    #[arg(
        short = 'm',
        long = "memory-limit",
        value_name = "num",
        default_value = "64"
    )]
    pub memory_limit: String,
    /// return error on memory exhausted instead of evicting
    #[arg(short = 'M', long = "disable-evictions")]
    pub disable_evictions: bool,
    /// max simultaneous connections (default: 1024)
    #[arg(
        short = 'c',
        long = "conn-limit",
        value_name = "num",
        default_value = "1024",
        value_parser = c_atoi,
        allow_hyphen_values = true
    )]
    pub conn_limit: i32,
    /// lock down all paged memory
    #[arg(short = 'k', long = "lock-memory")]
    pub lock_memory: bool,
    /// verbose (-v errors/warnings, -vv client commands and connections, -vvv internals)
    #[arg(short = 'v', long = "verbose", action = ArgAction::Count)]
    pub verbose: u8,
    /// print this help and exit
    #[arg(short = 'h', long = "help", action = ArgAction::Help)]
    pub help: Option<bool>,
    /// print license and exit
    #[arg(short = 'i', long = "license")]
    pub license: bool,
    /// save PID in <file>
    #[arg(short = 'P', long = "pidfile", value_name = "file")]
    pub pidfile: Option<String>,
    /// chunk size growth factor (default: 1.25)
    #[arg(
        short = 'f',
        long = "slab-growth-factor",
        value_name = "num",
        default_value = "1.25",
        value_parser = c_atof,
        allow_hyphen_values = true
    )]
    pub growth_factor: f64,
    /// min space used for key+value+flags (default: 48)
    #[arg(
        short = 'n',
        long = "slab-min-size",
        value_name = "bytes",
        default_value = "48",
        value_parser = c_atoi,
        allow_hyphen_values = true
    )]
    pub min_chunk: i32,
    /// try to use large memory pages (if available)
    #[arg(short = 'L', long = "enable-largepages")]
    pub large_pages: bool,
    /// delimiter between key prefixes and IDs for per-prefix stats (turns detail on)
    #[arg(short = 'D', value_name = "char")]
    pub delimiter: Option<String>,
    /// number of worker threads to use (default: 4)
    #[arg(
        short = 't',
        long = "threads",
        value_name = "num",
        default_value = "4",
        value_parser = c_atoi,
        allow_hyphen_values = true
    )]
    pub threads: i32,
    /// maximum number of requests per event per connection (default: 20)
    #[arg(
        short = 'R',
        long = "max-reqs-per-event",
        value_name = "num",
        default_value = "20",
        value_parser = c_atoi,
        allow_hyphen_values = true
    )]
    pub reqs_per_event: i32,
    /// disable use of CAS
    #[arg(short = 'C', long = "disable-cas")]
    pub disable_cas: bool,
    /// set the backlog queue limit (default: 1024)
    #[arg(
        short = 'b',
        long = "listen-backlog",
        value_name = "num",
        default_value = "1024",
        value_parser = c_atoi,
        allow_hyphen_values = true
    )]
    pub backlog: i32,
    /// protocol - one of ascii, binary, or auto (default: auto-negotiate; binary with -S)
    #[arg(short = 'B', long = "protocol", value_name = "name")]
    pub protocol: Option<String>,
    /// max item size, k/m/g suffixes (default: 1m, min: 1k, max: 1024m)
    #[arg(
        short = 'I',
        long = "max-item-size",
        value_name = "num",
        default_value = "1m"
    )]
    pub max_item_size: String,
    /// turn on SASL authentication: binary protocol only, SASL PLAIN checked against the
    /// `user:password` file named by the MEMCACHED_SASL_PWDB environment variable (as a
    /// memcached built with --enable-sasl-pwdb; no Cyrus sasldb); the UCX bootstrap asks
    /// for the same credentials
    #[arg(short = 'S', long = "enable-sasl")]
    pub sasl: bool,
    /// disable flush_all command
    #[arg(short = 'F', long = "disable-flush-all")]
    pub disable_flush: bool,
    /// disable stats cachedump and lru_crawler metadump
    #[arg(short = 'X', long = "disable-dumping")]
    pub disable_dumping: bool,
    /// disable watch commands (accepted: memfabricd has no watch commands)
    #[arg(short = 'W', long = "disable-watch")]
    pub disable_watch: bool,
    /// ASCII protocol authentication file: `user:password` lines (memcached's `-Y`;
    /// reloaded on SIGHUP; the UCX bootstrap asks for the same credentials). Needs `-U 0`
    #[arg(short = 'Y', long = "auth-file", value_name = "file")]
    pub auth_file: Option<String>,
    /// mmap a file for item memory, restartable cache (not supported: refuses to start)
    #[arg(short = 'e', long = "memory-file", value_name = "file")]
    pub memory_file: Option<String>,
    /// enable TLS on the TCP listeners (rustls; -o ssl_chain_cert=,ssl_key=[,ssl_ca_cert=,
    /// ssl_verify_mode=0-3,ssl_min_version=2|3 (TLS 1.2|1.3),ssl_session_cache,ssl_wbuf_size=KB];
    /// `-l notls:ADDR` listeners stay plain; `refresh_certs` reloads the files)
    #[arg(short = 'Z', long = "enable-ssl")]
    pub ssl: bool,
    /// number of napi ids (accepted, ignored)
    #[arg(
        short = 'N',
        long = "napi_ids",
        value_name = "num",
        value_parser = c_atoi,
        allow_hyphen_values = true
    )]
    pub napi_ids: Option<i32>,
    /// comma separated extended options, as memcached 1.6.18's: maxconns_fast, hashpower=N,
    /// idle_timeout=N, slab_automove=N, no_lru_crawler, sock_cookie_id=N, ...
    /// (no_lru_maintainer: the maintenance thread keeps no 1 ms tick under load, as it stops
    /// memcached's maintainer; memcached's other LRU tuning options are accepted and change
    /// nothing; ssl_* need -Z; an unknown one is an error). The flash
    /// tier (docs/flash.md): ext_path=FILE:SIZE[,ext_path=...]
    /// (SIZE with K|M|G|T), ext_item_size=BYTES (smaller items stay in RAM), ext_low_ttl=S,
    /// ext_item_age=S, ext_threads=N (read threads), ext_wbuf_size=MB (pages buffered);
    /// ext_page_size (the slab page is the flash page), ext_recache_rate (flash reads never
    /// recache), ext_compact_under, ext_drop_under, ext_max_frag, ext_drop_unread,
    /// ext_max_sleep, ext_io_depth are accepted and have no effect: there is no compaction
    #[arg(short = 'o', long = "extended", value_name = "opt[,opt]", action = ArgAction::Append)]
    pub extended: Vec<String>,
    /// with ext_path: bytes per second written to flash at most (items over it are evicted
    /// as without flash; a SET never waits for flash; 0 = no limit)
    #[arg(long = "flash-write-budget", value_name = "bytes", default_value_t = 0)]
    pub flash_write_budget: u64,
    /// with ext_path: direct (O_DIRECT where the file system allows it, else buffered) or
    /// buffered I/O
    #[arg(
        long = "flash-io",
        value_name = "direct|buffered",
        default_value = "direct"
    )]
    pub flash_io: String,
    /// with ext_path: how flash reads are done: io_uring (one thread, many reads in
    /// flight), psync (ext_threads threads doing pread), or auto (io_uring when a start-up
    /// probe says it works here, else psync)
    #[arg(
        long = "flash-io-engine",
        value_name = "auto|io_uring|psync",
        default_value = "auto"
    )]
    pub flash_io_engine: String,
    /// with ext_path: on a start, serve again what a previous run left on flash (after a
    /// clean shutdown or a crash); off starts empty and erases it
    #[arg(long = "flash-recover", value_name = "on|off", default_value = "on")]
    pub flash_recover: String,
    /// after any activity (TCP, UDP or UCX), keep polling for this many microseconds
    /// before sleeping in epoll (an override: by default only UCX work is followed by a
    /// short adaptive poll, --ucx-poll-us; default: 0)
    #[arg(long = "poll-us", value_name = "us", default_value_t = 0)]
    pub poll_us: u64,
    /// UCX: after UCX work, keep progressing UCX for up to this many microseconds before
    /// sleeping, while the sessions keep the worker busy (the window shrinks when they
    /// pause); TCP-only work never polls (0 = off)
    #[arg(long = "ucx-poll-us", value_name = "us", default_value_t = crate::settings::DEFAULT_UCX_POLL_US)]
    pub ucx_poll_us: u64,
    /// after TCP or UDP requests, keep polling the sockets for the next one for up to this
    /// many microseconds before sleeping, while the machine's CPUs are at least 30% idle
    /// and the polls catch requests (the window shrinks when they do not); spares a
    /// client the wake-up of a sleeping worker, at the cost of otherwise idle CPU time
    /// (0 = off)
    #[arg(long = "tcp-poll-us", value_name = "us", default_value_t = crate::settings::DEFAULT_TCP_POLL_US)]
    pub tcp_poll_us: u64,
    /// UCX data path: TCP port clients bootstrap their UCX connection on (default 11311;
    /// 0 = off). A port given here that cannot be bound stops the server; the default one,
    /// if taken on any interface, turns the UCX path off with a warning, so that several
    /// servers on one host still start (TCP only after the first). The UCX
    /// transports come from the environment (UCX_TLS), never from here
    #[arg(long = "ucx-port", value_name = "port")]
    pub ucx_port: Option<u16>,
    /// UCX: values larger than this many bytes go by rendezvous (the server pulls them
    /// into item memory / the client pulls them from item memory); smaller ones eagerly
    #[arg(long = "ucx-eager-max", value_name = "bytes", default_value_t = memfabric_proto::ucx_wire::DEFAULT_EAGER_MAX)]
    pub ucx_eager_max: usize,
    /// UCX: seconds a bootstrap connection has to complete its HELLO before it is closed
    /// (0 = no deadline).
    #[arg(
        long = "ucx-hello-timeout",
        value_name = "seconds",
        default_value_t = 10
    )]
    pub ucx_hello_timeout: u32,
    /// With -Y, -S or -Z: seconds a connection has to authenticate (or finish its TLS
    /// handshake) before it is closed (counted in idle_kicks; 0 = no deadline)
    #[arg(long = "auth-timeout", value_name = "seconds", default_value_t = 10)]
    pub auth_timeout: u32,
    /// UCX: seconds a rendezvous transfer (a large GET reply or SET value) may stay in
    /// flight before its session is ended and the transfer cancelled (0 = no deadline).
    #[arg(
        long = "ucx-transfer-timeout",
        value_name = "seconds",
        default_value_t = 30
    )]
    pub ucx_transfer_timeout: u32,
    /// UCX: rendezvous bytes one session may have in flight (k/m/g suffixes); further
    /// large GETs and SETs wait until some complete (one transfer is always let through).
    #[arg(long = "ucx-session-inflight-max", value_name = "size", default_value = "64m", value_parser = parse_size_arg)]
    pub ucx_session_inflight_max: u64,
    /// UCX: sessions served at once; a HELLO beyond them is refused (the client is told
    /// the server is full). Also UCX's estimate of the endpoints it will hold, by which it
    /// picks transports (UCX_NUM_EPS overrides). UCX sessions count toward -c as well
    #[arg(long = "max-clients", value_name = "num", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_clients: u32,
    /// UCX: the hot tier's transports (a UCX_TLS list; default: UCX_TLS, else UCX's own
    /// choice). Up to --hot-clients busy sessions are served on it (docs/scaling.md)
    #[arg(long = "ucx-hot-tls", value_name = "list")]
    pub ucx_hot_tls: Option<String>,
    /// UCX: the cold tier's transports (a UCX_TLS list), for sessions beyond the hot tier:
    /// transports whose cost stays small per client. "none": one tier
    #[arg(long = "ucx-cold-tls", value_name = "list", default_value = crate::settings::DEFAULT_COLD_TLS)]
    pub ucx_cold_tls: String,
    /// UCX: sessions served on the hot tier at most; the others are served on the cold
    /// tier, and move between them by how busy they are
    #[arg(long = "hot-clients", value_name = "num", default_value_t = 256)]
    pub hot_clients: u32,
    /// UCX: requests per second at which a cold session is promoted to the hot tier
    #[arg(long = "promote-rate", value_name = "per_second", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub promote_rate: u32,
    /// UCX: seconds below --promote-rate after which a hot session is demoted (0: only
    /// when the hot tier is full and a busier client needs its place)
    #[arg(long = "hot-idle", value_name = "seconds", default_value_t = 10)]
    pub hot_idle: u32,
    /// Test store (for tests only): retrievals of keys starting with this prefix stay
    /// pending until a client sends `debug release`
    #[arg(long = "debug-hold-keys", value_name = "prefix", hide = true)]
    pub debug_hold_keys: Option<String>,
}

/// Why the command line cannot start a server. `code` is the exit status memcached uses
/// (64, EX_USAGE, for bad values; 1 for others).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    pub message: String,
    pub code: i32,
}

/// memcached's slab page size, which slab_chunk_max must divide.
const SLAB_PAGE_SIZE: usize = 1 << 20;

fn usage(message: impl Into<String>) -> CliError {
    CliError {
        message: message.into(),
        code: 64,
    }
}

fn fatal(message: impl Into<String>) -> CliError {
    CliError {
        message: message.into(),
        code: 1,
    }
}

/// A flag asking for a feature memfabricd does not have: it refuses to start (EX_USAGE)
/// rather than run without it.
fn refused(flag: &str, why: &str) -> CliError {
    usage(format!(
        "memfabricd: {flag}: {why}; refusing to start without it"
    ))
}

/// `-S`: memcached's checks and messages, then the password file.
fn sasl_settings(
    with_auth_file: bool,
    s: &Settings,
) -> Result<std::sync::Arc<crate::auth::SaslPwdb>, CliError> {
    if s.protocol != ProtocolChoice::Binary {
        return Err(usage(
            "ERROR: You cannot allow the ASCII protocol while using SASL.",
        ));
    }
    if s.udp_port != 0 {
        return Err(usage(
            "ERROR: Cannot enable UDP while using binary SASL authentication.",
        ));
    }
    if with_auth_file {
        // memcached starts with both, and then answers neither protocol's handshake
        // correctly.
        return Err(refused(
            "-S with -Y",
            "SASL is binary-only and the -Y handshake text-only; use one",
        ));
    }
    let Some(path) = std::env::var_os("MEMCACHED_SASL_PWDB") else {
        return Err(refused(
            "-S (SASL authentication)",
            "memfabricd checks SASL PLAIN against the user:password file named by \
             MEMCACHED_SASL_PWDB (memcached's --enable-sasl-pwdb convention; it reads no \
             Cyrus sasldb), and MEMCACHED_SASL_PWDB is not set",
        ));
    };
    let path = path.to_string_lossy().into_owned();
    crate::auth::SaslPwdb::open(&path)
        .map(std::sync::Arc::new)
        .map_err(|e| usage(format!("memfabricd: {e}; refusing to start without it")))
}

/// `-Z` and the `ssl_*` options: memcached's names, values and messages; what rustls cannot
/// do refuses to start. The files are loaded here, so a certificate that cannot be read
/// stops the server (memcached's message, exit 64).
fn tls_settings(
    enabled: bool,
    extended: &[String],
) -> Result<Option<std::sync::Arc<crate::tls::Tls>>, CliError> {
    let mut o = crate::tls::TlsOptions::default();
    let mut given = None;
    for opt in extended.iter().flat_map(|o| o.split(',')).map(str::trim) {
        let (name, val) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        if !TLS_OPTIONS.contains(&name) {
            continue;
        }
        given.get_or_insert_with(|| opt.to_string());
        let unparsable = || usage(format!("could not parse argument to {name}"));
        match name {
            "ssl_chain_cert" => o.chain_cert = Some(required(name, val)?.to_string()),
            "ssl_key" => o.key = Some(required(name, val)?.to_string()),
            "ssl_ca_cert" => o.ca_cert = Some(required(name, val)?.to_string()),
            "ssl_verify_mode" => {
                let v: u8 = required(name, val)?
                    .trim()
                    .parse()
                    .map_err(|_| unparsable())?;
                if v > crate::tls::VERIFY_ONCE {
                    return Err(usage(
                        "Invalid ssl_verify_mode. Use help to see valid options.",
                    ));
                }
                o.verify_mode = v;
            }
            "ssl_min_version" => {
                // memcached's numbers: 0 TLS 1.0, 1 TLS 1.1, 2 TLS 1.2, 3 TLS 1.3.
                let v: i64 = required(name, val)?
                    .trim()
                    .parse()
                    .map_err(|_| unparsable())?;
                o.tls13_only = match v {
                    2 => false,
                    3 => true,
                    0 | 1 => {
                        return Err(refused(
                            &format!("-o {opt}"),
                            "memfabricd's TLS (rustls) speaks TLS 1.2 and 1.3 only",
                        ))
                    }
                    _ => {
                        return Err(usage(
                            "Invalid ssl_min_version. Use help to see valid options.",
                        ))
                    }
                }
            }
            "ssl_wbuf_size" => {
                let kb: usize = required(name, val)?
                    .trim()
                    .parse()
                    .map_err(|_| unparsable())?;
                o.wbuf_size = kb.max(1).checked_mul(1024).ok_or_else(unparsable)?;
            }
            "ssl_session_cache" => o.session_cache = true,
            "ssl_keyformat" => {
                if required(name, val)?.trim() != "1" {
                    return Err(refused(
                        &format!("-o {opt}"),
                        "memfabricd reads PEM keys only (ssl_keyformat=1)",
                    ));
                }
            }
            "ssl_ciphers" => {
                return Err(refused(
                    &format!("-o {opt}"),
                    "an OpenSSL cipher list; memfabricd's TLS (rustls) offers its own fixed \
                     set of modern suites and cannot restrict them by that syntax",
                ))
            }
            _ => {
                return Err(refused(
                    &format!("-o {opt}"),
                    "memfabricd's TLS (rustls) cannot hand connections to kernel TLS",
                ))
            }
        }
    }
    if !enabled {
        return match given {
            Some(opt) => Err(refused(
                &format!("-o {opt} without -Z"),
                "TLS options mean nothing without -Z, and the server would serve in clear text",
            )),
            None => Ok(None),
        };
    }
    crate::tls::Tls::new(o)
        .map(|t| Some(std::sync::Arc::new(t)))
        .map_err(usage)
}

/// The interfaces of every `-l`, as memcached joins them: each `-l` is appended to one
/// comma list unless its text already occurs in it. So a repeated `-l 127.0.0.1` is one
/// listener, not a failed second bind, and, memcached's quirk kept, `-l 127.0.0.1:P -l
/// 127.0.0.1` is only `127.0.0.1:P` (the second is a substring of the first).
fn listen_list(given: &[String]) -> Vec<String> {
    let mut joined = String::new();
    for l in given {
        if joined.is_empty() {
            joined.push_str(l);
        } else if !joined.contains(l.as_str()) {
            joined.push(',');
            joined.push_str(l);
        }
    }
    // memcached's strtok separators.
    joined
        .split([',', ';'])
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// `s` without the C whitespace strtol and atof skip first.
fn skip_c_space(s: &str) -> &str {
    s.trim_start_matches(|c: char| c.is_ascii() && memfabric_proto::number::c_isspace(c as u8))
}

/// glibc's `strtol(s, NULL, radix)`: leading whitespace, a sign, then the digits of
/// `radix` that follow; whatever comes next ends the number, no digits is 0, and a value
/// past `long` saturates. memcached reads most numeric flags with `atoi` (this, cast to
/// `int`), so `-t 5x` is 5 threads and `-c abc` is 0 connections, refused as 0.
fn c_strtol(s: &str, radix: u32) -> i64 {
    let s = skip_c_space(s);
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let mut v: i64 = 0;
    for d in digits.chars().map_while(|c| c.to_digit(radix)) {
        let d = i64::from(d);
        v = match v.checked_mul(i64::from(radix)).and_then(|v| {
            if negative {
                v.checked_sub(d)
            } else {
                v.checked_add(d)
            }
        }) {
            Some(v) => v,
            None => return if negative { i64::MIN } else { i64::MAX },
        };
    }
    v
}

/// C's `atoi` as a flag's parser: never an error (see [`c_strtol`]).
fn c_atoi(s: &str) -> Result<i32, std::convert::Infallible> {
    Ok(c_strtol(s, 10) as i32)
}

/// C's `atof` for decimal numbers as a flag's parser: the longest prefix that is a
/// number (`1.5x` is 1.5), 0 when there is none.
fn c_atof(s: &str) -> Result<f64, std::convert::Infallible> {
    let s = skip_c_space(s);
    let b = s.as_bytes();
    let digits_from = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut end = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let int_end = digits_from(end);
    let mut mantissa = int_end > end;
    end = int_end;
    if b.get(end) == Some(&b'.') {
        let frac_end = digits_from(end + 1);
        mantissa |= frac_end > end + 1;
        end = frac_end;
    }
    if !mantissa {
        return Ok(0.0);
    }
    if matches!(b.get(end), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(b.get(end + 1), Some(b'+' | b'-')));
        let exp_end = digits_from(end + 1 + sign);
        if exp_end > end + 1 + sign {
            end = exp_end;
        }
    }
    Ok(s[..end].parse().unwrap_or(0.0))
}

/// `-p`/`-U`: memcached's range. -1 asks for an ephemeral port, 0 turns the listener off.
/// Above 65535 is memcached's usage error; below -1 memcached fails to bind (EX_OSERR).
fn port(value: i32, proto: &str) -> Result<i32, CliError> {
    if value > i32::from(u16::MAX) {
        return Err(usage(format!("ERROR: Invalid port number {value}.")));
    }
    if value < -1 {
        return Err(CliError {
            message: format!("failed to listen on {proto} port {value}: not a port number"),
            code: 71,
        });
    }
    Ok(value)
}

/// Settings built from the command line, plus warnings to log once logging is set up.
#[derive(Debug)]
pub struct Parsed {
    pub settings: Settings,
    pub warnings: Vec<String>,
    /// `-i`: print the license and exit.
    pub license: bool,
}

/// Parse a size with an optional k/m/g/t/p suffix (binary units), as memcached's `-I` and
/// `ext_path`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1u64 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1u64 << 30),
        b't' | b'T' => (&s[..s.len() - 1], 1u64 << 40),
        b'p' | b'P' => (&s[..s.len() - 1], 1u64 << 50),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// A size flag's value for clap (`parse_size`).
fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).ok_or_else(|| format!("not a size: {s:?} (bytes, or k/m/g)"))
}

/// `-m`: megabytes, or a size with a k/m/g suffix.
fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<u64>().ok()?.checked_mul(1 << 20);
    }
    parse_size(s)
}

/// Parse `args` (including the program name) into settings.
///
/// `--help`, `--version` and clap's own errors come back as `Err(Left(clap::Error))` so the
/// caller can let clap print them and exit with clap's status.
pub fn parse<I, T>(args: I) -> Result<Parsed, Either>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let a = Args::try_parse_from(args).map_err(Either::Clap)?;
    into_settings(a).map_err(Either::Cli)
}

/// Error of [`parse`].
#[derive(Debug)]
pub enum Either {
    Clap(clap::Error),
    Cli(CliError),
}

/// Turn parsed flags into `Settings`, checking values as memcached does.
pub fn into_settings(a: Args) -> Result<Parsed, CliError> {
    let mut s = Settings::default();
    let mut warnings = Vec::new();

    // The features memfabricd lacks, first: nothing else matters if it will not start.
    if let Some(f) = &a.memory_file {
        return Err(refused(
            &format!("-e {f} (restartable memory file)"),
            "memfabricd keeps items in anonymous memory only, so they would not survive a restart",
        ));
    }

    s.tcp_port = port(a.port, "TCP")?;
    s.udp_port = port(a.udp_port, "UDP")?;
    s.listen = listen_list(&a.listen);
    if let Some(l) = s.listen.iter().find(|l| l.starts_with("notls:") && !a.ssl) {
        // memcached's message and status: the prefix only means something with -Z.
        return Err(CliError {
            message: format!(
                "'notls' option is valid only when SSL is enabled\n\
                 failed to listen on one of interface(s) {l}"
            ),
            code: 71,
        });
    }
    s.unix_socket = a.unix_socket;
    // memcached: strtol(optarg, NULL, 8), digits up to the first that is not octal.
    s.unix_mask = c_strtol(&a.unix_mask, 8) as u32;
    s.enable_shutdown = a.enable_shutdown;
    s.daemonize = a.daemon;
    s.enable_coredumps = a.enable_coredumps;
    s.user = a.user;
    s.store.memory_limit = parse_memory(&a.memory_limit)
        .and_then(|m| usize::try_from(m).ok())
        .ok_or_else(|| usage(format!("Invalid memory limit: {}", a.memory_limit)))?;
    s.store.evict = !a.disable_evictions;
    if a.conn_limit <= 0 {
        return Err(fatal("Maximum connections must be greater than 0"));
    }
    s.max_connections = a.conn_limit as usize;
    s.lock_memory = a.lock_memory;
    s.verbose = u32::from(a.verbose);
    s.pidfile = a.pidfile;
    if a.napi_ids.is_some_and(|n| n <= 0) {
        return Err(fatal("Maximum number of NAPI IDs must be greater than 0"));
    }
    if a.growth_factor <= 1.0 || !a.growth_factor.is_finite() {
        return Err(fatal("Factor must be greater than 1"));
    }
    s.store.growth_factor = a.growth_factor;
    if a.min_chunk == 0 {
        return Err(fatal("Chunk size must be greater than 0"));
    }
    // memcached checks only for 0; a negative one shrinks its first class below the item
    // header, ours starts at its smallest.
    s.store.min_chunk = a.min_chunk.max(1) as usize;
    s.large_pages = a.large_pages;
    if let Some(d) = &a.delimiter {
        // memcached takes the first character of whatever it is given, and refuses "".
        let Some(first) = d.chars().next() else {
            return Err(fatal("No delimiter specified"));
        };
        s.prefix_delimiter = first;
        s.detail_enabled = true;
    }
    if a.threads <= 0 {
        return Err(fatal("Number of threads must be greater than 0"));
    }
    if a.threads > 64 {
        warnings.push(
            "WARNING: Setting a high number of workerthreads is not recommended.\n \
             Set this value to the number of cores in your machine or less."
                .to_string(),
        );
    }
    s.threads = a.threads as usize;
    if a.reqs_per_event == 0 {
        return Err(fatal("Number of requests per event must be greater than 0"));
    }
    // memcached checks only for 0; with a negative count it yields after every request.
    s.reqs_per_event = a.reqs_per_event.max(1) as usize;
    s.use_cas = !a.disable_cas;
    s.store.use_cas = s.use_cas;
    // listen(2) caps the backlog at somaxconn; a negative one (memcached passes it on)
    // means the cap.
    s.backlog = u32::try_from(a.backlog).unwrap_or(i32::MAX as u32);
    s.protocol = match a.protocol.as_deref().unwrap_or(if a.sasl { "binary" } else { "auto" }) {
        "auto" => ProtocolChoice::Auto,
        "ascii" => ProtocolChoice::Ascii,
        "binary" => ProtocolChoice::Binary,
        other => {
            return Err(usage(format!(
                "Invalid value for binding protocol: {other}\n -- should be one of auto, binary, or ascii"
            )))
        }
    };
    let item_max = parse_size(&a.max_item_size)
        .ok_or_else(|| usage(format!("Invalid max item size: {}", a.max_item_size)))?;
    if item_max < 1024 {
        return Err(usage("Item max size cannot be less than 1024 bytes."));
    }
    if item_max > 1 << 30 {
        return Err(usage("Cannot set item size limit higher than 1 GB."));
    }
    s.store.item_size_max = item_max as usize;
    s.flush_enabled = !a.disable_flush;
    s.dump_enabled = !a.disable_dumping;
    s.poll_us = a.poll_us;
    s.ucx_poll_us = a.ucx_poll_us;
    s.tcp_poll_us = a.tcp_poll_us;
    s.ucx_port = a.ucx_port.unwrap_or(crate::settings::DEFAULT_UCX_PORT);
    s.ucx_port_given = a.ucx_port.is_some();
    if s.ucx_port_given
        && s.ucx_port != 0
        && s.unix_socket.is_none()
        && i32::from(s.ucx_port) == s.tcp_port
    {
        // Both are TCP listeners: the second bind would fail with a less helpful message.
        return Err(usage(format!(
            "--ucx-port {}: that is the memcached TCP port (-p) too; give each its own",
            s.ucx_port
        )));
    }
    s.ucx_eager_max = a.ucx_eager_max;
    s.ucx_hello_timeout = a.ucx_hello_timeout;
    s.auth_timeout = a.auth_timeout;
    s.ucx_transfer_timeout = a.ucx_transfer_timeout;
    s.ucx_session_inflight_max = a.ucx_session_inflight_max;
    s.ucx_max_clients = a.max_clients;
    s.ucx_hot_tls = a.ucx_hot_tls.clone();
    s.ucx_cold_tls_default = a.ucx_cold_tls == crate::settings::DEFAULT_COLD_TLS;
    s.ucx_cold_tls = match a.ucx_cold_tls.as_str() {
        "none" | "" => None,
        list => Some(list.to_string()),
    };
    s.ucx_hot_clients = a.hot_clients;
    s.ucx_promote_rate = a.promote_rate;
    s.ucx_hot_idle = a.hot_idle;
    s.debug_hold_keys = a.debug_hold_keys.map(String::into_bytes);
    if a.sasl {
        s.sasl = Some(sasl_settings(a.auth_file.is_some(), &s)?);
    }
    s.tls = tls_settings(a.ssl, &a.extended)?;
    if s.tls.is_some() && s.unix_socket.is_some() {
        return Err(refused(
            "-Z with -s (unix socket)",
            "a unix socket replaces the TCP listeners and carries no TLS: the server would \
             serve in clear text",
        ));
    }
    if s.tls.is_some() && s.udp_port != 0 {
        return Err(refused(
            "-Z with -U (UDP)",
            "UDP cannot carry TLS and would serve in clear text next to the TLS listeners",
        ));
    }
    if let Some(f) = &a.auth_file {
        // memcached's checks and messages. The UCX bootstrap uses the same file
        // (a challenge and a proof before UCX sees anything; docs/fabric-protocol.md).
        if s.udp_port != 0 {
            return Err(fatal(
                "Cannot use UDP with ascii authentication enabled (-U 0 to disable)",
            ));
        }
        let (file, warning) = crate::auth::AuthFile::load(f).map_err(fatal)?;
        warnings.extend(warning);
        s.auth = Some(std::sync::Arc::new(file));
    }

    for opt in a.extended.iter().flat_map(|o| o.split(',')) {
        apply_extended(&mut s, opt.trim(), &mut warnings)?;
    }
    s.store.slab_automove = s.slab_reassign && s.slab_automove > 0;
    if let Some(f) = s.store.flash.as_mut() {
        f.write_budget = a.flash_write_budget;
        f.direct_io = match a.flash_io.as_str() {
            "direct" => true,
            "buffered" => false,
            other => {
                return Err(fatal(format!(
                    "--flash-io {other}: expected direct or buffered"
                )))
            }
        };
        s.ext.engine = match a.flash_io_engine.as_str() {
            "auto" => crate::flash_reads::IoEngine::Auto,
            "io_uring" => crate::flash_reads::IoEngine::IoUring,
            "psync" => crate::flash_reads::IoEngine::Psync,
            other => {
                return Err(fatal(format!(
                    "--flash-io-engine {other}: expected auto, io_uring or psync"
                )))
            }
        };
        f.recover = match a.flash_recover.as_str() {
            "on" => true,
            "off" => false,
            other => {
                return Err(fatal(format!(
                    "--flash-recover {other}: expected on or off"
                )))
            }
        };
        f.item_min = s.ext.item_size;
        f.low_ttl = s.ext.low_ttl;
        f.write_buffers = (s.ext.wbuf_mb << 20).div_ceil(s.store.page_size).max(2);
    }

    // memcached sizes the item limit against memory: a slab page must hold two items.
    if s.store.item_size_max > s.store.memory_limit / 2 {
        return Err(usage(
            "Cannot set item size limit higher than 1/2 of memory max.",
        ));
    }
    // memcached's checks of -I against slab_chunk_max (the largest chunk; bigger items
    // are chained from chunks of it), in its order, with its messages. memfabricd's store
    // chains large items its own way, but a flag set memcached refuses is refused here
    // too, rather than a server started that memcached would not start.
    let (item_max, chunk_max) = (s.store.item_size_max, s.slab_chunk_max);
    if chunk_max == 0 || chunk_max > item_max {
        return Err(usage(format!(
            "slab_chunk_max (bytes: {chunk_max}) cannot be larger than -I (item_size_max {item_max})"
        )));
    }
    if !item_max.is_multiple_of(chunk_max) {
        return Err(usage(format!(
            "-I (item_size_max: {item_max}) must be evenly divisible by slab_chunk_max (bytes: {chunk_max})"
        )));
    }
    if !SLAB_PAGE_SIZE.is_multiple_of(chunk_max) {
        return Err(usage(format!(
            "slab_chunk_max (bytes: {chunk_max}) must divide evenly into {SLAB_PAGE_SIZE} (slab_page_size)"
        )));
    }
    if s.unix_socket.is_some() {
        // As memcached: a unix socket replaces the network listeners.
        s.tcp_port = 0;
        s.udp_port = 0;
    }
    Ok(Parsed {
        settings: s,
        warnings,
        license: a.license,
    })
}

fn num<T: std::str::FromStr>(name: &str, val: Option<&str>) -> Result<T, CliError> {
    let v = numeric(name, val)?;
    v.trim()
        .parse()
        .map_err(|_| fatal(format!("Invalid value for {name}: {v}")))
}

/// The value of a numeric option, or memcached's complaint that it has none.
fn numeric<'a>(name: &str, val: Option<&'a str>) -> Result<&'a str, CliError> {
    val.ok_or_else(|| fatal(format!("Missing numeric argument for {name}")))
}

/// The value of an option that needs one, or memcached's complaint.
fn required<'a>(name: &str, val: Option<&'a str>) -> Result<&'a str, CliError> {
    val.ok_or_else(|| fatal(format!("Missing {name} argument")))
}

/// memcached's extstore options: they configure the flash tier (`apply_extstore`).
const EXTSTORE_OPTIONS: &[&str] = &[
    "ext_path",
    "ext_page_size",
    "ext_wbuf_size",
    "ext_threads",
    "ext_io_depth",
    "ext_item_size",
    "ext_item_age",
    "ext_low_ttl",
    "ext_drop_unread",
    "ext_recache_rate",
    "ext_compact_under",
    "ext_drop_under",
    "ext_max_frag",
    "ext_max_sleep",
];

/// memcached's TLS options.
const TLS_OPTIONS: &[&str] = &[
    "ssl_chain_cert",
    "ssl_key",
    "ssl_keyformat",
    "ssl_verify_mode",
    "ssl_ciphers",
    "ssl_ca_cert",
    "ssl_wbuf_size",
    "ssl_session_cache",
    "ssl_kernel_tls",
    "ssl_min_version",
];

/// Tuning of mechanisms memfabricd does not have, taking a value (which memcached
/// requires). Accepted so that memcached's command lines start; they change nothing a
/// client can observe. docs/ARCHITECTURE.md says why for each.
const NO_EFFECT_WITH_VALUE: &[&str] = &[
    // memcached's segmented LRU and its crawler's pacing (memfabric: a queue per class in link order, and a sweeper).
    "lru_crawler_sleep",
    "lru_crawler_tocrawl",
    "hot_lru_pct",
    "warm_lru_pct",
    "hot_max_factor",
    "warm_max_factor",
    "temporary_ttl",
    // The slab mover's pacing (memfabric's automover has its own).
    "slab_automove_ratio",
    "slab_automove_freeratio",
    // `watch` buffers (memfabricd has no `watch`).
    "watcher_logbuf_size",
    "worker_logbuf_size",
    // A global cap on connection buffers (memfabricd bounds each connection instead).
    "read_buf_mem_limit",
    // Explicit slab class sizes (memfabricd derives its classes from -n and -f).
    "slab_sizes",
];

/// The same, as switches without a value.
const NO_EFFECT_SWITCHES: &[&str] = &[
    "no_hashexpand",
    "modern",
    "no_modern",
    "inline_ascii_resp",
    "no_inline_ascii_resp",
    "no_chunked_items",
    // seccomp sandboxing; Debian's memcached is built without it and ignores these too.
    "drop_privileges",
    "no_drop_privileges",
];

/// One extstore option (memcached's names and units).
fn apply_extstore(
    s: &mut Settings,
    name: &str,
    val: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<(), CliError> {
    let no_effect = |why: &str| format!("-o {name}: no effect in memfabricd ({why})");
    match name {
        "ext_path" => {
            let v = required(name, val)?;
            let (path, size) = v.rsplit_once(':').ok_or_else(|| {
                fatal("must supply size to ext_path, ie: ext_path=/f/e:64m (M|G|T|P supported)")
            })?;
            let size = parse_size(size).filter(|&b| b > 0).ok_or_else(|| {
                fatal("must supply size to ext_path, ie: ext_path=/f/e:64m (M|G|T|P supported)")
            })?;
            let f = s
                .store
                .flash
                .get_or_insert_with(memfabric_store::FlashConfig::default);
            if f.files.iter().any(|(p, _)| p.as_os_str() == path) {
                // Twice the same file would be two tiers writing the same pages.
                return Err(fatal(format!("ext_path {path} given twice")));
            }
            f.files.push((path.into(), size));
        }
        "ext_item_size" => s.ext.item_size = num(name, val)?,
        "ext_low_ttl" => s.ext.low_ttl = num(name, val)?,
        "ext_item_age" => {
            s.ext.item_age = num(name, val)?;
            warnings.push(no_effect(
                "items go to flash when RAM evicts them, never earlier because they are idle",
            ));
        }
        "ext_threads" => {
            let n: usize = num(name, val)?;
            if n == 0 || n > 64 {
                return Err(fatal("ext_threads must be between 1 and 64"));
            }
            s.ext.threads = n;
        }
        "ext_wbuf_size" => {
            let mb: usize = num(name, val)?;
            if mb == 0 {
                return Err(fatal("ext_wbuf_size must be at least 1"));
            }
            s.ext.wbuf_mb = mb;
        }
        "ext_page_size" => {
            s.ext.page_mb = num(name, val)?;
            warnings.push(no_effect(
                "the flash page is the slab page, -o slab_page_size",
            ));
        }
        "ext_recache_rate" => {
            s.ext.recache_rate = num(name, val)?;
            warnings.push(no_effect(
                "a flash read never copies the item back to RAM; a command that modifies it does",
            ));
        }
        "ext_compact_under" | "ext_drop_under" | "ext_max_frag" | "ext_drop_unread"
        | "ext_max_sleep" => {
            let v = required(name, val)?;
            match name {
                "ext_compact_under" => s.ext.compact_under = num(name, Some(v))?,
                "ext_drop_under" => s.ext.drop_under = num(name, Some(v))?,
                "ext_max_frag" => s.ext.max_frag = num(name, Some(v))?,
                "ext_max_sleep" => s.ext.max_sleep = num(name, Some(v))?,
                _ => s.ext.drop_unread = v != "0",
            }
            warnings.push(no_effect(
                "pages are reused oldest first, keeping only items read since they went to \
                 flash; nothing is compacted",
            ));
        }
        "ext_io_depth" => {
            let _: u32 = num(name, val)?;
            warnings.push(no_effect("each read thread has one read in flight"));
        }
        _ => return Err(fatal(format!("Illegal suboption \"{name}\""))),
    }
    Ok(())
}

/// One `-o` option.
fn apply_extended(s: &mut Settings, opt: &str, warnings: &mut Vec<String>) -> Result<(), CliError> {
    if opt.is_empty() {
        return Ok(());
    }
    let (name, val) = match opt.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (opt, None),
    };
    if EXTSTORE_OPTIONS.contains(&name) {
        return apply_extstore(s, name, val, warnings);
    }
    if TLS_OPTIONS.contains(&name) {
        // Read by `tls_settings`.
        return Ok(());
    }
    if NO_EFFECT_WITH_VALUE.contains(&name) {
        required(name, val)?;
        return Ok(());
    }
    if NO_EFFECT_SWITCHES.contains(&name) {
        return Ok(());
    }
    match name {
        "maxconns_fast" => s.maxconns_fast = true,
        "no_maxconns_fast" => s.maxconns_fast = false,
        "hashpower" => {
            let hp: u32 = num(name, val)?;
            if hp < 12 {
                return Err(fatal(format!(
                    "Initial hashtable multiplier of {hp} is too low"
                )));
            }
            if hp > 32 {
                return Err(fatal(format!(
                    "Initial hashtable multiplier of {hp} is too high\n\
                     Choose a value based on \"STAT hash_power_level\" from a running instance"
                )));
            }
            s.hashpower_init = hp;
            s.store.hashpower = Some(hp as u8);
        }
        "slab_reassign" => s.slab_reassign = true,
        // As memcached: the level stays (stats settings shows it), nothing moves.
        "no_slab_reassign" => s.slab_reassign = false,
        "no_slab_automove" => s.slab_automove = 0,
        "slab_automove" => {
            let n: u32 = match val {
                None => 1,
                Some(_) => num(name, val)?,
            };
            if n > 2 {
                return Err(fatal("slab_automove must be between 0 and 2"));
            }
            s.slab_automove = n;
        }
        "slab_automove_window" => {
            let w: u32 = num(name, val)?;
            if w < 3 {
                return Err(fatal("slab_automove_window must be > 2"));
            }
        }
        "hash_algorithm" => match required(name, val)? {
            // memfabricd's index has its own hash; which one memcached would use changes
            // nothing a client sees.
            "jenkins" | "murmur3" | "xxh3" => {}
            _ => {
                return Err(fatal(
                    "Unknown hash_algorithm option (jenkins, murmur3, xxh3)",
                ))
            }
        },
        // memcached reads it with atoi: `abc` is 0 (off), a negative value never closes
        // anything, and one past `int` wraps (99999999999 is 1215752191).
        "idle_timeout" => {
            s.idle_timeout = c_strtol(numeric(name, val)?, 10) as i32;
        }
        "lru_crawler" => {
            s.lru_crawler = true;
            s.store.background_sweeper = true;
        }
        "no_lru_crawler" => {
            s.lru_crawler = false;
            s.store.background_sweeper = false;
        }
        // memcached's LRU maintainer wakes every millisecond while it has work; the
        // store's maintenance thread keeps the same busy tick unless told not to.
        "lru_maintainer" => s.store.busy_tick = memfabric_store::StoreConfig::default().busy_tick,
        "no_lru_maintainer" => s.store.busy_tick = std::time::Duration::ZERO,
        // In bytes, as memcached 1.6.18 reads it (its docs say kilobytes).
        "slab_chunk_max" => s.slab_chunk_max = num(name, val)?,
        "track_sizes" => s.track_sizes = true,
        "tail_repair_time" => {
            let t: u32 = val.and_then(|v| v.trim().parse().ok()).unwrap_or(0);
            if t < 10 {
                return Err(fatal("Cannot set tail_repair_time to less than 10 seconds"));
            }
            s.tail_repair_time = t;
        }
        "sock_cookie_id" => s.sock_cookie_id = Some(num(name, val)?),
        "resp_obj_mem_limit" => warnings
            .push("DEPRECATED: resp_obj_mem_limit no longer used. See read_buf_mem_limit,".into()),
        // memcached's getsubopt() error and status.
        _ => return Err(fatal(format!("Illegal suboption \"{opt}\""))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(args: &[&str]) -> Parsed {
        let mut v = vec!["memfabricd"];
        v.extend_from_slice(args);
        match parse(v) {
            Ok(p) => p,
            Err(e) => panic!("{args:?}: {e:?}"),
        }
    }

    fn err(args: &[&str]) -> CliError {
        let mut v = vec!["memfabricd"];
        v.extend_from_slice(args);
        match parse(v) {
            Err(Either::Cli(e)) => e,
            other => panic!("{args:?}: expected a settings error, got {other:?}"),
        }
    }

    #[test]
    fn no_flags_give_memcached_defaults() {
        let s = ok(&[]).settings;
        assert_eq!(s.tcp_port, 11211);
        assert_eq!(s.udp_port, 0);
        assert_eq!(s.store.memory_limit, 64 << 20);
        assert_eq!(s.max_connections, 1024);
        assert_eq!(s.threads, 4);
        assert_eq!(s.store.item_size_max, 1 << 20);
        assert_eq!(s.store.growth_factor, 1.25);
        assert_eq!(s.store.min_chunk, 48);
        assert_eq!(s.reqs_per_event, 20);
        assert_eq!(s.backlog, 1024);
        assert_eq!(s.poll_us, 0);
        assert!(s.use_cas && s.store.evict);
    }

    #[test]
    fn listen_accepts_comma_lists_and_repeats() {
        let s = ok(&["-l", "127.0.0.1,::1", "-l", "127.0.0.2:5000"]).settings;
        assert_eq!(s.listen, vec!["127.0.0.1", "::1", "127.0.0.2:5000"]);
    }

    /// memcached skips a `-l` whose text occurs in what the earlier ones gave (checked
    /// with memcached 1.6.18: `-l 127.0.0.1 -l 127.0.0.1` listens once, `-l
    /// 127.0.0.1:P -l 127.0.0.1` only on P); a comma list is taken as written.
    #[test]
    fn listen_skips_a_repeat_as_memcached_does() {
        let listen = |args: &[&str]| ok(args).settings.listen;
        assert_eq!(
            listen(&["-l", "127.0.0.1", "-l", "127.0.0.1"]),
            vec!["127.0.0.1"]
        );
        assert_eq!(
            listen(&["-l", "127.0.0.1:5000", "-l", "127.0.0.1"]),
            vec!["127.0.0.1:5000"]
        );
        assert_eq!(
            listen(&["-l", "127.0.0.1", "-l", "127.0.0.1:5000"]),
            vec!["127.0.0.1", "127.0.0.1:5000"]
        );
        assert_eq!(
            listen(&["-l", "127.0.0.1,127.0.0.1"]),
            vec!["127.0.0.1", "127.0.0.1"]
        );
        assert_eq!(
            listen(&["-l", "127.0.0.1;127.0.0.2"]),
            vec!["127.0.0.1", "127.0.0.2"]
        );
    }

    #[test]
    fn repeated_v_counts_verbosity() {
        assert_eq!(ok(&["-vv"]).settings.verbose, 2);
        assert_eq!(ok(&["-v", "-v", "-v"]).settings.verbose, 3);
    }

    #[test]
    fn item_size_takes_suffixes_and_is_checked_against_memory() {
        assert_eq!(ok(&["-I", "2m"]).settings.store.item_size_max, 2 << 20);
        // Below slab_chunk_max (512 KB) only with a smaller one, as in memcached.
        assert_eq!(err(&["-I", "4k"]).code, 64);
        let small = ok(&["-I", "4k", "-o", "slab_chunk_max=4096"]).settings;
        assert_eq!(small.store.item_size_max, 4096);
        assert_eq!(
            ok(&["-I", "1536k"]).settings.store.item_size_max,
            1536 << 10
        );
        for (args, says) in [
            (
                &["-I", "1000k"][..],
                "-I (item_size_max: 1024000) must be evenly divisible by slab_chunk_max (bytes: 524288)",
            ),
            (
                &["-o", "slab_chunk_max=100"][..],
                "-I (item_size_max: 1048576) must be evenly divisible by slab_chunk_max (bytes: 100)",
            ),
            (
                &["-o", "slab_chunk_max=2097152"][..],
                "slab_chunk_max (bytes: 2097152) cannot be larger than -I (item_size_max 1048576)",
            ),
            (
                &["-I", "3m", "-o", "slab_chunk_max=3145728"][..],
                "slab_chunk_max (bytes: 3145728) must divide evenly into 1048576 (slab_page_size)",
            ),
        ] {
            let e = err(args);
            assert_eq!((e.code, e.message.as_str()), (64, says), "{args:?}");
        }
        assert_eq!(ok(&["-I", "32m"]).settings.store.item_size_max, 32 << 20);
        assert_eq!(err(&["-I", "40m"]).code, 64);
        assert_eq!(err(&["-I", "500"]).code, 64);
        assert_eq!(err(&["-I", "2g", "-m", "8192"]).code, 64);
        assert_eq!(
            ok(&["-I", "1g", "-m", "4096"]).settings.store.item_size_max,
            1 << 30
        );
    }

    #[test]
    fn unknown_extended_option_stops_the_server_as_memcached_does() {
        let e = err(&["-o", "modern,foo_bar=3", "-o", "idle_timeout=5"]);
        assert_eq!(e.code, 1);
        assert_eq!(e.message, "Illegal suboption \"foo_bar=3\"");
        // Options memcached 1.6.18 does not know either (built without its proxy).
        for o in [
            "bogus_option",
            "lru_segmented",
            "proxy_config=/x",
            "ext_bogus=1",
        ] {
            assert_eq!(
                err(&["-o", o]).message,
                format!("Illegal suboption \"{o}\"")
            );
        }
    }

    /// Every `-o` option memcached 1.6.18 accepts (from its `-h` and its binary),
    /// with a value it accepts.
    const MEMCACHED_EXTENDED_OPTIONS: &[&str] = &[
        "maxconns_fast",
        "no_maxconns_fast",
        "hashpower=16",
        "no_hashexpand",
        "slab_reassign",
        "no_slab_reassign",
        "slab_automove=2",
        "no_slab_automove",
        "slab_automove_ratio=0.8",
        "slab_automove_window=30",
        "slab_automove_freeratio=0.01",
        "tail_repair_time=10",
        "hash_algorithm=xxh3",
        "lru_crawler",
        "no_lru_crawler",
        "lru_crawler_sleep=100",
        "lru_crawler_tocrawl=0",
        "lru_maintainer",
        "no_lru_maintainer",
        "hot_lru_pct=20",
        "warm_lru_pct=40",
        "hot_max_factor=0.2",
        "warm_max_factor=2.0",
        "temporary_ttl=61",
        "idle_timeout=30",
        "watcher_logbuf_size=256",
        "worker_logbuf_size=64",
        "read_buf_mem_limit=0",
        "slab_sizes=96-192-384",
        "slab_chunk_max=512",
        "track_sizes",
        "inline_ascii_resp",
        "no_inline_ascii_resp",
        "modern",
        "no_modern",
        "no_chunked_items",
        "drop_privileges",
        "no_drop_privileges",
        "resp_obj_mem_limit=1",
        "sock_cookie_id=7",
    ];

    #[test]
    fn every_memcached_extended_option_starts_the_server() {
        for o in MEMCACHED_EXTENDED_OPTIONS {
            ok(&["-o", o]);
        }
        let p = ok(&["-o", "sock_cookie_id=7,idle_timeout=30,slab_automove=2"]);
        assert_eq!(p.settings.sock_cookie_id, Some(7));
        assert_eq!(p.settings.idle_timeout, 30);
        assert_eq!(p.settings.slab_automove, 2);
        // memcached 1.6.18 reads idle_timeout with atoi: it runs with a negative one
        // (shown as given, never closing anything), `abc` is 0, a number past `int`
        // wraps, and only a missing value stops it.
        let idle = |v: &str| {
            ok(&["-o", &format!("idle_timeout={v}")])
                .settings
                .idle_timeout
        };
        assert_eq!(idle("-1"), -1);
        assert_eq!(idle("abc"), 0);
        assert_eq!(idle("99999999999"), 1_215_752_191);
        assert_eq!(
            err(&["-o", "idle_timeout"]).message,
            "Missing numeric argument for idle_timeout"
        );
    }

    #[test]
    fn extended_options_that_need_a_value_say_so() {
        assert_eq!(
            err(&["-o", "hot_lru_pct"]).message,
            "Missing hot_lru_pct argument"
        );
        assert_eq!(
            err(&["-o", "hashpower"]).message,
            "Missing numeric argument for hashpower"
        );
        assert_eq!(err(&["-o", "hash_algorithm=md5"]).code, 1);
        assert_eq!(err(&["-o", "tail_repair_time=5"]).code, 1);
    }

    #[test]
    fn extstore_options_configure_the_flash_tier() {
        let p = ok(&[
            "-o",
            "ext_path=/mnt/a:64g,ext_path=/mnt/b:512M,ext_item_size=1024,ext_low_ttl=30",
            "-o",
            "ext_threads=8,ext_wbuf_size=16,ext_compact_under=5",
            "--flash-write-budget",
            "1000000",
        ]);
        let f = p.settings.store.flash.as_ref().expect("flash tier");
        assert_eq!(
            f.files,
            vec![("/mnt/a".into(), 64 << 30), ("/mnt/b".into(), 512 << 20)]
        );
        assert_eq!(
            (f.item_min, f.low_ttl, f.write_budget),
            (1024, 30, 1_000_000)
        );
        assert_eq!(f.write_buffers, 16);
        assert_eq!(p.settings.ext.threads, 8);
        // An option the design makes meaningless is accepted and said so at start-up.
        assert!(p.warnings.iter().any(|w| w.contains("ext_compact_under")));
        // Options without ext_path: no flash tier (as memcached).
        assert!(ok(&["-o", "ext_item_size=100"])
            .settings
            .store
            .flash
            .is_none());
        for bad in [
            "ext_path=/x",
            "ext_path=/x:",
            "ext_path=/x:0",
            "ext_path=/x:12q",
        ] {
            let e = err(&["-o", bad]);
            assert!(e.message.contains("must supply size to ext_path"), "{bad}");
        }
        assert!(err(&["-o", "ext_threads=0"])
            .message
            .contains("ext_threads"));
        let e = err(&["-o", "ext_path=/x:1g", "--flash-io", "weird"]);
        assert!(e.message.contains("--flash-io"));
        let e = err(&["-o", "ext_path=/x:1g", "--flash-io-engine", "aio"]);
        assert!(e.message.contains("--flash-io-engine aio"), "{}", e.message);
    }

    #[test]
    fn a_memory_file_refuses_to_start() {
        let e = err(&["-e", "/dev/shm/mc"]);
        assert_eq!(e.code, 64);
        assert!(e.message.contains("-e /dev/shm/mc"), "{}", e.message);
        assert!(!e.message.contains('\n'), "one line: {}", e.message);
    }

    #[test]
    fn sasl_is_binary_only_and_needs_its_password_file() {
        for flags in [&["-S", "-B", "ascii"][..], &["-S", "-B", "auto"]] {
            let e = err(flags);
            assert_eq!(
                (e.code, e.message.as_str()),
                (
                    64,
                    "ERROR: You cannot allow the ASCII protocol while using SASL."
                )
            );
        }
        let e = err(&["-S", "-U", "11211"]);
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                64,
                "ERROR: Cannot enable UDP while using binary SASL authentication."
            )
        );
        assert!(err(&["-S", "-Y", "/nonexistent"])
            .message
            .contains("-S with -Y"));
        // (This test process never sets MEMCACHED_SASL_PWDB.)
        if std::env::var_os("MEMCACHED_SASL_PWDB").is_none() {
            let e = err(&["-S", "-B", "binary"]);
            assert_eq!(e.code, 64);
            assert!(e.message.contains("MEMCACHED_SASL_PWDB"), "{}", e.message);
            assert!(e.message.contains("refusing to start"), "{}", e.message);
        }
    }

    #[test]
    fn minus_one_asks_for_an_ephemeral_port_and_the_range_is_memcacheds() {
        let s = ok(&["-p", "-1", "-U", "-1"]).settings;
        assert_eq!((s.tcp_port, s.udp_port), (-1, -1));
        assert_eq!(crate::settings::bind_port(-1), Some(0));
        assert_eq!(crate::settings::bind_port(0), None);
        assert_eq!(crate::settings::bind_port(11211), Some(11211));
        let e = err(&["-p", "70000"]);
        assert_eq!(
            (e.code, e.message.as_str()),
            (64, "ERROR: Invalid port number 70000.")
        );
        assert_eq!(err(&["-U", "65536"]).code, 64);
        assert_eq!(err(&["-p", "-2"]).code, 71);
    }

    #[test]
    fn tls_options_are_memcacheds_and_what_rustls_cannot_do_is_refused() {
        let m = |flags: &[&str]| err(flags).message;
        assert!(m(&["-Z"]).starts_with("Error loading the certificate chain: (null)"));
        assert_eq!(
            m(&["-Z", "-o", "ssl_verify_mode=7"]),
            "Invalid ssl_verify_mode. Use help to see valid options."
        );
        assert_eq!(
            m(&["-Z", "-o", "ssl_min_version=tlsv1.3"]),
            "could not parse argument to ssl_min_version"
        );
        assert_eq!(
            m(&["-Z", "-o", "ssl_min_version=7"]),
            "Invalid ssl_min_version. Use help to see valid options."
        );
        for refused in [
            "ssl_ciphers=HIGH",
            "ssl_kernel_tls",
            "ssl_keyformat=2",
            "ssl_min_version=0",
        ] {
            let e = err(&["-Z", "-o", refused]);
            assert_eq!(e.code, 64, "{refused}");
            assert!(e.message.contains(refused), "{}", e.message);
            assert!(e.message.contains("refusing to start"), "{}", e.message);
        }
        let e = err(&["-o", "ssl_chain_cert=/x.pem"]);
        assert!(e.message.contains("without -Z"), "{}", e.message);
        assert_eq!(
            m(&["-Z", "-o", "ssl_wbuf_size=99999999999999999999"]),
            "could not parse argument to ssl_wbuf_size"
        );
        assert_eq!(
            m(&["-Z", "-o", &format!("ssl_wbuf_size={}", usize::MAX / 512)]),
            "could not parse argument to ssl_wbuf_size"
        );
        let e = err(&["-Z", "-o", "ssl_chain_cert=/nonexistent.pem,ssl_key=/x"]);
        assert!(
            e.message
                .starts_with("Error loading the certificate chain: /nonexistent.pem : "),
            "{}",
            e.message
        );
    }

    #[test]
    fn notls_listen_prefix_needs_tls_as_in_memcached() {
        assert_eq!(err(&["-l", "notls:127.0.0.1"]).code, 71);
    }

    #[test]
    fn extended_options_map_onto_store_config() {
        let s = ok(&[
            "-o",
            "hashpower=20,slab_automove=0,no_lru_crawler,slab_chunk_max=256",
        ])
        .settings;
        assert_eq!(s.store.hashpower, Some(20));
        assert!(!s.store.slab_automove);
        assert!(!s.store.background_sweeper);
        assert_eq!(s.slab_chunk_max, 256);
        assert_eq!(err(&["-o", "hashpower=70"]).code, 1);
        let busy = |args: &[&str]| ok(args).settings.store.busy_tick;
        assert_eq!(busy(&[]), std::time::Duration::from_millis(1));
        assert!(busy(&["-o", "no_lru_maintainer"]).is_zero());
        assert!(!busy(&["-o", "no_lru_maintainer,lru_maintainer"]).is_zero());
    }

    #[test]
    fn bad_values_fail_as_memcached_does() {
        assert_eq!(err(&["-t", "0"]).code, 1);
        assert_eq!(err(&["-c", "0"]).code, 1);
        assert_eq!(err(&["-f", "1.0"]).code, 1);
        assert_eq!(err(&["-n", "0"]).code, 1);
        assert_eq!(err(&["-B", "foo"]).code, 64);
    }

    #[test]
    fn unix_socket_turns_off_network_listeners() {
        let s = ok(&["-s", "/tmp/x.sock", "-a", "766", "-U", "5000"]).settings;
        assert_eq!(s.unix_socket.as_deref(), Some("/tmp/x.sock"));
        assert_eq!(s.unix_mask, 0o766);
        assert_eq!((s.tcp_port, s.udp_port), (0, 0));
    }

    #[test]
    fn all_common_memcached_flags_are_accepted() {
        let p = ok(&[
            "-p",
            "1",
            "-U",
            "2",
            "-m",
            "128",
            "-c",
            "10",
            "-t",
            "2",
            "-R",
            "5",
            "-B",
            "ascii",
            "-C",
            "-A",
            "-M",
            "-L",
            "-k",
            "-r",
            "-D",
            "#",
            "-b",
            "64",
            "-F",
            "-X",
            "-u",
            "nobody",
            "-P",
            "/tmp/p",
            "-W",
            "-N",
            "2",
            "--poll-us",
            "50",
        ]);
        let s = p.settings;
        assert_eq!(s.protocol, ProtocolChoice::Ascii);
        assert!(!s.use_cas && !s.store.use_cas && s.enable_shutdown && !s.store.evict);
        assert_eq!(s.prefix_delimiter, '#');
        assert!(s.detail_enabled);
        assert_eq!(s.poll_us, 50);
        assert_eq!(s.backlog, 64);
    }

    /// Numeric flags read as memcached reads them (C's `atoi`/`atof`/`strtol`), each case
    /// checked against memcached 1.6.18.
    #[test]
    fn numeric_flags_read_as_c_reads_them() {
        assert_eq!(c_strtol(" -12x", 10), -12);
        assert_eq!(c_strtol("abc", 10), 0);
        assert_eq!(c_strtol("99999999999999999999", 10), i64::MAX);
        assert_eq!(c_strtol("0778", 8), 0o77);
        assert_eq!(c_atof("1.5x").unwrap(), 1.5);
        assert_eq!(c_atof("abc").unwrap(), 0.0);
        assert_eq!(c_atof("-3").unwrap(), -3.0);
        assert_eq!(c_atof("2e1x").unwrap(), 20.0);
        assert_eq!(c_atof("2ex").unwrap(), 2.0);
        // memcached runs with these
        assert_eq!(ok(&["-t", "5x"]).settings.threads, 5);
        assert_eq!(ok(&["-R", "-5"]).settings.reqs_per_event, 1);
        assert_eq!(ok(&["-b", "-1"]).settings.backlog, i32::MAX as u32);
        assert_eq!(ok(&["-f", "1.5x"]).settings.store.growth_factor, 1.5);
        assert_eq!(ok(&["-a", "0777x"]).settings.unix_mask, 0o777);
        assert_eq!(ok(&["-p", "abc"]).settings.tcp_port, 0);
        assert_eq!(ok(&["-p", "5x"]).settings.tcp_port, 5);
        // ... and refuses these, with these messages
        for (args, says) in [
            (
                &["-c", "abc"][..],
                "Maximum connections must be greater than 0",
            ),
            (&["-c", "-5"], "Maximum connections must be greater than 0"),
            (&["-t", "-1"], "Number of threads must be greater than 0"),
            (&["-t", "abc"], "Number of threads must be greater than 0"),
            (
                &["-R", "abc"],
                "Number of requests per event must be greater than 0",
            ),
            (&["-n", "abc"], "Chunk size must be greater than 0"),
            (&["-f", "abc"], "Factor must be greater than 1"),
            (&["-f", "-3"], "Factor must be greater than 1"),
            (
                &["-N", "0"],
                "Maximum number of NAPI IDs must be greater than 0",
            ),
            (
                &["-N", "-1"],
                "Maximum number of NAPI IDs must be greater than 0",
            ),
        ] {
            let e = err(args);
            assert_eq!((e.code, e.message.as_str()), (1, says), "{args:?}");
        }
    }

    /// `-D` takes the first character of its argument, as memcached does (`-D ab` is `a`,
    /// `-D ""` is refused, "No delimiter specified"): a delimiter turns on detail stats.
    #[test]
    fn delimiter_is_the_first_character_given() {
        let d = |v: &str| {
            let s = ok(&["-D", v]).settings;
            assert!(s.detail_enabled);
            s.prefix_delimiter
        };
        assert_eq!(d("ab"), 'a');
        let e = err(&["-D", ""]);
        assert_eq!((e.code, e.message.as_str()), (1, "No delimiter specified"));
    }

    #[test]
    fn help_lists_every_flag() {
        let mut v = vec!["memfabricd", "--help"];
        let e = match parse(v.drain(..)) {
            Err(Either::Clap(e)) => e,
            other => panic!("expected help, got {other:?}"),
        };
        let text = e.to_string();
        for flag in [
            "-p",
            "-U",
            "-s",
            "-a",
            "-A",
            "-l",
            "-d",
            "-r",
            "-u",
            "-m",
            "-M",
            "-c",
            "-k",
            "-v",
            "-h",
            "-P",
            "-f",
            "-n",
            "-L",
            "-D",
            "-t",
            "-R",
            "-C",
            "-b",
            "-B",
            "-I",
            "-F",
            "-X",
            "-o",
            "--poll-us",
        ] {
            assert!(text.contains(flag), "help lacks {flag}");
        }
    }
}
