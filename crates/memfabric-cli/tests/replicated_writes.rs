//! `memfabric` writes through a replicated pool, as a short-lived process makes them: a
//! copy that missed the write and could not be told to drop its old value before the
//! tool exits is named (exit 3), since nothing else will remember it; every copy lands
//! on a distinct server whatever the weights; and a `repair` that could not list every
//! server says which (exit 2).

#[path = "../../memfabric-client/tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};

use common::{Kind, Server};

fn memfabric(servers: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memfabric"))
        .args(["--servers", servers])
        .args(args)
        .output()
        .unwrap()
}

fn list(servers: &[Server]) -> String {
    servers
        .iter()
        .map(|s| s.addr())
        .collect::<Vec<_>>()
        .join(",")
}

/// What server `s` alone holds under `key` (`None`: a miss).
fn held_by(s: &Server, key: &str) -> Option<Vec<u8>> {
    let got = memfabric(&s.addr(), &["get", key]);
    match got.status.code() {
        Some(0) => Some(got.stdout),
        Some(1) => None,
        _ => panic!("{got:?}"),
    }
}

#[test]
fn a_copy_left_stale_at_exit_is_named_and_the_exit_status_says_so() {
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start(Kind::Memfabricd, &[]))
        .collect();
    let all = list(&servers);
    let pool = ["--replicas", "2", "--timeout", "300"];
    let set = |value: &str| memfabric(&all, &[&pool[..], &["set", "rk", value]].concat());
    let first = set("AAAA");
    assert_eq!(first.status.code(), Some(0), "{first:?}");

    // The key's primary, paused: the quorum write succeeds on the other two, and the
    // paused copy's delete cannot be sent before the tool exits.
    let located = memfabric(&all, &[&pool[..], &["locate", "rk"]].concat());
    let line = String::from_utf8(located.stdout).unwrap();
    let primary_name = line.split_whitespace().nth(1).unwrap().to_string();
    let primary = servers
        .iter()
        .position(|s| s.addr() == primary_name)
        .unwrap();
    servers[primary].signal("STOP");
    let second = set("BBBB");
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(3), "{second:?}");
    assert!(err.contains("acknowledged by 2 of 3 copies"), "{err}");
    assert!(
        err.contains(&format!(
            "warning: {primary_name} could not be sent deletes of 1 key"
        )),
        "{err}"
    );
    servers[primary].signal("CONT");
    // What the warning says: the paused copy still holds the old value.
    assert_eq!(
        held_by(&servers[primary], "rk").as_deref(),
        Some(&b"AAAA"[..])
    );
    // Written again through the pool, with every copy answering: exit 0, no warning.
    let third = set("CCCC");
    assert_eq!(third.status.code(), Some(0), "{third:?}");
    assert!(!String::from_utf8_lossy(&third.stderr).contains("warning"));
    for s in &servers {
        assert_eq!(held_by(s, "rk").as_deref(), Some(&b"CCCC"[..]));
    }
}

#[test]
fn copies_land_on_distinct_servers_whatever_the_weights() {
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start(Kind::Memfabricd, &[]))
        .collect();
    // 1000:1:1: weighted ketama gives the light servers no point on the ring.
    let weighted = format!(
        "{}:1000,{},{}",
        servers[0].addr(),
        servers[1].addr(),
        servers[2].addr()
    );
    let set = memfabric(
        &weighted,
        &["--replicas", "2", "--write-policy", "all", "set", "wk", "v"],
    );
    assert_eq!(set.status.code(), Some(0), "{set:?}");
    let err = String::from_utf8_lossy(&set.stderr);
    assert!(err.contains("acknowledged by 3 of 3 copies"), "{err}");
    for s in &servers {
        assert_eq!(held_by(s, "wk").as_deref(), Some(&b"v"[..]));
    }
}

/// `repair` says what kept it from finishing and exits 2: the other servers it lists
/// keys from not answering, so many that some key may have had no other copy listed
/// (not marked done then: the next repair runs in full), or the server being repaired
/// itself paused. One server of three not answering under `--replicas 2` leaves every
/// key listed by the third: done, with the silent one named.
#[test]
fn a_repair_that_cannot_list_every_server_says_which_and_is_not_marked_done() {
    let mut servers: Vec<Server> = (0..3)
        .map(|_| Server::start(Kind::Memfabricd, &[]))
        .collect();
    let all = list(&servers);
    let pool = ["--replicas", "2", "--timeout", "300"];
    let keys: Vec<String> = (0..10).map(|i| format!("rp{i}")).collect();
    for k in &keys {
        let out = memfabric(&all, &[&pool[..], &["set", k, k]].concat());
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    servers[0].kill();
    servers[0].restart();
    let names: Vec<String> = servers.iter().map(Server::addr).collect();
    let repair = |extra: &[&str]| {
        let out = memfabric(&all, &[&pool[..], &["repair", &names[0]], extra].concat());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let silent = |i: usize| format!("{} did not answer: its keys were not listed", names[i]);
    let refilled = |servers: &[Server]| {
        for k in &keys {
            assert_eq!(
                held_by(&servers[0], k).as_deref(),
                Some(k.as_bytes()),
                "{k}"
            );
        }
    };

    servers[1].signal("STOP");
    servers[2].signal("STOP");
    let (code, err) = repair(&[]);
    servers[1].signal("CONT");
    servers[2].signal("CONT");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&silent(1)) && err.contains(&silent(2)),
        "{err}"
    );
    // Not marked done: the next repair, without --force, runs and finishes.
    let (code, err) = repair(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("did not answer"), "{err}");
    refilled(&servers);

    servers[0].kill();
    servers[0].restart();
    servers[1].signal("STOP");
    let (code, err) = repair(&["--force"]);
    servers[1].signal("CONT");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains(&silent(1)), "{err}");
    refilled(&servers);

    servers[0].signal("STOP");
    let (code, err) = repair(&["--force"]);
    servers[0].signal("CONT");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}, the server being repaired, did not answer",
            names[0]
        )),
        "{err}"
    );
}

/// `locate` names the servers the pool writes to, and `--ec` over fewer servers than a
/// coded value needs says that values are kept whole (it listed every server, as if the
/// value were spread over them).
#[test]
fn locate_names_where_the_pool_puts_values_and_a_code_too_wide_is_named() {
    let four = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4";
    let out = memfabric(four, &["--ec", "4+2", "locate", "k"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(line.split_whitespace().count(), 1 + 3, "{line}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "--ec 4+2 spreads a value over 6 servers; over 4, every value is kept whole on 3"
        ),
        "{err}"
    );
    let six = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5,127.0.0.1:6";
    let out = memfabric(six, &["--ec", "4+2", "locate", "k"]);
    assert!(out.stderr.is_empty(), "{out:?}");
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(line.split_whitespace().count(), 1 + 6, "{line}");
}
