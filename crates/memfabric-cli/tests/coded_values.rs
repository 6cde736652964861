//! `memfabric get` of an erasure-coded value by a command line that was not told the
//! code: the value whole, or an error that says what the key holds; never the bytes of
//! one fragment on standard output as if they were the value.

#[path = "../../memfabric-client/tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::{Kind, Server};

fn memfabric(servers: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memfabric"))
        .args(["--servers", servers])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn get_without_the_code_prints_the_whole_value_or_says_why_not() {
    let servers: Vec<Server> = (0..6)
        .map(|_| Server::start(Kind::Memfabricd, &[]))
        .collect();
    let list = servers
        .iter()
        .map(|s| s.url())
        .collect::<Vec<_>>()
        .join(",");
    let value: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let set = memfabric(&list, &["--ec", "4+2", "set", "photo", "-"], &value);
    assert!(set.status.success(), "{set:?}");

    for args in [
        &["get", "photo"][..],
        &["--ec", "3+2", "get", "photo"],
        &["--replicas", "1", "get", "photo"],
    ] {
        let got = memfabric(&list, args, b"");
        assert!(got.status.success(), "{args:?}: {got:?}");
        assert_eq!(got.stdout.len(), value.len(), "{args:?}");
        assert!(got.stdout == value, "{args:?}: not the value");
    }

    // One server of the six holds one fragment (every one of them does: the CLI waits
    // for the last fragments before it exits): not enough to rebuild, and it says so.
    let one = memfabric(&servers[0].url(), &["get", "photo"], b"");
    let err = String::from_utf8_lossy(&one.stderr);
    assert_eq!(one.status.code(), Some(2), "{one:?}");
    assert!(one.stdout.is_empty(), "printed {} bytes", one.stdout.len());
    assert!(err.contains("fragment of a value coded RS(4,2)"), "{err}");
    let coded = memfabric(&servers[0].url(), &["--ec", "4+2", "get", "photo"], b"");
    assert_eq!(coded.status.code(), Some(2), "{coded:?}");
    assert!(
        coded.stdout.is_empty(),
        "printed {} bytes",
        coded.stdout.len()
    );
}
