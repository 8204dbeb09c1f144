#!/usr/bin/env python3
"""Benchmark: bursts of 1,000 interface events on a node while ``shaperd run`` enforces its uplink (issue 14).

    sudo .venv/bin/python bench/device_churn.py [--runs 3] [--devices 200] [--settle 5]

Two modes per run (tests/churn_burst.py): the daemon SIGSTOPped through the
burst (its event socket surely overflows: ENOBUFS), and the daemon running
(it reads events while they come). Per burst: overflows logged, reconciles
until quiet and in the ``--settle`` seconds after (a busy loop would show
there), the daemon's CPU seconds, time to recover, RSS before and after,
whether the uplink matches a fresh apply. /proc/loadavg is printed beside.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.churn_burst import run_burst  # noqa: E402
from tests.kill_trials import KillBed  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--devices", type=int, default=200, help="devices per burst (5 events each)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds watched after the daemon is quiet")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    ok = True
    with tempfile.TemporaryDirectory(prefix="shaperd-churn-") as work:
        bed = KillBed(f"shd{os.getpid() % 100000}", Path(work), tenants=40, prefixes_each=50)
        try:
            bed.build()
            for run in range(a.runs):
                for stopped in (True, False):
                    r = run_burst(bed, a.devices, stopped, a.settle)
                    ok &= r.matches
                    row = {"run": run, "daemon": "stopped" if stopped else "running", **dataclasses.asdict(r),
                           "loadavg": Path("/proc/loadavg").read_text().strip()}
                    print(json.dumps(row), flush=True)
        finally:
            bed.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
