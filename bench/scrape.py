#!/usr/bin/env python3
"""Benchmark: what one metrics scrape target costs with 64 tenants on 8 devices.

    sudo /tmp/venv/bin/python bench/scrape.py [--runs N] [--tenants 64] [--devices 8] [--json]

Builds a network namespace with 8 veth pairs, lets ``shaperd apply`` put
64 tenant classes (plus root and default) on each, then times, on one netlink
socket opened beforehand:

a. sample: one read of every shaperd class on every shaped device (a link
   dump, a qdisc dump, one class dump per device) through
   kernel/tcstats.StatsReader -- what the daemon's sampler thread does every
   0.5 s; the same read through pyroute2 (report.status.sample, what
   ``shaperd status`` uses) is timed too, for comparison;
b. ingest: feeding that sample through the accounting (report.sampler);
c. expose: ``generate_latest`` of the daemon's registry (what an HTTP
   scrape runs; it reads the snapshot, never the kernel);
d. total = a + b + c: the cost of one scrape target if it sampled on demand.

Prints median, min, max and p90 over the runs. Timings only; nothing is
asserted (tests do not assert timings). The namespace is removed even on
failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from shaperd.kernel import tc
from shaperd.kernel.tcstats import StatsReader
from shaperd.report.metrics import Metrics
from shaperd.report.sampler import Sampler, targets_from_plan
from shaperd.report.status import sample


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def config(tenants: int, devices: int) -> str:
    lines = ["node:", f"  interfaces: [{', '.join(f'bs{i}' for i in range(devices))}]", "  capacity: 100Gbps", "tenants:"]
    for t in range(tenants):
        lines += [f"  - name: t{t:03d}", "    bandwidthGuarantee: 1Gbps", "    bandwidthLimit: 50Gbps",
                  f"    priority: {t % 4}", f"    match: {{cidrs: [198.18.{t}.0/24]}}"]
    return "\n".join(lines) + "\n"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--tenants", type=int, default=64)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    ns = f"shpd-bench-scrape-{os.getpid()}"
    run("ip", "netns", "add", ns)
    try:
        for i in range(a.devices):
            run("ip", "-n", ns, "link", "add", f"bs{i}", "type", "veth", "peer", "name", f"bsp{i}")
            run("ip", "-n", ns, "link", "set", f"bs{i}", "up")
            run("ip", "-n", ns, "link", "set", f"bsp{i}", "up")
        with tempfile.TemporaryDirectory() as d:
            cfg = Path(d) / "tenants.yaml"
            cfg.write_text(config(a.tenants, a.devices))
            run("ip", "netns", "exec", ns, sys.executable, "-m", "shaperd", "--log-level", "error", "apply",
                "--config", str(cfg))
            from shaperd.cli import _reconciler  # the plan, to label classes as the daemon does
            from shaperd.config import load_file

            args = argparse.Namespace(netns=ns, take_over=False, sysfs_root="/sys")
            plan = _reconciler(args, probe=False).plan(load_file(cfg))
        ipr = tc.open_netlink(ns)
        reader = StatsReader(ns)
        sampler = Sampler(reader.sample)
        sampler.set_targets(targets_from_plan(plan))
        metrics = Metrics(sampler, CollectorRegistry())
        sampler.sample_once()  # warm-up: caches, first-time imports
        generate_latest(metrics.registry)
        t_sample, t_ingest, t_expose, t_total, t_pyroute2 = [], [], [], [], []
        classes = series = size = 0
        for _ in range(a.runs):
            t0 = time.perf_counter()
            stats = reader.sample()
            t1 = time.perf_counter()
            sampler.acc.ingest(time.monotonic(), stats, sampler.targets)
            sampler.snapshot = type(sampler.snapshot)(sampler.acc.view(), time.time(), True)
            t2 = time.perf_counter()
            body = generate_latest(metrics.registry)
            t3 = time.perf_counter()
            t_sample.append(t1 - t0)
            t_ingest.append(t2 - t1)
            t_expose.append(t3 - t2)
            t_total.append(t3 - t0)
            classes, size = len(stats), len(body)
            series = sum(1 for l in body.splitlines() if l and not l.startswith(b"#"))
        for _ in range(max(5, a.runs // 10)):
            t0 = time.perf_counter()
            sample(ipr)
            t_pyroute2.append(time.perf_counter() - t0)
        ipr.close()
        reader.close()
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    res = {"tenants": a.tenants, "devices": a.devices, "classes_read": classes, "series": series,
           "exposition_bytes": size, "runs": a.runs}
    for name, xs in (("sample", t_sample), ("ingest", t_ingest), ("expose", t_expose), ("total", t_total),
                     ("sample_pyroute2", t_pyroute2)):
        res[name + "_ms"] = {"median": statistics.median(xs) * 1e3, "min": min(xs) * 1e3, "p90": pct(xs, 0.9) * 1e3,
                             "max": max(xs) * 1e3}
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{a.tenants} tenants x {a.devices} devices: {classes} classes read, {series} series, "
          f"{size} bytes of exposition; {a.runs} runs")
    for name in ("sample", "ingest", "expose", "total", "sample_pyroute2"):
        r = res[name + "_ms"]
        print(f"  {name:<15} median {r['median']:7.2f} ms   min {r['min']:7.2f}   p90 {r['p90']:7.2f}   max {r['max']:7.2f}")
    print(f"  budget 20 ms per scrape target: total median {res['total_ms']['median']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
