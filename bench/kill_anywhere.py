#!/usr/bin/env python3
"""Benchmark: SIGKILL ``shaperd run`` at random points of first applies and large changes, N trials (issue 14).

    sudo .venv/bin/python bench/kill_anywhere.py [--trials 100] [--seed 14] [--tenants 40] [--prefixes 50] [--json]

Each trial (tests/kill_trials.py) kills the daemon's process group at a
uniform random point of the phase (start-up + first apply, or SIGHUP + large
change: a third of the tenants dropped, as many added, every other rate
changed), restarts it and checks: the uplink equals a fresh apply's (through
netlink), the unchanged tenant's counter was kept and grows, no process or
probe namespace is left. Prints one line per trial and a summary (recovery
time median and spread, RSS after restart, /proc/loadavg). Exit 0 when every
trial holds, 1 otherwise, 2 when it cannot run (not root).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.kill_trials import KillBed  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--tenants", type=int, default=40)
    ap.add_argument("--prefixes", type=int, default=50, help="/32 prefixes per tenant")
    ap.add_argument("--classifier", choices=["u32", "ebpf"], default="u32",
                    help="u32 pins the u32 path; ebpf is the default path (map entries compared too)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    load_before = Path("/proc/loadavg").read_text().strip()
    with tempfile.TemporaryDirectory(prefix="shaperd-kill-") as work:
        bed = KillBed(f"shk{os.getpid() % 100000}", Path(work), a.tenants, a.prefixes, classifier=a.classifier)
        try:
            bed.build()
            first_s, change_s = bed.measure()
            print(f"phase lengths: start-up + first apply {first_s:.2f} s, SIGHUP + change {change_s:.2f} s; "
                  f"{len(bed.ref_b['filters'])} filters, {len(bed.ref_b['classes'])} classes in the final state")
            rng = random.Random(a.seed)
            trials = []
            for n in range(a.trials):
                t = bed.trial(n, rng, first_s, change_s)
                trials.append(t)
                print(f"{n:3d} {t.kind:12s} kill@{t.kill_after_s:5.2f}s matches={t.matches} "
                      f"interrupted={t.interrupted} recover={t.recover_s:.2f}s kept={t.counter_kept} grew={t.counter_grew} "
                      f"rss={t.rss_kib_before}->{t.rss_kib_after}KiB left={t.leftovers} {t.error}", flush=True)
        finally:
            bed.cleanup()
    load_after = Path("/proc/loadavg").read_text().strip()
    ok = [t for t in trials if t.ok]
    rec = [t.recover_s for t in trials if t.matches]
    rss = [t.rss_kib_after for t in trials if t.rss_kib_after]
    summary = {
        "trials": len(trials), "ok": len(ok),
        "by_kind": {k: sum(1 for t in trials if t.kind == k) for k in ("first apply", "large change")},
        "recover_s_median": statistics.median(rec) if rec else None,
        "recover_s_min": min(rec, default=None), "recover_s_max": max(rec, default=None),
        "rss_kib_median": statistics.median(rss) if rss else None,
        "rss_kib_min": min(rss, default=None), "rss_kib_max": max(rss, default=None),
        "interrupted": {k: sum(1 for t in trials if t.kind == k and t.interrupted) for k in ("first apply", "large change")},
        "rss_kib_before_median": statistics.median([t.rss_kib_before for t in trials if t.kind == "large change"] or [0]),
        "leftovers": sum(len(t.leftovers) for t in trials),
        "loadavg_before": load_before, "loadavg_after": load_after,
    }
    print(json.dumps(summary, indent=None if not a.json else 2))
    return 0 if len(ok) == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
