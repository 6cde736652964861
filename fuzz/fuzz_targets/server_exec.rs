#![no_main]
//! The whole executor: arbitrary bytes as one connection's input (ascii, meta or binary,
//! chosen by the first byte as the server does), fed in two pieces split at an arbitrary
//! point, against a real store. It must never panic or loop. The split byte also picks
//! the server: open, with `-Y` (the ascii authentication handshake first) or with `-S`
//! (binary only, SASL PLAIN first).
use libfuzzer_sys::fuzz_target;
use memfabric_server::auth::{AuthFile, SaslPwdb};
use memfabric_server::exec::{process, ExecCtx, Session, Shared, Transport};
use memfabric_server::settings::{ProtocolChoice, Settings};
use memfabric_store::{Store, StoreConfig};
use std::sync::OnceLock;

/// Which server the input runs against.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Guard {
    Open,
    AuthFile,
    Sasl,
}

fn make_shared(guard: Guard) -> Shared {
    let cfg = StoreConfig {
        memory_limit: 4 << 20,
        slab_automove: false,
        background_sweeper: false,
        ..StoreConfig::default()
    };
    let auth = (guard == Guard::AuthFile).then(|| {
        let table = AuthFile::from_text("fuzz", b"alice:secret\nbob:pw2\n").expect("table");
        std::sync::Arc::new(table)
    });
    let sasl = (guard == Guard::Sasl).then(|| {
        let path = std::env::temp_dir().join(format!("memfabric-fuzz-pwdb-{}", std::process::id()));
        std::fs::write(&path, b"alice:secret\nbob:pw2\n").expect("pwdb");
        std::sync::Arc::new(SaslPwdb::open(path.to_str().expect("path")).expect("pwdb"))
    });
    let settings = Settings {
        store: cfg.clone(),
        protocol: if sasl.is_some() {
            ProtocolChoice::Binary
        } else {
            ProtocolChoice::Auto
        },
        auth,
        sasl,
        ..Settings::default()
    };
    Shared::new(settings, Store::new(cfg).expect("store"))
}

fn shared(guard: Guard) -> &'static Shared {
    static OPEN: OnceLock<Shared> = OnceLock::new();
    static AUTH: OnceLock<Shared> = OnceLock::new();
    static SASL: OnceLock<Shared> = OnceLock::new();
    let cell = match guard {
        Guard::Open => &OPEN,
        Guard::AuthFile => &AUTH,
        Guard::Sasl => &SASL,
    };
    cell.get_or_init(|| make_shared(guard))
}

/// One worker's counters for every run (registering a worker per run would grow the
/// server's list of workers without bound).
fn stats() -> &'static memfabric_server::counters::ThreadStats {
    static STATS: OnceLock<std::sync::Arc<memfabric_server::counters::ThreadStats>> =
        OnceLock::new();
    STATS.get_or_init(|| shared(Guard::Open).register_thread())
}

/// Feed `chunks` one after another like a socket would, keeping unconsumed bytes.
fn run(chunks: &[&[u8]], guard: Guard) -> Vec<u8> {
    let shared = shared(guard);
    let stats = stats();
    let mut ctx = ExecCtx {
        shared,
        stats,
        transport: Transport::Tcp,
        conn_id: 1,
        waiter: None,
        completion: None,
    };
    let mut sess = Session::default();
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut queue = memfabric_server::outqueue::OutQueue::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let p = process(&mut ctx, &mut sess, &buf, &mut queue, usize::MAX);
            out.extend(queue.take_vec());
            buf.drain(..p.consumed);
            if p.close {
                return out;
            }
            if p.consumed == 0 {
                break;
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let (a, b) = rest.split_at(first as usize % (rest.len() + 1));
    let guard = match first % 3 {
        0 => Guard::Open,
        1 => Guard::AuthFile,
        _ => Guard::Sasl,
    };
    let _ = run(&[a, b], guard);
});
