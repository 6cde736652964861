//! Meta commands (mg ms md ma mn me) end to end: bytes in through `exec::process` with a
//! real `Store`, replies out. Expected bytes are what memcached 1.6.18 answers (checked
//! against the Debian build on loopback).
use std::sync::Arc;

use memfabric_server::counters::ThreadStats;
use memfabric_server::exec::{self, ExecCtx, Session, Shared, Transport};
use memfabric_server::settings::Settings;
use memfabric_store::{Store, StoreConfig};

struct Conn {
    shared: Shared,
    stats: Arc<ThreadStats>,
    sess: Session,
    pending: Vec<u8>,
}

impl Conn {
    fn new() -> Conn {
        Conn::with_config(StoreConfig {
            memory_limit: 16 << 20,
            ..StoreConfig::default()
        })
    }

    fn with_config(store: StoreConfig) -> Conn {
        let settings = Settings {
            store: store.clone(),
            ..Settings::default()
        };
        let shared = Shared::new(settings, Store::new(store).expect("store"));
        let stats = shared.register_thread();
        Conn {
            shared,
            stats,
            sess: Session::default(),
            pending: Vec::new(),
        }
    }

    /// Append `bytes` to the connection's input and run what is complete; the replies.
    fn send(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut queue = memfabric_server::outqueue::OutQueue::new();
        loop {
            let mut ctx = ExecCtx {
                shared: &self.shared,
                stats: &self.stats,
                transport: Transport::Tcp,
                conn_id: 1,
                waiter: None,
                completion: None,
            };
            let p = exec::process(&mut ctx, &mut self.sess, &self.pending, &mut queue, 1000);
            out.extend(queue.take_vec());
            self.pending.drain(..p.consumed);
            assert!(
                !p.close,
                "connection closed; replies so far: {:?}",
                text(&out)
            );
            if p.consumed == 0 || self.pending.is_empty() {
                break;
            }
        }
        out
    }

    fn s(&mut self, bytes: &str) -> String {
        let out = self.send(bytes.as_bytes());
        text(&out)
    }

    /// The CAS of `key` as `mg` reports it.
    fn cas(&mut self, key: &str) -> u64 {
        let r = self.s(&format!("mg {key} c\r\n"));
        r.trim_end()
            .strip_prefix("HD c")
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no cas in {r:?}"))
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The number after ` <flag>` in a reply line.
fn flag_value(reply: &str, flag: char) -> i64 {
    let line = reply.lines().next().unwrap_or("");
    line.split(' ')
        .skip(1)
        .find_map(|t| t.strip_prefix(flag).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("no {flag} in {reply:?}"))
}

// ----- mn -------------------------------------------------------------------------------

#[test]
fn mn_answers_mn_whatever_follows() {
    let mut c = Conn::new();
    assert_eq!(c.s("mn\r\n"), "MN\r\n");
    assert_eq!(c.s("mn O1 k\r\n"), "MN\r\n");
}

#[test]
fn unknown_meta_word_is_error() {
    let mut c = Conn::new();
    assert_eq!(c.s("mz foo\r\n"), "ERROR\r\n");
}

// ----- mg -------------------------------------------------------------------------------

#[test]
fn mg_of_missing_key_returns_en() {
    let mut c = Conn::new();
    assert_eq!(c.s("mg nothere v\r\n"), "EN\r\n");
    assert_eq!(c.s("mg nothere\r\n"), "EN\r\n");
}

#[test]
fn mg_miss_echoes_key_and_opaque_in_request_order() {
    let mut c = Conn::new();
    assert_eq!(c.s("mg nothere k O123 v\r\n"), "EN knothere O123\r\n");
    assert_eq!(c.s("mg nothere O1 k\r\n"), "EN O1 knothere\r\n");
}

#[test]
fn quiet_mg_miss_is_silent_but_hits_answer() {
    let mut c = Conn::new();
    assert_eq!(c.s("mg nothere v q\r\nmn\r\n"), "MN\r\n");
    c.s("ms foo 2\r\nhi\r\n");
    assert_eq!(c.s("mg foo v q\r\n"), "VA 2\r\nhi\r\n");
    assert_eq!(c.s("mg foo q\r\n"), "HD\r\n");
    assert_eq!(c.s("mg foo k q\r\n"), "HD kfoo\r\n");
}

#[test]
fn mg_without_flags_is_hd() {
    let mut c = Conn::new();
    c.s("ms foo 3\r\nbar\r\n");
    assert_eq!(c.s("mg foo\r\n"), "HD\r\n");
}

#[test]
fn mg_returns_flags_in_request_order() {
    let mut c = Conn::new();
    assert_eq!(c.s("ms foo 3 F42\r\nbar\r\n"), "HD\r\n");
    let cas = c.cas("foo");
    assert_eq!(
        c.s("mg foo s v f t c k O9\r\n"),
        format!("VA 3 s3 f42 t-1 c{cas} kfoo O9\r\nbar\r\n")
    );
    assert_eq!(
        c.s("mg foo O7 k f s v\r\n"),
        "VA 3 O7 kfoo f42 s3\r\nbar\r\n"
    );
}

#[test]
fn mg_h_reports_whether_fetched_before_this_access() {
    let mut c = Conn::new();
    c.s("ms foo 1\r\nx\r\n");
    assert_eq!(c.s("mg foo h\r\n"), "HD h0\r\n");
    assert_eq!(c.s("mg foo h\r\n"), "HD h1\r\n");
}

#[test]
fn mg_u_does_not_record_the_access() {
    let mut c = Conn::new();
    c.s("ms foo 1\r\nx\r\n");
    assert_eq!(c.s("mg foo u v\r\n"), "VA 1\r\nx\r\n");
    assert_eq!(c.s("mg foo h\r\n"), "HD h0\r\n");
}

#[test]
fn mg_l_is_seconds_since_last_access() {
    let mut c = Conn::new();
    c.s("ms foo 1\r\nx\r\n");
    let l = flag_value(&c.s("mg foo l\r\n"), 'l');
    assert!((0..=2).contains(&l), "{l}");
}

/// As memcached's: an item's access time moves on its second fetch (the one that makes
/// it active), not on the first, nor on the ones after it. Before, every fetch moved it:
/// `get` two seconds after the set, then `mg ... l`, answered `l0` where memcached
/// answers `l2`.
#[test]
fn mg_l_moves_only_on_the_fetch_that_makes_the_item_active() {
    let mut c = Conn::new();
    c.s("ms foo 1\r\nx\r\n");
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let first = c.s("mg foo l h\r\n");
    assert!(
        flag_value(&first, 'l') >= 2 && flag_value(&first, 'h') == 0,
        "{first}"
    );
    // Reported before its own access: still the time of the set.
    let second = flag_value(&c.s("mg foo l\r\n"), 'l');
    assert!(second >= 2, "{second}");
    // That second fetch moved it.
    let after = flag_value(&c.s("mg foo l\r\n"), 'l');
    assert!(after < second, "{after} {second}");
}

/// A fragment of an erasure-coded value is not appended or prepended to, whatever the
/// command (memfabricd's store is `sealed` against it): `NS`, `NOT_STORED`, and the bytes
/// stay as they were. Plain values are.
#[test]
fn appends_leave_a_coded_fragment_alone() {
    let mut c = Conn::with_config(StoreConfig {
        memory_limit: 16 << 20,
        ..Settings::default().store
    });
    let payload = b"quarter of a value";
    let header = memfabric_proto::ec_fragment::FragmentHeader {
        k: 4,
        m: 2,
        index: 1,
        stripe: 77,
        value_len: 72,
        data_crc: 5,
    }
    .header_with(memfabric_checksum::crc32c(payload));
    let mut fragment = header.to_vec();
    fragment.extend_from_slice(payload);
    let mut set = format!("ms frag {} T0\r\n", fragment.len()).into_bytes();
    set.extend_from_slice(&fragment);
    set.extend_from_slice(b"\r\n");
    assert_eq!(text(&c.send(&set)), "HD\r\n");
    let cas = flag_value(&c.s("mg frag c\r\n"), 'c');
    for cmd in [
        format!("ms frag 2 MP C{cas}\r\nZZ\r\n"),
        format!("ms frag 2 MA C{cas}\r\nZZ\r\n"),
        "ms frag 2 MA\r\nZZ\r\n".to_string(),
    ] {
        assert_eq!(c.s(&cmd), "NS\r\n", "{cmd}");
    }
    assert_eq!(c.s("prepend frag 0 0 2\r\nZZ\r\n"), "NOT_STORED\r\n");
    let mut want = format!("VA {}\r\n", fragment.len()).into_bytes();
    want.extend_from_slice(&fragment);
    want.extend_from_slice(b"\r\n");
    assert_eq!(c.send(b"mg frag v\r\n"), want);
    c.s("ms plain 4\r\nMFEC\r\n");
    assert_eq!(c.s("ms plain 2 MA\r\n+1\r\n"), "HD\r\n");
    assert_eq!(c.s("mg plain v\r\n"), "VA 6\r\nMFEC+1\r\n");
}

#[test]
fn mg_t_then_touch_shows_old_ttl_touch_then_t_shows_new() {
    let mut c = Conn::new();
    c.s("ms foo 1\r\nx\r\n");
    assert_eq!(c.s("mg foo t T100\r\n"), "HD t-1\r\n");
    let t = flag_value(&c.s("mg foo T200 t\r\n"), 't');
    assert!((199..=200).contains(&t), "{t}");
    let t = flag_value(&c.s("mg foo t\r\n"), 't');
    assert!((199..=200).contains(&t), "{t}");
}

#[test]
fn mg_negative_ttl_expires_the_item() {
    let mut c = Conn::new();
    c.s("ms foo 1\r\nx\r\n");
    let r = c.s("mg foo T-1\r\n");
    assert_eq!(r, "HD\r\n");
    assert_eq!(c.s("mg foo v\r\n"), "EN\r\n");
}

#[test]
fn mg_base64_key_is_decoded_and_echoed_encoded() {
    let mut c = Conn::new();
    c.s("ms foo 2\r\nhi\r\n");
    assert_eq!(c.s("mg Zm9v b v\r\n"), "VA 2\r\nhi\r\n");
    assert_eq!(c.s("mg Zm9vYg== b k v\r\n"), "EN kZm9vYg== b\r\n");
    assert_eq!(
        c.s("mg !!!! b v\r\n"),
        "CLIENT_ERROR error decoding key\r\n"
    );
}

#[test]
fn mg_flag_errors_are_memcacheds() {
    let mut c = Conn::new();
    c.s("ms foo 1\r\nx\r\n");
    assert_eq!(c.s("mg foo v %\r\n"), "CLIENT_ERROR invalid flag\r\n");
    assert_eq!(c.s("mg foo v v\r\n"), "CLIENT_ERROR duplicate flag\r\n");
    assert_eq!(
        c.s("mg foo Tabc v\r\n"),
        "CLIENT_ERROR bad token in command line format\r\n"
    );
    assert_eq!(c.s("mg foo E5\r\n"), "CLIENT_ERROR invalid flag\r\n");
    assert_eq!(c.s("mg\r\n"), "ERROR\r\n");
    let k251 = "k".repeat(251);
    assert_eq!(
        c.s(&format!("mg {k251} v\r\n")),
        "CLIENT_ERROR bad command line format\r\n"
    );
    let many = "k v s t c f h l u q O1 N1 R1 T1 P L b I";
    assert_eq!(
        c.s(&format!("mg Zm9v {many}\r\n")),
        "CLIENT_ERROR options flags are too long\r\n"
    );
}

#[test]
fn mg_opaque_longer_than_32_is_an_error_hit_or_miss() {
    let mut c = Conn::new();
    let o = format!("O{}", "1".repeat(32));
    c.s("ms foo 1\r\nx\r\n");
    for k in ["foo", "nothere"] {
        assert_eq!(
            c.s(&format!("mg {k} q {o}\r\n")),
            "CLIENT_ERROR opaque token too long\r\n"
        );
    }
    let o32 = format!("O{}", "1".repeat(31));
    assert_eq!(c.s(&format!("mg foo {o32}\r\n")), format!("HD {o32}\r\n"));
}

#[test]
fn mg_vivify_creates_an_empty_item_and_hands_out_one_win() {
    let mut c = Conn::new();
    let r = c.s("mg viv N30 v s\r\n");
    assert_eq!(r, "VA 0 s0 W\r\n\r\n");
    assert_eq!(c.s("mg viv v s\r\n"), "VA 0 s0 Z\r\n\r\n");
    assert_eq!(c.s("mg viv N30 v\r\n"), "VA 0 Z\r\n\r\n");
    let t = flag_value(&c.s("mg viv t\r\n"), 't');
    assert!((29..=30).contains(&t), "{t}");
}

#[test]
fn mg_t_before_n_shows_the_vivified_item_without_ttl() {
    let mut c = Conn::new();
    assert_eq!(c.s("mg viv t N30\r\n"), "HD t-1 W\r\n");
}

#[test]
fn mg_vivify_with_bad_opaque_still_creates_the_item() {
    let mut c = Conn::new();
    let o = format!("O{}", "x".repeat(40));
    assert_eq!(
        c.s(&format!("mg newv N30 {o}\r\n")),
        "CLIENT_ERROR opaque token too long\r\n"
    );
    assert_eq!(c.s("mg newv s\r\n"), "HD s0\r\n");
}

#[test]
fn mg_recache_wins_once_when_ttl_is_below_threshold() {
    let mut c = Conn::new();
    c.s("ms rc 2 T100\r\nrc\r\n");
    assert_eq!(c.s("mg rc R50 v\r\n"), "VA 2\r\nrc\r\n");
    assert_eq!(c.s("mg rc R200 v\r\n"), "VA 2 W\r\nrc\r\n");
    assert_eq!(c.s("mg rc R200 v\r\n"), "VA 2 Z\r\nrc\r\n");
    assert_eq!(c.s("mg rc R50 v\r\n"), "VA 2 Z\r\nrc\r\n");
}

#[test]
fn mg_recache_never_wins_on_an_item_without_ttl() {
    let mut c = Conn::new();
    c.s("ms rc 2\r\nrc\r\n");
    assert_eq!(c.s("mg rc R200\r\n"), "HD\r\n");
}

#[test]
fn mg_counts_gets_hits_misses_and_touches() {
    let mut c = Conn::new();
    c.s("ms a 1\r\n1\r\n");
    c.s("mg a v\r\nmg b v\r\nmg a T10\r\nmg b T10\r\nmg zzz\r\nmg zzz s s\r\n");
    let s = &c.stats;
    assert_eq!(s.cmd_get.get(), 4);
    assert_eq!(s.get_hits.get(), 1);
    assert_eq!(s.get_misses.get(), 3);
    assert_eq!(s.cmd_touch.get(), 1);
    assert_eq!(s.touch_hits.get(), 1);
    assert_eq!(s.meta_cmds.get(), 0);
}

// ----- md / invalidation ------------------------------------------------------------------

#[test]
fn md_deletes_and_reports_hd_then_nf() {
    let mut c = Conn::new();
    c.s("ms d 1\r\nx\r\n");
    assert_eq!(c.s("md d\r\n"), "HD\r\n");
    assert_eq!(c.s("md d\r\n"), "NF\r\n");
    assert_eq!(c.s("mg d v\r\n"), "EN\r\n");
    assert_eq!(c.stats.delete_hits.get(), 1);
    assert_eq!(c.stats.delete_misses.get(), 1);
}

#[test]
fn quiet_md_hides_only_hd() {
    let mut c = Conn::new();
    c.s("ms d 1\r\nx\r\n");
    assert_eq!(c.s("md d q\r\nmn\r\n"), "MN\r\n");
    assert_eq!(c.s("md d q\r\n"), "NF\r\n");
    c.s("ms d 1\r\nx\r\n");
    assert_eq!(c.s("md d C1 q k O5\r\n"), "EX kd O5\r\n");
}

#[test]
fn md_with_matching_cas_deletes() {
    let mut c = Conn::new();
    c.s("ms d 1\r\nx\r\n");
    let cas = c.cas("d");
    assert_eq!(c.s(&format!("md d C{}\r\n", cas + 1)), "EX\r\n");
    assert_eq!(c.s("md d C0\r\n"), "EX\r\n");
    assert_eq!(c.s(&format!("md d C{cas}\r\n")), "HD\r\n");
    assert_eq!(c.s(&format!("md d C{cas}\r\n")), "NF\r\n");
}

#[test]
fn md_invalidate_marks_stale_and_the_next_reader_wins() {
    let mut c = Conn::new();
    c.s("ms d 1 T100\r\nx\r\n");
    let old = c.cas("d");
    assert_eq!(c.s("md d I T30 k O5 c\r\n"), "HD kd O5\r\n");
    let r = c.s("mg d t c v\r\n");
    let cas = flag_value(&r, 'c') as u64;
    assert_ne!(cas, old, "invalidation bumps the CAS");
    let t = flag_value(&r, 't');
    assert!((29..=30).contains(&t), "{t}");
    assert!(r.ends_with(" X W\r\nx\r\n"), "{r:?}");
    let r = c.s("mg d v\r\n");
    assert_eq!(r, "VA 1 Z X\r\nx\r\n");
    // A second invalidation clears the token: the next reader wins again.
    assert_eq!(c.s("md d I q\r\n"), "");
    assert_eq!(c.s("mg d\r\n"), "HD X W\r\n");
    assert_eq!(c.s("md d I C999\r\n"), "EX\r\n");
}

#[test]
fn md_ttl_without_invalidate_just_deletes() {
    let mut c = Conn::new();
    c.s("ms d 1\r\nx\r\n");
    assert_eq!(c.s("md d T30\r\n"), "HD\r\n");
    assert_eq!(c.s("mg d\r\n"), "EN\r\n");
}

#[test]
fn md_errors_are_invalid_or_duplicate_flag() {
    let mut c = Conn::new();
    assert_eq!(
        c.s("md d Tabc\r\n"),
        "CLIENT_ERROR invalid or duplicate flag\r\n"
    );
    assert_eq!(
        c.s("md d x\r\n"),
        "CLIENT_ERROR invalid or duplicate flag\r\n"
    );
    assert_eq!(c.s("md ZA== b k\r\n"), "NF kZA== b\r\n");
}

// ----- ms -----------------------------------------------------------------------------

#[test]
fn ms_stores_and_returns_requested_flags() {
    let mut c = Conn::new();
    let r = c.s("ms k1 3 F5 T0 c k O9\r\nabc\r\n");
    let cas = flag_value(&r, 'c');
    assert_eq!(r, format!("HD c{cas} kk1 O9\r\n"));
    assert_eq!(c.s("mg k1 v f c\r\n"), format!("VA 3 f5 c{cas}\r\nabc\r\n"));
}

#[test]
fn ms_quiet_hides_hd_but_not_failures() {
    let mut c = Conn::new();
    assert_eq!(c.s("ms k 2 q\r\nde\r\nmn\r\n"), "MN\r\n");
    assert_eq!(c.s("ms k 2 q MR C999999\r\nde\r\n"), "EX\r\n");
    assert_eq!(c.s("ms nope 2 q MR\r\nde\r\n"), "NS\r\n");
}

#[test]
fn ms_modes_behave_like_the_classic_commands() {
    let mut c = Conn::new();
    assert_eq!(c.s("ms k 2 ME\r\nab\r\n"), "HD\r\n");
    assert_eq!(c.s("ms k 2 ME\r\nzz\r\n"), "NS\r\n");
    assert_eq!(c.s("ms k 2 MA\r\ncd\r\n"), "HD\r\n");
    assert_eq!(c.s("ms k 2 MP\r\n01\r\n"), "HD\r\n");
    assert_eq!(c.s("mg k v\r\n"), "VA 6\r\n01abcd\r\n");
    assert_eq!(c.s("ms k 1 MR\r\nr\r\n"), "HD\r\n");
    assert_eq!(c.s("ms k 1 MS\r\ns\r\n"), "HD\r\n");
    assert_eq!(c.s("mg k v\r\n"), "VA 1\r\ns\r\n");
    assert_eq!(c.s("ms nope 2 MR\r\nde\r\n"), "NS\r\n");
    assert_eq!(c.s("ms nope 2 MA\r\nde\r\n"), "NS\r\n");
    assert_eq!(c.s("ms nope 2 MP\r\nde\r\n"), "NS\r\n");
}

#[test]
fn ms_append_keeps_flags_and_checks_cas() {
    let mut c = Conn::new();
    c.s("ms k 1 F7\r\na\r\n");
    let cas = c.cas("k");
    assert_eq!(c.s(&format!("ms k 1 MA C{}\r\nb\r\n", cas + 1)), "EX\r\n");
    assert_eq!(c.s(&format!("ms k 1 MA C{cas}\r\nb\r\n")), "HD\r\n");
    assert_eq!(c.s("mg k v f\r\n"), "VA 2 f7\r\nab\r\n");
}

#[test]
fn ms_with_cas_compares() {
    let mut c = Conn::new();
    c.s("ms k 1\r\na\r\n");
    let cas = c.cas("k");
    assert_eq!(c.s("ms k 3 C999999 c\r\nxyz\r\n"), "EX c0\r\n");
    assert_eq!(c.s("ms k 1 C0\r\nx\r\n"), "EX\r\n");
    let r = c.s(&format!("ms k 3 C{cas} c\r\nxyz\r\n"));
    assert!(r.starts_with("HD c"), "{r:?}");
    assert_eq!(c.s("ms nope 2 C5\r\nde\r\n"), "NF\r\n");
    assert_eq!(c.s("ms nope 2 ME C5\r\nde\r\n"), "HD\r\n");
    assert_eq!(c.stats.cas_badval.get(), 2);
    assert_eq!(c.stats.cas_hits.get(), 1);
    assert_eq!(c.stats.cas_misses.get(), 1);
}

#[test]
fn ms_invalidate_with_older_cas_stores_a_stale_value() {
    let mut c = Conn::new();
    c.s("ms k 1 T100\r\na\r\n");
    c.s("ms k 1 T100\r\nb\r\n");
    let cur = c.cas("k");
    let r = c.s(&format!("ms k 3 C{} I c\r\nxyz\r\n", cur - 1));
    let new = flag_value(&r, 'c') as u64;
    assert!(new > cur, "a stale store still gets a new CAS: {r:?}");
    let r = c.s("mg k v t\r\n");
    let t = flag_value(&r, 't');
    assert!(
        (99..=100).contains(&t),
        "stale value keeps the old TTL: {r:?}"
    );
    assert!(r.ends_with(" X W\r\nxyz\r\n"), "{r:?}");
    assert!(c.s("mg k v\r\n").starts_with("VA 3 Z X\r\n"));
    // A newer CAS is still a mismatch.
    assert_eq!(c.s(&format!("ms k 1 C{} I\r\nz\r\n", new + 5)), "EX\r\n");
}

#[test]
fn ms_bad_data_chunk_is_reported_and_the_rest_read_as_commands() {
    let mut c = Conn::new();
    assert_eq!(
        c.s("ms k 2\r\ndexx\r\nmn\r\n"),
        "CLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n"
    );
}

#[test]
fn ms_data_may_arrive_in_pieces() {
    let mut c = Conn::new();
    assert_eq!(c.s("ms k 10 T0"), "");
    assert_eq!(c.s("\r\n01234"), "");
    assert_eq!(c.s("56789\r"), "");
    assert_eq!(c.s("\n"), "HD\r\n");
    assert_eq!(c.s("mg k v\r\n"), "VA 10\r\n0123456789\r\n");
}

#[test]
fn ms_flag_errors_swallow_the_data_block() {
    let mut c = Conn::new();
    assert_eq!(
        c.s("ms k 2 Z\r\nhi\r\nmn\r\n"),
        "CLIENT_ERROR invalid flag\r\nMN\r\n"
    );
    assert_eq!(
        c.s("ms k 2 MX\r\nhi\r\nmn\r\n"),
        "CLIENT_ERROR invalid mode for ms M token\r\nMN\r\n"
    );
    assert_eq!(
        c.s("ms k 2 MEE\r\nhi\r\nmn\r\n"),
        "CLIENT_ERROR incorrect length for M token\r\nMN\r\n"
    );
    let o = format!("O{}", "x".repeat(40));
    assert_eq!(
        c.s(&format!("ms k 2 {o}\r\nhi\r\nmn\r\n")),
        "CLIENT_ERROR opaque token too long\r\nMN\r\n"
    );
    assert_eq!(
        c.s("ms k 2 Fabc\r\nhi\r\nmn\r\n"),
        "CLIENT_ERROR bad command line format\r\nMN\r\n"
    );
    assert_eq!(c.s("mg k\r\n"), "EN\r\n");
}

#[test]
fn ms_line_errors_do_not_swallow() {
    let mut c = Conn::new();
    assert_eq!(
        c.s("ms k abc\r\nde\r\n"),
        "CLIENT_ERROR bad command line format\r\nERROR\r\n"
    );
    assert_eq!(c.s("ms k\r\n"), "CLIENT_ERROR bad command line format\r\n");
    assert_eq!(
        c.s("ms k -1\r\n"),
        "CLIENT_ERROR bad command line format\r\n"
    );
}

#[test]
fn ms_too_large_is_refused_at_once_and_drops_the_old_value() {
    let mut c = Conn::new();
    c.s("ms k1 1\r\nx\r\n");
    // 48 + key + 1 + value + 2 + cas 8 must fit in 1 MiB.
    let max = (1 << 20) - 48 - 2 - 1 - 2 - 8;
    let mut req = format!("ms k1 {}\r\n", max + 1).into_bytes();
    assert_eq!(
        text(&c.send(&req)),
        "SERVER_ERROR object too large for cache\r\n"
    );
    req = vec![b'x'; max + 1];
    req.extend_from_slice(b"\r\nmn\r\n");
    assert_eq!(text(&c.send(&req)), "MN\r\n");
    assert_eq!(c.s("mg k1 s\r\n"), "EN\r\n");
    let mut req = format!("ms k1 {max}\r\n").into_bytes();
    req.extend_from_slice(&vec![b'y'; max]);
    req.extend_from_slice(b"\r\n");
    assert_eq!(text(&c.send(&req)), "HD\r\n");
    assert_eq!(c.s("mg k1 s\r\n"), format!("HD s{max}\r\n"));
}

#[test]
fn ms_base64_key_echoes_encoded() {
    let mut c = Conn::new();
    let r = c.s("ms Zm9vYg== 1 b k\r\nx\r\n");
    assert_eq!(r, "HD kZm9vYg== b\r\n");
    assert_eq!(c.s("mg foob v\r\n"), "VA 1\r\nx\r\n");
}

#[test]
fn ms_counts_sets() {
    let mut c = Conn::new();
    c.s("ms a 1\r\n1\r\nms a 1\r\n12\r\n");
    assert_eq!(c.stats.cmd_set.get(), 2);
}

// ----- ma -----------------------------------------------------------------------------

#[test]
fn ma_increments_by_one_by_default() {
    let mut c = Conn::new();
    c.s("ms n 3\r\n100\r\n");
    assert_eq!(c.s("ma n v\r\n"), "VA 3\r\n101\r\n");
    assert_eq!(c.s("ma n\r\n"), "HD\r\n");
    assert_eq!(c.stats.incr_hits.get(), 2);
}

#[test]
fn ma_decrement_pads_the_stored_value_like_memcached() {
    let mut c = Conn::new();
    c.s("ms n 3\r\n100\r\n");
    let r = c.s("ma n MD D95 v c k O1\r\n");
    let cas = flag_value(&r, 'c');
    assert_eq!(r, format!("VA 1 c{cas} kn O1\r\n5\r\n"));
    assert_eq!(c.s("mg n v\r\n"), "VA 3\r\n5  \r\n");
    assert_eq!(c.s("ma n MD D10 v\r\n"), "VA 1\r\n0\r\n");
    assert_eq!(c.stats.decr_hits.get(), 2);
}

#[test]
fn ma_increment_wraps_at_2_64() {
    let mut c = Conn::new();
    c.s("ms n 1\r\n6\r\n");
    assert_eq!(c.s("ma n MI D18446744073709551615 v\r\n"), "VA 1\r\n5\r\n");
    assert_eq!(c.s("ma n D5 M+ v\r\n"), "VA 2\r\n10\r\n");
    assert_eq!(c.s("ma n D5 M- v\r\n"), "VA 1\r\n5\r\n");
}

#[test]
fn ma_on_missing_key_is_nf_even_when_quiet() {
    let mut c = Conn::new();
    assert_eq!(c.s("ma nope q\r\n"), "NF\r\n");
    assert_eq!(c.s("ma nope k O2\r\n"), "NF knope O2\r\n");
    assert_eq!(c.stats.incr_misses.get(), 2);
}

#[test]
fn quiet_ma_hides_success_even_with_a_value() {
    let mut c = Conn::new();
    c.s("ms n 1\r\n5\r\n");
    assert_eq!(c.s("ma n v q\r\nma n q\r\nmn\r\n"), "MN\r\n");
    assert_eq!(c.s("mg n v\r\n"), "VA 1\r\n7\r\n");
}

#[test]
fn ma_vivify_creates_with_initial_value_and_reports_it_even_quiet() {
    let mut c = Conn::new();
    let r = c.s("ma nope q N0 J42 v c t\r\n");
    let cas = flag_value(&r, 'c');
    assert_eq!(r, format!("VA 2 c{cas} t-1\r\n42\r\n"));
    assert_eq!(c.s("ma nope v\r\n"), "VA 2\r\n43\r\n");
}

#[test]
fn ma_ttl_flags_apply_in_request_order() {
    let mut c = Conn::new();
    // t before N: the created item has no TTL yet.
    assert_eq!(c.s("ma v3 t N30 J7 v T60\r\n"), "VA 1 t-1\r\n7\r\n");
    let t = flag_value(&c.s("mg v3 t\r\n"), 't');
    assert!((59..=60).contains(&t), "T after N wins: {t}");
    let r = c.s("ma v4 T60 t N30 v\r\n");
    let t = flag_value(&r, 't');
    assert!((59..=60).contains(&t), "{r:?}");
    assert!(r.ends_with("\r\n0\r\n"), "{r:?}");
    let t = flag_value(&c.s("mg v4 t\r\n"), 't');
    assert!((29..=30).contains(&t), "N after T wins: {t}");
}

#[test]
fn ma_on_non_numeric_value_is_client_error() {
    let mut c = Conn::new();
    c.s("ms s 2\r\nab\r\nms e 0\r\n\r\n");
    let e = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
    assert_eq!(c.s("ma s\r\n"), e);
    assert_eq!(c.s("ma e\r\n"), e);
    assert_eq!(c.s("ma s t\r\n"), e);
}

#[test]
fn ma_cas_mismatch_is_ex_and_c0_means_no_compare() {
    let mut c = Conn::new();
    c.s("ms n 1\r\n7\r\n");
    let cas = c.cas("n");
    assert_eq!(c.s(&format!("ma n C{}\r\n", cas + 1)), "EX\r\n");
    assert_eq!(c.s("ma n C0 v\r\n"), "VA 1\r\n8\r\n");
    let cas = c.cas("n");
    assert_eq!(c.s(&format!("ma n C{cas} v\r\n")), "VA 1\r\n9\r\n");
}

#[test]
fn ma_errors_are_memcacheds() {
    let mut c = Conn::new();
    let e = "CLIENT_ERROR invalid or duplicate flag\r\n";
    for l in ["ma n Dabc", "ma n Jabc", "ma n D-1", "ma n q q", "ma n v b"] {
        assert_eq!(c.s(&format!("{l}\r\n")), e, "{l}");
    }
    assert_eq!(
        c.s("ma n MX\r\n"),
        "CLIENT_ERROR invalid mode for ma M token\r\n"
    );
    assert_eq!(c.s("ma\r\n"), "ERROR\r\n");
}

#[test]
fn ma_bad_opaque_is_reported_after_the_change() {
    let mut c = Conn::new();
    c.s("ms n 1\r\n5\r\n");
    let o = format!("O{}", "x".repeat(40));
    assert_eq!(
        c.s(&format!("ma n q {o}\r\n")),
        "CLIENT_ERROR opaque token too long\r\n"
    );
    assert_eq!(c.s("mg n v\r\n"), "VA 1\r\n6\r\n");
}

#[test]
fn ma_base64_key_echoes_encoded() {
    let mut c = Conn::new();
    c.s("ms n 1\r\n9\r\n");
    assert_eq!(c.s("ma bg== v b k\r\n"), "VA 2 kbg== b\r\n10\r\n");
}

// ----- me -----------------------------------------------------------------------------

#[test]
fn me_of_missing_key_is_en() {
    let mut c = Conn::new();
    assert_eq!(c.s("me nothere\r\n"), "EN\r\n");
    assert_eq!(c.s("me\r\n"), "CLIENT_ERROR bad command line format\r\n");
    assert_eq!(c.stats.meta_cmds.get(), 1);
}

#[test]
fn me_dumps_metadata_in_memcacheds_format() {
    let mut c = Conn::new();
    c.s("ms foo 2\r\nhi\r\n");
    let cas = c.cas("foo");
    let r = c.s("me foo\r\n");
    let want_prefix = "ME foo exp=-1 la=";
    assert!(r.starts_with(want_prefix), "{r:?}");
    assert!(
        r.ends_with(&format!(" cas={cas} fetch=yes cls=1 size=64\r\n"))
            || r.contains(&format!(" cas={cas} fetch=yes cls=")),
        "{r:?}"
    );
    assert!(r.contains(" size=64\r\n"), "{r:?}");
    // Non-zero client flags take 4 more bytes.
    c.s("ms foo 2 F5\r\nhi\r\n");
    assert!(c.s("me foo\r\n").contains("fetch=no"));
    assert!(c.s("me foo\r\n").ends_with(" size=68\r\n"));
    // memcached echoes the key the way the item was stored: `foo` was set plainly.
    assert!(c.s("me Zm9v b\r\n").starts_with("ME foo exp=-1 "));
    c.s("ms Zm9v 1 b\r\ny\r\n");
    assert!(c.s("me foo\r\n").starts_with("ME Zm9v exp=-1 "));
    assert_eq!(
        c.s("me foo b\r\n"),
        "CLIENT_ERROR bad command line format\r\n"
    );
}

#[test]
fn me_exp_is_negative_remaining_ttl() {
    let mut c = Conn::new();
    c.s("ms a 1 T10\r\n1\r\n");
    let r = c.s("me a\r\n");
    let exp: i64 = r
        .split(' ')
        .find_map(|t| t.strip_prefix("exp="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{r:?}"));
    assert!((-10..=-9).contains(&exp), "{r:?}");
}

// ----- pipelines ----------------------------------------------------------------------

#[test]
fn quiet_pipeline_ends_with_mn() {
    let mut c = Conn::new();
    let r =
        c.s("ms a 1 q\r\n1\r\nms b 1 q\r\n2\r\nmg a v q\r\nmg missing v q\r\nmg b v q k\r\nmn\r\n");
    assert_eq!(r, "VA 1\r\n1\r\nVA 1 kb\r\n2\r\nMN\r\n");
}

#[test]
fn classic_and_meta_see_each_others_items() {
    let mut c = Conn::new();
    c.s("ms classic 3 F9\r\nabc\r\n");
    assert_eq!(
        c.s("get classic\r\n"),
        "VALUE classic 9 3\r\nabc\r\nEND\r\n"
    );
    c.s("set m2 3 0 2\r\nhi\r\n");
    assert_eq!(c.s("mg m2 v f s\r\n"), "VA 2 f3 s2\r\nhi\r\n");
}

// ----- ms K (memfabricd's: keep a newer write's fragment) -------------------------------

/// Fragment `index` 0 of a 4+2 write under `stripe`, `payload_len` bytes of `fill`.
fn fragment(stripe: u64, fill: u8, payload_len: usize) -> Vec<u8> {
    use memfabric_proto::ec_fragment::FragmentHeader;
    let h = FragmentHeader {
        k: 4,
        m: 2,
        index: 0,
        stripe,
        value_len: 4 * payload_len as u64,
        data_crc: u32::from(fill),
    };
    let mut out = Vec::new();
    h.encode(&vec![fill; payload_len], &mut out);
    out
}

/// An `ms` of `value` with the flags `flags`, sent whole.
fn ms(key: &str, flags: &str, value: &[u8]) -> Vec<u8> {
    let mut req = format!("ms {key} {} {flags}\r\n", value.len()).into_bytes();
    req.extend_from_slice(value);
    req.extend_from_slice(b"\r\n");
    req
}

/// The value `mg` returns for `key`.
fn value_of(c: &mut Conn, key: &str) -> Vec<u8> {
    let r = c.send(format!("mg {key} v\r\n").as_bytes());
    let head = r.iter().position(|&b| b == b'\n').expect("a reply line") + 1;
    assert!(r.starts_with(b"VA "), "{:?}", text(&r));
    r[head..r.len() - 2].to_vec()
}

#[test]
fn ms_k_keeps_a_fragment_of_a_newer_write_and_says_which() {
    let mut c = Conn::new();
    let (older, newer, newest) = (
        fragment(100, b'o', 64),
        fragment(200, b'n', 64),
        fragment(300, b'w', 64),
    );
    assert_eq!(text(&c.send(&ms("k", "K", &newer))), "HD\r\n");
    // An older write's fragment is refused and told which write stays; the opaque and
    // the key are echoed as on any NS.
    assert_eq!(
        text(&c.send(&ms("k", "K O9 k", &older))),
        "NS K200 O9 kk\r\n"
    );
    assert_eq!(value_of(&mut c, "k"), newer);
    assert_eq!(text(&c.send(&ms("k", "K q", &older))), "NS K200\r\n");
    // A newer one replaces it; so does any set without K.
    assert_eq!(text(&c.send(&ms("k", "K", &newest))), "HD\r\n");
    assert_eq!(value_of(&mut c, "k"), newest);
    assert_eq!(text(&c.send(&ms("k", "", &older))), "HD\r\n");
    assert_eq!(value_of(&mut c, "k"), older);
    // K applies to plain sets of fragments only: a value that is not a fragment, or
    // another mode, or a compare-and-swap, is stored as its other flags say.
    assert_eq!(text(&c.send(&ms("k", "K", &newest))), "HD\r\n");
    assert_eq!(text(&c.send(&ms("k", "K", b"plain"))), "HD\r\n");
    assert_eq!(value_of(&mut c, "k"), b"plain");
    assert_eq!(text(&c.send(&ms("k", "K", &newest))), "HD\r\n");
    assert_eq!(text(&c.send(&ms("k", "K MA", b"!"))), "HD\r\n");
    let cas = c.cas("k");
    assert_eq!(
        text(&c.send(&ms("k", &format!("K C{cas}"), &older))),
        "HD\r\n"
    );
    assert_eq!(value_of(&mut c, "k"), older);
    // On a missing key a K set stores.
    assert_eq!(text(&c.send(&ms("fresh", "K", &older))), "HD\r\n");
    // Only ms takes K; the others refuse it as memcached refuses every unknown flag.
    assert_eq!(c.s("mg k K\r\n"), c.s("mg k Z\r\n"));
    assert_eq!(c.s("md k K\r\n"), c.s("md k Z\r\n"));
    assert_eq!(c.s("ma k K\r\n"), c.s("ma k Z\r\n"));
    assert_eq!(c.s("mg k K\r\n"), "CLIENT_ERROR invalid flag\r\n");
}

#[test]
fn ms_k_of_a_large_value_received_in_parts_keeps_the_newer_write() {
    let mut c = Conn::new();
    let newer = fragment(200, b'n', 64 << 10);
    let older = fragment(100, b'o', 64 << 10);
    assert_eq!(text(&c.send(&ms("big", "K", &newer))), "HD\r\n");
    let req = ms("big", "K", &older);
    let (a, b) = req.split_at(1000);
    assert_eq!(text(&c.send(a)), "");
    assert_eq!(text(&c.send(b)), "NS K200\r\n");
    assert_eq!(value_of(&mut c, "big"), newer);
}

#[test]
fn a_k_set_refused_for_its_size_leaves_the_newer_write_in_place() {
    let mut c = Conn::new();
    let newer = fragment(200, b'n', 64);
    assert_eq!(text(&c.send(&ms("k", "K", &newer))), "HD\r\n");
    // Larger than any item: refused before its data is read. Without K memcached
    // unlinks the old value (below); under K the item may be a newer write's fragment.
    let huge = vec![b'x'; 2 << 20];
    assert_eq!(
        text(&c.send(&ms("k", "K", &huge))),
        "SERVER_ERROR object too large for cache\r\n"
    );
    assert_eq!(value_of(&mut c, "k"), newer);
    assert_eq!(
        text(&c.send(&ms("k", "", &huge))),
        "SERVER_ERROR object too large for cache\r\n"
    );
    assert_eq!(c.s("mg k v\r\n"), "EN\r\n");
}
