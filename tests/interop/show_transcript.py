#!/usr/bin/env python3
"""Print what a server answers to transcripts, step by step (for writing transcripts).

    .venv/bin/python tests/interop/show_transcript.py tests/interop/transcripts/ascii_incr.txt
    ... --server memfabricd     # a fresh memfabricd instead of a fresh memcached
    ... --server 127.0.0.1:11211  # an already running server (it will be written to!)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import start_server  # noqa: E402
from transcript import describe_request, parse_transcript, run_transcript  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--server", default="memcached", help="memcached, memfabricd or HOST:PORT")
    ns = ap.parse_args()
    for path in ns.files:
        t = parse_transcript(path)
        srv = None
        if ns.server in ("memcached", "memfabricd"):
            srv = start_server(ns.server)
            addr = srv.addr
        else:
            host, _, port = ns.server.rpartition(":")
            addr = (host, int(port))
        try:
            results = run_transcript(t, addr)
        finally:
            if srv is not None:
                srv.stop()
        print(f"##### {path.name} ({t.protocol})")
        for step, res in zip(t.steps, results):
            print(f"== {step.name}   (line {step.line})")
            print(f"   > {describe_request(res.request)}")
            for line in res.lines:
                print(f"   < {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
