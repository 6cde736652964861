//! The runtime end to end inside one process: two workers on one thread, progressed in
//! turn. Run under each `UCX_TLS` the CI uses (posix,cma,self and tcp,self).
use std::time::{Duration, Instant};

use memfabric_ucx::{AmData, Context, Endpoint, Event, Posted, Proto, SendHow, Worker};

const AM_PING: u16 = 1;

/// Progress both workers until `pred` holds on an event of `b`, collecting a's events too.
fn pump(a: &mut Worker, b: &mut Worker, mut pred: impl FnMut(Event) -> Option<Event>) -> Event {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        a.progress();
        b.progress();
        for e in b.drain() {
            if let Some(e) = pred(e) {
                return e;
            }
        }
        assert!(Instant::now() < deadline, "timed out waiting for an event");
    }
}

/// The sockaddr listener needs a network transport on the listening device (UCX's
/// connection manager wires up over it), so it works with `tcp` in UCX_TLS (or no
/// UCX_TLS) and not with shared memory alone.
fn listener_usable() -> bool {
    std::env::var("UCX_TLS").map_or(true, |t| t.split(',').any(|x| x == "tcp" || x == "all"))
}

/// Close both endpoints and progress both workers until the closes finish.
fn close_both(a: &mut Worker, aep: Endpoint, b: &mut Worker, bep: Endpoint) {
    a.close(aep, false);
    b.close(bep, false);
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.closing() + b.closing() > 0 {
        a.progress();
        b.progress();
        assert!(Instant::now() < deadline, "endpoint close never finished");
    }
}

/// Connect `client` to `server`: through a listener when the transports allow it,
/// otherwise by exchanging worker addresses (the way memfabricd bootstraps).
fn connect(server: &mut Worker, client: &mut Worker) -> (Endpoint, Endpoint) {
    if !listener_usable() {
        let cep = client.connect_address(&server.address().unwrap()).unwrap();
        let sep = server.connect_address(&client.address().unwrap()).unwrap();
        return (cep, sep);
    }
    let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    let cep = client.connect_sockaddr(addr).unwrap();
    let req = pump(client, server, |e| match e {
        Event::ConnRequest(r) => Some(Event::ConnRequest(r)),
        _ => None,
    });
    let Event::ConnRequest(req) = req else {
        unreachable!()
    };
    let sep = server.accept(req).unwrap();
    (cep, sep)
}

fn roundtrip(size: usize, proto: Proto) {
    roundtrip_with(size, proto, None)
}

fn roundtrip_with(size: usize, proto: Proto, hold: Option<usize>) {
    let ctx = Context::new("am-test").unwrap();
    let mut server = Worker::new(&ctx).unwrap();
    let mut client = Worker::new(&ctx).unwrap();
    match hold {
        Some(min) => server.set_am_handler_holding(AM_PING, min).unwrap(),
        None => server.set_am_handler(AM_PING).unwrap(),
    }
    let (cep, sep) = connect(&mut server, &mut client);
    let value: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    let header = b"hdr-bytes".to_vec();
    match client
        .am_send(
            &cep,
            AM_PING,
            header.clone(),
            Some(Box::new(value.clone())),
            SendHow {
                proto,
                reply: false,
            },
            42,
        )
        .unwrap()
    {
        Posted::Done(_) | Posted::Pending => {}
    }
    let msg = pump(&mut client, &mut server, |e| match e {
        Event::Am(m) => Some(Event::Am(m)),
        _ => None,
    });
    let Event::Am(msg) = msg else { unreachable!() };
    assert_eq!(msg.id, AM_PING);
    assert_eq!(msg.header, header);
    let got = match msg.data {
        AmData::None => Vec::new(),
        AmData::Eager(v) => v,
        AmData::Held(h) => {
            assert!(hold.is_some_and(|min| size >= min), "held only when asked");
            // Readable from another thread, and given back to UCX when dropped.
            let copy = std::thread::spawn(move || h.as_ref().to_vec())
                .join()
                .unwrap();
            server.progress();
            copy
        }
        AmData::Rndv(d) => {
            assert_eq!(d.len(), size);
            match server.recv_rndv(d, Box::new(vec![0u8; size]), 7).unwrap() {
                Posted::Done(b) => *b.unwrap().downcast::<Vec<u8>>().unwrap(),
                Posted::Pending => {
                    let done = pump(&mut client, &mut server, |e| match e {
                        Event::Done { token: 7, .. } => Some(e),
                        _ => None,
                    });
                    let Event::Done { result, buf, .. } = done else {
                        unreachable!()
                    };
                    result.unwrap();
                    *buf.unwrap().downcast::<Vec<u8>>().unwrap()
                }
            }
        }
    };
    assert_eq!(got.len(), value.len());
    assert!(got == value, "payload differs");
    close_both(&mut client, cep, &mut server, sep);
}

#[test]
fn eager_small_and_empty() {
    roundtrip(0, Proto::Eager);
    roundtrip(1, Proto::Eager);
    roundtrip(4096, Proto::Eager);
}

#[test]
fn held_eager_data_is_read_in_place_and_released() {
    // Held when the transport allows it (shared memory does), copied otherwise: either
    // way the bytes arrive intact, and small messages are copied.
    roundtrip_with(4096, Proto::Eager, Some(1024));
    roundtrip_with(100, Proto::Eager, Some(1024));
    for _ in 0..3 {
        roundtrip_with(8000, Proto::Eager, Some(1));
    }
}

#[test]
fn rendezvous_large() {
    roundtrip(8193, Proto::Rndv);
    roundtrip(4 << 20, Proto::Rndv);
}

#[test]
fn worker_address_connect_and_rma_read() {
    let ctx = Context::new("rma-test").unwrap();
    let mut server = Worker::new(&ctx).unwrap();
    let mut client = Worker::new(&ctx).unwrap();
    server.set_am_handler(AM_PING).unwrap();
    let addr = server.address().unwrap();
    let mut cep = client.connect_address(&addr).unwrap();
    let sep = server.connect_address(&client.address().unwrap()).unwrap();
    // Registered server memory read one-sidedly by the client.
    let mut region_mem = vec![0u8; 65536];
    for (i, b) in region_mem.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let region = server
        .mem_map(region_mem.as_mut_ptr(), region_mem.len())
        .unwrap();
    let rkey = cep.unpack_rkey(&region.pack_rkey().unwrap()).unwrap();
    let buf = vec![0u8; 1000];
    let got = match client
        .get(&cep, region.addr() + 1234, rkey, Box::new(buf), 9)
        .unwrap()
    {
        Posted::Done(b) => *b.unwrap().downcast::<Vec<u8>>().unwrap(),
        Posted::Pending => {
            let done = pump(&mut server, &mut client, |e| match e {
                Event::Done { token: 9, .. } => Some(e),
                _ => None,
            });
            let Event::Done { result, buf, .. } = done else {
                unreachable!()
            };
            result.unwrap();
            *buf.unwrap().downcast::<Vec<u8>>().unwrap()
        }
    };
    assert_eq!(&got[..], &region_mem[1234..2234]);
    close_both(&mut client, cep, &mut server, sep);
    drop(region);
}

/// Read `n` bytes at `addr` of `server`'s region through `cep`, progressing both workers.
fn rma_read(
    client: &mut Worker,
    server: &mut Worker,
    cep: &Endpoint,
    addr: u64,
    rkey: memfabric_ucx::RemoteKey,
    n: usize,
) -> Vec<u8> {
    match client
        .get(cep, addr, rkey, Box::new(vec![0u8; n]), 11)
        .unwrap()
    {
        Posted::Done(b) => *b.unwrap().downcast::<Vec<u8>>().unwrap(),
        Posted::Pending => {
            let done = pump(server, client, |e| match e {
                Event::Done { token: 11, .. } => Some(e),
                _ => None,
            });
            let Event::Done { result, buf, .. } = done else {
                unreachable!()
            };
            result.unwrap();
            *buf.unwrap().downcast::<Vec<u8>>().unwrap()
        }
    }
}

#[test]
fn ucx_allocated_region_is_zeroed_writable_and_remotely_readable() {
    let ctx = Context::new("alloc-test").unwrap();
    let mut server = Worker::new(&ctx).unwrap();
    let mut client = Worker::new(&ctx).unwrap();
    let mut cep = client.connect_address(&server.address().unwrap()).unwrap();
    let sep = server.connect_address(&client.address().unwrap()).unwrap();
    let region = ctx.mem_alloc(1 << 20).unwrap();
    assert!(region.len() >= 1 << 20);
    // SAFETY: the region owns len() zero-filled bytes and is dropped only after the last
    // use of this slice; nothing else writes them meanwhile (the RMA read below only
    // reads them, after the writes through the slice are done).
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr(), region.len()) };
    assert!(
        mem.iter().all(|&b| b == 0),
        "UCX-allocated memory is zero-filled"
    );
    for (i, b) in mem.iter_mut().enumerate().take(70_000) {
        *b = (i % 253) as u8;
    }
    let rkey = cep.unpack_rkey(&region.pack_rkey().unwrap()).unwrap();
    let got = rma_read(
        &mut client,
        &mut server,
        &cep,
        region.addr() + 4096,
        rkey,
        65536,
    );
    assert_eq!(&got[..], &mem[4096..4096 + 65536]);
    let mapped = cep.rkey_is_mapped(rkey, region.addr());
    let lanes = cep.describe();
    eprintln!(
        "UCX_TLS={:?} rkey mapped here: {mapped}\n{lanes}",
        std::env::var("UCX_TLS")
    );
    assert!(!lanes.is_empty());
    close_both(&mut client, cep, &mut server, sep);
    drop(region);
}

/// Addresses off the network that UCX would abort on are refused before UCX sees them;
/// a genuine address cut short is read as if zero-padded, and fails or connects, without
/// taking the process down.
#[test]
fn implausible_worker_addresses_are_refused_not_fatal() {
    let ctx = Context::new("address-test").unwrap();
    let mut w = Worker::new(&ctx).unwrap();
    let mut peer = Worker::new(&ctx).unwrap();
    let genuine = peer.address().unwrap();
    let mut unknown_format = genuine.clone();
    unknown_format[0] = (unknown_format[0] & 0xf0) | 0x05;
    for bad in [Vec::new(), vec![1u8; 9], vec![0xffu8; 200], unknown_format] {
        assert!(w.connect_address(&bad).is_err(), "accepted {bad:?}");
    }
    // Cut short: whatever UCX makes of it, the process survives and a real peer still
    // connects afterwards.
    if let Ok(ep) = w.connect_address(&genuine[..10]) {
        w.close(ep, true);
    }
    let ep = w.connect_address(&genuine).unwrap();
    w.close(ep, true);
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.closing() > 0 && Instant::now() < deadline {
        w.progress();
        peer.progress();
    }
}
