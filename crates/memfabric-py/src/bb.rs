//! The burst buffer for Python (`memfabric._native.NativeBb`): memfabric-bb's file system
//! over a memfabric-client pool, by path. `python/memfabric/fsspec.py` makes an fsspec
//! filesystem (`memfabric://`) of it, so pandas, Dask and anything else that takes fsspec
//! URLs read and write burst-buffer files.
//!
//! Like `NativePool`, a `NativeBb` is `unsendable` (its client's UCX worker belongs to
//! the thread that made it) and releases the GIL around every call through `SendWrapper`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use memfabric_bb::flush::{self, FlushOptions, Flusher};
use memfabric_bb::fs::{Fs, FsError, Options};
use memfabric_bb::layout::{hex, Inode, Kind, ROOT};
use memfabric_client::{Client, Config};
use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyIsADirectoryError, PyNotADirectoryError, PyOSError,
    PyPermissionError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use send_wrapper::SendWrapper;

/// The Python exception a local file system's errno would raise.
fn os_error(path: &str, e: FsError) -> PyErr {
    let errno = e.errno();
    let msg = (errno, format!("{path}: {e}"));
    match errno {
        libc::ENOENT => PyFileNotFoundError::new_err(msg),
        libc::EEXIST => PyFileExistsError::new_err(msg),
        libc::EISDIR => PyIsADirectoryError::new_err(msg),
        libc::ENOTDIR => PyNotADirectoryError::new_err(msg),
        libc::EACCES | libc::EPERM => PyPermissionError::new_err(msg),
        _ => PyOSError::new_err(msg),
    }
}

fn split(path: &str) -> (&str, &str) {
    let t = path.trim_end_matches('/');
    match t.rfind('/') {
        Some(i) => (&t[..i.max(1)], &t[i + 1..]),
        None => ("/", t),
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Dir => "directory",
        Kind::Symlink => "link",
    }
}

/// One path's attributes, as fsspec's `info` wants them.
fn info<'py>(py: Python<'py>, path: &str, i: &Inode) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", path)?;
    d.set_item("size", i.size)?;
    d.set_item("type", kind_name(i.kind))?;
    d.set_item("mode", i.mode | i.kind.mode_bits())?;
    d.set_item("mtime", i.mtime.secs as f64 + i.mtime.nanos as f64 * 1e-9)?;
    d.set_item("id", i.id)?;
    d.set_item("flushed", !flush::is_dirty(i))?;
    d.set_item("sha256", i.sha256.map(|s| hex(&s)))?;
    Ok(d)
}

#[pyclass(unsendable, module = "memfabric._native")]
pub struct NativeBb {
    fs: Fs,
    /// Files open for writing through this object: handle → inode id.
    writers: HashMap<u64, (u64, String)>,
    next: u64,
}

impl NativeBb {
    fn call<T: Send>(&mut self, py: Python<'_>, f: impl FnOnce(&mut Fs) -> T + Send) -> T {
        let fs = SendWrapper::new(&mut self.fs);
        py.allow_threads(move || {
            let mut fs = fs;
            f(&mut fs)
        })
    }
}

#[pymethods]
impl NativeBb {
    /// `servers`: memfabric's server list (`host:port`, `ucx://host:port`, comma
    /// separated). `name`: the file system in the pool. `backing`: the backing directory
    /// (read-through, flushes).
    #[new]
    #[pyo3(signature = (servers, name="default", backing=None, chunk=0, depth=16, timeout_ms=10000, replicas=0, ec=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        servers: &str,
        name: &str,
        backing: Option<PathBuf>,
        chunk: u32,
        depth: usize,
        timeout_ms: u64,
        replicas: u8,
        ec: Option<&str>,
    ) -> PyResult<Self> {
        let timeout = Duration::from_millis(timeout_ms);
        let config = Config {
            timeout,
            connect_timeout: timeout,
            replicas,
            ec: ec
                .map(|g| g.parse())
                .transpose()
                .map_err(|e| PyValueError::new_err(format!("ec: {e}")))?,
            ..Config::default()
        };
        let opts = Options {
            name: name.to_string(),
            chunk_size: chunk,
            depth,
            backing,
            ..Options::default()
        };
        let servers = servers.to_string();
        // Made on this thread (the client stays on it); the GIL is released meanwhile.
        let made = SendWrapper::new(std::cell::RefCell::new(None));
        let slot = &made;
        let r: Result<(), String> = py.allow_threads(move || {
            let c = Client::new(servers.as_str(), config).map_err(|e| e.to_string())?;
            let fs = Fs::open(c, opts).map_err(|e| e.to_string())?;
            *slot.borrow_mut() = Some(fs);
            Ok(())
        });
        r.map_err(PyOSError::new_err)?;
        let fs = made.take().into_inner().expect("made above");
        Ok(NativeBb {
            fs,
            writers: HashMap::new(),
            next: 1,
        })
    }

    fn chunk_size(&self) -> u32 {
        self.fs.chunk_size()
    }

    /// The attributes of `path` (FileNotFoundError if it is not there).
    fn stat<'py>(&mut self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let p = path.to_string();
        let i = self
            .call(py, move |fs| {
                let i = fs.resolve(p.as_bytes())?;
                fs.getattr(i.id)
            })
            .map_err(|e| os_error(path, e))?;
        info(py, path, &i)
    }

    /// A directory's entries with their attributes (a file: itself).
    fn ls<'py>(&mut self, py: Python<'py>, path: &str) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let p = path.to_string();
        let rows = self
            .call(py, move |fs| -> Result<Vec<(String, Inode)>, FsError> {
                let i = fs.resolve(p.as_bytes())?;
                if i.kind != Kind::Dir {
                    return Ok(vec![(p.clone(), i)]);
                }
                let mut out = Vec::new();
                for e in fs.readdir(i.id)? {
                    let name = String::from_utf8_lossy(&e.name).into_owned();
                    let child = format!("{}/{}", p.trim_end_matches('/'), name);
                    out.push((child, fs.getattr(e.id)?));
                }
                Ok(out)
            })
            .map_err(|e| os_error(path, e))?;
        rows.iter().map(|(p, i)| info(py, p, i)).collect()
    }

    /// Makes a directory (`parents`: with its parents, no error if it exists).
    #[pyo3(signature = (path, parents=false, mode=0o755))]
    fn mkdir(&mut self, py: Python<'_>, path: &str, parents: bool, mode: u32) -> PyResult<()> {
        let p = path.to_string();
        self.call(py, move |fs| -> Result<(), FsError> {
            if parents {
                let mut at = fs.get_inode(ROOT)?;
                for c in p.split('/').filter(|c| !c.is_empty()) {
                    at = match fs.lookup(at.id, c.as_bytes()) {
                        Ok(i) if i.kind == Kind::Dir => i,
                        Ok(_) => return Err(FsError::NotDir),
                        Err(FsError::NotFound) => {
                            fs.create(at.id, c.as_bytes(), Kind::Dir, mode, 0, 0, b"")?
                        }
                        Err(e) => return Err(e),
                    };
                }
                return Ok(());
            }
            let (parent, name) = split(&p);
            let d = fs.resolve(parent.as_bytes())?;
            fs.create(d.id, name.as_bytes(), Kind::Dir, mode, 0, 0, b"")
                .map(|_| ())
        })
        .map_err(|e| os_error(path, e))
    }

    /// Removes a file, or an empty directory (`dir`).
    #[pyo3(signature = (path, dir=false))]
    fn rm(&mut self, py: Python<'_>, path: &str, dir: bool) -> PyResult<()> {
        let p = path.to_string();
        self.call(py, move |fs| -> Result<(), FsError> {
            let (parent, name) = split(&p);
            let d = fs.resolve(parent.as_bytes())?;
            let gone = fs.remove(d.id, name.as_bytes(), dir)?;
            flush::note_removed(fs, gone.id).map(|_| ())
        })
        .map_err(|e| os_error(path, e))
    }

    /// rename(2).
    fn rename(&mut self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        let (s, d) = (src.to_string(), dst.to_string());
        self.call(py, move |fs| -> Result<(), FsError> {
            let (sp, sn) = split(&s);
            let (dp, dn) = split(&d);
            let a = fs.resolve(sp.as_bytes())?;
            let b = fs.resolve(dp.as_bytes())?;
            fs.rename(a.id, sn.as_bytes(), b.id, dn.as_bytes(), false)
        })
        .map_err(|e| os_error(src, e))
    }

    /// Up to `length` bytes of `path` from `offset` (close-to-open: what was published
    /// when the read started).
    fn read<'py>(
        &mut self,
        py: Python<'py>,
        path: &str,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let p = path.to_string();
        let data = self
            .call(py, move |fs| {
                let i = fs.resolve(p.as_bytes())?;
                fs.read(i.id, offset, length)
            })
            .map_err(|e| os_error(path, e))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Opens `path` for writing (made if missing; `truncate`: emptied); a handle for
    /// `write` and `close_write`.
    #[pyo3(signature = (path, truncate=true, mode=0o644))]
    fn open_write(
        &mut self,
        py: Python<'_>,
        path: &str,
        truncate: bool,
        mode: u32,
    ) -> PyResult<u64> {
        let p = path.to_string();
        let id = self
            .call(py, move |fs| -> Result<u64, FsError> {
                let (parent, name) = split(&p);
                let d = fs.resolve(parent.as_bytes())?;
                let i = match fs.lookup(d.id, name.as_bytes()) {
                    Ok(i) if i.kind == Kind::Dir => return Err(FsError::IsDir),
                    Ok(i) => {
                        if truncate {
                            fs.truncate(i.id, 0)?;
                        }
                        i
                    }
                    Err(FsError::NotFound) => {
                        fs.create(d.id, name.as_bytes(), Kind::File, mode, 0, 0, b"")?
                    }
                    Err(e) => return Err(e),
                };
                fs.open_write(i.id)?;
                Ok(i.id)
            })
            .map_err(|e| os_error(path, e))?;
        let h = self.next;
        self.next += 1;
        self.writers.insert(h, (id, path.to_string()));
        Ok(h)
    }

    /// Writes `data` at `offset` of a file opened with `open_write`.
    fn write(
        &mut self,
        py: Python<'_>,
        handle: u64,
        offset: u64,
        data: Vec<u8>,
    ) -> PyResult<usize> {
        let (id, path) = self
            .writers
            .get(&handle)
            .cloned()
            .ok_or_else(|| PyValueError::new_err("not an open writer"))?;
        self.call(py, move |fs| fs.write(id, offset, &data))
            .map_err(|e| os_error(&path, e))
    }

    /// Publishes what was written (close-to-open) and forgets the handle.
    fn close_write(&mut self, py: Python<'_>, handle: u64) -> PyResult<()> {
        let Some((id, path)) = self.writers.remove(&handle) else {
            return Ok(());
        };
        self.call(py, move |fs| fs.close_write(id).map(|_| ()))
            .map_err(|e| os_error(&path, e))
    }

    /// Flushes what is unflushed under `path` to the backing directory and waits; the
    /// number of files flushed.
    #[pyo3(signature = (path="/"))]
    fn flush(&mut self, py: Python<'_>, path: &str) -> PyResult<usize> {
        let p = path.to_string();
        let sum = self
            .call(py, move |fs| -> Result<flush::Summary, FsError> {
                let i = fs.resolve(p.as_bytes())?;
                flush::enqueue_dirty(fs, i.id)?;
                Flusher::new(FlushOptions::default()).run(fs, &AtomicBool::new(false), &mut |_| {})
            })
            .map_err(|e| os_error(path, e))?;
        if let Some((p, e)) = sum.failed.first() {
            return Err(PyOSError::new_err(format!(
                "flush of {}: {e}",
                String::from_utf8_lossy(p)
            )));
        }
        Ok(sum.files)
    }
}
