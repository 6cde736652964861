"""memfabric's burst buffer as an fsspec filesystem: ``memfabric://``.

Registered under the ``fsspec.specs`` entry point, so once the package is installed,
pandas, Dask, xarray and anything else that takes fsspec URLs reads and writes
burst-buffer files::

    import pandas as pd
    df.to_csv("memfabric://127.0.0.1:11311/run42/table.csv")          # UCX (the default)
    pd.read_csv("memfabric://127.0.0.1:11311/run42/table.csv")
    pd.read_csv("memfabric:///run42/table.csv",
                storage_options={"servers": "h1:11211,h2:11211", "replicas": 1})

The URL's host is a server (``transport="ucx"``, the default, reaches memfabricd's UCX
port; ``"tcp"`` its memcached port); ``storage_options`` take ``servers`` (a whole pool,
memfabric's server-list syntax), ``fs`` (the file system's name in the pool, default
``"default"``), ``backing`` (the backing directory: read-through and ``flush``),
``replicas``, ``ec`` ("4+2"), ``chunk`` and ``timeout_ms``. The files are the same ones
``memfabric bb`` and the FUSE mount see (docs/burst-buffer.md), with close-to-open
consistency: what a writer wrote is visible to opens after its ``close``.

Like ``memfabric.Client``, the native file system belongs to the thread that made it:
this filesystem keeps one per thread.
"""

import threading

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from ._native import NativeBb

__all__ = ["MemfabricFileSystem"]


class MemfabricFileSystem(AbstractFileSystem):
    protocol = ("memfabric",)
    root_marker = "/"

    def __init__(
        self,
        host=None,
        port=None,
        servers=None,
        transport="ucx",
        fs="default",
        backing=None,
        replicas=0,
        ec=None,
        chunk=0,
        timeout_ms=10000,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if servers is None:
            if host is None:
                raise ValueError("memfabric:// needs a server: memfabric://HOST:PORT/path, or servers=")
            where = f"{host}:{port}" if port else host
            servers = f"ucx://{where}" if transport == "ucx" else where
        elif transport == "ucx":
            servers = ",".join(
                s if "://" in s else f"ucx://{s}" for s in servers.split(",") if s
            )
        self._args = dict(
            servers=servers,
            name=fs,
            backing=backing,
            chunk=chunk,
            timeout_ms=timeout_ms,
            replicas=replicas,
            ec=ec,
        )
        self._local = threading.local()

    @property
    def native(self):
        n = getattr(self._local, "native", None)
        if n is None:
            n = NativeBb(**self._args)
            self._local.native = n
        return n

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("memfabric://"):
            path = path[len("memfabric://"):]
            slash = path.find("/")
            path = path[slash:] if slash >= 0 else "/"
        path = "/" + path.strip("/")
        return path

    @staticmethod
    def _get_kwargs_from_urls(path):
        out = {}
        if str(path).startswith("memfabric://"):
            netloc = str(path)[len("memfabric://"):].split("/", 1)[0]
            if netloc:
                host, _, port = netloc.rpartition(":")
                if host and port.isdigit():
                    out["host"], out["port"] = host, int(port)
                else:
                    out["host"] = netloc
        return out

    def _info(self, d):
        return {
            "name": d["name"],
            "size": d["size"],
            "type": d["type"],
            "mode": d["mode"],
            "mtime": d["mtime"],
            "flushed": d["flushed"],
            "sha256": d["sha256"],
        }

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        rows = [self._info(d) for d in self.native.ls(path)]
        return rows if detail else [r["name"] for r in rows]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._info(self.native.stat(path))

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        self.native.mkdir(path, parents=create_parents)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if not exist_ok and self.exists(path):
            raise FileExistsError(path)
        self.native.mkdir(path, parents=True)

    def rmdir(self, path):
        self.native.rm(self._strip_protocol(path), dir=True)

    def _rm(self, path):
        path = self._strip_protocol(path)
        self.native.rm(path, dir=self.isdir(path))

    def rm_file(self, path):
        self.native.rm(self._strip_protocol(path))

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        self.native.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def cp_file(self, path1, path2, **kwargs):
        with self.open(path1, "rb") as src, self.open(path2, "wb") as dst:
            while True:
                block = src.read(self.native.chunk_size() * 4)
                if not block:
                    break
                dst.write(block)

    def flush(self, path="/"):
        """Flush what is unflushed under ``path`` to the backing directory and wait for
        it; the number of files flushed."""
        return self.native.flush(self._strip_protocol(path))

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if block_size in (None, "default"):
            block_size = self.native.chunk_size() * 4
        return MemfabricFile(
            self, path, mode, block_size=block_size, autocommit=autocommit,
            cache_options=cache_options, **kwargs,
        )


class MemfabricFile(AbstractBufferedFile):
    """A burst-buffer file: reads in ranges, writes in blocks through the pipelined
    chunk writes; ``close`` publishes (close-to-open)."""

    def _fetch_range(self, start, end):
        return self.fs.native.read(self.path, start, end - start)

    def _initiate_upload(self):
        self._handle = self.fs.native.open_write(self.path, truncate=True)

    def _upload_chunk(self, final=False):
        data = self.buffer.getvalue()
        if data:
            self.fs.native.write(self._handle, self.offset, data)
        if final:
            self.fs.native.close_write(self._handle)
        return True

    def close(self):
        # An empty file written and closed is still a file.
        if self.mode == "wb" and not self.closed and self.offset is None and not self.buffer.tell():
            self._initiate_upload()
            self.offset = 0
        super().close()
