#!/usr/bin/env python3
"""Benchmark: time from a ConfigMap update through the API to the new class in the kernel (issue 12).

    sudo .venv/bin/python bench/configmap_latency.py [--trials 30]

The real daemon (``shaperd run --config-map kubeflow/training-network-isolation
--netns NODE --kubeconfig K``, resync 300 s so only the watch can explain a
change) follows the ConfigMap in the fake API server of the tests
(tests/k8s_fake.py). Each trial updates tenant-a's bandwidthLimit (alternating
5 and 6 Gbit/s) at t0 (put_object returns once the fake has the new version and
has woken its watches) and polls the node's HTB classes every 5 ms through this
process's own pyroute2 socket until tenant-a's ceil is the new value. Measured,
not asserted (tests/integration/test_configmap_api.py waits on the condition).
The namespaces and the daemon are removed even on failure.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyroute2 import IPRoute  # noqa: E402

from shaperd.backends.common.objects import ROOT_HANDLE  # noqa: E402
from shaperd.core.ids import assign_minors  # noqa: E402
from tests import procs  # noqa: E402
from tests.integration.conftest import PY, Bed  # noqa: E402
from tests.integration.test_configmap_api import CMS, configmap, tenants  # noqa: E402
from tests.k8s_fake import FakeKubeAPI, write_kubeconfig  # noqa: E402

A = ROOT_HANDLE | assign_minors(["tenant-a", "tenant-b"])["tenant-a"]
POLL_S = 0.005


def ceil_bps(ipr: IPRoute, idx: int) -> int:
    for c in ipr.get_classes(index=idx):
        if c["handle"] == A:
            opts = c.get_attr("TCA_OPTIONS")
            return 8 * (opts.get_attr("TCA_HTB_CEIL64") or opts.get_attr("TCA_HTB_PARMS")["ceil"])
    return 0


def wait_ceil(ipr, idx, want: int, timeout_s: float = 10.0) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if ceil_bps(ipr, idx) == want:
            return time.monotonic()
        time.sleep(POLL_S)
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=30)
    args = ap.parse_args()
    bed = Bed(f"shpdcm{int(time.time()) % 10000}")
    api = FakeKubeAPI()
    lat_ms: list[float] = []
    try:
        bed.build()
        api.collection(CMS)
        api.put_object(CMS, configmap(tenants("6Gbps")))
        tmp = Path(tempfile.mkdtemp(prefix="shpdcm"))
        kubeconfig = write_kubeconfig(tmp / "kubeconfig", api.url)
        with open(tmp / "daemon.log", "w") as logf, procs.running(
            [PY, "-m", "shaperd", "--log-json", "run", "--config", str(tmp / "absent.yaml"), "--netns", bed.node,
             "--config-map", "kubeflow/training-network-isolation", "--kubeconfig", str(kubeconfig),
             "--no-kubernetes", "--metrics-address", "", "--resync-interval", "300"],
            stdout=subprocess.DEVNULL, stderr=logf,
        ), IPRoute(netns=bed.node) as ipr:
            idx = ipr.link_lookup(ifname="up0")[0]
            if wait_ceil(ipr, idx, 6 * 10**9, 30) is None:
                print("daemon never enforced the first ConfigMap", file=sys.stderr)
                return 1
            for i in range(args.trials):
                gbit = 5 if i % 2 == 0 else 6
                t0 = time.monotonic()
                api.put_object(CMS, configmap(tenants(f"{gbit}Gbps")))
                t1 = wait_ceil(ipr, idx, gbit * 10**9)
                if t1 is None:
                    print(f"trial {i}: not enforced within 10 s", file=sys.stderr)
                    return 1
                lat_ms.append((t1 - t0) * 1000)
    finally:
        api.close()
        bed.cleanup()
    q = statistics.quantiles(lat_ms, n=10)
    print(f"{len(lat_ms)} updates: ConfigMap update -> kernel median {statistics.median(lat_ms):.1f} ms, "
          f"p90 {q[-1]:.1f} ms, min {min(lat_ms):.1f} ms, max {max(lat_ms):.1f} ms (5 ms poll)")
    print("loadavg:", Path("/proc/loadavg").read_text().strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
