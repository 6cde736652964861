//! Values of 0 B to 4 MB round-trip unchanged (servers started with `-I 8m -m 256`), over
//! TCP and over UCX (where 8 KB is the default eager limit: values up to it travel inside the
//! message, larger ones by rendezvous).

mod common;

use bytes::Bytes;
use common::{Kind, Server};
use memfabric_client::{Client, Config, Reply};
use std::time::Duration;

const SIZES: [usize; 7] = [0, 1, 8191, 8 << 10, 8193, 1 << 20, 4 << 20];

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn round_trip(kind: Kind) {
    let s = Server::start(kind, &["-I", "8m", "-m", "256"]);
    let mut c = Client::new(
        s.url().as_str(),
        Config {
            timeout: Duration::from_secs(5),
            ..Config::default()
        },
    )
    .unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        let key = format!("v{len}");
        let data = pattern(len, i as u8);
        c.set(key.as_bytes(), &data, len as u32, 0).unwrap();
        let v = c
            .get(key.as_bytes())
            .unwrap()
            .unwrap_or_else(|| panic!("{kind:?}: {len} B missing"));
        assert_eq!(v.data.len(), len, "{kind:?}");
        assert!(v.data[..] == data[..], "{kind:?}: {len} B value differs");
        assert_eq!(v.flags, len as u32);
    }
    // The same sizes pipelined, non-blocking and without copies of the values.
    let values: Vec<Bytes> = SIZES
        .iter()
        .map(|&len| Bytes::from(pattern(len, 7)))
        .collect();
    let sets: Vec<_> = values
        .iter()
        .enumerate()
        .map(|(i, v)| c.iset(format!("nb{i}").as_bytes(), v.clone(), 0, 0))
        .collect();
    for r in c.wait_all(&sets, Duration::from_secs(10)) {
        r.unwrap();
    }
    let gets: Vec<_> = (0..SIZES.len())
        .map(|i| c.iget(format!("nb{i}").as_bytes()))
        .collect();
    for (r, v) in c
        .wait_all(&gets, Duration::from_secs(10))
        .into_iter()
        .zip(&values)
    {
        match r.unwrap() {
            Reply::Value(Some(got)) => {
                assert!(got.data == *v, "{kind:?}: pipelined {} B differs", v.len())
            }
            r => panic!("{kind:?}: {r:?}"),
        }
    }
}

#[test]
fn values_from_0_bytes_to_4_mb_round_trip_memcached() {
    round_trip(Kind::Memcached);
}

#[test]
fn values_from_0_bytes_to_4_mb_round_trip_memfabricd() {
    round_trip(Kind::Memfabricd);
}

#[test]
fn values_from_0_bytes_to_4_mb_round_trip_memfabricd_ucx() {
    round_trip(Kind::MemfabricdUcx);
}
