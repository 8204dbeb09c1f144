#!/usr/bin/env python3
"""Benchmark (issue 15 follow-ups): what the start-up and per-reconcile probes cost.

    sudo .venv/bin/python bench/probe_costs.py [--calls 200] [--runs 3]

- device probe (discovery/htb_offload.py DeviceProbe.probe): the HTB offload
  capability of one uplink, read per reconcile (driver from sysfs,
  hw-tc-offload through ethtool generic netlink, one socket per call);
- kind question (kernel/kind_ask.py ask("fq")): the probe's request the kernel
  must refuse, asked once at start where the kernel's files say nothing of
  sch_fq (this host: ENOENT; a kernel with sch_fq: EINVAL).

Both in a fresh namespace (a veth with 4 TX queues), ``--calls`` calls per
run, ``--runs`` runs; prints per-call median and the spread of the run
medians, with /proc/loadavg. Namespaces are removed on exit. Nothing here is
asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from shaperd_bed import netns  # noqa: E402

NS = f"shb-probe-{os.getpid()}"


def _per_call_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    from shaperd.backends.htb.offload_probe import DeviceProbe
    from shaperd.core.inventory import Link
    from shaperd.kernel import kind_ask, netns as knetns

    netns.add_netns(NS)
    try:
        netns.run(["ip", "link", "add", "up0", "numtxqueues", "4", "type", "veth", "peer", "name", "up1"], NS)
        netns.run(["ip", "link", "set", "up0", "up"], NS)
        idx = netns.link(NS, "up0")["ifindex"]
        link = Link("up0", idx, kind="veth", tx_queues=4)
        probe = DeviceProbe(NS)
        out: dict = {"loadavg_before": open("/proc/loadavg").read().strip()}
        dev_runs, ask_runs = [], []
        answer = None
        for _ in range(args.runs):
            dev_runs.append(_per_call_us(lambda: probe.probe([link]), args.calls))

            def ask():
                nonlocal answer
                with knetns.entered(NS):
                    answer = kind_ask.ask("fq")

            ask_runs.append(_per_call_us(ask, args.calls))
        out.update({
            "device_probe_us": {"median": round(statistics.median(dev_runs), 1), "runs": [round(x, 1) for x in dev_runs]},
            "kind_ask_us": {"median": round(statistics.median(ask_runs), 1), "runs": [round(x, 1) for x in ask_runs],
                            "answer": str(answer)},
            "device_probe_answer": str(probe.probe([link])["up0"]),
            "calls_per_run": args.calls, "loadavg_after": open("/proc/loadavg").read().strip(),
        })
        print(json.dumps(out))
        print(f"| device probe, one uplink | {out['device_probe_us']['median']} µs per call "
              f"(runs {', '.join(map(str, out['device_probe_us']['runs']))}) | {out['loadavg_after']} |")
        print(f"| kind question (fq on lo) | {out['kind_ask_us']['median']} µs per call "
              f"(runs {', '.join(map(str, out['kind_ask_us']['runs']))}); {answer.state} | {out['loadavg_after']} |")
    finally:
        netns.delete_netns(NS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
