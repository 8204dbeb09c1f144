#!/usr/bin/env python3
"""Benchmark: what one metrics scrape costs with 64 tenants on 8 devices.

    /tmp/venv/bin/python bench/scrape.py [--runs N] [--tenants 64] [--devices 8] [--present 4] [--json]   (as root)

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

Then the series count per node, two ways, on the same snapshot: every tenant
(``shaperd run --metrics-all-tenants``, the timed runs above) and the default,
the tenants present on the node only. ``--present N`` puts one pod of each of
the first N tenants on the node (an inventory with a pod whose IP is in the
tenant's cidrs, Kubernetes discovery on), and report/presence.py decides who
is present, as the daemon does after a reconcile; the bounded exposition is
timed too (render_present).
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


def tenant_series(body: bytes) -> int:
    return sum(1 for l in body.splitlines() if l.startswith(b"shaperd_tenant_"))


def bounded(metrics_all, sampler, cfg, plan, n: int, runs: int):
    """(present tenants, per-tenant series all / present, series present, render times) on the current snapshot."""
    from shaperd.core.inventory import Inventory, Pod
    from shaperd.core.tenancy import tenancy
    from shaperd.report.presence import present_tenants

    inv = Inventory(links=plan.tenancy.uplinks, pods=tuple(
        Pod(f"uid-{i}", "default", f"worker-{i}", ips=(f"198.18.{i}.10",)) for i in range(n)))
    present = present_tenants(cfg, inv, tenancy(cfg, inv), pods_known=True)
    m = Metrics(sampler, CollectorRegistry(), all_tenants=False)
    m.present(present)
    body_all = metrics_all.exposition()
    body = m.exposition()
    times = []
    for _ in range(runs):
        m.collectors.collectors["tenants"]._cached = None  # uncached, as on a new snapshot
        t0 = time.perf_counter()
        m.exposition()
        times.append(time.perf_counter() - t0)
    count = lambda b: sum(1 for l in b.splitlines() if l and not l.startswith(b"#"))  # noqa: E731
    return present, tenant_series(body_all), tenant_series(body), count(body), times


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--tenants", type=int, default=64)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--present", type=int, default=4, help="tenants with a pod on the node (default 4)")
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
            loaded = load_file(cfg)
            plan = reconciler(args, probe=False).plan(loaded)
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
        present, per_tenant_all, per_tenant_present, series_present, t["render_present"] = bounded(
            metrics, sampler, loaded, plan, a.present, a.runs)
        server.stop()
        reader.close()
    res = {"tenants": a.tenants, "devices": a.devices, "classes_read": classes, "series": series,
           "exposition_bytes": size, "runs": a.runs, "present": sorted(present),
           "series_all_tenants": series, "tenant_series_all_tenants": per_tenant_all,
           "series_present_only": series_present, "tenant_series_present_only": per_tenant_present}
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
    print(f"  series per node: {series} with --metrics-all-tenants ({per_tenant_all} per-tenant), "
          f"{series_present} by default with {len(present)} tenants present ({per_tenant_present} per-tenant)")
    r = res["scrape_http_ms"]
    print(f"  budget 20 ms per scrape (GET /metrics, new snapshot): median {r['median']:.2f} ms, p90 {r['p90']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
