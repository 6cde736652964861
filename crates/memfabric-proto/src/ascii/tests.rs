//! Tests of the classic ascii protocol: framing, tokenizing, every command's parse and
//! errors, encoding round trips.

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
        b"extstore item_size\r\n",
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
    // A delta negative as i64 is refused when its token holds a '-' anywhere, even after
    // the whitespace that ends the number (memcached 1.6.18 does the same).
    assert_eq!(
        err(b"incr n 18446744073709551615\t-x\r\n"),
        (ErrorReply::InvalidDelta, false)
    );
    assert!(matches!(
        req(b"incr n 5\t-x\r\n"),
        Request::Arith { delta: 5, .. }
    ));
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
    assert_eq!(
        req(b"refresh_certs\r\n"),
        Request::RefreshCerts { noreply: false }
    );
    assert_eq!(
        req(b"refresh_certs noreply\r\n"),
        Request::RefreshCerts { noreply: true }
    );
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
            "lru_crawler", "lru", "watch", "refresh_certs", "mg", "ms", "extstore",
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
