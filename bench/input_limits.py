#!/usr/bin/env python3
"""Benchmark: time and peak memory of ``shaperd check-config`` on oversized and hostile tenants files.

    .venv/bin/python bench/input_limits.py [--repeat 3] [--json]

Owns: generating the files (in a temporary directory) and running the CLI on each in a fresh process
(``/usr/bin/time -f '%e %M'``: wall seconds, peak RSS KiB), reporting median and spread over
``--repeat`` runs with the load average. The files: 100 MB of real bytes; the issue's 400,000 tenants
(33 MB); billion laughs; 65,505 tenants in flow style (under the size cap, one over the tenant limit);
65,504 tenants in block style with label matches (the largest accepted file, 6.7 MiB); brackets nested
100,000 deep. Must not: touch the kernel (check-config is pure) or keep the files.
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


def tenants_block(n: int) -> str:
    lines = ["node: {interfaces: [eth0], capacity: 100Tbps}", "tenants:"]
    lines += [f"  - name: tenant-{i}\n    bandwidthGuarantee: 1Mbps\n    priority: 1\n    match: {{podLabels: {{team: t{i}}}}}"
              for i in range(n)]
    return "\n".join(lines) + "\n"


def tenants_flow(n: int) -> str:
    return "node: {interfaces: [eth0], capacity: 100Tbps}\ntenants:\n" + "".join(
        f"- {{name: t{i}, bandwidthGuarantee: 1Mbps}}\n" for i in range(n))


def laughs() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join(f'*a{i - 1}' for _ in range(9))}]" for i in range(1, 10)]
    return "\n".join(lines) + "\ntenants: *a9\n"


CASES = {
    "100 MB file": lambda: tenants_flow(10) + "#" * (100 * 10**6),
    "400,000 tenants (33 MB)": lambda: tenants_block(400_000).replace("    match: {podLabels: {team: t", "    #{").replace(
        "1Mbps\n    priority: 1", "1Mbps\n    priority: 1"),
    "billion laughs (9^9 via 81 aliases)": laughs,
    "65,505 tenants, flow style": lambda: tenants_flow(65_505),
    "65,504 tenants, block style (largest accepted)": lambda: tenants_block(65_504),
    "brackets nested 100,000 deep": lambda: "a: " + "[" * 100_000 + "\n",
}


def run_one(path: Path) -> tuple[float, int, int, str]:
    r = subprocess.run(["/usr/bin/time", "-f", "%e %M", PY, "-m", "shaperd", "check-config", str(path)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    *rest, last = r.stderr.strip().splitlines()
    wall, kib = last.split()
    first = (r.stdout.strip().splitlines() or rest or [""])[0] if r.returncode == 0 else \
        next((ln for ln in rest if "problem" in ln or " - " in ln or "limit" in ln), rest[-1] if rest else "")
    detail = "\n".join(rest[-3:]) if r.returncode else first
    return float(wall), int(kib), r.returncode, detail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="shpd-limits-") as tmp:
        for name, make in CASES.items():
            p = Path(tmp) / "t.yaml"
            p.write_text(make())
            size = p.stat().st_size
            runs = [run_one(p) for _ in range(args.repeat)]
            with open("/proc/loadavg") as f:
                load = " ".join(f.read().split()[:3])
            walls, mems = [r[0] for r in runs], [r[1] for r in runs]
            rows.append({"case": name, "bytes": size, "exit": runs[-1][2], "message": runs[-1][3][-300:],
                         "wall_s_median": statistics.median(walls), "wall_s_min": min(walls), "wall_s_max": max(walls),
                         "peak_rss_mib_median": statistics.median(mems) / 1024, "load": load})
            p.unlink()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['case']:48} {r['bytes']:>11,} B exit {r['exit']}  {r['wall_s_median']:.2f} s "
                  f"({r['wall_s_min']:.2f}..{r['wall_s_max']:.2f})  {r['peak_rss_mib_median']:.0f} MiB  load {r['load']}")
            print(f"    {r['message'].splitlines()[-1] if r['message'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
