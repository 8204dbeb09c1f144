#!/usr/bin/env python3
"""Benchmark (not CI): the bad-input properties of tests/fuzz_inputs.py with a long budget.

    .venv/bin/python bench/fuzz.py [--examples 20000] [--json]

Owns: running each property (tenants loader, pod objects, pod-resources bytes and messages, pod
bandwidth annotations beside steady pods, the tenants' ingress block) for
``--examples`` random inputs (hypothesis, not derandomized: each run explores new inputs) and
reporting per property: inputs tried, accepted / refused, the slowest input, wall time, and the first
failure (a traceback other than the typed errors, or an input over fuzz_inputs.MAX_INPUT_S) with the
input that caused it. Must not: touch the kernel (pure functions only); no root needed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from shaperd.core.roots import Roots  # noqa: E402
from tests import fuzz_inputs as fz  # noqa: E402

NO_SYSFS = Roots.of(sys="/nonexistent-sysfs")
PROPERTIES = {
    "tenants file": (fz.tenants_texts, fz.check_tenants_text),
    "pod objects": (fz.pod_objects, fz.check_pod_object),
    "pod-resources bytes": (fz.pod_resources_bytes, lambda b: fz.check_pod_resources_bytes(b, NO_SYSFS)),
    "pod-resources messages": (fz.pod_resources_messages, lambda m: fz.check_pod_resources_message(m, NO_SYSFS)),
    "pod annotations": (fz.annotated_pods, fz.check_annotated_pods),
    "ingress block": (fz.ingress_texts, fz.check_ingress_text),
}


def run(name: str, strategy, check, examples: int) -> dict:
    outcomes: collections.Counter = collections.Counter()
    slowest = [0.0, None]

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def prop(x):
        t = time.perf_counter()
        outcomes[check(x)] += 1
        took = time.perf_counter() - t
        if took > slowest[0]:
            slowest[:] = [took, repr(x)[:120]]

    start = time.perf_counter()
    failure = None
    try:
        prop()
    except Exception:
        failure = traceback.format_exc(limit=-3)[-2000:]
    return {"property": name, "inputs": sum(outcomes.values()), "accepted": outcomes["accepted"],
            "refused": outcomes["refused"], "slowest_ms": round(slowest[0] * 1000, 1), "slowest_input": slowest[1],
            "wall_s": round(time.perf_counter() - start, 1), "failure": failure}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    rows = [run(n, s, c, args.examples) for n, (s, c) in PROPERTIES.items()]
    doc = {"examples_per_property": args.examples, "load_start": load, "rows": rows, "pid": os.getpid()}
    with open("/proc/loadavg") as f:
        doc["load_end"] = " ".join(f.read().split()[:3])
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        for r in rows:
            print(f"{r['property']:24} {r['inputs']:6} inputs ({r['accepted']} accepted, {r['refused']} refused), "
                  f"slowest {r['slowest_ms']} ms, {r['wall_s']} s, {'FAILED' if r['failure'] else 'ok'}")
            if r["failure"]:
                print(r["failure"])
        print(f"load {doc['load_start']} -> {doc['load_end']}")
    return 1 if any(r["failure"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
