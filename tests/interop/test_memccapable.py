"""libmemcached's conformance checker, memccapable, against both servers.

It runs its ascii tests (-a) and binary tests (-b) separately so a failure names the
protocol; every one of its tests must pass.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest


@pytest.mark.parametrize("protocol", ["ascii", "binary"])
def test_memccapable_passes_every_test(server, protocol):
    exe = shutil.which("memccapable")
    if exe is None:
        pytest.fail("memccapable is not installed (run scripts/setup.sh)", pytrace=False)
    flag = "-a" if protocol == "ascii" else "-b"
    try:
        proc = subprocess.run(
            [exe, "-h", "127.0.0.1", "-p", str(server.port), "-t", "5", flag],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"memccapable {flag} hung against {server.kind}:\n{e.stdout}", pytrace=False)
    out = proc.stdout + proc.stderr
    results = re.findall(r"^(.+?)\s+\[(\w+)\]\s*$", out, re.M)
    failed = [name.strip() for name, verdict in results if verdict != "pass"]
    assert results, f"memccapable printed no test results:\n{out}"
    assert proc.returncode == 0 and not failed and "All tests passed" in out, (
        f"memccapable {flag} against {server.kind}: failed {failed}, exit {proc.returncode}\n{out}"
    )
