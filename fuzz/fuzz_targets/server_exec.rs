#![no_main]
//! The whole executor: arbitrary bytes as one connection's input (ascii, meta or binary,
//! chosen by the first byte as the server does), fed in two pieces split at an arbitrary
//! point, against a real store. It must never panic or loop. An odd split byte runs the
//! input against a server with `-Y` (the authentication handshake first).
use libfuzzer_sys::fuzz_target;
use memfabric_server::exec::{process, ExecCtx, Session, Shared, Transport};
use memfabric_server::auth::AuthFile;
use memfabric_server::settings::Settings;
use memfabric_store::{Store, StoreConfig};
use std::sync::OnceLock;

fn make_shared(auth: bool) -> Shared {
    let cfg = StoreConfig {
        memory_limit: 4 << 20,
        slab_automove: false,
        background_sweeper: false,
        ..StoreConfig::default()
    };
    let auth = auth.then(|| {
        let table = AuthFile::from_text("fuzz", b"alice:secret\nbob:pw2\n").expect("table");
        std::sync::Arc::new(table)
    });
    let settings = Settings {
        store: cfg.clone(),
        auth,
        ..Settings::default()
    };
    Shared::new(settings, Store::new(cfg).expect("store"))
}

fn shared(auth: bool) -> &'static Shared {
    static OPEN: OnceLock<Shared> = OnceLock::new();
    static AUTH: OnceLock<Shared> = OnceLock::new();
    if auth {
        AUTH.get_or_init(|| make_shared(true))
    } else {
        OPEN.get_or_init(|| make_shared(false))
    }
}

/// One worker's counters for every run (registering a worker per run would grow the
/// server's list of workers without bound).
fn stats() -> &'static memfabric_server::counters::ThreadStats {
    static STATS: OnceLock<std::sync::Arc<memfabric_server::counters::ThreadStats>> =
        OnceLock::new();
    STATS.get_or_init(|| shared(false).register_thread())
}

/// Feed `chunks` one after another like a socket would, keeping unconsumed bytes.
fn run(chunks: &[&[u8]], auth: bool) -> Vec<u8> {
    let shared = shared(auth);
    let stats = stats();
    let mut ctx = ExecCtx {
        shared,
        stats,
        transport: Transport::Tcp,
        conn_id: 1,
        waiter: None,
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
    let _ = run(&[a, b], first & 1 == 1);
});
