#!/usr/bin/env python3
"""Benchmark: netlink faults injected at the kernel boundary, per kind, with recovery figures (issue 14).

    sudo .venv/bin/python bench/netlink_faults.py [--trials 20] [--timeout 5] [--json]

A node namespace with two veth uplinks, up0 and up2, shaped from one tenants
file (8 tenants, 40 prefixes) in process, as ``shaperd run`` does: each
trial starts from fresh devices, injects one fault (kernel/faults.py) on up0
only during the first reconcile, then reconciles again as the daemon's retry
would, until up0's tree (read through netlink) equals up2's. up2 is the
fresh-apply reference and must be enforced after the first reconcile
whatever happened on up0. Per kind: faults injected (fired), what the agent
did (retries, errors), matches, time from the first reconcile to the
matching state (the daemon's backoff pause is not slept here: it is added
by the daemon, 1 s for the first retry), VmRSS of this process before and
after the trials. ``--timeout`` is the writer's and reader's per-exchange
deadline (production: 5 s).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from shaperd_bed import netns  # noqa: E402

from tests.tc_state import snapshot  # noqa: E402

TENANTS, PREFIXES = 8, 40


def config_text() -> str:
    lines = ["node: {interfaces: [up0, up2], capacity: 10Gbps}", "tenants:"]
    for i in range(TENANTS):
        cidrs = ", ".join(f"198.19.{i}.{j}/32" for j in range(PREFIXES // TENANTS))
        lines.append(f"  - {{name: t{i}, bandwidthGuarantee: 500Mbps, priority: {i * 10}, match: {{cidrs: [{cidrs}]}}}}")
    return "\n".join(lines) + "\n"


def vmrss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from shaperd.core import log
    from shaperd.core.config import load_text
    from shaperd.engine.reconciler import Reconciler, default_backends
    from shaperd.kernel import faults, tc
    from shaperd.engine.probe import probe_capabilities
    from shaperd.kernel.rtnl import RTM_GETTCLASS, RtnlReader

    log.configure(json=True, level="critical")
    import dataclasses

    caps = dataclasses.replace(probe_capabilities(), bpf_maps=False)  # the u32 path: all state is tc objects
    cfg = load_text(config_text())
    nets = netns.Namespaces(stop_grace_s=0)
    node = nets.add(f"shf{os.getpid() % 100000}")
    netns.veth("up0", node, "up1", node)
    netns.veth("up2", node, "up3", node)
    kinds = {
        "EPERM on every write": lambda p, i: p.refuse(errno.EPERM, ifindex=i),
        "EINVAL on every write": lambda p, i: p.refuse(errno.EINVAL, ifindex=i),
        "EBUSY once": lambda p, i: p.refuse(errno.EBUSY, ifindex=i, times=1),
        "EBUSY 3 times": lambda p, i: p.refuse(errno.EBUSY, ifindex=i, times=3),
        "ENOBUFS once": lambda p, i: p.refuse(errno.ENOBUFS, ifindex=i, times=1),
        "reply never comes (write)": lambda p, i: p.no_answer(ifindex=i, times=1),
        "reply never comes (read)": lambda p, i: p.read_silent(msg_type=RTM_GETTCLASS, ifindex=i, times=1),
        "dump interrupted twice": lambda p, i: p.dump_interrupted(msg_type=RTM_GETTCLASS, ifindex=i, times=2),
        "dump interrupted always": lambda p, i: p.dump_interrupted(msg_type=RTM_GETTCLASS, ifindex=i, times=4),
    }
    rows = []
    try:
        writer, reader = tc.open_writer(node), RtnlReader(node, timeout_s=a.timeout)
        writer.nl.timeout_s = a.timeout
        rec = Reconciler(reader, default_backends(writer), caps)
        idx = {l.name: l.ifindex for l in reader.links()}
        for kind, install in kinds.items():
            rss0 = vmrss_kib()
            fired = matched = other_ok = 0
            recover, reconciles, errors = [], [], set()
            for _ in range(a.trials):
                for dev in ("up0", "up2"):
                    netns.run(["tc", "qdisc", "del", "dev", dev, "root"], node, check=False)
                if "read" in kind or "dump" in kind:
                    # Reads of a device's classes happen only where the tree is shaperd's: start from an
                    # applied tree with drift on both devices (the default class's leaf removed), so the
                    # reconcile under the fault has work on each.
                    rec.apply(cfg)
                    for dev in ("up0", "up2"):
                        netns.run(["tc", "qdisc", "del", "dev", dev, "parent", "7368:2"], node)
                plan = faults.FaultPlan()
                install(plan, idx["up0"])
                t0 = time.perf_counter()
                with faults.installed(plan):
                    rep = rec.apply(cfg)
                fired += plan.fired
                for d in rep.devices:
                    if d.backend == "htb" and d.device == "up0":
                        errors |= {str(e).split(": ", 1)[1][:60] for _op, e in d.failed[:1]}
                        if d.error:
                            errors.add(d.error.split(": ", 1)[1][:60])
                    if d.backend == "htb" and d.device == "up2" and not d.failed and not d.error:
                        other_ok += 1
                n = 1
                # The fault has cleared: the daemon's retry (after its backoff) or its next resync.
                while snapshot(reader, idx["up0"], "up0") != snapshot(reader, idx["up2"], "up2") and n < 5:
                    rec.apply(cfg)
                    n += 1
                ok = snapshot(reader, idx["up0"], "up0") == snapshot(reader, idx["up2"], "up2")
                matched += ok
                if ok:
                    recover.append(time.perf_counter() - t0)
                reconciles.append(n)
            rows.append({"fault": kind, "trials": a.trials, "injected": fired, "matches": matched,
                         "other_device_enforced": other_ok, "reconciles_median": statistics.median(reconciles),
                         "recover_s_median": statistics.median(recover) if recover else None,
                         "recover_s_min": min(recover, default=None), "recover_s_max": max(recover, default=None),
                         "errors": sorted(errors), "rss_kib_before": rss0, "rss_kib_after": vmrss_kib(),
                         "loadavg": Path("/proc/loadavg").read_text().strip()})
            print(json.dumps(rows[-1]), flush=True)
        writer.close()
        reader.close()
    finally:
        nets.cleanup()
    return 0 if all(r["matches"] == r["trials"] == r["other_device_enforced"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
