//! Consistent hashing exactly as libmemcached places keys, so a mixed fleet of libmemcached
//! clients (pylibmc, PHP memcached, memcslap, ...) and memfabric clients agree on every key.
//!
//! libmemcached's `update_continuum` (libmemcached/hosts.cc) builds the ring:
//!
//! * every server gets points named `"<host>:<port>-<n>"`, or `"<host>-<n>"` when the port is
//!   11211 (the default port is left out of the name), `n` counting from 0;
//! * **weighted ketama** (`MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED`, `MEMCACHED_DISTRIBUTION_CONSISTENT_WEIGHTED`):
//!   a server gets `floor(weight/total * 160/4 * servers) * 4` points (single-precision float
//!   arithmetic, as in C); each name is hashed once with MD5 and gives 4 points, the 4
//!   little-endian 32-bit words of the digest. Keys are hashed with MD5 (first word);
//! * **plain ketama** (`MEMCACHED_BEHAVIOR_KETAMA`, `MEMCACHED_DISTRIBUTION_CONSISTENT_KETAMA`):
//!   100 points per server whatever its weight, one per name, hashed with the client's hash
//!   function, which also hashes keys. libmemcached's default function is Bob Jenkins'
//!   one-at-a-time (`hash: default`); `hash: md5` is the usual companion of ketama.
//!
//! Points are sorted by (value, server index). A key goes to the first point whose value is
//! `>=` the key's hash, wrapping to the first point past the end.

use md5::{Digest, Md5};

use crate::addr::DEFAULT_PORT;

/// libmemcached's `MEMCACHED_POINTS_PER_SERVER` (plain ketama).
pub const POINTS_PER_SERVER: u32 = 100;
/// libmemcached's `MEMCACHED_POINTS_PER_SERVER_KETAMA` (weighted ketama).
pub const POINTS_PER_SERVER_KETAMA: u32 = 160;

/// The hash function of plain ketama (libmemcached's `MEMCACHED_BEHAVIOR_HASH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHash {
    /// `MEMCACHED_HASH_MD5`: the first little-endian 32-bit word of the MD5 digest.
    Md5,
    /// `MEMCACHED_HASH_DEFAULT`: one-at-a-time over the bytes as C `char` (signed).
    OneAtATime,
}

/// How keys are spread over the servers of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Distribution {
    /// libmemcached's weighted ketama (MD5, 160 points per server scaled by weight).
    #[default]
    KetamaWeighted,
    /// libmemcached's plain ketama (100 points per server, weights ignored).
    Ketama(KeyHash),
}

/// The MD5 digest of `data`.
pub fn md5(data: &[u8]) -> [u8; 16] {
    Md5::digest(data).into()
}

/// Word `i` (0..4) of `data`'s MD5 digest, little-endian (libmemcached's `ketama_server_hash`).
fn md5_word(digest: &[u8; 16], i: usize) -> u32 {
    u32::from_le_bytes([
        digest[i * 4],
        digest[i * 4 + 1],
        digest[i * 4 + 2],
        digest[i * 4 + 3],
    ])
}

/// libhashkit's one-at-a-time hash. It reads the key through a `const char *`, and `char` is
/// signed on the platforms libmemcached runs on, so bytes >= 0x80 are sign-extended.
pub fn one_at_a_time(key: &[u8]) -> u32 {
    let mut value: u32 = 0;
    for &b in key {
        value = value.wrapping_add(b as i8 as i32 as u32);
        value = value.wrapping_add(value << 10);
        value ^= value >> 6;
    }
    value = value.wrapping_add(value << 3);
    value ^= value >> 11;
    value = value.wrapping_add(value << 15);
    value
}

impl KeyHash {
    pub fn hash(self, key: &[u8]) -> u32 {
        match self {
            KeyHash::Md5 => md5_word(&md5(key), 0),
            KeyHash::OneAtATime => one_at_a_time(key),
        }
    }
}

/// One server as the ring sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub host: String,
    pub port: u16,
    pub weight: u32,
}

/// The ring: sorted `(point, server index)` pairs.
#[derive(Debug, Clone)]
pub struct Continuum {
    points: Vec<(u32, usize)>,
    hash: KeyHash,
    servers: usize,
    /// Per server, a hash of its name (`host:port`): orders the servers without points
    /// for a key whatever the list's order (`successors`).
    name_hashes: Vec<u32>,
}

/// The name libmemcached hashes for point group `n` of a server.
pub fn point_name(host: &str, port: u16, n: u32) -> String {
    if port == DEFAULT_PORT {
        format!("{host}-{n}")
    } else {
        format!("{host}:{port}-{n}")
    }
}

/// Points a server gets under weighted ketama (libmemcached computes this in `float`).
pub fn weighted_points(weight: u32, total_weight: u64, servers: usize) -> u32 {
    let pct = weight as f32 / total_weight as f32;
    let per = (pct * POINTS_PER_SERVER_KETAMA as f32 / 4.0 * servers as f32 + 0.000_000_000_1_f32)
        .floor();
    (per as u32) * 4
}

impl Continuum {
    pub fn new(nodes: &[Node], distribution: Distribution) -> Continuum {
        let mut points = Vec::new();
        let hash = match distribution {
            Distribution::KetamaWeighted => {
                let total: u64 = nodes.iter().map(|n| n.weight as u64).sum();
                for (index, node) in nodes.iter().enumerate() {
                    let count = weighted_points(node.weight, total, nodes.len());
                    for n in 0..count / 4 {
                        let digest = md5(point_name(&node.host, node.port, n).as_bytes());
                        for word in 0..4 {
                            points.push((md5_word(&digest, word), index));
                        }
                    }
                }
                KeyHash::Md5
            }
            Distribution::Ketama(hash) => {
                for (index, node) in nodes.iter().enumerate() {
                    for n in 0..POINTS_PER_SERVER {
                        points.push((
                            hash.hash(point_name(&node.host, node.port, n).as_bytes()),
                            index,
                        ));
                    }
                }
                hash
            }
        };
        points.sort_unstable();
        let name_hashes = nodes
            .iter()
            .map(|n| md5_word(&md5(format!("{}:{}", n.host, n.port).as_bytes()), 0))
            .collect();
        Continuum {
            points,
            hash,
            servers: nodes.len(),
            name_hashes,
        }
    }

    /// The key's position on the ring (libmemcached hashes nothing when there is one server).
    pub fn key_hash(&self, key: &[u8]) -> u32 {
        if self.servers == 1 {
            0
        } else {
            self.hash.hash(key)
        }
    }

    /// Index of the first point at or after `hash`, wrapping around.
    fn first_point(&self, hash: u32) -> usize {
        let i = self.points.partition_point(|&(v, _)| v < hash);
        if i == self.points.len() {
            0
        } else {
            i
        }
    }

    /// The server libmemcached would send `key` to; `None` if the ring is empty.
    pub fn locate(&self, key: &[u8]) -> Option<usize> {
        // One server owns the whole ring: no need to hash (MD5 costs more than a shared
        // memory round trip).
        if let Some(&(_, only)) = self.points.first() {
            if self.servers == 1 {
                return Some(only);
            }
        }
        self.locate_live(key, |_| true)
    }

    /// Like [`Continuum::locate`], but walks the ring past points whose server `live` rejects
    /// (failover to the next live server on the ring).
    pub fn locate_live(&self, key: &[u8], live: impl Fn(usize) -> bool) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let start = self.first_point(self.key_hash(key));
        let n = self.points.len();
        (0..n)
            .map(|i| self.points[(start + i) % n].1)
            .find(|&s| live(s))
    }

    /// The first `n` distinct servers met walking the ring from `key`'s position (all of
    /// them if the ring has fewer): where a key and its replicas (or the fragments of an
    /// erasure-coded value) go. The first is [`Continuum::locate`]'s server. Because the
    /// walk follows the ring, a server joining or leaving changes a key's list only by
    /// that server (the others keep their order) wherever the other servers' points stay
    /// put: always on the unweighted ring, and on the weighted one while the weights are
    /// equal (weighted ketama rescales every server's share of points when the total
    /// changes unevenly). A server whose weight is too small a share of the total for
    /// weighted ketama to give it any point (under 1/(40 x servers); libmemcached sends it
    /// no key) still holds copies: when the ring's points name fewer than `n` servers,
    /// those without points follow, so a pool of `r + 1` (or `k + m`) servers always puts
    /// a key's copies (or fragments) on that many distinct servers. They follow in an
    /// order of their own per key (highest random weight: a hash of the key's position
    /// and the server's name), never in list order: two clients that list the same
    /// servers in different orders must agree where a key's copies are, or one reads an
    /// old copy the other's writes and deletes never reached.
    pub fn successors(&self, key: &[u8], n: usize) -> Vec<usize> {
        let want = n.min(self.servers);
        let mut out = Vec::with_capacity(want);
        if want == 0 || self.points.is_empty() {
            return out;
        }
        let start = self.first_point(self.key_hash(key));
        let len = self.points.len();
        for i in 0..len {
            let s = self.points[(start + i) % len].1;
            if !out.contains(&s) {
                out.push(s);
                if out.len() == want {
                    return out;
                }
            }
        }
        let position = self.key_hash(key);
        let mut rest: Vec<(u64, usize)> = (0..self.servers)
            .filter(|s| !out.contains(s))
            .map(|s| (mix(position, self.name_hashes[s]), s))
            .collect();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        out.extend(rest.iter().map(|&(_, s)| s).take(want - out.len()));
        out
    }

    /// All points, sorted (for tests and diagnostics).
    pub fn points(&self) -> &[(u32, usize)] {
        &self.points
    }
}

/// A well-spread 64-bit score of key position `key` and server name hash `name`
/// (splitmix64's finaliser over both).
fn mix(key: u32, name: u32) -> u64 {
    let mut z = (u64::from(key) << 32 | u64::from(name)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: u16, weight: u32) -> Node {
        Node {
            host: host.into(),
            port,
            weight,
        }
    }

    /// Vectors printed by a C program against Debian's libmemcached 1.1.4
    /// (`memcached_generate_hash` after `memcached_server_add_with_weight` of
    /// 10.0.1.1:11211, 10.0.1.2:11212, cache3:11213; keys "key0".."key23", then "\xc3\xa9t\xe9").
    fn libmemcached_vector(distribution: Distribution, weights: [u32; 3], expect: [usize; 25]) {
        let nodes = [
            node("10.0.1.1", 11211, weights[0]),
            node("10.0.1.2", 11212, weights[1]),
            node("cache3", 11213, weights[2]),
        ];
        let ring = Continuum::new(&nodes, distribution);
        let mut got: Vec<usize> = (0..24)
            .map(|i| ring.locate(format!("key{i}").as_bytes()).unwrap())
            .collect();
        got.push(ring.locate(b"\xc3\xa9t\xe9").unwrap());
        assert_eq!(got, expect);
    }

    #[test]
    fn weighted_ketama_matches_libmemcached() {
        libmemcached_vector(
            Distribution::KetamaWeighted,
            [1, 3, 1],
            [
                1, 2, 1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1,
            ],
        );
    }

    #[test]
    fn ketama_md5_matches_libmemcached() {
        libmemcached_vector(
            Distribution::Ketama(KeyHash::Md5),
            [1, 1, 1],
            [
                2, 2, 0, 0, 1, 2, 1, 1, 0, 2, 1, 1, 2, 2, 1, 0, 1, 1, 2, 2, 0, 0, 2, 1, 1,
            ],
        );
    }

    #[test]
    fn ketama_default_hash_matches_libmemcached() {
        libmemcached_vector(
            Distribution::Ketama(KeyHash::OneAtATime),
            [1, 1, 1],
            [
                1, 0, 2, 1, 1, 2, 1, 1, 2, 2, 1, 1, 2, 0, 1, 1, 2, 0, 2, 2, 1, 2, 2, 2, 1,
            ],
        );
    }

    #[test]
    fn key_hashes_match_libhashkit() {
        // memcached_generate_hash_value("hello", MD5 / DEFAULT) and DEFAULT of "\xc3\xa9t\xe9".
        assert_eq!(KeyHash::Md5.hash(b"hello"), 708854109);
        assert_eq!(one_at_a_time(b"hello"), 3372029979);
        assert_eq!(one_at_a_time(b"\xc3\xa9t\xe9"), 1117343168);
    }

    #[test]
    fn md5_words_are_little_endian() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e
        let d = md5(b"");
        assert_eq!(md5_word(&d, 0), 0xd98c1dd4);
        assert_eq!(md5_word(&d, 3), 0x7e42f8ec);
        assert_eq!(KeyHash::Md5.hash(b""), 0xd98c1dd4);
    }

    #[test]
    fn one_at_a_time_matches_libhashkit() {
        // Jenkins' one-at-a-time of "a" is 0xca2e9442; libhashkit's is the same for ASCII.
        assert_eq!(one_at_a_time(b"a"), 0xca2e9442);
        assert_eq!(one_at_a_time(b""), 0);
        // Bytes >= 0x80 go through a signed char: 0xff adds 0xffffffff, not 0xff.
        assert_ne!(one_at_a_time(&[0xff]), {
            let mut v: u32 = 0xff;
            v = v.wrapping_add(v << 10);
            v ^= v >> 6;
            v = v.wrapping_add(v << 3);
            v ^= v >> 11;
            v.wrapping_add(v << 15)
        });
    }

    #[test]
    fn point_names_leave_out_the_default_port() {
        assert_eq!(point_name("10.0.0.1", 11211, 0), "10.0.0.1-0");
        assert_eq!(point_name("10.0.0.1", 11212, 7), "10.0.0.1:11212-7");
    }

    #[test]
    fn servers_without_points_still_hold_copies() {
        // 1000:1:1 gives the light servers no point (libmemcached sends them no key), but a
        // key's three copies still go to three distinct servers, the heavy one first.
        let nodes = [node("a", 1, 1000), node("b", 2, 1), node("c", 3, 1)];
        assert_eq!(weighted_points(1, 1002, 3), 0);
        let ring = Continuum::new(&nodes, Distribution::KetamaWeighted);
        let mut second = [0; 3];
        for i in 0..200 {
            let key = format!("k{i}");
            assert_eq!(ring.locate(key.as_bytes()), Some(0));
            let three = ring.successors(key.as_bytes(), 3);
            assert_eq!(three[0], 0);
            let mut sorted = three.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2]);
            assert_eq!(ring.successors(key.as_bytes(), 2), three[..2].to_vec());
            second[three[1]] += 1;
        }
        // The light servers share the second copies: neither takes them all.
        assert!(second[1] > 50 && second[2] > 50, "{second:?}");
        // 100:100:100:100:100:1: the last has no point; six fragments need it.
        let mut six: Vec<Node> = (0..5).map(|i| node("h", 10 + i, 100)).collect();
        six.push(node("h", 20, 1));
        let ring = Continuum::new(&six, Distribution::KetamaWeighted);
        assert!(ring.points().iter().all(|p| p.1 != 5));
        for i in 0..50 {
            let list = ring.successors(format!("key{i}").as_bytes(), 6);
            let mut sorted = list.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4, 5], "{list:?}");
            assert_eq!(list[5], 5, "the server without points last");
        }
    }

    #[test]
    fn servers_without_points_follow_in_an_order_the_list_order_does_not_change() {
        // Two clients listing the same servers in other orders put every copy on the
        // same servers in the same order (the light ones have no point).
        let a = [
            node("a", 1, 100),
            node("b", 2, 100),
            node("c", 3, 1),
            node("d", 4, 1),
        ];
        let b = [a[3].clone(), a[1].clone(), a[2].clone(), a[0].clone()];
        let (ra, rb) = (
            Continuum::new(&a, Distribution::KetamaWeighted),
            Continuum::new(&b, Distribution::KetamaWeighted),
        );
        let mut third = std::collections::HashMap::new();
        for i in 0..300 {
            let key = format!("key:{i}");
            for n in 1..=4 {
                assert_eq!(
                    names(&a, &ra.successors(key.as_bytes(), n)),
                    names(&b, &rb.successors(key.as_bytes(), n)),
                    "{key}, {n} copies"
                );
            }
            *third
                .entry(names(&a, &ra.successors(key.as_bytes(), 3))[2].clone())
                .or_insert(0) += 1;
        }
        assert_eq!(third.len(), 2, "{third:?}");
    }

    #[test]
    fn weighted_points_scale_with_weight() {
        // Equal weights: 160 points each.
        assert_eq!(weighted_points(1, 3, 3), 160);
        // Weights 1,1,2 over 3 servers: 1/4*40*3 = 30 -> 120, 2/4*40*3 = 60 -> 240.
        assert_eq!(weighted_points(1, 4, 3), 120);
        assert_eq!(weighted_points(2, 4, 3), 240);
        // Weights 1,3 over 2 servers: 1/4*40*2 = 20 -> 80; 3/4*80 = 60 -> 240.
        assert_eq!(weighted_points(1, 4, 2), 80);
        assert_eq!(weighted_points(3, 4, 2), 240);
        // 1/3*40*3 in float is 39.999996 or 40.0: libmemcached's float gives 40 -> 160.
        assert_eq!(weighted_points(1, 3, 3), 160);
    }

    #[test]
    fn ring_sizes() {
        let nodes = [node("a", 1, 1), node("b", 2, 1), node("c", 3, 2)];
        let w = Continuum::new(&nodes, Distribution::KetamaWeighted);
        assert_eq!(w.points().len(), 120 + 120 + 240);
        assert!(w.points().windows(2).all(|p| p[0] <= p[1]));
        let k = Continuum::new(&nodes, Distribution::Ketama(KeyHash::Md5));
        assert_eq!(k.points().len(), 300);
    }

    #[test]
    fn weighted_points_come_from_the_named_digest() {
        // Server "127.0.0.1:11212" point group 0 is MD5("127.0.0.1:11212-0"), four words.
        let nodes = [node("127.0.0.1", 11212, 1), node("127.0.0.1", 11213, 1)];
        let ring = Continuum::new(&nodes, Distribution::KetamaWeighted);
        let d = md5(b"127.0.0.1:11212-0");
        for w in 0..4 {
            assert!(ring.points().contains(&(md5_word(&d, w), 0)));
        }
    }

    #[test]
    fn keys_go_to_the_first_point_at_or_after_their_hash() {
        let nodes = [
            node("h1", 11211, 1),
            node("h2", 11211, 1),
            node("h3", 11211, 1),
        ];
        let ring = Continuum::new(&nodes, Distribution::KetamaWeighted);
        for i in 0..500 {
            let key = format!("key{i}");
            let h = KeyHash::Md5.hash(key.as_bytes());
            let expect = ring
                .points()
                .iter()
                .find(|&&(v, _)| v >= h)
                .unwrap_or(&ring.points()[0])
                .1;
            assert_eq!(ring.locate(key.as_bytes()), Some(expect));
        }
    }

    #[test]
    fn hash_past_the_last_point_wraps_to_the_first() {
        let nodes = [node("h1", 11211, 1), node("h2", 11211, 1)];
        let ring = Continuum::new(&nodes, Distribution::KetamaWeighted);
        let last = ring.points().last().unwrap().0;
        assert!(last < u32::MAX);
        assert_eq!(ring.first_point(last + 1), 0);
        assert_eq!(ring.first_point(last), ring.points().len() - 1);
    }

    #[test]
    fn one_server_takes_every_key() {
        let ring = Continuum::new(&[node("only", 1, 5)], Distribution::KetamaWeighted);
        assert_eq!(ring.points().len(), 160);
        assert_eq!(ring.locate(b"anything"), Some(0));
    }

    #[test]
    fn failover_walks_to_the_next_live_server() {
        let nodes = [node("h1", 1, 1), node("h2", 2, 1), node("h3", 3, 1)];
        let ring = Continuum::new(&nodes, Distribution::KetamaWeighted);
        for i in 0..200 {
            let key = format!("k{i}");
            let home = ring.locate(key.as_bytes()).unwrap();
            let other = ring.locate_live(key.as_bytes(), |s| s != home).unwrap();
            assert_ne!(other, home);
            assert_eq!(ring.locate_live(key.as_bytes(), |_| false), None);
        }
    }

    fn names(nodes: &[Node], list: &[usize]) -> Vec<String> {
        list.iter().map(|&i| nodes[i].host.clone()).collect()
    }

    #[test]
    fn successors_are_distinct_and_start_at_the_home_server() {
        let nodes: Vec<Node> = (1..=6).map(|i| node(&format!("h{i}"), i, 1)).collect();
        let ring = Continuum::new(&nodes, Distribution::KetamaWeighted);
        let mut seen = [0usize; 6];
        for i in 0..3000 {
            let key = format!("k{i}");
            let list = ring.successors(key.as_bytes(), 3);
            assert_eq!(list.len(), 3);
            assert_eq!(Some(list[0]), ring.locate(key.as_bytes()));
            let mut sorted = list.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 3, "{list:?}");
            for s in list {
                seen[s] += 1;
            }
            assert_eq!(ring.successors(key.as_bytes(), 10).len(), 6, "at most all");
            assert!(ring.successors(key.as_bytes(), 0).is_empty());
        }
        // Three copies of 3000 keys over six equal servers: about 1500 each.
        for (s, n) in seen.iter().enumerate() {
            assert!((1100..1900).contains(n), "server {s} holds {n} copies");
        }
        let one = Continuum::new(&[node("only", 1, 1)], Distribution::KetamaWeighted);
        assert_eq!(one.successors(b"x", 3), vec![0]);
        let empty = Continuum::new(&[], Distribution::KetamaWeighted);
        assert!(empty.successors(b"x", 3).is_empty());
    }

    #[test]
    fn a_server_leaving_or_joining_changes_replica_lists_only_by_itself() {
        let six: Vec<Node> = (1..=6).map(|i| node(&format!("h{i}"), i, 1)).collect();
        let five: Vec<Node> = six.iter().filter(|n| n.host != "h4").cloned().collect();
        let (a, b) = (
            Continuum::new(&six, Distribution::KetamaWeighted),
            Continuum::new(&five, Distribution::KetamaWeighted),
        );
        let mut changed = 0;
        for i in 0..3000 {
            let key = format!("key:{i}");
            let with = names(&six, &a.successors(key.as_bytes(), 3));
            let without = names(&five, &b.successors(key.as_bytes(), 3));
            if with.iter().any(|h| h == "h4") {
                changed += 1;
                // h4 drops out; the others keep their order, the next server joins last.
                let kept: Vec<&String> = with.iter().filter(|h| *h != "h4").collect();
                assert_eq!(kept, without.iter().take(2).collect::<Vec<_>>(), "{key}");
            } else {
                assert_eq!(with, without, "{key}: h4 was not in its list");
            }
        }
        // h4 held about half of the lists (3 of 6 servers); only those changed.
        assert!((1100..1900).contains(&changed), "{changed}");
    }

    #[test]
    fn adding_a_server_moves_few_keys() {
        let three = [node("h1", 1, 1), node("h2", 2, 1), node("h3", 3, 1)];
        let four = [
            node("h1", 1, 1),
            node("h2", 2, 1),
            node("h3", 3, 1),
            node("h4", 4, 1),
        ];
        let (a, b) = (
            Continuum::new(&three, Distribution::KetamaWeighted),
            Continuum::new(&four, Distribution::KetamaWeighted),
        );
        let moved = (0..4000)
            .filter(|i| {
                let k = format!("key:{i}");
                a.locate(k.as_bytes()) != b.locate(k.as_bytes())
            })
            .count();
        assert!(moved < 1700, "{moved} of 4000 moved");
    }
}
