//! The `memfabric` command line against a real server: what it prints where (moved here
//! from memfabric-client's UCX hostile-client tests with the binary).

#[path = "../../memfabric-client/tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Kind, Server};
use memfabric_client::{Client, Config, GetMode};

fn config() -> Config {
    Config {
        timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(30),
        get_mode: GetMode::TwoSided,
        ..Config::default()
    }
}

/// Read `s` until the server closes it; what it sent. A hang is the failure.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the server kept a bogus bootstrap connection open: {e}"),
        }
    }
}

/// UCX's log never lands on standard output, where the CLI prints values: a failed GET
/// prints nothing there, a hit prints exactly the value, with UCX logging everything it
/// can. And a server on one host logs no UCX `no peer failure handler` ERROR per
/// connection (memfabricd tries that endpoint mode first and expects the refusal), and
/// what bogus HELLOs carry reaches its log escaped.
#[test]
fn ucx_logs_go_to_stderr_and_expected_refusals_and_raw_bytes_stay_out_of_the_log() {
    let log = std::env::temp_dir().join(format!("ucx-hostile-{}.log", std::process::id()));
    let mut server = Server::start_logged(Kind::MemfabricdUcx, &["-vv"], &log);
    let url = server.url();
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_memfabric"))
            .args(["--servers", &url, "--timeout", "30000"])
            .args(args)
            .env("UCX_LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let miss = cli(&["get", "no-such-key"]);
    assert_eq!(miss.status.code(), Some(1));
    assert!(
        miss.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&miss.stdout)
    );
    assert!(
        String::from_utf8_lossy(&miss.stderr).contains("UCX"),
        "UCX said nothing at info level: {:?}",
        String::from_utf8_lossy(&miss.stderr)
    );
    let mut c = Client::new(url.as_str(), config()).unwrap();
    c.set(b"k", b"the value", 0, 0).unwrap();
    let hit = cli(&["get", "k"]);
    assert!(hit.status.success());
    assert_eq!(hit.stdout, b"the value");
    // A HELLO whose address is noise, with terminal escapes and invalid UTF-8 in it.
    let mut frame = b"MFAB\x01\x00\x00\x00".to_vec();
    let address: Vec<u8> = [&b"\x00"[..], &b"\x1b[31m\xff\xfe"[..]]
        .concat()
        .into_iter()
        .chain((0..=255u8).cycle().take(400))
        .collect();
    frame.extend_from_slice(&(address.len() as u32).to_le_bytes());
    frame.extend_from_slice(&address);
    let mut s = TcpStream::connect(("127.0.0.1", server.ucx_port.unwrap())).unwrap();
    s.write_all(&frame).unwrap();
    let _ = read_to_close(&mut s);
    server.kill();
    let text = std::fs::read(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let as_text = String::from_utf8_lossy(&text);
    assert!(
        !as_text.contains("no peer failure handler"),
        "expected refusal logged: {as_text}"
    );
    assert!(!text.contains(&0xff), "raw bytes in the log");
    // The two sessions above and the bogus HELLO were all served or refused.
    assert!(as_text.contains("ucx session"), "{as_text}");
}
