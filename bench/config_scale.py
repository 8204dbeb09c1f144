#!/usr/bin/env python3
"""Benchmark: ``shaperd check-config`` at the tenant limit, before and after the libyaml loader, as ratios
to a bare ``yaml.load(..., Loader=yaml.CSafeLoader)`` of the same file in the same run.

    .venv/bin/python bench/config_scale.py [--tenants 65504] [--over 70000] [--repeat 1] [--before REF] [--json]

Owns: writing the files (block and flow style, each tenant with a label match: the largest accepted
file and one over the limit), and timing in a fresh process each (``/usr/bin/time -f '%e %M'``: wall
seconds, peak RSS KiB): the bare C load, main's ``shaperd`` (``git archive main`` into a temporary
directory: "before"; ``--before REF`` for another commit) and this tree's ("after").
Must not: touch the kernel or keep the files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BARE = "import sys, yaml; yaml.load(open(sys.argv[1]).read(), Loader=yaml.CSafeLoader)"


def tenants(n: int, flow: bool) -> str:
    head = "node: {interfaces: [eth0], capacity: 100Tbps}\ntenants:\n"
    if flow:
        return head + "".join(f"- {{name: tenant-{i}, bandwidthGuarantee: 1Mbps, priority: 1, "
                              f"match: {{podLabels: {{team: t{i}}}}}}}\n" for i in range(n))
    return head + "".join(f"  - name: tenant-{i}\n    bandwidthGuarantee: 1Mbps\n    priority: 1\n"
                          f"    match: {{podLabels: {{team: t{i}}}}}\n" for i in range(n))


def timed(argv: list[str], pythonpath: Path) -> tuple[float, float, int]:
    r = subprocess.run(["/usr/bin/time", "-f", "%e %M", *argv], capture_output=True, text=True, timeout=1800,
                       cwd=pythonpath, env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"})
    wall, kib = r.stderr.strip().splitlines()[-1].split()
    return float(wall), int(kib) / 1024, r.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", type=int, default=65_504)
    ap.add_argument("--over", type=int, default=70_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--before", default="main", help="the commit to compare with (default main)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="shpd-cfgscale-") as tmp:
        before = Path(tmp) / "main"
        before.mkdir()
        arc = subprocess.run(["git", "archive", args.before, "shaperd"], cwd=ROOT, capture_output=True, check=True, timeout=60)
        subprocess.run(["tar", "-x", "-C", str(before)], input=arc.stdout, check=True, timeout=60)
        for n in (args.tenants, args.over):
            for flow in (False, True):
                p = Path(tmp) / "t.yaml"
                p.write_text(tenants(n, flow))
                res = {}
                for name, cmd, path in (("bare", [PY, "-c", BARE, str(p)], ROOT),
                                        ("before", [PY, "-m", "shaperd", "check-config", str(p)], before),
                                        ("after", [PY, "-m", "shaperd", "check-config", str(p)], ROOT)):
                    runs = [timed(cmd, path) for _ in range(args.repeat)]
                    res[name] = {"wall_s": statistics.median(r[0] for r in runs),
                                 "rss_mib": statistics.median(r[1] for r in runs), "exit": runs[-1][2]}
                with open("/proc/loadavg") as f:
                    load = " ".join(f.read().split()[:3])
                rows.append({"tenants": n, "style": "flow" if flow else "block", "bytes": p.stat().st_size,
                             "load": load, **res})
                p.unlink()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        b, o, a = r["bare"], r["before"], r["after"]
        print(f"{r['tenants']:>7,} {r['style']:5} {r['bytes']:>10,} B | bare {b['wall_s']:7.2f} s {b['rss_mib']:5.0f} MiB"
              f" | before {o['wall_s']:7.2f} s ({o['wall_s'] / b['wall_s']:4.1f}x) {o['rss_mib']:5.0f} MiB exit {o['exit']}"
              f" | after {a['wall_s']:7.2f} s ({a['wall_s'] / b['wall_s']:4.1f}x) {a['rss_mib']:5.0f} MiB exit {a['exit']}"
              f" | load {r['load']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
