"""The flash tier against Debian's memcached with extstore, started with the same
memcached extstore settings: pymemcache and pylibmc store a working set several times RAM
and read it back; every value that comes back is the one stored, both servers serve far
more than RAM holds, and memfabricd prints every ``extstore_*`` / ``*_extstore`` stat and
``ext_*`` setting memcached prints (what the Prometheus exporter and dashboards read).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pylibmc
import pytest
from pymemcache.client.base import Client

from conftest import KINDS

RAM_MB = 32
FLASH = "256m"  # a multiple of memcached's 64 MB ext_page_size
VLEN = 4000
KEYS = 24_000  # ~96 MB: three times RAM, within RAM + flash


def value(i: int) -> bytes:
    head = f"value-of-{i:06}:".encode()
    return (head * (VLEN // len(head) + 1))[:VLEN]


@pytest.fixture
def flash_dir():
    d = tempfile.mkdtemp(prefix="mff-", dir="/var/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(servers, kind: str, flash_dir: str):
    opts = (f"ext_path={os.path.join(flash_dir, kind)}:{FLASH},ext_item_size=512,"
            "ext_wbuf_size=8,ext_threads=4,ext_max_frag=0.8,ext_compact_under=2")
    return servers(kind, args=("-m", str(RAM_MB), "-o", opts))


def stats(c: Client, group: str | None = None) -> dict[str, str]:
    raw = c.stats(group) if group else c.stats()
    return {k.decode() if isinstance(k, bytes) else k:
            v.decode() if isinstance(v, bytes) else str(v) for k, v in raw.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_a_working_set_three_times_ram_is_served_from_flash(servers, flash_dir, kind):
    srv = start(servers, kind, flash_dir)
    c = Client(srv.addr, timeout=30)
    keys = [f"fk{i:06}" for i in range(KEYS)]
    for base in range(0, KEYS, 200):
        c.set_many({k: value(base + j) for j, k in enumerate(keys[base:base + 200])},
                   noreply=False)
    time.sleep(1.0)  # let the writers write what they buffer
    hits = 0
    for base in range(0, KEYS, 100):
        got = c.get_many(keys[base:base + 100])
        for k, v in got.items():
            i = int(k[2:])
            assert v == value(i), f"{kind}: wrong value for {k}"
            hits += 1
    ram_holds = RAM_MB * 1024 * 1024 // VLEN
    print(f"{kind}: {hits} of {KEYS} hits; RAM holds ~{ram_holds}")
    assert hits > 1.5 * ram_holds, f"{kind}: {hits} hits, RAM holds ~{ram_holds}"
    st = stats(c)
    assert int(st["extstore_objects_read"]) > 0
    assert int(st["get_extstore"]) > 0
    # pylibmc (libmemcached) reads the same values.
    mc = pylibmc.Client([srv.hostport], binary=False)
    for i in range(0, KEYS, 97):
        v = mc.get(keys[i])
        assert v is None or v == value(i), f"{kind}: pylibmc read a wrong value"
    c.close()


def test_memfabricd_prints_every_extstore_stat_and_setting_memcached_prints(servers,
                                                                             flash_dir):
    names = {}
    for kind in KINDS:
        srv = start(servers, kind, flash_dir)
        c = Client(srv.addr, timeout=10)
        c.set("k", b"v")
        general = stats(c)
        settings = stats(c, "settings")
        names[kind] = (
            {k for k in general if "extstore" in k},
            {k for k in settings if k.startswith("ext_")},
        )
        c.close()
    mc_general, mc_settings = names["memcached"]
    mf_general, mf_settings = names["memfabricd"]
    assert mc_general <= mf_general, f"missing: {sorted(mc_general - mf_general)}"
    assert mc_settings <= mf_settings, f"missing: {sorted(mc_settings - mf_settings)}"


def test_extstore_commands_answer_and_change_settings_as_memcacheds(servers, flash_dir):
    import socket

    lines = ["extstore item_size 1024", "extstore low_ttl 5", "extstore item_age 10",
             "extstore recache_rate 100", "extstore max_frag 0.5", "extstore drop_unread 1",
             "extstore compact_under 3", "extstore drop_under 2", "extstore max_sleep 100",
             "extstore bogus 1", "extstore item_size", "extstore ratio 0.5", "extstore",
             "extstore low_ttl abc"]
    seen = {}
    for kind in KINDS:
        for flash in (True, False):
            srv = start(servers, kind, flash_dir) if flash else servers(kind)
            s = socket.create_connection(srv.addr, timeout=10)
            f = s.makefile("rb")
            replies = []
            for line in lines:
                s.sendall(line.encode() + b"\r\n")
                replies.append(f.readline())
            c = Client(srv.addr, timeout=10)
            settings = {k: v for k, v in stats(c, "settings").items() if k.startswith("ext_")}
            settings.pop("ext_wbuf_size", None)  # given differently above
            seen[(kind, flash)] = (replies, settings)
            s.close()
            c.close()
    for flash in (True, False):
        assert seen[("memfabricd", flash)] == seen[("memcached", flash)], flash
