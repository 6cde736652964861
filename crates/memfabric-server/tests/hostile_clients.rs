//! Heavy and hostile TCP clients against a real `memfabricd`: the server's memory stays
//! bounded relative to `-m`, no valid request is dropped, and every reply arrives whole.
//! Effects are measured (the server's RSS from /proc, items stored, replies counted),
//! never timed; servers run on loopback ports the kernel picks and are killed by a Drop
//! guard (tests/common).
//!
//! The bounds are one mechanism, described in docs/connections.md.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

mod common;
use common::Server;

const BIN: &str = env!("CARGO_BIN_EXE_memfabricd");
const MIB: u64 = 1 << 20;

struct Daemon {
    server: Server,
}

impl Daemon {
    /// A server on a port the kernel picks (see [`Server::spawn_on_own_port`]).
    fn start(extra: &[&str]) -> Daemon {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "-p",
            "-1",
            "-l",
            "127.0.0.1",
            "-U",
            "0",
            "--ucx-port",
            "0",
            "-t",
            "2",
        ])
        .args(extra);
        Daemon {
            server: Server::spawn_on_own_port(&mut cmd),
        }
    }

    fn tcp(&self) -> TcpStream {
        let port = self.server.port;
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| {
            panic!(
                "connect to memfabricd on {port}: {e}; {}",
                self.server.state()
            )
        });
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        s
    }

    /// Resident memory of the server, in bytes.
    fn rss(&self) -> u64 {
        self.server.rss()
    }

    fn alive(&mut self) -> bool {
        matches!(self.server.child.try_wait(), Ok(None))
    }

    fn stat(&self, name: &str) -> u64 {
        self.stat_of("", name)
    }

    /// A value of `stats <group>`.
    fn stat_of(&self, group: &str, name: &str) -> u64 {
        let mut c = self.tcp();
        let cmd = format!("stats {group}\r\n");
        let text = String::from_utf8(request(&mut c, cmd.as_bytes(), b"END\r\n")).expect("utf-8");
        text.lines()
            .find_map(|l| {
                let mut it = l.split(' ');
                match (it.next(), it.next(), it.next()) {
                    (Some("STAT"), Some(k), Some(v)) if k == name => v.trim().parse().ok(),
                    _ => None,
                }
            })
            .unwrap_or_else(|| panic!("no stat {name}"))
    }

    /// Wait (bounded) until `stats <group>` shows `want` for `name` (a dead client's
    /// close is seen by the server a moment after the client closes); returns the last
    /// value seen.
    fn wait_stat_of(&self, group: &str, name: &str, want: u64) -> u64 {
        let mut now = self.stat_of(group, name);
        for _ in 0..100 {
            if now == want {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            now = self.stat_of(group, name);
        }
        now
    }

    /// Wait until the server has stopped doing work for us: `stat` no longer changes
    /// between two looks (a bounded wait for a state, not a timing assertion).
    fn settle(&self, stat: &str) -> u64 {
        let mut last = self.stat(stat);
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(150));
            let now = self.stat(stat);
            if now == last {
                return now;
            }
            last = now;
        }
        last
    }
}

fn read_until(s: &mut impl Read, end: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    while !buf.ends_with(end) {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("read failed: {e}"),
        }
    }
    buf
}

fn request(s: &mut (impl Read + Write), req: &[u8], end: &[u8]) -> Vec<u8> {
    s.write_all(req).expect("write");
    read_until(s, end)
}

fn set(d: &Daemon, key: &str, value: &[u8]) {
    let mut c = d.tcp();
    let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(value);
    req.extend_from_slice(b"\r\n");
    assert_eq!(request(&mut c, &req, b"\r\n"), b"STORED\r\n");
}

/// Read a reply stream to its end, counting `VALUE` blocks without keeping the values.
fn count_values(s: &mut TcpStream, value_len: usize) -> usize {
    let mut r = std::io::BufReader::with_capacity(1 << 20, s);
    let mut values = 0;
    let mut line = Vec::new();
    let mut value = vec![0u8; value_len + 2];
    loop {
        line.clear();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            r.read_exact(&mut byte).expect("reply line");
            line.push(byte[0]);
        }
        if line == b"END\r\n" {
            return values;
        }
        assert!(line.starts_with(b"VALUE "), "unexpected line {line:?}");
        r.read_exact(&mut value).expect("value");
        assert!(value.ends_with(b"\r\n"));
        values += 1;
    }
}

#[test]
fn one_multiget_line_naming_a_large_key_many_times_is_streamed_not_built_whole() {
    let mut d = Daemon::start(&["-m", "64"]);
    let value = vec![b'v'; 500_000];
    set(&d, "big", &value);
    let before = d.rss();
    // ~1 GB of reply from a 10 KB line; the client reads nothing at first.
    const REPEAT: usize = 2000;
    let mut line = b"get".to_vec();
    for _ in 0..REPEAT {
        line.extend_from_slice(b" big");
    }
    line.extend_from_slice(b"\r\n");
    let mut c = d.tcp();
    c.write_all(&line).expect("write");
    d.settle("get_hits");
    let grown = d.rss().saturating_sub(before);
    assert!(d.alive(), "server died");
    assert!(
        grown < 64 * MIB,
        "server grew by {} MiB for one unread multiget",
        grown / MIB
    );
    // What it holds is counted: a few values pinned, the connection paused.
    assert!(d.stat_of("bounds", "pinned_values") > 0);
    assert_eq!(d.stat_of("bounds", "paused_on_output"), 1);
    // And every value arrives once the client reads; then nothing is held.
    assert_eq!(count_values(&mut c, value.len()), REPEAT);
    drop(c);
    assert_eq!(d.wait_stat_of("bounds", "pinned_values", 0), 0);
    assert_eq!(d.stat_of("bounds", "pinned_bytes"), 0);
}

#[test]
fn fifty_clients_that_never_read_big_multigets_cost_less_than_the_cache() {
    let mut d = Daemon::start(&["-m", "64"]);
    let value = vec![b'w'; 500_000];
    for k in 0..4 {
        set(&d, &format!("big{k}"), &value);
    }
    let before = d.rss();
    let mut line = b"get".to_vec();
    for i in 0..100 {
        line.extend_from_slice(format!(" big{}", i % 4).as_bytes());
    }
    line.extend_from_slice(b"\r\n");
    let mut clients = Vec::new();
    for _ in 0..50 {
        let mut c = d.tcp();
        c.write_all(&line).expect("write");
        clients.push(c);
    }
    d.settle("get_hits");
    let grown = d.rss().saturating_sub(before);
    assert!(d.alive(), "server died");
    assert!(
        grown < 64 * MIB,
        "50 idle readers grew the server by {} MiB (-m 64)",
        grown / MIB
    );
    // Other clients are still served.
    assert_eq!(count_values(&mut clients[0], value.len()), 100);
    let mut c = d.tcp();
    assert_eq!(
        request(&mut c, b"version\r\n", b"\r\n"),
        b"VERSION 1.6.18\r\n"
    );
}

/// Write `burst` in one go from a thread while this thread reads replies until `end`.
fn pipelined(d: &Daemon, burst: Vec<u8>, end: &'static [u8]) -> Vec<u8> {
    let mut c = d.tcp();
    let mut w = c.try_clone().expect("clone");
    let writer = std::thread::spawn(move || w.write_all(&burst).expect("burst written whole"));
    let replies = read_until(&mut c, end);
    writer.join().expect("writer");
    replies
}

#[test]
fn a_pipelined_bulk_load_is_stored_whole_not_dropped() {
    let d = Daemon::start(&["-m", "64"]);
    const N: usize = 100_000;
    let mut burst = Vec::new();
    for i in 0..N {
        burst.extend_from_slice(format!("set bulk:{i} 0 0 10\r\n0123456789\r\n").as_bytes());
    }
    burst.extend_from_slice(b"get bulk:0\r\n");
    assert!(burst.len() > 2 * MIB as usize);
    let replies = pipelined(&d, burst, b"END\r\n");
    let stored = replies.windows(8).filter(|w| w == b"STORED\r\n").count();
    assert_eq!(stored, N, "every set answered");
    assert!(replies.ends_with(b"VALUE bulk:0 0 10\r\n0123456789\r\nEND\r\n"));
    assert_eq!(d.stat("curr_items"), N as u64);
}

#[test]
fn a_pipelined_noreply_bulk_load_is_stored_whole_not_dropped() {
    let d = Daemon::start(&["-m", "64"]);
    const N: usize = 150_000;
    let mut burst = Vec::new();
    for i in 0..N {
        burst.extend_from_slice(
            format!("set quiet:{i} 0 0 10 noreply\r\n0123456789\r\n").as_bytes(),
        );
    }
    burst.extend_from_slice(format!("get quiet:{}\r\n", N - 1).as_bytes());
    assert!(burst.len() > 6 * MIB as usize);
    let replies = pipelined(&d, burst, b"END\r\n");
    assert_eq!(
        replies,
        format!("VALUE quiet:{} 0 10\r\n0123456789\r\nEND\r\n", N - 1).as_bytes()
    );
    assert_eq!(d.stat("curr_items"), N as u64);
}

#[test]
fn set_headers_that_never_send_their_data_cost_item_memory_inside_the_limit() {
    let mut d = Daemon::start(&["-m", "64"]);
    let before = d.rss();
    let mut idle = Vec::new();
    for i in 0..300 {
        let mut c = d.tcp();
        // Declares ~1 MB, sends 100 KB of it, then stalls.
        c.write_all(format!("set stall:{i} 0 0 1000000\r\n").as_bytes())
            .expect("header");
        c.write_all(&vec![b's'; 100_000]).expect("partial value");
        idle.push(c);
    }
    d.settle("bytes_read");
    let grown = d.rss().saturating_sub(before);
    assert!(d.alive(), "server died");
    // 300 declared megabytes: what they hold is item memory, inside -m.
    assert!(
        grown < 100 * MIB,
        "300 stalled 1 MB sets grew the server by {} MiB (-m 64)",
        grown / MIB
    );
    // Counted: the values arriving hold item memory, at most one per connection.
    let receiving = d.stat_of("bounds", "receiving_values");
    assert!(
        receiving > 0 && receiving <= 300,
        "{receiving} values arriving"
    );
    assert!(d.stat_of("bounds", "receiving_bytes") <= 64 * MIB);
    // A stalled client that finishes gets its item stored, if it was given item memory
    // when its value began to arrive; one refused it (every item taken by values still
    // arriving: which ones depends on the order the workers read the 300 connections)
    // gets memcached's "out of memory" and nothing stored. Others are unaffected.
    let mut rest = vec![b's'; 900_000];
    rest.extend_from_slice(b"\r\n");
    let mut stored = None;
    for (i, c) in idle.iter_mut().enumerate() {
        let reply = request(c, &rest, b"\r\n");
        if reply == b"STORED\r\n" {
            stored = Some(i);
            break;
        }
        assert_eq!(
            reply, b"SERVER_ERROR out of memory storing object\r\n",
            "stall:{i}"
        );
    }
    let i = stored.expect("no stalled set was stored when it finished");
    let mut c = d.tcp();
    let got = request(&mut c, format!("get stall:{i}\r\n").as_bytes(), b"END\r\n");
    let header = format!("VALUE stall:{i} 0 1000000\r\n");
    assert!(got.starts_with(header.as_bytes()));
    assert_eq!(got.len(), header.len() + 1_000_002 + 5);
    // Clients that die mid-value give their item memory back.
    drop(idle);
    assert_eq!(d.wait_stat_of("bounds", "receiving_values", 0), 0);
    assert_eq!(d.stat_of("bounds", "receiving_bytes"), 0);
}

#[test]
fn one_header_declaring_a_gigabyte_costs_no_gigabyte() {
    let mut d = Daemon::start(&["-m", "2048", "-I", "1024m"]);
    let before = d.rss();
    let mut c = d.tcp();
    c.write_all(b"set huge 0 0 1000000000\r\n").expect("header");
    c.write_all(&[b'h'; 1000]).expect("a little data");
    d.settle("bytes_read");
    let grown = d.rss().saturating_sub(before);
    assert!(d.alive(), "server died");
    assert!(
        grown < 64 * MIB,
        "one 1 GB header grew the server by {} MiB",
        grown / MIB
    );
    let mut other = d.tcp();
    assert_eq!(
        request(&mut other, b"version\r\n", b"\r\n"),
        b"VERSION 1.6.18\r\n"
    );
}

#[test]
fn a_ten_megabyte_get_line_is_answered() {
    let d = Daemon::start(&["-m", "64"]);
    set(&d, "k0000017", b"seventeen");
    set(&d, "k1199999", b"last");
    let mut line = b"get".to_vec();
    for i in 0..1_200_000 {
        line.extend_from_slice(format!(" k{i:07}").as_bytes());
    }
    line.extend_from_slice(b"\r\n");
    assert!(line.len() > 10 * MIB as usize);
    let reply = pipelined(&d, line, b"END\r\n");
    assert_eq!(
        reply,
        b"VALUE k0000017 0 9\r\nseventeen\r\nVALUE k1199999 0 4\r\nlast\r\nEND\r\n"
    );
    assert_eq!(d.stat("cmd_get"), 1_200_000);
}

#[test]
fn a_streamed_get_line_with_a_too_long_key_answers_the_error_and_goes_on() {
    let d = Daemon::start(&["-m", "64"]);
    set(&d, "after", b"ok");
    let mut line = b"get".to_vec();
    for i in 0..20_000 {
        line.extend_from_slice(format!(" miss{i}").as_bytes());
    }
    line.push(b' ');
    line.extend_from_slice(&[b'x'; 300]);
    line.extend_from_slice(b" more keys\r\nget after\r\n");
    let reply = pipelined(&d, line, b"END\r\n");
    assert_eq!(
        reply,
        b"CLIENT_ERROR bad command line format\r\nVALUE after 0 2\r\nok\r\nEND\r\n"
    );
}

#[test]
fn clients_that_half_close_after_their_request_get_the_reply_and_are_closed() {
    // `printf 'version\r\n' | nc -q1 ...`: the request and the FIN often arrive in one
    // readiness event; the server must still see the FIN and close.
    let d = Daemon::start(&["-m", "64"]);
    // One connection reads the count throughout (a fresh one per look would itself be
    // counted, and closing it is seen by the server a moment later).
    let mut watcher = d.tcp();
    // Only the watcher, once the start-up probe's close has been seen.
    let base = 1;
    wait_for_connections(&mut watcher, base);
    for _ in 0..50 {
        let mut c = d.tcp();
        c.write_all(b"version\r\n").expect("write");
        c.shutdown(std::net::Shutdown::Write).expect("half-close");
        let mut all = Vec::new();
        c.read_to_end(&mut all)
            .expect("the server closes after replying");
        assert_eq!(all, b"VERSION 1.6.18\r\n");
    }
    // Every half-closed connection is closed by the server.
    assert_eq!(wait_for_connections(&mut watcher, base), base);
}

/// Wait (bounded) until `curr_connections` is `want`; returns the last value seen.
fn wait_for_connections(watcher: &mut TcpStream, want: u64) -> u64 {
    let mut now = stat_via(watcher, "curr_connections");
    for _ in 0..100 {
        if now == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        now = stat_via(watcher, "curr_connections");
    }
    now
}

fn stat_via(c: &mut TcpStream, name: &str) -> u64 {
    let text = String::from_utf8(request(c, b"stats\r\n", b"END\r\n")).expect("utf-8");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no stat {name}"))
}

/// A value received in place is read on after a short read, up to 1 MiB per turn, and the
/// bytes after it (the next request) are not pulled through the read buffer while it is
/// still arriving. Drive both edges: a value that trickles in a few bytes at a time, and
/// one of 3 MB sent at once; each followed in the same write by a pipelined `get`, whose
/// reply must carry exactly the bytes sent. Nothing is held back, nothing is dropped, and
/// the connection's buffers give back their memory afterwards.
#[test]
fn values_arriving_in_trickles_or_in_one_burst_are_stored_exactly_with_the_request_after_them() {
    let d = Daemon::start(&["-m", "64", "-I", "4m"]);
    let value = |n: usize, seed: u8| -> Vec<u8> {
        (0..n)
            .map(|i| b'a' + ((i as u8).wrapping_mul(7).wrapping_add(seed)) % 26)
            .collect()
    };
    let expect_get = |key: &str, v: &[u8]| -> Vec<u8> {
        let mut e = format!("VALUE {key} 0 {}\r\n", v.len()).into_bytes();
        e.extend_from_slice(v);
        e.extend_from_slice(b"\r\nEND\r\n");
        e
    };

    // 200 KB in pieces of 997 bytes, each its own write, with pauses now and then.
    let slow = value(200_000, 3);
    let mut c = d.tcp();
    c.write_all(format!("set trickle 0 0 {}\r\n", slow.len()).as_bytes())
        .expect("header");
    for (i, piece) in slow.chunks(997).enumerate() {
        c.write_all(piece).expect("piece");
        if i % 20 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    c.write_all(b"\r\nget trickle\r\n")
        .expect("trailer and get");
    let mut want = b"STORED\r\n".to_vec();
    want.extend_from_slice(&expect_get("trickle", &slow));
    assert_eq!(read_until(&mut c, b"END\r\n"), want);

    // 3 MB at once (three value turns of 1 MiB), the get in the same write.
    let big = value(3_000_000, 11);
    let mut burst = format!("set burst 0 0 {}\r\n", big.len()).into_bytes();
    burst.extend_from_slice(&big);
    burst.extend_from_slice(b"\r\nget burst\r\n");
    let mut c2 = d.tcp();
    let writer = {
        let mut w = c2.try_clone().expect("clone");
        std::thread::spawn(move || w.write_all(&burst).expect("burst"))
    };
    let mut want = b"STORED\r\n".to_vec();
    want.extend_from_slice(&expect_get("burst", &big));
    assert_eq!(read_until(&mut c2, b"END\r\n"), want);
    writer.join().expect("writer");

    // Done: no value still counted as arriving, no input held.
    assert_eq!(d.wait_stat_of("bounds", "receiving_values", 0), 0);
    assert_eq!(d.stat_of("bounds", "receiving_bytes"), 0);
    assert!(
        d.stat("read_buf_bytes") < MIB,
        "read buffers grown and kept"
    );
    drop(c);
    drop(c2);
}

/// Clients that die with a reset in the middle of a value: each leaves a reply unread, so
/// closing its socket sends a reset, and the server's next read fails instead of seeing
/// an end of file (the read that fails is now the one done for every ready connection
/// before any runs). Their connections close, the item memory of their values comes
/// back, nothing of the cut values is stored, and the others are served.
#[test]
fn clients_that_reset_mid_value_give_back_what_they_held() {
    let mut d = Daemon::start(&["-m", "64"]);
    set(&d, "k", b"v");
    let mut watcher = d.tcp();
    let base = 1;
    wait_for_connections(&mut watcher, base);
    let mut dying = Vec::new();
    for i in 0..20 {
        let mut c = d.tcp();
        c.write_all(b"get k\r\n").expect("get");
        c.write_all(format!("set reset:{i} 0 0 1000000\r\n").as_bytes())
            .expect("header");
        c.write_all(&vec![b'r'; 200_000]).expect("partial value");
        dying.push(c);
    }
    d.settle("bytes_read");
    assert!(d.stat_of("bounds", "receiving_values") > 0);
    assert_eq!(stat_via(&mut watcher, "curr_connections"), base + 20);
    drop(dying);
    assert_eq!(d.wait_stat_of("bounds", "receiving_values", 0), 0);
    assert_eq!(d.stat_of("bounds", "receiving_bytes"), 0);
    assert_eq!(wait_for_connections(&mut watcher, base), base);
    assert!(d.alive(), "server died");
    let mut c = d.tcp();
    for i in 0..20 {
        let get = format!("get reset:{i}\r\n");
        assert_eq!(request(&mut c, get.as_bytes(), b"END\r\n"), b"END\r\n");
    }
    set(&d, "after", b"fine");
    assert_eq!(
        request(&mut c, b"get after\r\n", b"END\r\n"),
        b"VALUE after 0 4\r\nfine\r\nEND\r\n"
    );
}

#[test]
fn metadumps_nobody_reads_cost_their_output_caps_and_a_read_one_lists_every_item() {
    let mut d = Daemon::start(&["-m", "256"]);
    // Long keys: the dump (~100 MB of lines) is far larger than any output cap.
    const N: usize = 300_000;
    let key = |i: usize| format!("{}{i:08}", "k".repeat(200));
    let mut burst = Vec::new();
    for i in 0..N {
        burst.extend_from_slice(format!("set {} 0 0 1 noreply\r\nv\r\n", key(i)).as_bytes());
    }
    burst.extend_from_slice(b"mn\r\n");
    pipelined(&d, burst, b"MN\r\n");
    assert_eq!(d.stat("curr_items"), N as u64);
    let before = d.rss();
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut c = d.tcp();
        c.write_all(b"lru_crawler metadump all\r\n").expect("write");
        idle.push(c);
    }
    d.settle("bytes_written");
    let grown = d.rss().saturating_sub(before);
    println!("20 unread metadumps: RSS +{} MiB", grown / MIB);
    assert!(d.alive(), "server died");
    assert!(
        grown < 128 * MIB,
        "20 unread metadumps grew the server by {} MiB (a dump is ~100 MB)",
        grown / MIB
    );
    // A client that reads gets every item once, then END, then what it asked after.
    let mut c = d.tcp();
    c.write_all(b"lru_crawler metadump all\r\nversion\r\n")
        .expect("write");
    let dump = read_until(&mut c, b"END\r\nVERSION 1.6.18\r\n");
    let mut keys: Vec<&[u8]> = dump
        .split(|&b| b == b'\n')
        .filter_map(|l| l.strip_prefix(b"key="))
        .map(|l| &l[..l.iter().position(|&b| b == b' ').unwrap_or(l.len())])
        .collect();
    assert_eq!(keys.len(), N, "every item listed");
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), N, "no item listed twice");
    let line = dump.split(|&b| b == b'\n').next().unwrap();
    let line = String::from_utf8_lossy(line);
    assert!(
        line.contains(" exp=-1 la=") && line.contains(" fetch=no cls="),
        "memcached's line format: {line}"
    );
    // The unread ones, read at last, are whole too.
    assert!(read_until(&mut idle[3], b"END\r\n").len() >= dump.len() - 32);
}
