//! Replicated pools (`Config::replicas`): copies on the ring's successors, the write
//! policies, reads that go on past errors and misses, read repair, conditional operations
//! that keep the copies equal, hints that keep a copy which missed a write from being read
//! stale, and restarts recognised by the server's instance id. Every copy is checked by
//! asking its server directly. Over memfabricd's TCP and UCX front ends, and against
//! Debian's memcached (replication lives in the client; any memcached serves it).

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::{key_on, Kind, Server};
use memfabric_client::{Acks, Client, Config, Error, StoreStatus, Ttl, WritePolicy};

fn pool(servers: &[Server], config: Config) -> Client {
    let list: Vec<String> = servers.iter().map(|s| s.url()).collect();
    Client::new(list.join(",").as_str(), config).unwrap()
}

fn replicated(replicas: u8, policy: WritePolicy) -> Config {
    Config {
        replicas,
        write_policy: policy,
        // Far above a loaded machine's stalls: under `all` one late copy fails a write.
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        retry_timeout: Duration::from_millis(300),
        ..Config::default()
    }
}

/// A one-server pool's settings that give a fragment of a coded value as stored.
fn raw() -> Config {
    Config {
        raw_fragments: true,
        ..Config::default()
    }
}

/// What each server holds for `key`, asked directly (a one-server pool each).
fn copies(servers: &[Server], key: &[u8]) -> Vec<Option<Vec<u8>>> {
    servers
        .iter()
        .map(|s| {
            let mut c = Client::new(s.url().as_str(), raw()).unwrap();
            c.get(key).unwrap().map(|v| v.data.to_vec())
        })
        .collect()
}

/// The servers (indexes into the pool) that hold `key`'s copies, primary first.
fn homes(c: &Client, key: &[u8], n: usize) -> Vec<usize> {
    let all = c.servers();
    c.locate_successors(key, n)
        .into_iter()
        .map(|a| all.iter().position(|s| *s == a).unwrap())
        .collect()
}

fn start(kind: Kind, n: usize) -> Vec<Server> {
    (0..n).map(|_| Server::start(kind, &[])).collect()
}

fn copies_on_successors_and_policies(kind: Kind) {
    let servers = start(kind, 4);
    let mut c = pool(&servers, replicated(2, WritePolicy::All));
    for i in 0..40 {
        let key = format!("rep:{i}").into_bytes();
        let value = format!("value {i}");
        let acks = c.set_acked(&key, value.as_bytes(), 7, 0).unwrap();
        assert_eq!(
            acks,
            Acks {
                acked: 3,
                copies: 3
            },
            "{kind:?}"
        );
        let held = copies(&servers, &key);
        let home = homes(&c, &key, 3);
        for (s, v) in held.iter().enumerate() {
            if home.contains(&s) {
                assert_eq!(v.as_deref(), Some(value.as_bytes()), "{kind:?} copy on {s}");
            } else {
                assert_eq!(v, &None, "{kind:?}: server {s} is not one of {home:?}");
            }
        }
        let got = c.get(&key).unwrap().unwrap();
        assert_eq!((&got.data[..], got.flags), (value.as_bytes(), 7));
    }
    // Deleted everywhere; then a miss.
    assert!(c.delete(b"rep:0").unwrap());
    assert_eq!(copies(&servers, b"rep:0"), vec![None; 4]);
    assert_eq!(c.get(b"rep:0").unwrap(), None);
}

#[test]
fn copies_land_on_the_ring_successors_and_every_copy_acknowledges() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        copies_on_successors_and_policies(kind);
    }
}

fn miss_is_read_past_and_repaired(kind: Kind) {
    let servers = start(kind, 3);
    let mut c = pool(&servers, replicated(1, WritePolicy::Quorum));
    let key = key_on(&c, 0, "repair:");
    let home = homes(&c, &key, 2);
    assert_eq!(home[0], 0);
    c.set(&key, b"kept", 5, 0).unwrap();
    // The primary loses it (as a restarted or evicting server would).
    let mut direct = Client::new(servers[0].url().as_str(), Config::default()).unwrap();
    assert!(direct.delete(&key).unwrap());
    let got = c.get(&key).unwrap().expect("read past the miss");
    assert_eq!((&got.data[..], got.flags), (&b"kept"[..], 5));
    // The repair runs in the background: the next operations drive it.
    for _ in 0..50 {
        if c.pool_counters().read_repairs >= 1 {
            break;
        }
        let _ = c.get(b"other");
        sleep(Duration::from_millis(10));
    }
    let repaired = direct.get(&key).unwrap().expect("repaired on the primary");
    assert_eq!((&repaired.data[..], repaired.flags), (&b"kept"[..], 5));
    let counters = c.pool_counters();
    assert!(
        counters.reads_failed_over >= 1 && counters.read_repairs >= 1,
        "{counters:?}"
    );
    // A key on no copy is a miss, not an error.
    assert_eq!(c.get(b"never-written").unwrap(), None);
}

#[test]
fn a_miss_on_the_primary_is_read_past_and_repaired() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        miss_is_read_past_and_repaired(kind);
    }
}

/// A read that finds the value only past a miss repairs the copy that missed, after asking
/// the source how long the value lives. A delete issued right after the read goes out
/// before that repair's `add`; the `add` must then not be sent, or it brings the deleted
/// value back on the copy it repairs.
fn read_repair_after_delete(kind: Kind) {
    let servers = start(kind, 3);
    let mut c = pool(&servers, replicated(1, WritePolicy::Quorum));
    let mut direct = Client::new(servers[0].url().as_str(), Config::default()).unwrap();
    for i in 0..20 {
        let key = key_on(&c, 0, &format!("gone{i}:"));
        c.set(&key, b"deleted soon", 5, 0).unwrap();
        assert!(direct.delete(&key).unwrap());
        // Read past the miss on the primary: the repair asks the other copy for the time
        // to live; its answer is handled during the delete below.
        let got = c.get(&key).unwrap().expect("read past the miss");
        assert_eq!(&got.data[..], b"deleted soon");
        c.delete(&key).unwrap();
        assert!(c.drain(Duration::from_secs(5)));
        assert_eq!(
            copies(&servers, &key),
            vec![None; 3],
            "{kind:?} round {i}: the deleted value came back"
        );
        assert_eq!(c.get(&key).unwrap(), None, "{kind:?} round {i}");
    }
    // The race was run: repairs were overtaken (not merely done before the delete).
    let counters = c.pool_counters();
    assert!(counters.read_repairs_skipped >= 1, "{kind:?}: {counters:?}");
    eprintln!("{kind:?}: {counters:?}");
}

#[test]
fn a_read_repair_overtaken_by_a_delete_writes_nothing() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        read_repair_after_delete(kind);
    }
}

/// Drives a pool's background work until `done` says it is over (at most 5 s).
fn until(c: &mut Client, done: impl Fn(&Client) -> bool) {
    for _ in 0..500 {
        if done(c) {
            return;
        }
        let _ = c.drain(Duration::from_millis(10));
    }
}

fn seconds(t: Option<Ttl>) -> u32 {
    match t {
        Some(Ttl::Seconds(s)) => s,
        other => panic!("expected a time to live, got {other:?}"),
    }
}

/// A copy written back by read repair expires when the value it copies does: a plain
/// read asks the server it read from how long the value still lives (relative times,
/// times beyond memcached's 30 days given as unix times, and no expiry at all); a gat
/// gives its own time; erasure-coded fragments likewise. (Written without it, the copy
/// would outlive the value and serve it after it expired.)
fn read_repair_keeps_the_expiry_time(kind: Kind) {
    let servers = start(kind, 6);
    let mut c = pool(&servers, replicated(1, WritePolicy::All));
    let mut direct = direct(&servers);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as u32;
    let forty_days = 40 * 24 * 3600;
    let cases: [(&str, u32); 3] = [("rel", 1000), ("never", 0), ("abs", now + forty_days)];
    for (i, (tag, exptime)) in cases.into_iter().enumerate() {
        let key = key_on(&c, i, &format!("ttl-{tag}:"));
        c.set(&key, b"kept", 3, exptime).unwrap();
        assert!(direct[i].delete(&key).unwrap(), "{kind:?} {tag}");
        let repairs = c.pool_counters().read_repairs;
        assert_eq!(&c.get(&key).unwrap().unwrap().data[..], b"kept");
        until(&mut c, |c| c.pool_counters().read_repairs > repairs);
        let repaired = direct[i].ttl(&key).unwrap();
        // The pool's own answer comes from the primary, now repaired.
        assert!(c.ttl(&key).unwrap().is_some(), "{kind:?} {tag}");
        match tag {
            "never" => assert_eq!(repaired, Some(Ttl::Never), "{kind:?}"),
            // memcached's clock may round a second up.
            "rel" => assert!((1..=1001).contains(&seconds(repaired)), "{kind:?}"),
            _ => {
                let left = seconds(repaired);
                // memcached's clock runs up to two seconds behind the wall clock its
                // unix times are read against: the original's time left and the copy's
                // each carry that.
                assert!(
                    left > 30 * 24 * 3600 && left <= forty_days + 4,
                    "{kind:?}: {left} s left"
                );
            }
        }
    }
    // gat: the copy gets the gat's time.
    let key = key_on(&c, 3, "ttl-gat:");
    c.set(&key, b"kept", 0, 0).unwrap();
    assert!(direct[3].delete(&key).unwrap());
    let repairs = c.pool_counters().read_repairs;
    assert!(c.gat(&key, 500).unwrap().is_some());
    until(&mut c, |c| c.pool_counters().read_repairs > repairs);
    assert!((1..=501).contains(&seconds(direct[3].ttl(&key).unwrap())));
    // A miss has no time to live; no repair was skipped.
    assert_eq!(c.ttl(b"ttl-never-written").unwrap(), None);
    assert_eq!(c.pool_counters().read_repairs_skipped, 0);

    // Erasure coded: the fragment written back carries the value's time.
    let config = coded_all();
    let mut ec = pool(&servers, config);
    let value = big(3, 100_000);
    ec.set(b"ttl-ec", &value, 0, 2000).unwrap();
    assert_eq!(ec.get(b"ttl-ec").unwrap().unwrap().data.len(), 100_000);
    // The first data fragment's server: always among those a read asks.
    let holder = homes(&ec, b"ttl-ec", 6)[0];
    assert!(direct[holder].delete(b"ttl-ec").unwrap());
    // One read repairs it, whether its miss arrives before the decode or after (a
    // read that has k fragments first decodes without waiting for it).
    assert_eq!(&ec.get(b"ttl-ec").unwrap().unwrap().data[..], &value[..]);
    until(&mut ec, |c| c.pool_counters().fragment_repairs > 0);
    assert!(ec.pool_counters().fragment_repairs > 0, "{kind:?}");
    assert!((1..=2001).contains(&seconds(direct[holder].ttl(b"ttl-ec").unwrap())));
    // A miss that surely arrives after the decode: its server is paused while the
    // others answer, and resumed once the value is delivered.
    assert!(direct[holder].delete(b"ttl-ec").unwrap());
    let repairs = ec.pool_counters().fragment_repairs;
    servers[holder].signal("STOP");
    let read = ec.get(b"ttl-ec");
    servers[holder].signal("CONT");
    assert_eq!(&read.unwrap().unwrap().data[..], &value[..]);
    until(&mut ec, |c| c.pool_counters().fragment_repairs > repairs);
    assert_eq!(ec.pool_counters().fragment_repairs, repairs + 1, "{kind:?}");
    assert!((1..=2001).contains(&seconds(direct[holder].ttl(b"ttl-ec").unwrap())));

    // gat of a coded value: every fragment gets the new time, also those of servers the
    // read did not ask (it asks k+1 of k+m).
    ec.set(b"gat-ec", &value, 0, 100).unwrap();
    assert_eq!(
        &ec.gat(b"gat-ec", 5000).unwrap().unwrap().data[..],
        &value[..]
    );
    let holders = homes(&ec, b"gat-ec", 6);
    let lives = |direct: &mut Vec<Client>| -> Vec<u32> {
        holders
            .iter()
            .map(|&s| seconds(direct[s].ttl(b"gat-ec").unwrap()))
            .collect()
    };
    let mut left = lives(&mut direct);
    for _ in 0..500 {
        if left.iter().all(|&l| l > 4000) {
            break;
        }
        let _ = ec.drain(Duration::from_millis(10));
        left = lives(&mut direct);
    }
    assert!(
        left.iter().all(|&l| (4000..=5001).contains(&l)),
        "{kind:?}: {left:?}"
    );
}

#[test]
fn read_repair_writes_copies_that_expire_with_the_value() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        read_repair_keeps_the_expiry_time(kind);
    }
}

fn conditional_ops_keep_copies_equal(kind: Kind) {
    let servers = start(kind, 3);
    let mut c = pool(&servers, replicated(2, WritePolicy::All));
    let same = |c: &Client, key: &[u8], want: Option<&[u8]>| {
        let held = copies(&servers, key);
        for s in homes(c, key, 3) {
            assert_eq!(held[s].as_deref(), want, "{kind:?} copy on {s}");
        }
    };
    assert!(c.add(b"cond", b"1", 0, 0).unwrap());
    same(&c, b"cond", Some(b"1"));
    assert!(
        !c.add(b"cond", b"2", 0, 0).unwrap(),
        "add of an existing key"
    );
    same(&c, b"cond", Some(b"1"));
    assert!(c.replace(b"cond", b"10", 0, 0).unwrap());
    assert!(c.append(b"cond", b"0").unwrap());
    assert!(c.prepend(b"cond", b"1").unwrap());
    same(&c, b"cond", Some(b"1100"));
    assert_eq!(c.incr(b"cond", 5).unwrap(), Some(1105));
    assert_eq!(c.decr(b"cond", 100).unwrap(), Some(1005));
    same(&c, b"cond", Some(b"1005"));
    let v = c.gets(b"cond").unwrap().unwrap();
    assert!(matches!(
        c.cas(b"cond", b"cas", 0, 0, v.cas).unwrap(),
        StoreStatus::Stored { .. }
    ));
    same(&c, b"cond", Some(b"cas"));
    assert_eq!(
        c.cas(b"cond", b"stale", 0, 0, v.cas).unwrap(),
        StoreStatus::Exists
    );
    same(&c, b"cond", Some(b"cas"));
    assert!(!c.replace(b"absent", b"x", 0, 0).unwrap());
    assert_eq!(c.incr(b"absent", 1).unwrap(), None);
    same(&c, b"absent", None);
    assert!(c.touch(b"cond", 1000).unwrap());
    assert!(!c.touch(b"absent", 1000).unwrap());
    let g = c.gat(b"cond", 2000).unwrap().unwrap();
    assert_eq!(&g.data[..], b"cas");
    // A counter that differs on one copy: the copy is deleted, not left disagreeing.
    c.set(b"ctr", b"5", 0, 0).unwrap();
    let h = homes(&c, b"ctr", 3);
    let mut direct = Client::new(servers[h[2]].url().as_str(), Config::default()).unwrap();
    direct.set(b"ctr", b"500", 0, 0).unwrap();
    let r = c.incr(b"ctr", 1);
    assert!(
        matches!(r, Err(Error::NotEnoughCopies { acked: 2, .. })),
        "{kind:?}: {r:?}"
    );
    for _ in 0..50 {
        if direct.get(b"ctr").unwrap().is_none() {
            break;
        }
        let _ = c.get(b"other");
        sleep(Duration::from_millis(10));
    }
    assert_eq!(direct.get(b"ctr").unwrap(), None, "{kind:?}");
    assert_eq!(&c.get(b"ctr").unwrap().unwrap().data[..], b"6");
}

/// Both succeeded, or both failed the same way.
fn same<T, U>(a: &Result<T, Error>, b: &Result<U, Error>) -> bool {
    match (a, b) {
        (Err(a), Err(b)) => std::mem::discriminant(a) == std::mem::discriminant(b),
        (Ok(_), Ok(_)) => true,
        _ => false,
    }
}

/// Requests every server refuses — an `incr` of a value that is not a number, a value
/// over the item size limit, a key the protocol cannot carry — fail in a replicated pool
/// as on one server, with that answer, not as `NotEnoughCopies` ("0 of 3 copies
/// answered, 2 needed: CLIENT_ERROR ..."), and do to the copies what one server does.
fn refusals(kind: Kind) {
    let servers = start(kind, 3);
    let mut plain = pool(&servers, Config::default());
    let coded = Config {
        ec: Some("2+1".parse().unwrap()),
        ..replicated(2, WritePolicy::Quorum)
    };
    let mut pools = [
        pool(&servers, replicated(2, WritePolicy::Quorum)),
        pool(&servers, replicated(2, WritePolicy::All)),
        pool(&servers, coded),
    ];
    pools[1].set(b"word", b"abc", 0, 0).unwrap();
    let too_big = vec![7u8; 3 << 19];
    for (i, r) in pools.iter_mut().enumerate() {
        let (one, many) = (plain.incr(b"word", 1), r.incr(b"word", 1));
        assert!(
            matches!(many, Err(Error::Client(_))),
            "{kind:?} {i}: {many:?}"
        );
        assert!(same(&one, &many), "{kind:?} {i}: {one:?} {many:?}");
        let (one, many) = (plain.decr(b"word", 1), r.decr(b"word", 1));
        assert!(same(&one, &many), "{kind:?} {i}: {one:?} {many:?}");
        let (one, many) = (
            plain.set(b"word", &too_big, 0, 0),
            r.set(b"word", &too_big, 0, 0),
        );
        if i < 2 {
            assert!(
                matches!(many, Err(Error::TooLarge)),
                "{kind:?} {i}: {many:?}"
            );
            assert!(same(&one, &many), "{kind:?} {i}: {one:?} {many:?}");
            // memcached drops the old value of a key whose set is too large; so did
            // every copy.
            assert_eq!(copies(&servers, b"word"), vec![None; 3], "{kind:?} {i}");
        } else {
            // Coded 2+1, each fragment is half the value: it fits.
            assert!(many.is_ok(), "{kind:?} {i}: {many:?}");
        }
        r.set(b"word", b"abc", 0, 0).unwrap();
        let (one, many) = (
            plain.set(b"bad key", b"v", 0, 0),
            r.set(b"bad key", b"v", 0, 0),
        );
        assert!(same(&one, &many), "{kind:?} {i}: {one:?} {many:?}");
        let (one, many) = (plain.get(b"bad key"), r.get(b"bad key"));
        assert_eq!(format!("{one:?}"), format!("{many:?}"), "{kind:?} {i}");
        assert_eq!(
            &r.get(b"word").unwrap().unwrap().data[..],
            b"abc",
            "{kind:?} {i}"
        );
    }
    assert_eq!(
        copies(&servers, b"word"),
        vec![Some(b"abc".to_vec()); 3],
        "{kind:?}"
    );
}

#[test]
fn requests_every_copy_refuses_fail_as_on_one_server() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        refusals(kind);
    }
}

#[test]
fn conditional_operations_keep_the_copies_equal() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        conditional_ops_keep_copies_equal(kind);
    }
}

fn dead_copy(kind: Kind) {
    let mut servers = start(kind, 4);
    let mut c = pool(&servers, replicated(2, WritePolicy::Quorum));
    let key = key_on(&c, 1, "dead:");
    c.set(&key, b"before", 0, 0).unwrap();
    assert!(c.stats(Some("fabric")).iter().all(|(_, r)| r.is_ok()) || kind == Kind::Memcached);
    servers[1].kill();
    // Quorum: two of three copies are enough, and the result says so.
    let mut acked = Vec::new();
    for attempt in 0..3 {
        let r = c.set_acked(&key, format!("after{attempt}").as_bytes(), 0, 0);
        acked.push(r.expect("quorum with one copy down"));
    }
    assert!(
        acked.iter().all(|a| *a
            == Acks {
                acked: 2,
                copies: 3
            }),
        "{acked:?}"
    );
    assert_eq!(&c.get(&key).unwrap().unwrap().data[..], b"after2");
    // All: one dead copy fails the write, and says how many copies took it.
    let mut all = pool(&servers, replicated(2, WritePolicy::All));
    let r = all.set(&key, b"all", 0, 0);
    assert!(
        matches!(
            r,
            Err(Error::NotEnoughCopies {
                acked: 2,
                needed: 3,
                copies: 3,
                ..
            })
        ),
        "{r:?}"
    );
    // One: answered by the first copy, the others finish in the background.
    let mut one = pool(&servers, replicated(2, WritePolicy::One));
    let a = one.set_acked(&key, b"one", 0, 0).unwrap();
    assert_eq!(a.copies, 3);
    assert!(a.acked >= 1);
    // The copies it did not wait for go out as the client progresses (`Client::drain`):
    // over UCX a new connection's first request may still be waiting for its wire-up,
    // and left to itself it would never reach the primary, which the reads below ask
    // first (it held the failed `all` write's value: seen once in CI, over UCX/TCP).
    one.drain(Duration::from_secs(5));
    // A missing key with a copy down is still a miss: two copies missed.
    assert_eq!(c.get(b"dead:never").unwrap(), None);

    // Back, empty: read past its miss, repaired, recognised as a new instance.
    servers[1].restart();
    sleep(Duration::from_millis(400));
    for _ in 0..50 {
        if c.get(&key).unwrap().is_some_and(|v| &v.data[..] == b"one") {
            break;
        }
        sleep(Duration::from_millis(20));
    }
    assert_eq!(&c.get(&key).unwrap().unwrap().data[..], b"one");
    let mut direct = Client::new(servers[1].url().as_str(), Config::default()).unwrap();
    for _ in 0..50 {
        if direct.get(&key).unwrap().is_some() {
            break;
        }
        let _ = c.get(&key);
        sleep(Duration::from_millis(10));
    }
    assert_eq!(&direct.get(&key).unwrap().unwrap().data[..], b"one");
    if kind != Kind::Memcached {
        assert_eq!(c.pool_counters().restarts_detected, 1, "{kind:?}");
    }
}

#[test]
fn a_dead_copy_fails_policy_all_but_not_quorum_and_is_refilled_when_back() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        dead_copy(kind);
    }
}

/// What docs/resilience.md says of a coded pool's small values while m servers are down.
/// Under `quorum` a small value's write needs a majority of its m+1 copies, and a miss is
/// certain once more copies answered it than a write may leave out; so each key's fate
/// follows from how many of its copies are down (`d`): written while m+1-d copies make a
/// majority, a miss while d is below a majority. `one` writes every key (a miss then
/// needs every copy), `replicas` 2m writes and misses every key. Coded values go on.
fn small_values_of_a_coded_pool_with_m_down(kind: Kind, k: usize, m: usize) {
    let mut servers = start(kind, k + m);
    let code = format!("{k}+{m}");
    let coded = |replicas: u8, policy: WritePolicy| Config {
        ec: Some(code.parse().unwrap()),
        ..replicated(replicas, policy)
    };
    let mut quorum = pool(&servers, coded(0, WritePolicy::Quorum));
    let mut one = pool(&servers, coded(0, WritePolicy::One));
    let mut wide = pool(&servers, coded(2 * m as u8, WritePolicy::Quorum));
    let down: Vec<usize> = (k..k + m).collect();
    for &s in &down {
        servers[s].kill();
    }
    let copies = m + 1;
    let majority = copies / 2 + 1;
    let mut seen = std::collections::BTreeMap::<usize, usize>::new();
    for i in 0..60 {
        let key = format!("small:{i}");
        let absent = format!("absent:{i}");
        let d_of = |c: &Client, key: &str| {
            homes(c, key.as_bytes(), copies)
                .iter()
                .filter(|s| down.contains(s))
                .count()
        };
        let d = d_of(&quorum, &key);
        *seen.entry(d).or_default() += 1;
        let r = quorum.set_acked(key.as_bytes(), b"v", 0, 0);
        if copies - d >= majority {
            let a = r.unwrap_or_else(|e| panic!("{code} {key}, {d} copies down: {e}"));
            // Answered once a majority stored it; the others may still be on their way.
            assert!(
                (majority..=copies - d).contains(&(a.acked as usize)),
                "{code} {key}: {a:?}"
            );
        } else {
            assert!(
                matches!(r, Err(Error::NotEnoughCopies { needed, .. }) if needed as usize == majority),
                "{code} {key}, {d} copies down: {r:?}"
            );
        }
        let d_absent = d_of(&quorum, &absent);
        let miss = quorum.get(absent.as_bytes());
        if d_absent < majority {
            assert_eq!(
                miss.unwrap(),
                None,
                "{code} {absent}, {d_absent} copies down"
            );
        } else {
            assert!(
                miss.is_err(),
                "{code} {absent}, {d_absent} copies down: {miss:?}"
            );
        }
        let a = one.set_acked(key.as_bytes(), b"w", 0, 0).expect("one");
        assert!(a.acked >= 1 && a.copies as usize == copies, "{key}: {a:?}");
        let miss = one.get(absent.as_bytes());
        assert_eq!(miss.is_err(), d_absent > 0, "one: {absent}: {miss:?}");
        let a = wide
            .set_acked(key.as_bytes(), b"x", 0, 0)
            .expect("replicas 2m");
        assert_eq!(a.copies as usize, 2 * m + 1, "{key}");
        assert_eq!(
            wide.get(absent.as_bytes()).unwrap(),
            None,
            "replicas 2m: {absent}"
        );
    }
    // Keys with no copy down and keys the quorum refuses both occur in 60.
    assert!(
        seen.contains_key(&0) && seen.range(copies + 1 - majority..).count() > 0,
        "{code}: keys by copies down {seen:?}"
    );
    // A coded value needs k of its k+m fragments: written and read with m servers down.
    let value = big(7, 40_000);
    quorum
        .set(b"coded", &value, 0, 0)
        .expect("coded write, m down");
    assert_eq!(&quorum.get(b"coded").unwrap().unwrap().data[..], &value[..]);
    one.drain(Duration::from_secs(5));
    wide.drain(Duration::from_secs(5));
}

#[test]
fn small_values_of_a_coded_pool_with_m_servers_down_are_refused_as_documented() {
    small_values_of_a_coded_pool_with_m_down(Kind::Memfabricd, 2, 1);
    small_values_of_a_coded_pool_with_m_down(Kind::Memfabricd, 4, 2);
}

fn paused_copy_is_never_read_stale(kind: Kind) {
    let servers = start(kind, 3);
    let config = Config {
        retry_timeout: Duration::from_secs(2),
        ..replicated(2, WritePolicy::Quorum)
    };
    let mut c = pool(&servers, config);
    let key = key_on(&c, 0, "stale:");
    let other = key_on(&c, 0, "other:");
    c.set(&key, b"old", 0, 0).unwrap();
    // The primary stops answering: a request to it times out and it is marked down.
    servers[0].signal("STOP");
    assert!(c.get(&other).is_ok(), "read past the paused copy");
    servers[0].signal("CONT");
    // Written while the primary is marked down: it never sees this write, and really
    // still holds the old value.
    let a = c.set_acked(&key, b"new", 0, 0).unwrap();
    assert_eq!(
        a,
        Acks {
            acked: 2,
            copies: 3
        },
        "{kind:?}"
    );
    for i in 0..3 {
        c.set(format!("more:{i}").as_bytes(), b"x", 0, 0).unwrap();
    }
    let mut direct = Client::new(servers[0].url().as_str(), Config::default()).unwrap();
    assert_eq!(&direct.get(&key).unwrap().unwrap().data[..], b"old");
    assert!(c.pool_counters().hints_recorded >= 1);
    // Once it may be tried again, the primary is read first: never the old value.
    sleep(Duration::from_millis(2100));
    // Reads go on while the hinted delete is on its way; then the primary serves again.
    for i in 0..400 {
        let v = c.get(&key).unwrap().expect("the value");
        assert_eq!(&v.data[..], b"new", "{kind:?}: stale read");
        if c.pool_counters().hinted_deletes >= 1 && i >= 20 {
            break;
        }
        sleep(Duration::from_millis(5));
    }
    assert!(
        c.pool_counters().hinted_deletes >= 1,
        "{:?}",
        c.pool_counters()
    );
    let _ = c.get(&other);
    let held = direct.get(&key).unwrap().map(|v| v.data.to_vec());
    assert!(
        held.is_none() || held.as_deref() == Some(b"new"),
        "{held:?}"
    );
}

#[test]
fn a_copy_that_missed_a_write_is_never_read_stale() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        paused_copy_is_never_read_stale(kind);
    }
}

#[test]
fn a_paused_copy_is_probed_instead_of_connected_and_used_again_once_resumed() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        let servers = start(kind, 3);
        common::paused_copy_is_probed_not_connected(
            &format!("{kind:?}"),
            &servers,
            replicated(2, WritePolicy::Quorum),
        );
    }
}

fn big(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn erasure_coded(kind: Kind) {
    let mut servers = start(kind, 6);
    let config = Config {
        ec: Some("4+2".parse().unwrap()),
        ..replicated(0, WritePolicy::Quorum)
    };
    let mut c = pool(&servers, config.clone());
    // A client remembers which keys it coded and reads them from k+1 servers at once;
    // another client may have changed them meanwhile. (Policy all: a quorum write's last
    // fragments could land after the other client's change, and clients are not ordered.)
    let all = Config {
        write_policy: WritePolicy::All,
        ..config.clone()
    };
    let mut mine = pool(&servers, all.clone());
    let mut other = pool(&servers, all);
    mine.set(b"ec:changes", &big(9, 40_000), 0, 0).unwrap();
    assert_eq!(mine.get(b"ec:changes").unwrap().unwrap().data.len(), 40_000);
    other.set(b"ec:changes", b"small now", 0, 0).unwrap();
    assert_eq!(
        &mine.get(b"ec:changes").unwrap().unwrap().data[..],
        b"small now"
    );
    mine.set(b"ec:changes", &big(8, 40_000), 0, 0).unwrap();
    assert!(other.delete(b"ec:changes").unwrap());
    assert_eq!(copies(&servers, b"ec:changes"), vec![None; 6], "{kind:?}");
    assert_eq!(mine.get(b"ec:changes").unwrap(), None, "{kind:?}");
    let value = big(1, 100_000);
    let a = c.set_acked(b"ec:big", &value, 9, 0).unwrap();
    // Quorum: a majority of the six fragments, at least k = 4; the rest follow.
    assert!(a.acked >= 4 && a.copies == 6, "{kind:?}: {a:?}");
    let got = c.get(b"ec:big").unwrap().unwrap();
    assert!(got.data[..] == value[..]);
    // Every server holds one fragment (the last ones may still be on their way: quorum):
    // a quarter of the value and a header, not a copy.
    for _ in 0..200 {
        if copies(&servers, b"ec:big").iter().all(Option::is_some) {
            break;
        }
        let _ = c.get(b"ec:other");
        sleep(Duration::from_millis(10));
    }
    for (s, held) in copies(&servers, b"ec:big").into_iter().enumerate() {
        let held = held.unwrap_or_else(|| panic!("{kind:?}: no fragment on {s}"));
        assert_eq!(&held[..4], b"MFEC");
        assert!(held.len() < value.len() / 3, "{}", held.len());
    }
    let got = c.get(b"ec:big").unwrap().unwrap();
    assert_eq!((got.data.len(), got.flags), (value.len(), 9));
    assert!(got.data[..] == value[..]);
    // Small values are replicated on m + 1 = 3 servers, not coded.
    let a = c.set_acked(b"ec:small", b"tiny", 0, 0).unwrap();
    assert_eq!(a.copies, 3);
    assert_eq!(&c.get(b"ec:small").unwrap().unwrap().data[..], b"tiny");

    // Two servers down, one of them the primary: both still work, degraded.
    let home = homes(&c, b"ec:big", 6);
    servers[home[0]].kill();
    servers[home[2]].kill();
    let got = c.get(b"ec:big").unwrap().unwrap();
    assert!(got.data[..] == value[..], "{kind:?}: degraded read");
    assert!(c.pool_counters().degraded_reads >= 1);
    let value2 = big(2, 70_000);
    let a = c.set_acked(b"ec:big", &value2, 3, 0).unwrap();
    assert_eq!(
        a,
        Acks {
            acked: 4,
            copies: 6
        },
        "{kind:?}"
    );
    assert!(c.get(b"ec:big").unwrap().unwrap().data[..] == value2[..]);
    // A third server down: a write can no longer be acknowledged, and says so.
    servers[home[4]].kill();
    let r = c.set(b"ec:big", &big(3, 50_000), 0, 0);
    assert!(
        matches!(
            r,
            Err(Error::NotEnoughCopies {
                acked: 3,
                needed: 4,
                ..
            })
        ),
        "{r:?}"
    );
    // Known down now: the next write does not even start (it would tear the value).
    let r = c.set(b"ec:big", &big(4, 50_000), 0, 0);
    assert!(
        matches!(r, Err(Error::NotEnoughCopies { acked: 0, .. })),
        "{r:?}"
    );
    servers[home[4]].restart();
    servers[home[0]].restart();
    servers[home[2]].restart();
    sleep(Duration::from_millis(400));
    // The torn write's three fragments replaced three of the old value's four, and the
    // fourth was deleted as stale: neither write can be read — never a mix of the two,
    // never a wrong value (the write hole, docs/resilience.md). The three restarted
    // servers answer without a fragment, more than a quorum write leaves out: the old
    // value is lost (three of six servers failed, one more than m), and a lost value is
    // a miss, as when every copy of a replicated one is gone.
    let lost_before = c.pool_counters().ec_lost_reads;
    let r = c.get(b"ec:big");
    assert!(matches!(r, Ok(None)), "{kind:?}: {r:?}");
    assert_eq!(c.pool_counters().ec_lost_reads, lost_before + 1, "{kind:?}");
    let value5 = big(5, 90_000);
    c.set(b"ec:big", &value5, 0, 0).unwrap();
    assert!(c.get(b"ec:big").unwrap().unwrap().data[..] == value5[..]);
    // Deleted everywhere.
    assert!(c.delete(b"ec:big").unwrap());
    assert_eq!(c.get(b"ec:big").unwrap(), None);
}

/// Pools over the same servers with different codes, or none: each reads the value the
/// newest write stored, whole, whatever code that write used; never one fragment's bytes.
fn values_of_another_code(kind: Kind) {
    let servers = start(kind, 6);
    let coded = |g: &str| Config {
        ec: Some(g.parse().unwrap()),
        ..replicated(0, WritePolicy::All)
    };
    let mut four = pool(&servers, coded("4+2"));
    let mut three = pool(&servers, coded("3+2"));
    let mut copied = pool(&servers, replicated(2, WritePolicy::All));
    let mut plain = pool(&servers, Config::default());
    let key = b"ec:recoded";
    let (v1, v2, v3) = (big(11, 40_000), big(12, 70_001), big(13, 100_000));

    four.set(key, &v1, 5, 0).unwrap();
    for (name, c) in [("3+2", &mut three), ("replicas 2", &mut copied)] {
        let got = c.get(key).unwrap().unwrap();
        assert!(
            got.data[..] == v1[..],
            "{kind:?}: {name} read of a 4+2 value"
        );
        assert_eq!(got.flags, 5, "{kind:?}: {name}");
    }
    // A pool with neither reads one server, which holds a fragment: its get reads the
    // value whole with the fragment's code; a non-blocking read says what it met; a pool
    // asked for raw fragments gives the fragment, which names its code.
    let got = plain.get(key).unwrap().unwrap();
    assert!(got.data[..] == v1[..], "{kind:?}: plain get");
    assert_eq!(got.flags, 5, "{kind:?}");
    let h = plain.iget(key);
    let r = plain.wait(h, Duration::from_secs(2));
    assert!(
        matches!(r, Err(Error::CodedValue { k: 4, m: 2, .. })),
        "{kind:?}: {r:?}"
    );
    let many = plain.get_multi(&[key.as_slice(), b"ec:absent"]).unwrap();
    assert_eq!(many.len(), 1, "{kind:?}");
    assert!(
        many[&key[..]].data[..] == v1[..],
        "{kind:?}: plain get_multi"
    );
    let mut raw_pool = pool(&servers, raw());
    let held = raw_pool.get(key).unwrap().unwrap();
    assert_eq!(
        memfabric_client::EcGeometry::of_fragment(&held.data),
        Some("4+2".parse().unwrap()),
        "{kind:?}"
    );
    // One server of the six: the value cannot be read whole, and the error says why.
    let mut lone = Client::new(servers[0].url().as_str(), Config::default()).unwrap();
    let r = lone.get(key);
    assert!(
        matches!(&r, Err(Error::CodedValue { k: 4, m: 2, cause }) if cause.contains("spread over 6")),
        "{kind:?}: {r:?}"
    );

    // Written again with 3+2: five servers get its fragments, the sixth keeps 4+2's
    // last one. The 4+2 pool knows the key as coded by itself and reads its fragments
    // straight away; it must find the newer write and read it with its code.
    three.set(key, &v2, 6, 0).unwrap();
    for (name, c) in [("4+2", &mut four), ("replicas 2", &mut copied)] {
        let got = c.get(key).unwrap().unwrap();
        assert!(
            got.data[..] == v2[..],
            "{kind:?}: {name} read of a 3+2 rewrite"
        );
    }
    // And back: the 3+2 pool, which remembers the key as its own, reads the 4+2 write.
    four.set(key, &v3, 7, 0).unwrap();
    let got = three.get(key).unwrap().unwrap();
    assert!(
        got.data[..] == v3[..],
        "{kind:?}: 3+2 read of a 4+2 rewrite"
    );
    assert_eq!(got.flags, 7);
    // Deleted by the wider code's pool (a delete reaches the servers of the deleting
    // pool's code: docs/resilience.md): gone for everyone.
    assert!(four.delete(key).unwrap());
    assert_eq!(three.get(key).unwrap(), None, "{kind:?}");
    assert_eq!(copied.get(key).unwrap(), None, "{kind:?}");
    // Deleted by the narrower code's pool: the sixth server keeps the 4+2 write's last
    // fragment, which alone cannot be the value. The 4+2 pool, which reads its own keys'
    // fragments straight away, finds it and reads a miss, not an error.
    four.set(key, &v1, 5, 0).unwrap();
    assert!(three.delete(key).unwrap());
    let held = copies(&servers, key);
    assert_eq!(held.iter().flatten().count(), 1, "{kind:?}: {held:?}");
    let lost_before = four.pool_counters().ec_lost_reads;
    assert_eq!(four.get(key).unwrap(), None, "{kind:?}");
    assert_eq!(
        four.pool_counters().ec_lost_reads,
        lost_before + 1,
        "{kind:?}"
    );
    assert_eq!(copied.get(key).unwrap(), None, "{kind:?}");
}

/// A coded value with fewer than k fragments left, read by a pool whose servers all
/// answer: a miss when more of them answered without a fragment than a write leaves out
/// (the value lost fragments: evicted, deleted, on a server that restarted empty); an
/// error when they hold fragments of two writes (writers racing), never a mix.
fn coded_values_that_lost_fragments(kind: Kind) {
    let mut servers = start(kind, 6);
    let config = Config {
        ec: Some("4+2".parse().unwrap()),
        ..replicated(0, WritePolicy::Quorum)
    };
    let mut c = pool(&servers, config);
    // A pool that knows no key as coded: its read starts at the primary.
    let fresh = |servers: &[Server], c: &Client| pool(servers, c.config().clone());
    let key = b"ec:lost";
    let home = homes(&c, key, 6);
    let one = |servers: &[Server], s: usize| {
        Client::new(servers[home[s]].url().as_str(), Config::default()).unwrap()
    };
    // A quorum write returns with k fragments stored; the rest land after it.
    let set = |c: &mut Client, value: &[u8], flags: u32| {
        c.set(key, value, flags, 0).unwrap();
        let _ = c.drain(Duration::from_secs(2));
    };

    // Fragments of two writes, three of each, every server answering: neither can be
    // rebuilt and none is missing, so the read fails (and keeps failing) rather than
    // guess a miss, as writers racing each other leave it (docs/resilience.md).
    let (v1, v2) = (big(21, 50_000), big(22, 60_000));
    set(&mut c, &v1, 1);
    let first = copies(&servers, key);
    set(&mut c, &v2, 2);
    for (s, &srv) in home.iter().enumerate().take(3) {
        let frag = first[srv].as_ref().unwrap();
        one(&servers, s).set(key, frag, 1, 0).unwrap();
    }
    let mut reader = fresh(&servers, &c);
    for reader in [&mut c, &mut reader] {
        let r = reader.get(key);
        assert!(
            matches!(r, Err(Error::NotEnoughCopies { .. })),
            "{kind:?}: {r:?}"
        );
    }

    // Written again, then three fragments gone (as an LRU evicts them, server by server):
    // the three left cannot be the value, and more servers miss than a quorum write
    // leaves out (2). A miss, for the pool that reads the fragments straight away and
    // for one that starts at the primary.
    set(&mut c, &v1, 1);
    for s in [0, 2, 5] {
        assert!(one(&servers, s).delete(key).unwrap());
    }
    let lost_before = c.pool_counters().ec_lost_reads;
    assert_eq!(c.get(key).unwrap(), None, "{kind:?}");
    assert_eq!(c.pool_counters().ec_lost_reads, lost_before + 1, "{kind:?}");
    let mut reader = fresh(&servers, &c);
    assert_eq!(reader.get(key).unwrap(), None, "{kind:?}");
    assert_eq!(reader.pool_counters().ec_lost_reads, 1, "{kind:?}");

    // Two gone (m): still the value, rebuilt.
    set(&mut c, &v2, 2);
    for s in [1, 3] {
        assert!(one(&servers, s).delete(key).unwrap());
    }
    let got = fresh(&servers, &c).get(key).unwrap().unwrap();
    assert!(got.data[..] == v2[..], "{kind:?}");

    // The first two gone and the third server paused: a pool that starts at the primary
    // finds two misses among the m + 1 servers a plain value would be on, and one that
    // does not answer. The other fragment servers are asked before that is a miss: the
    // three fragments there and the one paused are the value (it used to read as a miss,
    // found by trying).
    set(&mut c, &v1, 1);
    for s in [0, 1] {
        assert!(one(&servers, s).delete(key).unwrap());
    }
    servers[home[2]].signal("STOP");
    let r = fresh(&servers, &c).get(key);
    servers[home[2]].signal("CONT");
    assert!(
        matches!(
            r,
            Err(Error::NotEnoughCopies {
                acked: 3,
                needed: 4,
                ..
            })
        ),
        "{kind:?}: {r:?}"
    );
    let got = fresh(&servers, &c).get(key).unwrap().unwrap();
    assert!(got.data[..] == v1[..], "{kind:?}");

    // Under `all` one miss is more than a write leaves out, but only when every server
    // answered: with two servers down, one miss and three fragments may be a value whose
    // other fragments are on the servers down. An error, not a miss.
    let mut all = pool(
        &servers,
        Config {
            ec: Some("4+2".parse().unwrap()),
            ..replicated(0, WritePolicy::All)
        },
    );
    all.set(key, &v1, 1, 0).unwrap();
    assert!(one(&servers, 0).delete(key).unwrap());
    servers[home[4]].kill();
    servers[home[5]].kill();
    let r = all.get(key);
    assert!(
        matches!(r, Err(Error::NotEnoughCopies { .. })),
        "{kind:?}: {r:?}"
    );
    // More than m misses: no k fragments can be left, down servers or not.
    for s in [1, 2] {
        assert!(one(&servers, s).delete(key).unwrap());
    }
    assert_eq!(all.get(key).unwrap(), None, "{kind:?}");
}

/// A full cache: six servers of different sizes evict the fragments of a key at
/// different times (each by its own LRU), so many keys keep only some of theirs. Every
/// read of a key whose writes all succeeded is the value, byte-exact, or a miss; never an
/// error (they used to fail until rewritten: `NotEnoughCopies`).
fn a_full_cache_of_coded_values(kind: Kind) {
    let sizes = ["8", "9", "10", "12", "14", "16"];
    let servers: Vec<Server> = sizes
        .iter()
        .map(|m| Server::start(kind, &["-m", m]))
        .collect();
    let config = Config {
        ec: Some("4+2".parse().unwrap()),
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let mut c = pool(&servers, config.clone());
    let keys = 1200usize;
    let len = |i: usize| 40_000 + (i * 7919) % 30_000;
    let mut torn = std::collections::HashSet::new();
    for i in 0..keys {
        let key = format!("full:{i}");
        if c.set(key.as_bytes(), &big(i as u8, len(i)), i as u32, 0)
            .is_err()
        {
            torn.insert(i);
        }
    }
    // A client that knows no key as coded reads through the primaries; this one reads
    // the fragments straight away.
    let mut fresh = pool(&servers, config);
    let (mut hits, mut misses) = (0, 0);
    for reader in [&mut c, &mut fresh] {
        for i in (0..keys).filter(|i| !torn.contains(i)) {
            match reader.get(format!("full:{i}").as_bytes()) {
                Ok(Some(v)) => {
                    assert!(v.data[..] == big(i as u8, len(i))[..], "{kind:?}: key {i}");
                    assert_eq!(v.flags, i as u32, "{kind:?}: key {i}");
                    hits += 1;
                }
                Ok(None) => misses += 1,
                Err(e) => panic!("{kind:?}: key {i}: {e}"),
            }
        }
    }
    let lost = c.pool_counters().ec_lost_reads + fresh.pool_counters().ec_lost_reads;
    eprintln!(
        "{kind:?}: {} writes failed; {hits} hits, {misses} misses, {lost} of them lost values",
        torn.len()
    );
    assert!(
        hits > 0 && misses > 0,
        "{kind:?}: {hits} hits, {misses} misses"
    );
    assert!(lost > 0, "{kind:?}: no key kept only some of its fragments");
}

#[test]
fn a_full_cache_of_coded_values_reads_hits_and_misses_never_errors() {
    for kind in [Kind::Memfabricd, Kind::Memcached] {
        a_full_cache_of_coded_values(kind);
    }
}

#[test]
fn a_coded_value_that_lost_fragments_reads_as_a_miss_and_a_mix_of_writes_as_an_error() {
    for kind in [Kind::Memfabricd, Kind::Memcached] {
        coded_values_that_lost_fragments(kind);
    }
}

#[test]
fn a_pool_reads_values_coded_with_another_code_whole() {
    // Over TCP: the reading logic does not depend on the transport, and six more UCX
    // servers polling beside the other tests' would starve them on two cores.
    for kind in [Kind::Memfabricd, Kind::Memcached] {
        values_of_another_code(kind);
    }
}

#[test]
fn erasure_coded_values_survive_m_servers_down_and_torn_writes_are_never_mixed() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        erasure_coded(kind);
    }
}

/// A pool coding values 4+2 whose writes wait for all six fragments.
fn coded_all() -> Config {
    Config {
        ec: Some("4+2".parse().unwrap()),
        ..replicated(0, WritePolicy::All)
    }
}

/// Writer `w`'s value of round `r`: `len` bytes, each writer's different throughout.
fn racing_value(w: u8, r: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(w.wrapping_add(3))
                .wrapping_add(r as u8)
        })
        .collect();
    v[..4].copy_from_slice(&r.to_le_bytes());
    v[4] = w;
    v
}

/// Two clients code-write one key at the same moment, round after round, with values of
/// one length (so only the data checksum tells their fragments apart when their clocks
/// give both writes one stripe); after each round a third reads it. The read is one of
/// the two values whole, never pieces of both (before fragments carried the data
/// checksum, 15 of 400 rounds here read such a mix). Over TCP, and with memcached, it may
/// also be a miss or an error: each server keeps the fragment that reached it last, so
/// the servers can end up with fewer than k of either write (the write hole,
/// docs/resilience.md; 6-30 of 300 rounds). memfabricd keeps the newer write's
/// fragment (`StoreMode::SetFragment`; over TCP its `ms` flag `K`), so every round reads
/// a value there. With `fresh`, each round's writes are the first of new clients: over
/// TCP they wait for the servers' `stats fabric` answers, and then go with the flag.
fn racing_coded_writers(kind: Kind, rounds: u32, fresh: bool) {
    use std::sync::{Arc, Barrier};
    let servers = start(kind, 6);
    let list: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let list = list.join(",");
    let config = coded_all();
    let len = 40_000;
    let go = Arc::new(Barrier::new(3));
    let done = Arc::new(Barrier::new(3));
    let writers: Vec<_> = (0..2u8)
        .map(|w| {
            let (go, done, list, config) = (go.clone(), done.clone(), list.clone(), config.clone());
            std::thread::spawn(move || {
                let new_client = || Client::new(list.as_str(), config.clone()).unwrap();
                let mut c = new_client();
                // Failures are collected, not unwrapped here: a writer that stopped would
                // leave the others waiting at the barrier for ever.
                let mut failed = Vec::new();
                let mut superseded = 0;
                for r in 0..rounds {
                    if fresh && r > 0 {
                        superseded += c.pool_counters().ec_fragments_superseded;
                        c = new_client();
                    }
                    go.wait();
                    let written = c.set(b"race", &racing_value(w, r, len), 0, 0);
                    done.wait();
                    if let Err(e) = written {
                        failed.push(format!("writer {w}, round {r}: {e}"));
                    }
                }
                superseded += c.pool_counters().ec_fragments_superseded;
                (superseded, failed)
            })
        })
        .collect();
    let mut reader = Client::new(list.as_str(), config).unwrap();
    let (mut whole, mut mixed, mut not_read) = (0, Vec::new(), 0);
    for r in 0..rounds {
        go.wait();
        done.wait();
        match reader.get(b"race") {
            Ok(Some(v)) if (0..2).any(|w| v.data[..] == racing_value(w, r, len)[..]) => whole += 1,
            Ok(Some(_)) => mixed.push(r),
            Ok(None) | Err(_) => not_read += 1,
        }
    }
    let (mut superseded, mut failed) = (0, Vec::new());
    for w in writers {
        let (s, f) = w.join().unwrap();
        superseded += s;
        failed.extend(f);
    }
    assert!(failed.is_empty(), "{kind:?}: writes failed: {failed:?}");
    eprintln!(
        "{kind:?}{}: {whole} whole, {not_read} miss or error, {} mixed, {superseded} fragments \
         superseded",
        if fresh {
            ", new clients each round"
        } else {
            ""
        },
        mixed.len()
    );
    assert!(
        mixed.is_empty(),
        "{kind:?}: rounds {mixed:?} read pieces of two writes"
    );
    assert!(whole > 0, "{kind:?}: no round read a value");
    if kind == Kind::Memcached {
        assert_eq!(
            superseded, 0,
            "{kind:?}: only memfabricd keeps the newer write"
        );
    } else {
        assert_eq!(not_read, 0, "{kind:?}: rounds read neither value");
    }
}

#[test]
fn racing_coded_writers_never_read_as_pieces_of_both() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        racing_coded_writers(kind, 300, false);
    }
}

/// The same race between the very first writes of new clients, round after round: over
/// TCP a pool used to send fragments as plain sets until the server's `stats fabric`
/// answer said it keeps newer writes, so writers racing on new connections (after a
/// restart, every client's) could leave the write hole open for the key. Fragments now
/// wait for that answer.
#[test]
fn racing_first_writes_of_new_coded_clients_keep_the_newer_write() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        racing_coded_writers(kind, 100, true);
    }
}

/// A delete, or a set of a small (replicated) value, issued right after a coded set of
/// the same key on new connections, before the servers' first answers: it must not be
/// undone by the coded set's fragments, which wait for those answers (to know whether
/// the keep-newer flag may go): what is submitted after them waits too, in order.
fn writes_after_a_first_coded_set_keep_their_order(kind: Kind) {
    let servers = start(kind, 6);
    let len = 40_000;
    for round in 0..20u8 {
        let deleted = format!("deleted-{round}");
        let small = format!("small-{round}");
        let mut c = pool(&servers, coded_all());
        let handles = [
            c.iset(deleted.as_bytes(), big(round, len).into(), 0, 0),
            c.submit(memfabric_client::Op::Delete {
                key: deleted.as_bytes().to_vec(),
            }),
            c.iset(small.as_bytes(), big(round, len).into(), 0, 0),
            c.iset(small.as_bytes(), b"small".to_vec().into(), 0, 0),
        ];
        for r in c.wait_all(&handles, Duration::from_secs(10)) {
            assert!(r.is_ok(), "{kind:?}, round {round}: {r:?}");
        }
        let held = copies(&servers, deleted.as_bytes());
        assert!(
            held.iter().all(Option::is_none),
            "{kind:?}, round {round}: the deleted key is back on {} servers",
            held.iter().flatten().count()
        );
        let got = pool(&servers, coded_all())
            .get(small.as_bytes())
            .unwrap()
            .expect("a value");
        assert_eq!(got.data[..], b"small"[..], "{kind:?}, round {round}");
    }
}

#[test]
fn writes_right_after_a_first_coded_set_are_not_undone_by_it() {
    for kind in [Kind::Memfabricd, Kind::Memcached] {
        writes_after_a_first_coded_set_keep_their_order(kind);
    }
}

/// A pool with one request in flight per server: requests held until a new connection's
/// first answer do not count toward it (only that answer sends them, and it may wait to
/// be handled behind the very request being issued). A read of a coded value and a coded
/// write issued together on new connections both complete; before, the write waited out
/// its deadline and failed.
#[test]
fn held_requests_do_not_stall_a_pool_with_one_request_in_flight() {
    let servers = start(Kind::Memfabricd, 6);
    let value = big(1, 40_000);
    pool(&servers, coded_all())
        .set(b"coded", &value, 0, 0)
        .unwrap();
    for round in 0..10u8 {
        let config = Config {
            max_in_flight: 1,
            ..coded_all()
        };
        let mut c = pool(&servers, config);
        let other = format!("other-{round}");
        let handles = [
            c.iget(b"coded"),
            c.iset(other.as_bytes(), big(round, 40_000).into(), 0, 0),
        ];
        let results = c.wait_all(&handles, Duration::from_secs(10));
        match &results[0] {
            Ok(memfabric_client::Reply::Value(Some(v))) => assert!(v.data[..] == value[..]),
            r => panic!("round {round}: the read gave {r:?}"),
        }
        assert!(
            results[1].is_ok(),
            "round {round}: the write gave {:?}",
            results[1]
        );
    }
}

/// The stripe a client whose clock is a minute ahead gives a write (as
/// `Client::next_stripe` makes them: microseconds, shifted).
fn stripe_a_minute_ahead() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (now.as_micros() as u64 + 60_000_000) << 8
}

/// A write made after another by a client whose clock is behind carries the older
/// stripe. Servers that keep the newer write's fragment (memfabricd over UCX) refuse
/// it, and the writer writes it again with a stripe newer than the one kept: the later
/// write is the value, as it is where the last write to arrive wins (TCP, memcached).
/// Without the rewrite, the key kept serving the earlier value.
fn a_later_write_from_a_clock_behind_wins(kind: Kind) {
    let servers = start(kind, 6);
    let config = coded_all();
    let mut writer = pool(&servers, config.clone());
    // The earlier write, by a client whose clock is a minute ahead: its fragments put
    // where a pool puts them.
    let early = big(1, 40_000);
    let ahead = stripe_a_minute_ahead();
    let code = memfabric_client::ec::Code::new(4, 2).unwrap();
    let homes = homes(&writer, b"skew", 6);
    for (i, f) in code.encode(ahead, &early).unwrap().into_iter().enumerate() {
        let mut direct = Client::new(servers[homes[i]].url().as_str(), raw()).unwrap();
        direct.set(b"skew", &f, 0, 0).unwrap();
    }
    assert_eq!(writer.get(b"skew").unwrap().unwrap().data[..], early[..]);
    // The later write, from this client's clock.
    let late = big(2, 40_000);
    writer.set(b"skew", &late, 0, 0).unwrap();
    let counters = writer.pool_counters().clone();
    let mut reader = pool(&servers, config);
    let got = reader.get(b"skew").unwrap().expect("a value");
    assert!(
        got.data[..] == late[..],
        "{kind:?}: the earlier write is still the value"
    );
    if kind == Kind::Memcached {
        assert_eq!(counters.ec_rewrites, 0, "{kind:?}");
    } else {
        assert_eq!(counters.ec_fragments_superseded, 6, "{kind:?}");
        assert_eq!(counters.ec_rewrites, 1, "{kind:?}");
    }
}

#[test]
fn a_later_coded_write_from_a_client_whose_clock_is_behind_is_the_value() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        a_later_write_from_a_clock_behind_wins(kind);
    }
}

/// A newer write left on one server only (its writer, whose clock is ahead, failed after
/// one fragment): a later `quorum` write is acknowledged by the other five before that
/// server refuses it. The writer makes it again in the background, so that all six
/// servers end up holding the later write; before, that server went on holding the lone
/// fragment and refusing every later write there.
fn a_lone_newer_fragment_is_overwritten(kind: Kind) {
    use memfabric_proto::ec_fragment::FragmentHeader;
    let servers = start(kind, 6);
    let config = Config {
        ec: Some("4+2".parse().unwrap()),
        ..replicated(0, WritePolicy::Quorum)
    };
    let mut writer = pool(&servers, config);
    let homes = homes(&writer, b"lone", 6);
    let ahead = stripe_a_minute_ahead();
    let code = memfabric_client::ec::Code::new(4, 2).unwrap();
    let lone = code.encode(ahead, &big(1, 40_000)).unwrap().remove(5);
    let mut direct = Client::new(servers[homes[5]].url().as_str(), raw()).unwrap();
    direct.set(b"lone", &lone, 0, 0).unwrap();
    let late = big(2, 40_000);
    writer.set(b"lone", &late, 0, 0).unwrap();
    let writes = |servers: &[Server]| -> Vec<Option<(u64, u8)>> {
        let held = copies(servers, b"lone");
        homes
            .iter()
            .map(|&i| {
                held[i]
                    .as_ref()
                    .and_then(|v| FragmentHeader::decode(v).ok())
                    .map(|(h, _)| (h.stripe, h.index))
            })
            .collect()
    };
    let mut held = writes(&servers);
    for _ in 0..100 {
        let stripes: std::collections::HashSet<u64> =
            held.iter().flatten().map(|&(s, _)| s).collect();
        if held.iter().all(Option::is_some) && stripes.len() == 1 {
            break;
        }
        let _ = writer.drain(Duration::from_millis(20));
        held = writes(&servers);
    }
    let stripes: std::collections::HashSet<u64> = held.iter().flatten().map(|&(s, _)| s).collect();
    assert!(
        held.iter().all(Option::is_some) && stripes.len() == 1,
        "{kind:?}: the servers hold {held:?}"
    );
    assert!(
        !stripes.contains(&ahead),
        "{kind:?}: the lone fragment's write won"
    );
    for (pos, h) in held.iter().enumerate() {
        assert_eq!(h.map(|(_, i)| usize::from(i)), Some(pos), "{kind:?}");
    }
    let mut reader = pool(&servers, replicated(0, WritePolicy::Quorum));
    assert!(reader.get(b"lone").unwrap().unwrap().data[..] == late[..]);
    if kind != Kind::Memcached {
        assert_eq!(writer.pool_counters().ec_rewrites, 1, "{kind:?}");
    }
}

#[test]
fn a_newer_fragment_left_on_one_server_does_not_refuse_later_writes() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        a_lone_newer_fragment_is_overwritten(kind);
    }
}

/// A fragment damaged where it is stored (an `append` reached it), found on the primary
/// by a reader that does not know the key is coded: the value is read whole from the
/// others, never the damaged bytes as the value (before, they were returned).
fn damaged_primary_fragment(kind: Kind) {
    let servers = start(kind, 6);
    let config = coded_all();
    let mut writer = pool(&servers, config.clone());
    let value = big(3, 40_000);
    writer.set(b"torn", &value, 5, 0).unwrap();
    let primary = homes(&writer, b"torn", 6)[0];
    let mut direct = Client::new(servers[primary].url().as_str(), raw()).unwrap();
    // Damaged in place: its last byte flipped, header intact (memfabricd refuses an
    // append onto a fragment, which damaged it the same way).
    let mut torn = direct.get(b"torn").unwrap().unwrap().data.to_vec();
    *torn.last_mut().unwrap() ^= 0xff;
    direct.set(b"torn", &torn, 5, 0).unwrap();
    for config in [config, replicated(0, WritePolicy::All), Config::default()] {
        let mut fresh = pool(&servers, config.clone());
        let got = fresh
            .get(b"torn")
            .unwrap()
            .expect("the value, read from the others");
        assert_eq!(got.data.len(), value.len(), "{kind:?}, {config:?}");
        assert!(got.data[..] == value[..], "{kind:?}: not the value");
        assert_eq!(got.flags, 5);
    }
}

#[test]
fn a_damaged_fragment_on_the_primary_is_read_past() {
    for kind in [Kind::Memfabricd, Kind::Memcached] {
        damaged_primary_fragment(kind);
    }
}

/// Whether every fragment of `key` the servers hold is intact (header and payload checked).
fn fragments_intact(servers: &[Server], key: &[u8]) -> usize {
    let mut intact = 0;
    for (i, copy) in copies(servers, key).into_iter().enumerate() {
        let Some(bytes) = copy else { continue };
        if memfabric_proto::ec_fragment::code_of(&bytes).is_some() {
            let checked = memfabric_proto::ec_fragment::FragmentHeader::decode(&bytes);
            assert!(
                checked.is_ok(),
                "server {i}: a damaged fragment: {checked:?}"
            );
            intact += 1;
        }
    }
    intact
}

/// `append` and `prepend` in a pool that codes values: a coded value is read, joined and
/// written whole again (no fragment is appended to), with its flags and the expiry time
/// it had left; a plain value gets the operation itself; a missing key is not stored.
fn appends_in_a_coded_pool(kind: Kind) {
    let servers = start(kind, 6);
    let mut c = pool(&servers, coded_all());
    let value = big(7, 40_000);
    c.set(b"log", &value, 5, 3600).unwrap();
    assert_eq!(fragments_intact(&servers, b"log"), 6);
    assert!(c.append(b"log", b"<tail>").unwrap(), "{kind:?}");
    assert!(c.prepend(b"log", b"<head>").unwrap(), "{kind:?}");
    let mut want = b"<head>".to_vec();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"<tail>");
    assert_eq!(
        fragments_intact(&servers, b"log"),
        6,
        "{kind:?}: coded again"
    );
    // Read by pools that know nothing of the key: coded, replicated, plain.
    for config in [
        coded_all(),
        replicated(2, WritePolicy::All),
        Config::default(),
    ] {
        let got = pool(&servers, config.clone()).get(b"log").unwrap();
        let got = got.unwrap_or_else(|| panic!("{kind:?} {config:?}: a miss"));
        assert!(
            got.data[..] == want[..],
            "{kind:?} {config:?}: not the value"
        );
        assert_eq!(got.flags, 5);
    }
    let left = seconds(c.ttl(b"log").unwrap());
    assert!((3000..=3600).contains(&left), "{kind:?}: {left} s left");

    // Many at once, each its own steps, on keys coded and plain.
    let keys: Vec<Vec<u8>> = (0..24).map(|i| format!("many{i}").into_bytes()).collect();
    let start_value = |i: usize| {
        if i.is_multiple_of(2) {
            big(i as u8, 30_000)
        } else {
            vec![b'x'; 100]
        }
    };
    for (i, k) in keys.iter().enumerate() {
        c.set(k, &start_value(i), 0, 0).unwrap();
    }
    let hs: Vec<_> = keys
        .iter()
        .map(|k| {
            c.submit(memfabric_client::Op::Store {
                mode: memfabric_client::StoreMode::Append,
                key: k.clone(),
                value: bytes::Bytes::from_static(b"+1"),
                flags: 0,
                exptime: 0,
                cas: 0,
            })
        })
        .collect();
    for r in c.wait_all(&hs, Duration::from_secs(20)) {
        assert!(
            matches!(
                r,
                Ok(memfabric_client::Reply::Stored(StoreStatus::Stored { .. }))
            ),
            "{kind:?}: {r:?}"
        );
    }
    for (i, k) in keys.iter().enumerate() {
        let mut want = start_value(i);
        want.extend_from_slice(b"+1");
        let got = pool(&servers, coded_all()).get(k).unwrap().unwrap();
        assert!(got.data[..] == want[..], "{kind:?} key {i}");
        if i % 2 == 1 {
            // Plain: every copy was appended to.
            let held: Vec<_> = copies(&servers, k).into_iter().flatten().collect();
            assert_eq!(held.len(), 3, "{kind:?} key {i}");
            assert!(held.iter().all(|h| h[..] == want[..]), "{kind:?} key {i}");
        } else {
            assert_eq!(fragments_intact(&servers, k), 6, "{kind:?} key {i}");
        }
    }
    assert!(
        !c.append(b"never-set", b"x").unwrap(),
        "{kind:?}: a miss is not stored"
    );
    assert!(!c.prepend(b"never-set", b"x").unwrap());
    assert_eq!(c.get(b"never-set").unwrap(), None);
}

/// memfabricd refuses `append` and `prepend` onto a fragment of a coded value (`NOT_STORED`,
/// as for a missing key): a pool without the code sends them as they are, and a prepend
/// pushed the fragment's header from the front, where readers look for it, so that
/// every pool then read the damaged fragment (the prepended bytes, a header and a
/// quarter of the value) as the value.
fn appends_without_the_code(kind: Kind) {
    let servers = start(kind, 6);
    let mut coded = pool(&servers, coded_all());
    let value = big(31, 100_000);
    coded.set(b"pk", &value, 4, 0).unwrap();
    for config in [Config::default(), replicated(2, WritePolicy::All)] {
        let mut c = pool(&servers, config.clone());
        assert!(!c.prepend(b"pk", b"ZZ").unwrap(), "{kind:?} {config:?}");
        assert!(!c.append(b"pk", b"YY").unwrap(), "{kind:?} {config:?}");
    }
    assert_eq!(fragments_intact(&servers, b"pk"), 6, "{kind:?}");
    for config in [
        coded_all(),
        replicated(2, WritePolicy::All),
        Config::default(),
    ] {
        let got = pool(&servers, config.clone()).get(b"pk").unwrap().unwrap();
        assert!(
            got.data[..] == value[..],
            "{kind:?} {config:?}: {} bytes",
            got.data.len()
        );
    }
    // Plain values are appended to as ever.
    let mut plain = pool(&servers, Config::default());
    plain.set(b"log", b"MFEC", 0, 0).unwrap();
    assert!(plain.append(b"log", b"+1").unwrap());
    assert!(plain.prepend(b"log", b"0+").unwrap());
    assert_eq!(&plain.get(b"log").unwrap().unwrap().data[..], b"0+MFEC+1");
}

#[test]
fn memfabricd_keeps_appends_of_pools_without_the_code_off_fragments() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx] {
        appends_without_the_code(kind);
    }
}

#[test]
fn append_and_prepend_to_a_coded_value_write_it_whole_again() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        appends_in_a_coded_pool(kind);
    }
}

/// `gets` of a coded value gives a CAS value a `cas` can use: the leader's fragment's.
/// A `cas` with it stores; one with it after any other write of the key does not.
fn cas_on_coded_values(kind: Kind) {
    let servers = start(kind, 6);
    let mut c = pool(&servers, coded_all());
    let first = big(9, 50_000);
    c.set(b"doc", &first, 2, 0).unwrap();
    let seen = c.gets(b"doc").unwrap().unwrap();
    assert!(seen.data[..] == first[..], "{kind:?}");
    assert_ne!(
        seen.cas, 0,
        "{kind:?}: a coded value's gets gives a usable cas"
    );
    let mut other = pool(&servers, coded_all());
    assert_eq!(
        other.gets(b"doc").unwrap().unwrap().cas,
        seen.cas,
        "{kind:?}"
    );
    let second = big(10, 60_000);
    assert!(
        matches!(
            c.cas(b"doc", &second, 3, 0, seen.cas),
            Ok(StoreStatus::Stored { .. })
        ),
        "{kind:?}"
    );
    assert_eq!(
        other.cas(b"doc", b"late", 0, 0, seen.cas).unwrap(),
        StoreStatus::Exists,
        "{kind:?}: the cas was used"
    );
    for config in [
        coded_all(),
        replicated(2, WritePolicy::All),
        Config::default(),
    ] {
        let got = pool(&servers, config.clone()).get(b"doc").unwrap().unwrap();
        assert!(got.data[..] == second[..], "{kind:?} {config:?}");
        assert_eq!(got.flags, 3);
    }
    // A read-modify-write loop on a value coded again: the first try stores.
    c.set(b"doc", &first, 2, 0).unwrap();
    let seen = other.gets(b"doc").unwrap().unwrap();
    assert!(seen.data[..] == first[..]);
    c.set(b"doc", &second, 2, 0).unwrap();
    assert_eq!(
        other.cas(b"doc", b"stale", 0, 0, seen.cas).unwrap(),
        StoreStatus::Exists,
        "{kind:?}: a write since changes the cas"
    );
    let seen = other.gets(b"doc").unwrap().unwrap();
    assert!(seen.data[..] == second[..]);
    let third = big(11, 20_000);
    assert!(
        matches!(
            other.cas(b"doc", &third, 4, 0, seen.cas),
            Ok(StoreStatus::Stored { .. })
        ),
        "{kind:?}"
    );
    assert!(c.get(b"doc").unwrap().unwrap().data[..] == third[..]);
    // A pool of one server's view (no `ec`) reads the value whole, with the same cas.
    c.set(b"doc", &first, 2, 0).unwrap();
    let plain = pool(&servers, Config::default())
        .gets(b"doc")
        .unwrap()
        .unwrap();
    assert!(plain.data[..] == first[..]);
    assert_eq!(plain.cas, c.gets(b"doc").unwrap().unwrap().cas, "{kind:?}");
}

#[test]
fn gets_of_a_coded_value_gives_a_cas_that_a_cas_can_use() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        cas_on_coded_values(kind);
    }
}

/// Bytes every server holds for `key`, together.
fn bytes_held(servers: &[Server], key: &[u8]) -> usize {
    copies(servers, key).iter().flatten().map(Vec::len).sum()
}

/// `add`, `replace` and `cas` of a value at or above the threshold code it as a `set`
/// does: one fragment per server, the condition decided by the leader's fragment; a
/// condition that fails leaves every server as it was. Before, such a value was stored
/// whole on m + 1 = 3 servers (3x its size, against 1.5x for its fragments at 4+2).
fn conditional_stores_of_big_values(kind: Kind) {
    let mut servers = start(kind, 6);
    let mut c = pool(&servers, coded_all());
    let first = big(21, 80_000);
    assert!(c.add(b"doc", &first, 7, 0).unwrap(), "{kind:?}");
    assert_eq!(
        fragments_intact(&servers, b"doc"),
        6,
        "{kind:?}: add coded it"
    );
    let held = bytes_held(&servers, b"doc");
    assert!(held < first.len() * 16 / 10, "{kind:?}: {held} bytes held");
    let got = c.get(b"doc").unwrap().unwrap();
    assert!(got.data[..] == first[..] && got.flags == 7, "{kind:?}");

    // Conditions that fail change nothing, anywhere.
    let before = copies(&servers, b"doc");
    assert!(!c.add(b"doc", &big(22, 80_000), 0, 0).unwrap(), "{kind:?}");
    assert!(
        copies(&servers, b"doc") == before,
        "{kind:?}: a refused add"
    );
    assert!(!c.replace(b"none", &first, 0, 0).unwrap(), "{kind:?}");
    assert_eq!(copies(&servers, b"none"), vec![None; 6], "{kind:?}");

    let second = big(23, 70_000);
    assert!(c.replace(b"doc", &second, 8, 0).unwrap(), "{kind:?}");
    assert_eq!(
        fragments_intact(&servers, b"doc"),
        6,
        "{kind:?}: replace coded it"
    );
    for config in [
        coded_all(),
        replicated(2, WritePolicy::All),
        Config::default(),
    ] {
        let got = pool(&servers, config.clone()).get(b"doc").unwrap().unwrap();
        assert!(
            got.data[..] == second[..] && got.flags == 8,
            "{kind:?} {config:?}"
        );
    }

    // gets, then cas: coded; the same cas again, or one from before, is refused.
    let seen = c.gets(b"doc").unwrap().unwrap();
    let third = big(24, 90_000);
    assert!(
        matches!(
            c.cas(b"doc", &third, 9, 0, seen.cas),
            Ok(StoreStatus::Stored { .. })
        ),
        "{kind:?}"
    );
    assert_eq!(
        fragments_intact(&servers, b"doc"),
        6,
        "{kind:?}: cas coded it"
    );
    let before = copies(&servers, b"doc");
    assert_eq!(
        c.cas(b"doc", &big(25, 90_000), 0, 0, seen.cas).unwrap(),
        StoreStatus::Exists,
        "{kind:?}"
    );
    assert!(
        copies(&servers, b"doc") == before,
        "{kind:?}: a refused cas"
    );
    assert_eq!(
        c.cas(b"gone", &third, 0, 0, seen.cas).unwrap(),
        StoreStatus::NotFound,
        "{kind:?}"
    );
    assert_eq!(copies(&servers, b"gone"), vec![None; 6], "{kind:?}");
    // A gets/cas loop goes on from the value the cas coded, through another client too.
    let mut other = pool(&servers, coded_all());
    let seen = other.gets(b"doc").unwrap().unwrap();
    assert!(seen.data[..] == third[..] && seen.flags == 9, "{kind:?}");
    let fourth = big(26, 100_000);
    assert!(
        matches!(
            other.cas(b"doc", &fourth, 10, 0, seen.cas),
            Ok(StoreStatus::Stored { .. })
        ),
        "{kind:?}"
    );
    assert!(
        c.get(b"doc").unwrap().unwrap().data[..] == fourth[..],
        "{kind:?}"
    );

    // The leader down: the next of the first m + 1 servers decides; with quorum the
    // write stands on five fragments and reads back whole.
    let quorum = Config {
        ec: Some("4+2".parse().unwrap()),
        ..replicated(0, WritePolicy::Quorum)
    };
    let mut q = pool(&servers, quorum.clone());
    let home = homes(&q, b"doc", 6);
    servers[home[0]].kill();
    let seen = q.gets(b"doc").unwrap().unwrap();
    assert!(seen.data[..] == fourth[..], "{kind:?}");
    let fifth = big(27, 60_000);
    assert!(
        matches!(
            q.cas(b"doc", &fifth, 11, 0, seen.cas),
            Ok(StoreStatus::Stored { .. })
        ),
        "{kind:?}"
    );
    let got = pool(&servers, quorum).get(b"doc").unwrap().unwrap();
    assert!(got.data[..] == fifth[..] && got.flags == 11, "{kind:?}");
    assert!(q.add(b"late", &fifth, 0, 0).unwrap(), "{kind:?}");
    assert!(
        q.get(b"late").unwrap().unwrap().data[..] == fifth[..],
        "{kind:?}"
    );
}

#[test]
fn add_replace_and_cas_of_big_values_code_them() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx, Kind::Memcached] {
        conditional_stores_of_big_values(kind);
    }
}

/// A `set` that reached the leader after a coded `cas` stored there is the value: the
/// `cas`'s other fragments, sent once the leader answered, find the `set`'s newer ones
/// and are not written again over them (found in review: they were, and the
/// acknowledged `set` was lost to the `cas`). memfabricd only: memcached keeps whichever
/// fragment came last (docs/resilience.md).
fn a_set_after_a_coded_cas(kind: Kind) {
    let servers = start(kind, 6);
    let mut a = pool(&servers, coded_all());
    let mut b = pool(&servers, coded_all());
    // Fragments of 5 KB: below the UCX eager limit, so the cas leaves at once.
    let mut stored_first = 0;
    for round in 0..5u8 {
        let first = big(40 + round, 20_000);
        a.set(b"doc", &first, 0, 0).unwrap();
        let seen = a.gets(b"doc").unwrap().unwrap();
        assert!(b.get(b"doc").unwrap().unwrap().data[..] == first[..]);
        // The cas goes to the leader; `a` reads its answer (and sends the other
        // fragments) only when it waits, after `b`'s set is acknowledged everywhere.
        let h = a.submit(memfabric_client::Op::Store {
            mode: memfabric_client::StoreMode::Cas,
            key: b"doc".to_vec(),
            value: bytes::Bytes::from(big(60 + round, 20_000)),
            flags: 1,
            exptime: 0,
            cas: seen.cas,
        });
        // One round without waiting sends it (a zero-time poll, which the leader's
        // answer does not make); the sleep lets the leader take it before `b`'s set.
        assert!(
            a.test(h).is_none(),
            "{kind:?}: answered within a zero-time poll"
        );
        sleep(Duration::from_millis(100));
        let later = big(80 + round, 20_000);
        b.set(b"doc", &later, 2, 0).unwrap();
        match a.wait(h, Duration::from_secs(5)) {
            Ok(memfabric_client::Reply::Stored(StoreStatus::Stored { .. })) => stored_first += 1,
            // The set reached the leader first: nothing to show this round.
            Ok(memfabric_client::Reply::Stored(StoreStatus::Exists)) => {
                eprintln!("{kind:?} round {round}: the set reached the leader first")
            }
            other => panic!("{kind:?} round {round}: {other:?}"),
        }
        a.drain(Duration::from_secs(5));
        for reader in [&mut a, &mut b] {
            let got = reader.get(b"doc").unwrap().unwrap();
            assert!(
                got.data[..] == later[..] && got.flags == 2,
                "{kind:?} round {round}: the set acknowledged last is not the value"
            );
        }
    }
    assert!(
        stored_first > 0,
        "{kind:?}: no round had the cas first at the leader"
    );
}

#[test]
fn a_set_acknowledged_after_a_coded_cas_is_not_undone_by_it() {
    for kind in [Kind::Memfabricd, Kind::MemfabricdUcx] {
        a_set_after_a_coded_cas(kind);
    }
}

/// Each server's TCP (text protocol) port, whatever the kind: `lru_crawler metadump all`
/// there gives every key's expiry time (unix time, -1 = none).
fn expiry_times(server: &Server) -> std::collections::HashMap<Vec<u8>, i64> {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::net::TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"lru_crawler metadump all\r\n").unwrap();
    let mut out = std::collections::HashMap::new();
    for line in BufReader::new(s).split(b'\n') {
        let line = line.unwrap();
        if line.starts_with(b"END") {
            return out;
        }
        match memfabric_proto::metadump::parse_line(&line) {
            Ok(memfabric_proto::metadump::DumpLine::Entry(e)) => {
                out.insert(e.key, e.exp.map_or(-1, |t| t as i64));
            }
            other => panic!("{other:?}: {}", String::from_utf8_lossy(&line)),
        }
    }
    panic!("the dump did not end");
}

/// One direct client per server (its own pool of one).
fn direct(servers: &[Server]) -> Vec<Client> {
    servers
        .iter()
        .map(|s| Client::new(s.url().as_str(), raw()).unwrap())
        .collect()
}

/// A server that restarted empty is refilled from the others in the background: every
/// value and every erasure-coded fragment it held comes back byte for byte, with its
/// expiry time, and without a client reading anything. memfabricd's new instance id
/// starts the repair; memcached has none, so there the test asks for it.
fn a_restarted_server_is_refilled_in_the_background(kind: Kind) {
    let mut servers = start(kind, 6);
    let config = Config {
        ec: Some("4+2".parse().unwrap()),
        repair_bandwidth: 4 << 20,
        ..replicated(2, WritePolicy::All)
    };
    let mut c = pool(&servers, config.clone());
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for i in 0..400u32 {
        // Keys a dump must encode: spaces are not possible in the text protocol, but
        // '%', '/', ':' and bytes above 0x7f are.
        let key = format!("rf:{i}/%é:{}", i % 7).into_bytes();
        let ttl = if i % 3 == 0 { 3600 } else { 0 };
        let len = if i % 10 == 0 {
            20_000 + 97 * i as usize
        } else {
            1 + i as usize
        };
        let value: Vec<u8> = (0..len).map(|j| (i as usize * 31 + j) as u8).collect();
        c.set(&key, &value, i, ttl).unwrap();
        keys.push(key);
    }
    let victim = 3;
    let mut one = direct(&servers);
    let before: Vec<(Vec<u8>, memfabric_client::Value)> = keys
        .iter()
        .filter_map(|k| one[victim].get(k).unwrap().map(|v| (k.clone(), v)))
        .collect();
    let coded = before
        .iter()
        .filter(|(_, v)| v.data.starts_with(b"MFEC"))
        .count();
    assert!(
        before.len() > 100 && coded > 5,
        "{} held, {coded} coded",
        before.len()
    );
    let expiry_before = expiry_times(&servers[victim]);
    drop(one);

    // A second client of the same pool, which knows the server's run too: one of the
    // two repairs it, the other leaves it to that one.
    let mut c2 = pool(&servers, config);
    let probe = key_on(&c, victim, "probe");
    c2.set(&probe, b"p", 0, 0).unwrap();
    servers[victim].kill();
    servers[victim].restart();
    assert_eq!(expiry_times(&servers[victim]).len(), 0, "restarted empty");
    // The pools notice the restart when they next talk to the server.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    if kind == Kind::Memcached {
        sleep(Duration::from_millis(400));
        c.repair(victim, false).unwrap();
        c2.repair(victim, false).unwrap();
    } else {
        for c in [&mut c, &mut c2] {
            while c.pool_counters().restarts_detected == 0 {
                assert!(std::time::Instant::now() < deadline, "restart never seen");
                let _ = c.set(&probe, b"p", 0, 0);
                sleep(Duration::from_millis(50));
            }
        }
    }
    while c.repairs_running() + c2.repairs_running() > 0 {
        assert!(std::time::Instant::now() < deadline + Duration::from_secs(40));
        sleep(Duration::from_millis(50));
    }
    let (a, b) = (c.repair_counters(), c2.repair_counters());
    let counted = if a.repairs_finished > 0 { &a } else { &b };
    assert_eq!(
        (a.repairs_started, b.repairs_started),
        (1, 1),
        "{kind:?}: {a:?} {b:?}"
    );
    assert_eq!(
        (
            a.repairs_finished + b.repairs_finished,
            a.repairs_left_to_others + b.repairs_left_to_others,
            a.repair_sources_failed + b.repair_sources_failed
        ),
        (1, 1, 0),
        "{kind:?}: {a:?} {b:?} {:?} {:?}",
        c.repair_problem(),
        c2.repair_problem()
    );
    let mut one = direct(&servers);
    for (key, value) in &before {
        let now = one[victim].get(key).unwrap();
        let now = now
            .unwrap_or_else(|| panic!("{kind:?}: {:?} not refilled", String::from_utf8_lossy(key)));
        assert!(
            now.data == value.data,
            "{kind:?}: {:?} differs",
            String::from_utf8_lossy(key)
        );
        assert_eq!(now.flags, value.flags);
    }
    // What it held, and nothing it should not hold (the probe may have been refilled
    // too: a write that failed on the restarting server still landed on the others).
    assert!(
        counted.repair_copies_written >= before.len() as u64,
        "{counted:?}"
    );
    let expiry_after = expiry_times(&servers[victim]);
    for key in expiry_after.keys() {
        assert!(
            key == &probe
                || key.starts_with(b"memfabric.repair.claim")
                || before.iter().any(|(k, _)| k == key),
            "{kind:?}: {:?} refilled on a server that is not its copy",
            String::from_utf8_lossy(key)
        );
    }
    for (key, _) in &before {
        let (was, is) = (expiry_before[key], expiry_after[key]);
        assert!(
            was == is || (was > 0 && (was - is).abs() <= 2),
            "{was} {is}"
        );
    }
    assert!(expiry_after.values().filter(|&&e| e > 0).count() > 30);
}

#[test]
fn a_restarted_server_is_refilled_in_the_background_memfabricd() {
    a_restarted_server_is_refilled_in_the_background(Kind::Memfabricd);
}

#[test]
fn a_restarted_server_is_refilled_in_the_background_memfabricd_ucx() {
    a_restarted_server_is_refilled_in_the_background(Kind::MemfabricdUcx);
}

#[test]
fn a_restarted_server_is_refilled_in_the_background_memcached() {
    a_restarted_server_is_refilled_in_the_background(Kind::Memcached);
}

/// A coded pool's server replaced by one at another address (the usual way to replace a
/// host): the new list puts the key's fragments at other positions than the old one did,
/// so the new server's position often names a fragment another server already holds.
/// `repair` writes it a fragment no other server holds: every key has its k + m distinct
/// fragments again and survives m more failures (it used to get its position's, a second
/// copy of one, leaving the value one failure from loss while everything said done).
/// Six memfabricd and an RS(4,2) pool over them; `n` keys of 40 KB written, then the
/// first server killed and replaced by a new one at another address (last in the list).
/// Returns the servers, a pool over the new list, the keys and their value.
fn coded_keys_with_a_server_replaced(
    tag: &str,
    n: usize,
    seed: u8,
) -> (Vec<Server>, Client, Vec<Vec<u8>>, Vec<u8>) {
    let mut servers = start(Kind::Memfabricd, 6);
    let config = Config {
        ec: Some("4+2".parse().unwrap()),
        ..replicated(0, WritePolicy::All)
    };
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("{tag}:{i}").into_bytes()).collect();
    let value = big(seed, 40_000);
    {
        let mut c = pool(&servers, config.clone());
        for k in &keys {
            c.set(k, &value, 0, 0).unwrap();
        }
    }
    servers[0].kill();
    servers.remove(0);
    servers.push(Server::start(Kind::Memfabricd, &[]));
    let c = pool(&servers, config);
    (servers, c, keys, value)
}

/// The fragment index of every copy of `key` the servers hold, in server order.
fn fragment_indices(servers: &[Server], key: &[u8]) -> Vec<u8> {
    use memfabric_proto::ec_fragment::FragmentHeader;
    copies(servers, key)
        .iter()
        .flatten()
        .filter_map(|v| FragmentHeader::decode(v).ok().map(|(h, _)| h.index))
        .collect()
}

#[test]
fn a_server_replaced_at_another_address_is_repaired_with_the_fragments_missing() {
    let (mut servers, mut c, keys, value) = coded_keys_with_a_server_replaced("moved", 30, 7);
    let repair = |c: &mut Client| {
        c.repair(5, true).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while c.repairs_running() > 0 {
            assert!(std::time::Instant::now() < deadline, "repair never ended");
            sleep(Duration::from_millis(50));
        }
    };
    // First with one of the others paused: a server not heard from may hold the fragment
    // that looks free, and a second copy written with `add` would stay; such keys are
    // left for a later repair (this one is not finished).
    servers[2].signal("STOP");
    repair(&mut c);
    servers[2].signal("CONT");
    repair(&mut c);
    assert_eq!(
        c.repair_counters().repairs_finished,
        1,
        "{:?}",
        c.repair_problem()
    );
    for k in &keys {
        let indices: std::collections::BTreeSet<u8> =
            fragment_indices(&servers, k).into_iter().collect();
        assert_eq!(
            indices.len(),
            6,
            "{}: {indices:?}",
            String::from_utf8_lossy(k)
        );
    }
    // Any two more servers down: every key still reads back.
    servers[1].kill();
    servers[4].kill();
    for k in &keys {
        let got = c.get(k).unwrap().unwrap();
        assert!(got.data[..] == value[..], "{}", String::from_utf8_lossy(k));
    }
}

/// Read repair after the server list changed (a server replaced by one at another
/// address): positions then no longer say which fragment a server holds, so a read that
/// heard only k + 1 servers cannot tell which fragment the new server lacks. It must not
/// guess: a second copy of a fragment another server holds, written with `add`, would stay
/// for good and leave the key a failure closer to loss than it looks. A read that repairs
/// first hears every server of the key.
#[test]
fn read_repair_after_a_server_is_replaced_at_another_address_writes_no_second_copies() {
    let (servers, mut c, keys, value) = coded_keys_with_a_server_replaced("reread", 40, 9);
    // The repairs run in the background: further operations drive them, until the
    // counts stay put for a while (past the timeout of a paused server's requests).
    let settle = |c: &mut Client| {
        let mut last = (None, 0);
        for _ in 0..1000 {
            let _ = c.get(b"other");
            sleep(Duration::from_millis(10));
            let p = c.pool_counters();
            let now = Some((p.fragment_repairs, p.read_repairs_skipped));
            last = if now == last.0 {
                (now, last.1 + 1)
            } else {
                (now, 0)
            };
            if last.1 >= 300 {
                break;
            }
        }
    };
    // First with another server paused: a read that cannot hear every server, and finds
    // a fragment away from its position, leaves the repair to `memfabric repair`.
    let (paused, later) = keys.split_at(10);
    servers[1].signal("STOP");
    for k in paused {
        let got = c
            .get(k)
            .unwrap()
            .expect("read with one server replaced, one paused");
        assert!(got.data[..] == value[..], "{}", String::from_utf8_lossy(k));
    }
    settle(&mut c);
    servers[1].signal("CONT");
    let skipped = c.pool_counters().read_repairs_skipped;
    for k in later {
        let got = c.get(k).unwrap().expect("read with one server replaced");
        assert!(got.data[..] == value[..], "{}", String::from_utf8_lossy(k));
    }
    settle(&mut c);
    // Those keys span all six servers. A read that asked the new server met its miss and
    // repairs once it has heard the paused one, or, once that one's request timed out,
    // leaves the repair. Which of them do, and how many decoded from four fragments before
    // asking the new server, depends on the machine's timing: only reported.
    eprintln!("repairs left while a server was paused: {skipped}");
    assert!(
        c.pool_counters().fragment_repairs > 0,
        "no read repaired anything"
    );
    let mut whole = 0;
    for k in &keys {
        let mut indices = fragment_indices(&servers, k);
        indices.sort_unstable();
        let held = indices.len();
        indices.dedup();
        assert_eq!(
            held,
            indices.len(),
            "{}: a fragment twice: {indices:?} of {held}",
            String::from_utf8_lossy(k)
        );
        whole += usize::from(held == 6);
    }
    // Keys whose new server was among those a read asked got their fragment back.
    assert!(whole > 0, "no key was repaired whole");
}
