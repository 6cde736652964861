//! `stats slabs`, `stats items`, `stats settings` and `stats reset` as memcached 1.6.18
//! prints them, driven through `exec::process` with a real `Store`.
use std::collections::HashMap;
use std::sync::Arc;

use memfabric_proto::binary::{opcode, write_request};
use memfabric_server::counters::ThreadStats;
use memfabric_server::exec::{process, ExecCtx, Session, Shared, Transport};
use memfabric_server::settings::Settings;
use memfabric_store::Store;

fn server_with(settings: Settings) -> Shared {
    let store = Store::new(settings.store.clone()).expect("store");
    Shared::new(settings, store)
}

fn server() -> Shared {
    server_with(Settings::default())
}

/// One client connection: buffers input as a worker does and runs `process` on it.
struct Conn<'a> {
    shared: &'a Shared,
    stats: Arc<ThreadStats>,
    sess: Session,
    pending: Vec<u8>,
    closed: bool,
}

impl<'a> Conn<'a> {
    fn new(shared: &'a Shared) -> Conn<'a> {
        Conn {
            shared,
            stats: shared.register_thread(),
            sess: Session::default(),
            pending: Vec::new(),
            closed: false,
        }
    }

    /// Feed `bytes`, run everything that is complete, return the replies.
    fn send(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut queue = memfabric_server::outqueue::OutQueue::new();
        if self.closed {
            return out;
        }
        self.pending.extend_from_slice(bytes);
        loop {
            let mut ctx = ExecCtx {
                shared: self.shared,
                stats: &self.stats,
                transport: Transport::Tcp,
                conn_id: 1,
                waiter: None,
                completion: None,
            };
            let p = process(&mut ctx, &mut self.sess, &self.pending, &mut queue, 1000);
            out.extend(queue.take_vec());
            self.pending.drain(..p.consumed);
            if p.close {
                self.closed = true;
                self.pending.clear();
                break;
            }
            if p.consumed == 0 {
                break;
            }
        }
        out
    }

    fn send_str(&mut self, s: &str) -> String {
        String::from_utf8_lossy(&self.send(s.as_bytes())).into_owned()
    }
}

/// The `STAT` lines of `stats <group>` as (key, value) pairs, in order.
fn stats(c: &mut Conn<'_>, group: &str) -> Vec<(String, String)> {
    let reply = c.send_str(&format!("stats {group}\r\n"));
    assert!(reply.ends_with("END\r\n"), "{reply}");
    reply
        .lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("STAT key value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn stat(pairs: &[(String, String)], key: &str) -> u64 {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {pairs:?}"))
        .1
        .parse()
        .expect("a number")
}

fn bin(op: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
    let mut v = Vec::new();
    write_request(&mut v, op, 7, cas, extras, key, value);
    v
}

#[test]
fn stats_slabs_counts_every_protocols_commands_in_the_class_of_their_item() {
    let s = server();
    let store = &s.store;
    let small = store.item_class(1, 10).unwrap();
    let big = store.item_class(1, 3000).unwrap();
    let one = store.item_class(1, 1).unwrap();
    assert_ne!(small, big);
    let mut c = Conn::new(&s);
    let v10 = "0123456789";
    let v3k = "x".repeat(3000);
    // ascii: 2 sets (small, big), get hit small, gets hit big, a miss, touch big,
    // incr/decr small, delete small, cas bad + good on big (counted in big; the new
    // values are 1 byte: their cmd_set is in the 1-byte class).
    c.send_str(&format!(
        "set a 0 0 10\r\n{v10}\r\nset b 0 0 3000\r\n{v3k}\r\n"
    ));
    c.send_str("get a nope\r\n");
    let gets = c.send_str("gets b\r\n");
    let cas: u64 = gets
        .split("\r\n")
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    c.send_str("touch b 100\r\nincr a 1\r\nincr a 1\r\ndecr a 1\r\n");
    assert_eq!(
        c.send_str(&format!("cas b 0 0 1 {}\r\nz\r\n", cas + 1)),
        "EXISTS\r\n"
    );
    assert_eq!(
        c.send_str(&format!("cas b 0 0 1 {cas}\r\nz\r\n")),
        "STORED\r\n"
    );
    // meta: set small, get hit small, delete small.
    c.send_str(&format!("ms m 10\r\n{v10}\r\nmg m v\r\nmd m\r\nmn\r\n"));
    assert_eq!(c.send_str("delete a\r\n"), "DELETED\r\n");
    // binary on its own connection: set big, get hit big, delete big.
    let mut bc = Conn::new(&s);
    let mut req = bin(opcode::SET, &[0; 8], b"c", v3k.as_bytes(), 0);
    req.extend(bin(opcode::GET, &[], b"c", &[], 0));
    req.extend(bin(opcode::DELETE, &[], b"c", &[], 0));
    bc.send(&req);

    // What each class should have counted (`one` may be `small`'s class: added up).
    let mut want: HashMap<(u8, &str), u64> = HashMap::new();
    for (class, what, count) in [
        (small, "cmd_set", 2), // ascii set a, ms m
        (big, "cmd_set", 2),   // ascii set b, binary set c
        (one, "cmd_set", 2),   // the two cas values
        (small, "get_hits", 2),
        (big, "get_hits", 2),
        (big, "touch_hits", 1),
        (small, "incr_hits", 2),
        (small, "decr_hits", 1),
        (big, "cas_badval", 1),
        (big, "cas_hits", 1),
        (small, "delete_hits", 2), // md m, delete a
        (big, "delete_hits", 1),   // binary delete c
    ] {
        *want.entry((class, what)).or_default() += count;
    }
    let slabs = stats(&mut c, "slabs");
    let n = |class: u8, what: &str| stat(&slabs, &format!("{class}:{what}"));
    for ((class, what), count) in &want {
        assert_eq!(n(*class, what), *count, "class {class} {what}");
    }
    // The totals of `stats` are the sums over the classes.
    let general = stats(&mut c, "");
    for what in [
        "get_hits",
        "cmd_set",
        "delete_hits",
        "incr_hits",
        "decr_hits",
        "cas_hits",
        "cas_badval",
        "touch_hits",
    ] {
        let mut classes = vec![small, big, one];
        classes.sort_unstable();
        classes.dedup();
        let sum: u64 = classes.iter().map(|&k| n(k, what)).sum();
        assert_eq!(stat(&general, what), sum, "{what}");
    }
}

#[test]
fn stats_reset_zeroes_per_class_counters_and_evictions_but_not_what_is_stored() {
    let mut settings = Settings::default();
    settings.store.memory_limit = 8 << 20;
    let s = server_with(settings);
    let mut c = Conn::new(&s);
    let value = "e".repeat(100_000);
    for i in 0..200 {
        assert_eq!(
            c.send_str(&format!("set ev{i} 0 0 100000\r\n{value}\r\n")),
            "STORED\r\n"
        );
    }
    c.send_str("get ev199\r\n");
    let class = s.store.item_class(5, 100_000).unwrap();
    let items = stats(&mut c, "items");
    let evicted = stat(&items, &format!("items:{class}:evicted"));
    let number = stat(&items, &format!("items:{class}:number"));
    assert!(evicted > 0, "-m 8 must evict: {items:?}");
    assert!(stat(&items, &format!("items:{class}:evicted_time")) < 1000);
    assert_eq!(
        stat(&stats(&mut c, "slabs"), &format!("{class}:cmd_set")),
        200
    );

    assert_eq!(c.send_str("stats reset\r\n"), "RESET\r\n");
    let items = stats(&mut c, "items");
    for what in [
        "evicted",
        "evicted_nonzero",
        "evicted_time",
        "evicted_unfetched",
        "evicted_active",
        "outofmemory",
        "reclaimed",
        "hits_to_cold",
    ] {
        assert_eq!(stat(&items, &format!("items:{class}:{what}")), 0, "{what}");
    }
    assert_eq!(stat(&items, &format!("items:{class}:number")), number);
    let slabs = stats(&mut c, "slabs");
    for what in ["get_hits", "cmd_set"] {
        assert_eq!(stat(&slabs, &format!("{class}:{what}")), 0, "{what}");
    }
    assert!(stat(&slabs, &format!("{class}:total_pages")) > 0);
    // Counting goes on from zero.
    c.send_str(&format!("set ev0 0 0 100000\r\n{value}\r\n"));
    assert_eq!(
        stat(&stats(&mut c, "slabs"), &format!("{class}:cmd_set")),
        1
    );
}

#[test]
fn stats_settings_prints_memcacheds_76_keys_and_stats_extstore_answers_empty() {
    let s = server();
    let mut c = Conn::new(&s);
    let settings = stats(&mut c, "settings");
    let keys: Vec<&str> = settings.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 76, "{keys:?}");
    assert_eq!(keys.first(), Some(&"maxbytes"));
    assert_eq!(keys.last(), Some(&"memory_file"));
    for k in [
        "slab_automove_ratio",
        "hash_algorithm",
        "lru_segmented",
        "ext_item_size",
        "ssl_enabled",
        "read_buf_mem_limit",
        "temporary_ttl",
        "num_napi_ids",
    ] {
        assert!(keys.contains(&k), "{k}");
    }
    assert!(
        !keys.contains(&"poll_us"),
        "memfabric's own setting is in stats fabric"
    );
    assert_eq!(stat(&stats(&mut c, "fabric"), "poll_us"), 0);
    assert_eq!(stat(&stats(&mut c, "fabric"), "tcp_poll_us"), 50);
    assert_eq!(c.send_str("stats extstore\r\n"), "END\r\n");
}
