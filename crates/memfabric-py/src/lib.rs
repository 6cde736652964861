//! memfabric for Python, the native part (`memfabric._native`): a `NativePool` over
//! libmemfabric's pool (`memfabric::pool::Pool`: per-server clients over TCP or UCX, with
//! one-sided GETs; libmemcached's placement), with the GIL released while a request is on
//! the network, and memcached's errors as typed exceptions. `python/memfabric/` shapes it
//! like pymemcache (`Client`, `HashClient`) and aiomcache (`AsyncClient`). `bb.rs` binds the
//! burst buffer's file system (`NativeBb`), which `python/memfabric/fsspec.py` makes an
//! fsspec filesystem of.
//!
//! A pool's UCX worker belongs to the thread that made it, so a `NativePool` is
//! `unsendable` (pyo3 refuses it on another thread) and the GIL is released around calls
//! through `SendWrapper`, which checks at run time that the pool never leaves its thread
//! (`allow_threads` runs the call on the calling thread).

mod bb;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use memfabric::abi;
use memfabric::commands::{Command, Kind, Outcome};
use memfabric::pool::{Pool, TransportChoice};
use memfabric_client::{Handle, Op, Reply, StoreMode};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use send_wrapper::SendWrapper;

create_exception!(
    _native,
    MemcacheError,
    PyException,
    "Every memfabric error."
);
create_exception!(
    _native,
    MemcacheClientError,
    MemcacheError,
    "The server refused the request (CLIENT_ERROR, ERROR)."
);
create_exception!(
    _native,
    MemcacheIllegalInputError,
    MemcacheClientError,
    "A key or value memcached cannot take (bad key, too large)."
);
create_exception!(
    _native,
    MemcacheServerError,
    MemcacheError,
    "SERVER_ERROR from the server."
);
create_exception!(
    _native,
    MemcacheUnexpectedCloseError,
    MemcacheError,
    "The connection failed or the server is marked down."
);
create_exception!(
    _native,
    MemcacheTimeoutError,
    MemcacheError,
    "No answer within the timeout."
);
create_exception!(
    _native,
    MemcacheNotSupportedError,
    MemcacheError,
    "Not supported here."
);

/// The exception for a libmemcached code.
fn error(rc: i32, message: &str) -> PyErr {
    let name = abi::strerror(rc).trim_end_matches('\0');
    let text = if message.is_empty() || message == name {
        name.to_string()
    } else {
        message.to_string()
    };
    match rc {
        abi::BAD_KEY_PROVIDED | abi::KEY_TOO_BIG | abi::INVALID_ARGUMENTS => {
            MemcacheIllegalInputError::new_err(text)
        }
        // pymemcache's class for "SERVER_ERROR object too large for cache".
        abi::E2BIG => MemcacheServerError::new_err(text),
        abi::TIMEOUT => MemcacheTimeoutError::new_err(text),
        abi::CONNECTION_FAILURE
        | abi::SERVER_TEMPORARILY_DISABLED
        | abi::WRITE_FAILURE
        | abi::NO_SERVERS
        | abi::PROTOCOL_ERROR => MemcacheUnexpectedCloseError::new_err(text),
        abi::SERVER_ERROR | abi::SERVER_MEMORY_ALLOCATION_FAILURE => {
            MemcacheServerError::new_err(text)
        }
        abi::CLIENT_ERROR | abi::ERROR | abi::UNKNOWN_READ_FAILURE => {
            MemcacheClientError::new_err(text)
        }
        abi::NOT_SUPPORTED => MemcacheNotSupportedError::new_err(text),
        _ => MemcacheError::new_err(text),
    }
}

type Item = (Py<PyBytes>, u32, u64);

/// A non-blocking request: in flight, or its outcome (taken by `wait`).
enum Pending {
    InFlight(usize, Handle, Kind),
    Done(Outcome),
}

#[pyclass(unsendable, module = "memfabric._native")]
struct NativePool {
    pool: Pool,
    requests: HashMap<u64, Pending>,
    next_request: u64,
}

impl NativePool {
    /// Runs `f` on the pool with the GIL released (other Python threads run meanwhile).
    fn call<T: Send>(&mut self, py: Python<'_>, f: impl FnOnce(&mut Pool) -> T + Send) -> T {
        let pool = SendWrapper::new(&mut self.pool);
        py.allow_threads(move || {
            let mut pool = pool;
            f(&mut pool)
        })
    }

    fn last_message(&self) -> String {
        self.pool.last_message.to_string_lossy().into_owned()
    }

    fn fail(&self, rc: i32) -> PyErr {
        error(rc, &self.last_message())
    }

    fn item(py: Python<'_>, o: &Outcome) -> Option<Item> {
        o.value
            .as_ref()
            .map(|v| (PyBytes::new(py, &v.data).unbind(), v.flags, v.cas))
    }

    /// True for SUCCESS, False for a refused condition, an exception otherwise.
    fn stored(&self, rc: i32) -> PyResult<bool> {
        match rc {
            abi::SUCCESS => Ok(true),
            abi::NOTSTORED | abi::DATA_EXISTS | abi::NOTFOUND => Ok(false),
            rc => Err(self.fail(rc)),
        }
    }
}

fn store_mode(mode: &str) -> PyResult<StoreMode> {
    Ok(match mode {
        "set" => StoreMode::Set,
        "add" => StoreMode::Add,
        "replace" => StoreMode::Replace,
        "append" => StoreMode::Append,
        "prepend" => StoreMode::Prepend,
        "cas" => StoreMode::Cas,
        m => return Err(PyValueError::new_err(format!("unknown store mode {m:?}"))),
    })
}

#[pymethods]
impl NativePool {
    /// `servers`: (host, port, weight) triples. `distribution`: "ketama" (libmemcached's
    /// weighted ketama, MD5) or "modula". `transport`: "auto" (UCX where memfabricd offers
    /// it), "ucx" or "tcp". `get_mode`: "auto", "one-sided" or "two-sided".
    #[new]
    #[pyo3(signature = (servers, timeout_ms=1000, connect_timeout_ms=1000, transport="auto", get_mode="auto", distribution="ketama", retry_timeout_s=2))]
    fn new(
        servers: Vec<(String, u16, u32)>,
        timeout_ms: i32,
        connect_timeout_ms: i32,
        transport: &str,
        get_mode: &str,
        distribution: &str,
        retry_timeout_s: i32,
    ) -> PyResult<Self> {
        let mut pool = Pool::default();
        pool.transport = match transport {
            "auto" => TransportChoice::Auto,
            "ucx" => TransportChoice::Ucx,
            "tcp" => TransportChoice::Tcp,
            t => {
                return Err(PyValueError::new_err(format!(
                    "transport {t:?}: auto, ucx or tcp"
                )))
            }
        };
        pool.get_mode = get_mode.parse().map_err(PyValueError::new_err)?;
        match distribution {
            "ketama" => {
                pool.behaviors.set(16, 1);
            }
            "modula" => {}
            d => {
                return Err(PyValueError::new_err(format!(
                    "distribution {d:?}: ketama or modula"
                )))
            }
        }
        pool.behaviors.poll_timeout = timeout_ms;
        pool.behaviors.connect_timeout = connect_timeout_ms;
        pool.behaviors.retry_timeout = retry_timeout_s;
        if servers.is_empty() {
            return Err(PyValueError::new_err("no servers"));
        }
        for (host, port, weight) in servers {
            pool.add_server(&host, port, weight);
        }
        Ok(NativePool {
            pool,
            requests: HashMap::new(),
            next_request: 1,
        })
    }

    /// The item, or None on a miss.
    fn get(&mut self, py: Python<'_>, key: Vec<u8>) -> PyResult<Option<Item>> {
        let o = self.call(py, move |p| p.run(None, &key, Command::Get));
        match o.rc {
            abi::SUCCESS => Ok(Self::item(py, &o)),
            abi::NOTFOUND => Ok(None),
            rc => Err(self.fail(rc)),
        }
    }

    /// Get and touch: the item (its expiry time set), or None.
    fn gat(&mut self, py: Python<'_>, key: Vec<u8>, exptime: i64) -> PyResult<Option<Item>> {
        let o = self.call(py, move |p| p.run(None, &key, Command::Gat { exptime }));
        match o.rc {
            abi::SUCCESS => Ok(Self::item(py, &o)),
            abi::NOTFOUND => Ok(None),
            rc => Err(self.fail(rc)),
        }
    }

    /// The items found, by key (all requests in flight together).
    fn get_multi<'py>(
        &mut self,
        py: Python<'py>,
        keys: Vec<Vec<u8>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        if keys.is_empty() {
            return Ok(out);
        }
        let (rc, found) = self.call(py, move |p| {
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let rc = p.mget(None, &refs);
            let mut found = Vec::new();
            while let Some(f) = p.next_result() {
                found.push(f);
            }
            (rc, found)
        });
        // SOME ERRORS: a server failed, the others' hits are still answers.
        if rc != abi::SUCCESS && (rc != abi::SOME_ERRORS || found.is_empty()) {
            return Err(self.fail(rc));
        }
        for f in found {
            out.set_item(
                PyBytes::new(py, &f.key),
                (PyBytes::new(py, &f.value.data), f.value.flags, f.value.cas),
            )?;
        }
        Ok(out)
    }

    /// set/add/replace/append/prepend/cas: True if stored, False if the mode's condition
    /// failed (or a cas found another version), None for a cas of a missing key.
    #[pyo3(signature = (mode, key, value, flags=0, exptime=0, cas=0, noreply=false))]
    #[allow(clippy::too_many_arguments)]
    fn store(
        &mut self,
        py: Python<'_>,
        mode: &str,
        key: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
        exptime: i64,
        cas: u64,
        noreply: bool,
    ) -> PyResult<Option<bool>> {
        let mode = store_mode(mode)?;
        let rc = self.call(py, move |p| {
            let saved = std::mem::replace(&mut p.behaviors.noreply, noreply);
            let cmd = Command::Store {
                mode,
                value: &value,
                exptime,
                flags,
                cas,
            };
            let rc = p.run(None, &key, cmd).rc;
            p.behaviors.noreply = saved;
            rc
        });
        if mode == StoreMode::Cas && rc == abi::NOTFOUND {
            return Ok(None);
        }
        self.stored(rc).map(Some)
    }

    /// True if it was there.
    #[pyo3(signature = (key, noreply=false))]
    fn delete(&mut self, py: Python<'_>, key: Vec<u8>, noreply: bool) -> PyResult<bool> {
        let rc = self.call(py, move |p| {
            let saved = std::mem::replace(&mut p.behaviors.noreply, noreply);
            let rc = p.run(None, &key, Command::Delete { expiration: 0 }).rc;
            p.behaviors.noreply = saved;
            rc
        });
        self.stored(rc)
    }

    /// incr/decr: the new value, None if the key is missing (or with noreply).
    #[pyo3(signature = (key, delta, incr=true, noreply=false))]
    fn arith(
        &mut self,
        py: Python<'_>,
        key: Vec<u8>,
        delta: u64,
        incr: bool,
        noreply: bool,
    ) -> PyResult<Option<u64>> {
        let o = self.call(py, move |p| {
            let saved = std::mem::replace(&mut p.behaviors.noreply, noreply);
            let o = p.run(None, &key, Command::Arith { delta, incr });
            p.behaviors.noreply = saved;
            o
        });
        match o.rc {
            abi::SUCCESS => Ok(o.number),
            abi::NOTFOUND => Ok(None),
            rc => Err(self.fail(rc)),
        }
    }

    /// True if the key was there.
    fn touch(&mut self, py: Python<'_>, key: Vec<u8>, exptime: i64) -> PyResult<bool> {
        let rc = self.call(py, move |p| {
            p.run(None, &key, Command::Touch { exptime }).rc
        });
        self.stored(rc)
    }

    /// Every server's statistics: [(host:port, {name: value})].
    #[pyo3(signature = (group=None))]
    fn stats(
        &mut self,
        py: Python<'_>,
        group: Option<String>,
    ) -> PyResult<Vec<(String, HashMap<String, String>)>> {
        let (rc, out) = self.call(py, move |p| {
            let mut out = Vec::new();
            let rc = p.each_server(&Op::Stats { group }, false, |p, i, reply| {
                if let (Reply::Stats(list), Some(inst)) = (reply, p.instance(i)) {
                    let name = format!("{}:{}", inst.hostname.to_string_lossy(), inst.port);
                    out.push((name, list.into_iter().collect()));
                }
            });
            (rc, out)
        });
        if rc != abi::SUCCESS {
            return Err(self.fail(rc));
        }
        Ok(out)
    }

    /// flush_all on every server.
    #[pyo3(signature = (delay=0))]
    fn flush_all(&mut self, py: Python<'_>, delay: u32) -> PyResult<()> {
        let rc = self.call(py, move |p| {
            p.each_server(&Op::FlushAll { delay }, false, |_, _, _| {})
        });
        if rc != abi::SUCCESS {
            return Err(self.fail(rc));
        }
        Ok(())
    }

    /// Every server's version: [(host:port, version)].
    fn version(&mut self, py: Python<'_>) -> PyResult<Vec<(String, String)>> {
        let (rc, out) = self.call(py, move |p| {
            let mut out = Vec::new();
            let rc = p.each_server(&Op::Version, false, |p, i, reply| {
                if let (Reply::Version(v), Some(inst)) = (reply, p.instance(i)) {
                    out.push((
                        format!("{}:{}", inst.hostname.to_string_lossy(), inst.port),
                        v,
                    ));
                }
            });
            (rc, out)
        });
        if rc != abi::SUCCESS {
            return Err(self.fail(rc));
        }
        Ok(out)
    }

    /// Issues a set without waiting; returns the request's id (for `wait`).
    #[pyo3(signature = (key, value, flags=0, exptime=0))]
    fn iset(
        &mut self,
        py: Python<'_>,
        key: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
        exptime: i64,
    ) -> PyResult<u64> {
        let r = self.call(py, move |p| {
            let cmd = Command::Store {
                mode: StoreMode::Set,
                value: &value,
                exptime,
                flags,
                cas: 0,
            };
            p.start(None, &key, cmd)
        });
        self.track(r)
    }

    /// Issues a get without waiting; returns the request's id (for `wait`).
    fn iget(&mut self, py: Python<'_>, key: Vec<u8>) -> PyResult<u64> {
        let r = self.call(py, move |p| p.start(None, &key, Command::Get));
        self.track(r)
    }

    /// Whether request `id` has completed (never blocks).
    fn test(&mut self, py: Python<'_>, id: u64) -> PyResult<bool> {
        let (server, handle, kind) = match self.requests.get(&id) {
            Some(Pending::InFlight(s, h, k)) => (*s, *h, *k),
            Some(Pending::Done(_)) => return Ok(true),
            None => return Err(PyValueError::new_err(format!("no request {id}"))),
        };
        let o = self.call(py, move |p| p.poll(server, handle, kind, None));
        Ok(match o {
            Some(o) => {
                self.requests.insert(id, Pending::Done(o));
                true
            }
            None => false,
        })
    }

    /// Waits for requests (at most `timeout_ms` in all; None: the pool's timeout) and
    /// returns their results in order: a get's item or None, a set's True/False, or the
    /// exception a request met (returned, not raised; a timeout abandons the request).
    #[pyo3(signature = (ids, timeout_ms=None))]
    fn wait(
        &mut self,
        py: Python<'_>,
        ids: Vec<u64>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Vec<PyObject>> {
        let total = timeout_ms.map_or(self.pool.client_config().timeout, Duration::from_millis);
        let deadline = Instant::now() + total;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let outcome = match self.requests.remove(&id) {
                Some(Pending::Done(o)) => o,
                Some(Pending::InFlight(server, handle, kind)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.call(py, move |p| p.poll(server, handle, kind, Some(left)))
                        .unwrap_or_else(|| Outcome::rc(abi::TIMEOUT))
                }
                None => {
                    return Err(PyValueError::new_err(format!(
                        "no request {id} (or already waited for)"
                    )))
                }
            };
            out.push(match outcome.rc {
                abi::SUCCESS if outcome.value.is_some() => Self::item(py, &outcome)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
                abi::SUCCESS => true.into_pyobject(py)?.to_owned().into_any().unbind(),
                abi::NOTFOUND if outcome.value.is_none() => py.None(),
                abi::NOTSTORED | abi::DATA_EXISTS => {
                    false.into_pyobject(py)?.to_owned().into_any().unbind()
                }
                rc => error(rc, &self.last_message()).into_value(py).into_any(),
            });
        }
        Ok(out)
    }

    /// Forgets request `id` (its Python object is gone): one in flight is abandoned.
    fn discard(&mut self, py: Python<'_>, id: u64) {
        if let Some(Pending::InFlight(server, handle, kind)) = self.requests.remove(&id) {
            self.call(py, move |p| {
                let _ = p.poll(server, handle, kind, Some(Duration::ZERO));
            });
        }
    }

    /// Whether server `index` is reached over UCX (None: not connected yet).
    fn over_ucx(&self, index: usize) -> Option<bool> {
        self.pool.over_ucx(index)
    }

    /// Closes every connection (the next request reconnects); requests in flight are lost.
    fn close(&mut self) {
        self.requests.clear();
        self.pool.quit();
    }
}

impl NativePool {
    fn track(&mut self, r: Result<(usize, Handle, Kind), i32>) -> PyResult<u64> {
        let (server, handle, kind) = r.map_err(|rc| self.fail(rc))?;
        let id = self.next_request;
        self.next_request += 1;
        self.requests
            .insert(id, Pending::InFlight(server, handle, kind));
        Ok(id)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<NativePool>()?;
    m.add_class::<bb::NativeBb>()?;
    m.add("MemcacheError", py.get_type::<MemcacheError>())?;
    m.add("MemcacheClientError", py.get_type::<MemcacheClientError>())?;
    m.add(
        "MemcacheIllegalInputError",
        py.get_type::<MemcacheIllegalInputError>(),
    )?;
    m.add("MemcacheServerError", py.get_type::<MemcacheServerError>())?;
    m.add(
        "MemcacheUnexpectedCloseError",
        py.get_type::<MemcacheUnexpectedCloseError>(),
    )?;
    m.add(
        "MemcacheTimeoutError",
        py.get_type::<MemcacheTimeoutError>(),
    )?;
    m.add(
        "MemcacheNotSupportedError",
        py.get_type::<MemcacheNotSupportedError>(),
    )?;
    Ok(())
}
