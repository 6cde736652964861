"""The burst buffer through fsspec (``memfabric://``, memfabric's Python package) and
pandas: the same files the ``memfabric bb`` CLI sees, over UCX and TCP, with Python's
exceptions for a local file system's errors, and flushed to a backing directory."""

from __future__ import annotations

import hashlib
import os
import subprocess

import fsspec
import pandas as pd
import pytest

from conftest import memfabricd_path


def _ucx_port(srv) -> int:
    return int(srv.argv[srv.argv.index("--ucx-port") + 1])


def _cli() -> str:
    return os.path.join(os.path.dirname(memfabricd_path()), "memfabric")


@pytest.fixture
def bb(servers):
    srv = servers("memfabricd", args=("-m", "256"))
    return srv


def test_the_entry_point_registers_memfabric_urls():
    from memfabric.fsspec import MemfabricFileSystem

    assert fsspec.get_filesystem_class("memfabric") is MemfabricFileSystem


def test_pandas_writes_and_reads_a_table_and_the_cli_sees_the_same_file(bb, tmp_path):
    url = f"memfabric://127.0.0.1:{_ucx_port(bb)}/run42/table.csv"
    fs = fsspec.filesystem("memfabric", host="127.0.0.1", port=_ucx_port(bb), fs="pd")
    fs.makedirs("/run42", exist_ok=True)
    df = pd.DataFrame({"rank": range(1000), "value": [i * 0.5 for i in range(1000)]})
    df.to_csv(url, index=False, storage_options={"fs": "pd"})
    back = pd.read_csv(url, storage_options={"fs": "pd"})
    pd.testing.assert_frame_equal(back, df)
    # The CLI reads the file pandas wrote (another client, after its close).
    out = tmp_path / "table.csv"
    subprocess.run(
        [_cli(), "--servers", f"ucx://127.0.0.1:{_ucx_port(bb)}", "bb", "--fs", "pd",
         "cp", "bb:/run42/table.csv", str(out)],
        check=True, capture_output=True, timeout=60)
    with fsspec.open(url, "rb", fs="pd") as f:
        assert out.read_bytes() == f.read()
    info = fs.info("/run42/table.csv")
    assert info["type"] == "file" and info["size"] == out.stat().st_size
    assert [e["name"] for e in fs.ls("/run42")] == ["/run42/table.csv"]


@pytest.mark.parametrize("transport", ["ucx", "tcp"])
def test_large_binary_files_ranges_renames_and_removal(bb, transport):
    port = _ucx_port(bb) if transport == "ucx" else bb.port
    fs = fsspec.filesystem("memfabric", host="127.0.0.1", port=port, transport=transport,
                           fs=f"bin-{transport}", skip_instance_cache=True)
    data = os.urandom(3 * 1024 * 1024 + 17)
    with fs.open("/big.bin", "wb") as f:
        for i in range(0, len(data), 100_000):
            f.write(data[i:i + 100_000])
    assert fs.cat_file("/big.bin") == data
    assert fs.cat_file("/big.bin", start=1_048_570, end=1_048_600) == data[1_048_570:1_048_600]
    with fs.open("/big.bin", "rb") as f:
        f.seek(2_000_000)
        assert f.read(10) == data[2_000_000:2_000_010]
    fs.mv("/big.bin", "/moved.bin")
    assert not fs.exists("/big.bin")
    assert hashlib.sha256(fs.cat_file("/moved.bin")).digest() == hashlib.sha256(data).digest()
    fs.pipe_file("/empty", b"")
    assert fs.cat_file("/empty") == b"" and fs.info("/empty")["size"] == 0
    fs.rm("/moved.bin")
    assert not fs.exists("/moved.bin")


def test_errors_are_a_local_file_systems(bb):
    fs = fsspec.filesystem("memfabric", host="127.0.0.1", port=_ucx_port(bb), fs="errs",
                           skip_instance_cache=True)
    with pytest.raises(FileNotFoundError):
        fs.cat_file("/nope")
    fs.pipe_file("/f", b"x")
    with pytest.raises(NotADirectoryError):
        fs.pipe_file("/f/g", b"y")
    with pytest.raises(FileExistsError):
        fs.makedirs("/f")
    fs.mkdir("/d")
    fs.pipe_file("/d/x", b"1")
    with pytest.raises(OSError) as e:
        fs.rmdir("/d")
    assert e.value.errno == 39  # ENOTEMPTY
    with pytest.raises(OSError) as e:
        fs.pipe_file("/" + "n" * 256, b"1")
    assert e.value.errno == 36  # ENAMETOOLONG


def test_flush_puts_the_files_in_the_backing_directory(bb, tmp_path):
    backing = tmp_path / "pfs"
    backing.mkdir()
    fs = fsspec.filesystem("memfabric", host="127.0.0.1", port=_ucx_port(bb), fs="fl",
                           backing=str(backing), skip_instance_cache=True)
    fs.makedirs("/ckpt", exist_ok=True)
    blobs = {f"/ckpt/rank{i}": os.urandom(200_000 + i) for i in range(3)}
    for p, b in blobs.items():
        fs.pipe_file(p, b)
    assert not fs.info("/ckpt/rank0")["flushed"]
    assert fs.flush("/") == 4  # the directory and its three files
    for p, b in blobs.items():
        assert (backing / p.lstrip("/")).read_bytes() == b
        info = fs.info(p)
        assert info["flushed"] and info["sha256"] == hashlib.sha256(b).hexdigest()
    assert sorted(os.listdir(backing / "ckpt")) == ["rank0", "rank1", "rank2"]
