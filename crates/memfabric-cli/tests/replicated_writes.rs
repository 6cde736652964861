//! `memfabric` writes through a replicated pool, as a short-lived process makes them: a
//! copy that missed the write and could not be told to drop its old value before the
//! tool exits is named (exit 3), since nothing else will remember it; and every copy
//! lands on a distinct server whatever the weights.

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
