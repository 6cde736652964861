//! Transport tiers (docs/scaling.md): memfabricd serves at most `--hot-clients` sessions on
//! its hot UCX worker (shared memory here) and the rest on its cold one (TCP here), and
//! moves sessions between them by their request rate. Every request made across moves is
//! checked: none fails, none is answered wrongly; the server's counters say where each
//! session is. `--max-clients` refuses the session after the last with a clear error.
//!
//! The tiers are this test's own choice (`--ucx-hot-tls`, `--ucx-cold-tls`), and the
//! client can reach both: its UCX_TLS is set before its first UCX context, whatever the
//! stage of CI runs it (this file is its own test binary).

mod common;

use std::sync::Once;
use std::time::{Duration, Instant};

use common::{Kind, Server};
use memfabric_client::{Client, Config, Error};

/// The server's tiers (shared memory hot, TCP cold), quick promotion.
const TIERS: &[&str] = &[
    "--ucx-hot-tls",
    "posix,cma,self",
    "--ucx-cold-tls",
    "tcp",
    "--hot-clients",
    "2",
    "--promote-rate",
    "50",
];

fn client_reaches_both_tiers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var("UCX_TLS", "posix,cma,tcp,self"));
}

fn client(server: &Server) -> Client {
    client_reaches_both_tiers();
    Client::new(server.url().as_str(), Config::default()).unwrap()
}

fn stat(server: &Server, name: &str) -> u64 {
    let mut c = Client::new(server.addr().as_str(), Config::default()).unwrap();
    let stats = c.stats(Some("fabric")).remove(0).1.unwrap();
    stats
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or_else(|| panic!("no {name} in stats fabric"))
}

fn moves(c: &Client) -> u64 {
    c.transport_counters()
        .iter()
        .find(|(k, _)| k == "ucx_moves")
        .map_or(0, |(_, v)| *v)
}

/// A SET then a GET of a value made from `key` and `n` (sizes from 10 B to 300 KB, so
/// eager and rendezvous on both tiers), checked byte for byte.
fn round_trip(c: &mut Client, key: &[u8], n: usize) {
    let len = [10, 1000, 9000, 300_000][n % 4];
    let value: Vec<u8> = (0..len).map(|i| (i + n) as u8).collect();
    c.set(key, &value, n as u32, 0).unwrap_or_else(|e| {
        panic!(
            "set #{n} of {len} bytes: {e} ({:?})",
            c.transport_counters()
        )
    });
    let got = c
        .get(key)
        .unwrap_or_else(|e| panic!("get #{n}: {e}"))
        .unwrap_or_else(|| panic!("get #{n}: miss"));
    assert_eq!(got.flags, n as u32, "#{n}");
    assert!(got.data[..] == value[..], "#{n}: wrong value");
}

#[test]
fn sessions_beyond_the_hot_cap_are_served_cold() {
    let server = Server::start(Kind::MemfabricdUcx, TIERS);
    let mut clients: Vec<Client> = (0..5).map(|_| client(&server)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        for n in 0..8 {
            round_trip(c, format!("cap-{i}").as_bytes(), n);
        }
    }
    assert_eq!(stat(&server, "ucx_tiers"), 2);
    assert_eq!(stat(&server, "ucx_hot_sessions"), 2);
    assert_eq!(stat(&server, "ucx_cold_sessions"), 3);
    assert_eq!(stat(&server, "ucx_tier_fallbacks"), 0);
    assert!(stat(&server, "ucx_session_bytes") > 0);
    drop(clients);
    // Sessions end with their clients; their places are given back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(&server, "ucx_curr_sessions") > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stat(&server, "ucx_curr_sessions"), 0);
    assert_eq!(stat(&server, "ucx_hot_sessions"), 0);
    assert_eq!(stat(&server, "ucx_cold_sessions"), 0);
    assert_eq!(stat(&server, "ucx_session_bytes"), 0);
}

/// A cold client that stays busy is promoted; the hot tier being full, the quieter hot
/// session makes room (demoted: it arrives on the cold tier when it next talks). Every
/// request of every client is answered right throughout.
#[test]
fn a_busy_cold_client_is_promoted_and_a_quiet_hot_one_makes_room() {
    let server = Server::start(Kind::MemfabricdUcx, TIERS);
    let mut hot: Vec<Client> = (0..2).map(|_| client(&server)).collect();
    for (i, c) in hot.iter_mut().enumerate() {
        round_trip(c, format!("quiet-{i}").as_bytes(), 0);
    }
    let mut busy = client(&server);
    round_trip(&mut busy, b"busy", 0);
    assert_eq!(stat(&server, "ucx_cold_sessions"), 1);
    // Busy (far above 50 requests a second) until moved, for at most 20 s or 200k
    // requests: the move itself is the server's decision, not a timing we assert.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    while moves(&busy) == 0 && Instant::now() < deadline && n < 200_000 {
        round_trip(&mut busy, b"busy", n);
        n += 1;
    }
    assert_eq!(
        moves(&busy),
        1,
        "not promoted after {n} requests: promotions {} refused {} hot {} cold {}",
        stat(&server, "ucx_promotions"),
        stat(&server, "ucx_moves_refused"),
        stat(&server, "ucx_hot_sessions"),
        stat(&server, "ucx_cold_sessions")
    );
    // And it keeps working where it went.
    for m in n..n + 50 {
        round_trip(&mut busy, b"busy", m);
    }
    assert_eq!(stat(&server, "ucx_promotions"), 1);
    assert_eq!(stat(&server, "ucx_hot_sessions"), 2);
    assert_eq!(stat(&server, "ucx_cold_sessions"), 1);
    // The demoted session moves when its client next talks: once its client has the
    // server's endpoint on the cold tier (its READY, which can take a while on a loaded
    // machine) and every request sent on the old one is answered. Both quiet clients talk
    // until one has moved (for at most 20 s or 2,000 rounds: the move is theirs to
    // finish, not a timing we assert), every request answered right throughout.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut m = 1;
    while (m < 6 || hot.iter().map(moves).sum::<u64>() == 0)
        && Instant::now() < deadline
        && m < 2_000
    {
        for (i, c) in hot.iter_mut().enumerate() {
            round_trip(c, format!("quiet-{i}").as_bytes(), m);
        }
        m += 1;
    }
    // One more request each: the server has read the moved client's arrival before it.
    for (i, c) in hot.iter_mut().enumerate() {
        round_trip(c, format!("quiet-{i}").as_bytes(), m);
    }
    assert_eq!(stat(&server, "ucx_demotions"), 1, "after {m} rounds");
    assert_eq!(
        hot.iter().map(moves).sum::<u64>(),
        1,
        "exactly one quiet client was moved"
    );
    assert_eq!(stat(&server, "ucx_moves_refused"), 0);
}

/// Clients take turns at being busy while all of them keep talking: sessions move both
/// ways, many times, while each client checks every reply it gets (pipelined batches
/// too). None fails.
#[test]
fn churn_between_tiers_loses_no_request() {
    let server = Server::start(
        Kind::MemfabricdUcx,
        &[TIERS, &["--hot-clients", "1", "--hot-idle", "1"]].concat(),
    );
    let mut clients: Vec<Client> = (0..3).map(|_| client(&server)).collect();
    let mut n = 0usize;
    let rounds_end = Instant::now() + Duration::from_secs(12);
    let mut round = 0usize;
    while Instant::now() < rounds_end && round < 12 {
        // This round's busy client runs for about a second; the others talk now and then.
        let turn = round % clients.len();
        let until = Instant::now() + Duration::from_millis(1000);
        let mut i = 0usize;
        let mut others_at = Instant::now();
        while Instant::now() < until && i < 100_000 {
            round_trip(&mut clients[turn], format!("churn-{turn}").as_bytes(), n);
            // The others stay connected and quiet: a request now and then.
            if Instant::now() >= others_at {
                others_at += Duration::from_millis(300);
                for (j, c) in clients.iter_mut().enumerate() {
                    if j != turn {
                        round_trip(c, format!("churn-{j}").as_bytes(), n);
                    }
                }
            }
            if i.is_multiple_of(500) {
                // A pipelined batch: several requests in flight when a move comes.
                let c = &mut clients[turn];
                let keys: Vec<Vec<u8>> = (0..16)
                    .map(|k| format!("batch-{turn}-{k}").into_bytes())
                    .collect();
                for k in &keys {
                    c.set(k, k, 0, 0).unwrap();
                }
                let got = c
                    .get_multi(&keys.iter().map(|k| &k[..]).collect::<Vec<_>>())
                    .unwrap();
                assert_eq!(got.len(), keys.len());
                for (k, v) in got {
                    assert_eq!(k, v.data[..], "batch");
                }
            }
            i += 1;
            n += 1;
        }
        round += 1;
    }
    let moved: u64 = clients.iter().map(moves).sum();
    let (promotions, demotions) = (
        stat(&server, "ucx_promotions"),
        stat(&server, "ucx_demotions"),
    );
    assert!(
        promotions >= 2,
        "promotions {promotions}, demotions {demotions}, moves {moved}, refused {}, hot {}, cold {}, rounds {round}, requests {n}",
        stat(&server, "ucx_moves_refused"),
        stat(&server, "ucx_hot_sessions"),
        stat(&server, "ucx_cold_sessions")
    );
    assert!(demotions >= 1, "demotions {demotions}");
    assert!(stat(&server, "ucx_hot_sessions") <= 1);
    assert_eq!(stat(&server, "ucx_moves_refused"), 0);
}

#[test]
fn the_session_past_max_clients_is_refused_clearly() {
    let server = Server::start(
        Kind::MemfabricdUcx,
        &[TIERS, &["--max-clients", "3"]].concat(),
    );
    let mut three: Vec<Client> = (0..3).map(|_| client(&server)).collect();
    for (i, c) in three.iter_mut().enumerate() {
        round_trip(c, format!("max-{i}").as_bytes(), i);
    }
    let mut fourth = client(&server);
    let e = fourth.get(b"max-0").unwrap_err();
    assert!(
        matches!(&e, Error::Io { msg, .. } if msg.contains("--max-clients")),
        "{e:?}"
    );
    assert!(stat(&server, "ucx_sessions_refused") >= 1);
    // A place frees up when a client leaves.
    drop(three.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(&server, "ucx_curr_sessions") > 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut fifth = client(&server);
    round_trip(&mut fifth, b"max-5", 5);
}

/// Thousands of HELLOs at once, a part of them from clients that die mid-connect: every
/// live client gets its session (the listener queues, never drops), and what the dead
/// ones held is given back (no session, no connection left of them).
#[test]
fn a_connect_storm_is_queued_and_half_connected_clients_cost_nothing() {
    use memfabric_client::transport::{GetMode, Transport};
    use memfabric_client::ucx::UcxTransport;
    use memfabric_client::ServerAddr;
    use std::io::Write;
    client_reaches_both_tiers();
    let server = Server::start(
        Kind::MemfabricdUcx,
        &[TIERS, &["-c", "4096", "--ucx-hello-timeout", "1"]].concat(),
    );
    const THREADS: usize = 8;
    const EACH: usize = 128;
    let url = ServerAddr::parse(&server.url()).unwrap();
    let ucx_port = server.ucx_port.unwrap();
    let start = std::sync::Arc::new(std::sync::Barrier::new(THREADS + 1));
    // The clients stay connected until the main thread has counted their sessions.
    let counted = std::sync::Arc::new(std::sync::Barrier::new(THREADS + 1));
    let (tx, rx) = std::sync::mpsc::channel();
    let mut live = Vec::new();
    for _ in 0..THREADS {
        let (url, start, counted, tx) = (url.clone(), start.clone(), counted.clone(), tx.clone());
        live.push(std::thread::spawn(move || {
            let mut t = UcxTransport::new(GetMode::Auto, false).unwrap();
            start.wait();
            let conns: Vec<_> = (0..EACH)
                .map(|_| t.connect(&url, Duration::from_secs(60)))
                .collect();
            let ok = conns.iter().filter(|c| c.is_ok()).count();
            let first_error = conns
                .into_iter()
                .find_map(|c| c.err().map(|e| e.to_string()));
            tx.send((ok, first_error)).unwrap();
            counted.wait();
            drop(t);
        }));
    }
    // Beside them, clients that die mid-connect: half a HELLO, or nothing, then gone.
    let dying = std::thread::spawn(move || {
        for i in 0..200 {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", ucx_port)) {
                if i % 2 == 0 {
                    let _ = s.write_all(b"MFAB\x01\x00");
                }
            }
        }
    });
    start.wait();
    let results: Vec<(usize, Option<String>)> = (0..THREADS).map(|_| rx.recv().unwrap()).collect();
    dying.join().unwrap();
    for (ok, first_error) in &results {
        assert_eq!(*ok, EACH, "a connect failed: {first_error:?}");
    }
    assert_eq!(stat(&server, "ucx_curr_sessions"), (THREADS * EACH) as u64);
    assert_eq!(stat(&server, "ucx_sessions_refused"), 0);
    counted.wait();
    for h in live {
        h.join().unwrap();
    }
    // Everything goes back: the live clients' sessions, and the dead ones' connections
    // (closed at once, or by the HELLO deadline).
    let deadline = Instant::now() + Duration::from_secs(20);
    let conns = |server: &Server| {
        let mut c = Client::new(server.addr().as_str(), Config::default()).unwrap();
        let stats = c.stats(None).remove(0).1.unwrap();
        stats
            .iter()
            .find(|(k, _)| k == "curr_connections")
            .map(|(_, v)| v.parse::<u64>().unwrap())
            .unwrap()
    };
    while (stat(&server, "ucx_curr_sessions") > 0 || conns(&server) > 2)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stat(&server, "ucx_curr_sessions"), 0);
    assert!(conns(&server) <= 2, "{} connections left", conns(&server));
    assert_eq!(stat(&server, "ucx_hot_sessions"), 0);
    assert_eq!(stat(&server, "ucx_cold_sessions"), 0);
}
