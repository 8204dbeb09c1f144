#!/usr/bin/env python3
"""Benchmark: what one metrics scrape costs with 64 tenants on 8 devices.

    /tmp/venv/bin/python bench/scrape.py [--runs N] [--tenants 64] [--devices 8] [--json]   (as root)

Builds a network namespace with 8 veth pairs, lets ``shaperd apply`` put
64 tenant classes (plus root and default) on each, serves the daemon's
metrics (report.metrics.Metrics behind report.http.MetricsServer on
127.0.0.1) and, per run:

a. sample: one read of every shaperd class on every shaped device (a link
   dump, a qdisc dump, one class dump per device) through
   kernel/rtnl.RtnlReader -- what the daemon's sampler thread does every
   0.5 s, off the scrape path;
b. ingest: feeding that sample through the accounting (report.sampler) and
   publishing the new snapshot;
c. scrape_http: ``GET /metrics`` on a new connection, body read in full --
   what a Prometheus scrape costs. Every run has a new snapshot, so every
   GET renders the tenant text (the uncached case);
d. render: ``Metrics.exposition()`` in process on a new snapshot (the
   /metrics body without HTTP);
e. render_reference: ``generate_latest`` of the same registry (the
   prometheus_client rendering /metrics used before; for comparison);
f. scrape_http_cached: ``GET /metrics`` again on the same snapshot (a second
   scraper within the same 0.5 s sample; the tenant text is reused).

Prints median, min, p90 and max over the runs.
Timings only; nothing is asserted (tests do not assert timings). The
namespace (shaperd_bed.netns) is removed even on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from shaperd_bed import netns

from shaperd.backends.htb.backend import HtbBackend
from shaperd.backends.htb.observe import read_counters
from shaperd.kernel.rtnl import RtnlReader
from shaperd.report.http import MetricsServer
from shaperd.report.metrics import Metrics
from shaperd.report.sampler import Sampler, Snapshot


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
    with netns.Namespaces() as nets:
        ns = nets.add(f"shpd-bench-scrape-{os.getpid()}")
        for i in range(a.devices):
            netns.veth(f"bs{i}", ns, f"bsp{i}", ns)
        with tempfile.TemporaryDirectory() as d:
            cfg = Path(d) / "tenants.yaml"
            cfg.write_text(config(a.tenants, a.devices))
            netns.run([sys.executable, "-m", "shaperd", "--log-level", "error", "apply", "--config", str(cfg)], ns,
                      timeout=120)
            from shaperd.cli.node import reconciler  # the plan, to label classes as the daemon does
            from shaperd.core.config import load_file

            args = argparse.Namespace(netns=ns, take_over=False, sysfs_root="/sys", procfs_root="/proc",
                                      run_root="/run", kubelet_root="/var/lib/kubelet")
            plan = reconciler(args, probe=False).plan(load_file(cfg))
        reader = RtnlReader(ns)
        sampler = Sampler(lambda: read_counters(reader))  # its thread is not started: the runs below sample in turn
        sampler.set_targets(HtbBackend(None).stats(plan.desired["htb"]).targets)
        metrics = Metrics(sampler, CollectorRegistry())
        server = MetricsServer("127.0.0.1:0", metrics)
        server.start()
        host, port = server.address[:2]

        def get() -> bytes:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            try:
                conn.request("GET", "/metrics")
                r = conn.getresponse()
                body = r.read()
                if r.status != 200:
                    raise RuntimeError(f"GET /metrics: {r.status}")
                return body
            finally:
                conn.close()

        t = {k: [] for k in ("sample", "ingest", "scrape_http", "render", "render_reference", "scrape_http_cached")}

        def new_snapshot() -> dict:
            t0 = time.perf_counter()
            stats = read_counters(reader)
            t1 = time.perf_counter()
            sampler.acc.ingest(time.monotonic(), stats, sampler.targets)
            prev = sampler.snapshot
            sampler.snapshot = Snapshot(sampler.acc.view(), time.time(), True, None, t1 - t0, prev.samples + 1)
            t["sample"].append(t1 - t0)
            t["ingest"].append(time.perf_counter() - t1)
            return stats

        for _ in range(3):  # warm-up: caches, first-time imports
            new_snapshot()
            get()
            generate_latest(metrics.registry)
        for k in t:
            t[k].clear()
        classes = series = size = 0
        for _ in range(a.runs):
            stats = new_snapshot()
            t0 = time.perf_counter()
            body = get()
            t1 = time.perf_counter()
            get()
            t2 = time.perf_counter()
            t["scrape_http"].append(t1 - t0)
            t["scrape_http_cached"].append(t2 - t1)
            new_snapshot()
            t0 = time.perf_counter()
            metrics.exposition()
            t1 = time.perf_counter()
            generate_latest(metrics.registry)
            t2 = time.perf_counter()
            t["render"].append(t1 - t0)
            t["render_reference"].append(t2 - t1)
            classes, size = len(stats), len(body)
            series = sum(1 for l in body.splitlines() if l and not l.startswith(b"#"))
        server.stop()
        reader.close()
    res = {"tenants": a.tenants, "devices": a.devices, "classes_read": classes, "series": series,
           "exposition_bytes": size, "runs": a.runs}
    for name, xs in t.items():
        res[name + "_ms"] = {"median": statistics.median(xs) * 1e3, "min": min(xs) * 1e3, "p90": pct(xs, 0.9) * 1e3,
                             "max": max(xs) * 1e3}
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{a.tenants} tenants x {a.devices} devices: {classes} classes read, {series} series, "
          f"{size} bytes of exposition; {a.runs} runs")
    for name in t:
        r = res[name + "_ms"]
        print(f"  {name:<18} median {r['median']:7.2f} ms   min {r['min']:7.2f}   p90 {r['p90']:7.2f}   max {r['max']:7.2f}")
    r = res["scrape_http_ms"]
    print(f"  budget 20 ms per scrape (GET /metrics, new snapshot): median {r['median']:.2f} ms, p90 {r['p90']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
