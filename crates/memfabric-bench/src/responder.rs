//! A trivial in-process memcached stand-in on 127.0.0.1: `get <key>` and `set`, answered from
//! a hash map, one thread per connection.
//!
//! Two uses: the end-to-end tests of the load generator (counts and correctness), and the
//! load generator's own ceiling (`compare` runs the same load against it: a server that does
//! almost nothing shows how many ops/s the client side can drive on this machine). With
//! `corrupt`, every GET answers a value one byte short, which the generator must flag.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Stored items, by key.
pub type Items = Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>;

/// A running responder; stops accepting when dropped (open connections end when their
/// client closes them).
pub struct Responder {
    pub addr: SocketAddr,
    pub items: Items,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Responder {
    pub fn start(corrupt: bool) -> io::Result<Responder> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let items: Items = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (Arc::clone(&items), Arc::clone(&stop));
        let acceptor = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::Acquire) {
                    return;
                }
                let Ok(stream) = stream else { return };
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    // A connection error ends that connection only.
                    let _ = serve(stream, &m, corrupt);
                });
            }
        });
        Ok(Responder {
            addr,
            items,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// How many items are stored.
    pub fn len(&self) -> usize {
        self.items
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the acceptor so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

fn serve(stream: TcpStream, items: &Items, corrupt: bool) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    let mut out = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["get", key] => {
                let map = items.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(v) = map.get(key.as_bytes()) {
                    let v = if corrupt {
                        &v[..v.len().saturating_sub(1)]
                    } else {
                        &v[..]
                    };
                    out.extend_from_slice(format!("VALUE {key} 0 {}\r\n", v.len()).as_bytes());
                    out.extend_from_slice(v);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"END\r\n");
            }
            ["set", key, _flags, _exp, len] => {
                if let Ok(n) = len.parse::<usize>() {
                    let mut data = vec![0; n + 2];
                    r.read_exact(&mut data)?;
                    data.truncate(n);
                    items
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(key.as_bytes().to_vec(), data);
                    out.extend_from_slice(b"STORED\r\n");
                } else {
                    out.extend_from_slice(b"CLIENT_ERROR bad data chunk\r\n");
                }
            }
            _ => out.extend_from_slice(b"ERROR\r\n"),
        }
        // Answer a pipelined batch with one write: only when no more requests are buffered.
        if r.buffer().is_empty() {
            w.write_all(&out)?;
            out.clear();
        }
    }
}
