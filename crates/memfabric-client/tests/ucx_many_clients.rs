//! Many clients in one process, on several threads, each opening fresh UCX connections:
//! every first request is answered.
//!
//! Runs with every transport family at once (`UCX_TLS=posix,cma,tcp,self`, set here for
//! this test's servers and client, whatever CI chose): the endpoints are then TCP (peer
//! failure mode rules shared memory out), and the server's endpoint to a client starts
//! connecting at HELLO. When the client made its own endpoint at once as well, both ends
//! connected at the same time and UCX 1.13 sometimes lost a reply: 9 of these 60 first
//! SETs timed out. The client now waits for the server's READY first.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{Kind, Server};
use memfabric_client::{Client, Config, WritePolicy};

#[test]
fn every_first_request_of_fresh_clients_on_several_threads_is_answered() {
    // Before any UCX context exists in this process, and inherited by the servers.
    std::env::set_var("UCX_TLS", "posix,cma,tcp,self");
    let servers: Vec<Server> = (0..6)
        .map(|_| Server::start(Kind::MemfabricdUcx, &[]))
        .collect();
    let list: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let list = Arc::new(list.join(","));
    let threads = 3;
    let rounds = 20;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let list = Arc::clone(&list);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut failed = Vec::new();
                for r in 0..rounds {
                    // The threads' connections are made at the same moments.
                    barrier.wait();
                    let config = Config {
                        // Every server gets the SET: each one's first request counts.
                        replicas: 5,
                        write_policy: WritePolicy::All,
                        // A hang, not a slow machine: far above any stall.
                        timeout: Duration::from_secs(10),
                        connect_timeout: Duration::from_secs(10),
                        ..Config::default()
                    };
                    let key = format!("t{t}r{r}");
                    // Above the server's eager limit (8 KiB): rendezvous, which lost
                    // its reply most often.
                    let value = vec![b'a' + (r % 26) as u8; 10_000];
                    match Client::new(list.as_str(), config) {
                        Ok(mut c) => {
                            if let Err(e) = c.set(key.as_bytes(), &value, 0, 0) {
                                failed.push(format!("{key}: {e}"));
                            }
                        }
                        Err(e) => failed.push(format!("{key}: client: {e}")),
                    }
                }
                failed
            })
        })
        .collect();
    let failed: Vec<String> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} first SETs failed: {failed:?}",
        failed.len(),
        threads * rounds
    );
    // Every server holds every value, as sent.
    for s in &servers {
        let mut c = Client::new(s.url().as_str(), Config::default()).unwrap();
        for t in 0..threads {
            for r in 0..rounds {
                let v = c.get(format!("t{t}r{r}").as_bytes()).unwrap().unwrap();
                assert_eq!(v.data.len(), 10_000);
                assert!(v.data.iter().all(|&b| b == b'a' + (r % 26) as u8));
            }
        }
    }
}
