#!/usr/bin/env python3
"""Benchmark (issue 11, bounded writes): a first apply of 64 tenants x 50,000 /32 prefixes on the u32 path.

    sudo .venv/bin/python bench/bounded_writes.py [--prefixes 50000] [--tenants 64] [--runs 3] [--json]

Per run, on a fresh veth ``sh0`` in a namespace of its own (bench/apply_perf.py's helpers):

a. whole process: ``shaperd apply --netns NS --config FILE`` (interpreter, imports, probe, apply), wall time
   and peak RSS (GNU time's %M), then the same command again on the now in-sync device;
b. in process: ``Reconciler.apply`` on a fresh device, then again (in-sync resync: 0 changes), wall time of
   each, the writer's batch count, and VmRSS of this process after them;
c. ``tc -n NS -batch FILE`` of ``render.device_commands`` of the same plan on a fresh device (child process
   in its own group, killed at a deadline), wall time and peak RSS; then shaperd's diff of the tc-built
   device must be empty (the same tree).

Prints medians with min-max and /proc/loadavg before and after. Before the bounded writer, (a) and (b)
never returned from 3,000 prefixes on (the deadline kills the child and the run says so).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import apply_perf as ap  # noqa: E402

ap.CHILD_DEADLINE_S = 600.0
DEVICE = "sh0"


def config_dict(tenants: int, prefixes: int) -> dict:
    """``prefixes`` distinct /32s from 198.18.0.0/15 dealt round-robin to ``tenants`` (u32 only: no interfaces)."""
    base = int(ipaddress.ip_network("198.18.0.0/15").network_address)
    if prefixes > 1 << 17:
        raise ValueError("at most 131,072 /32s in 198.18.0.0/15")
    out = []
    for i in range(tenants):
        out.append({"name": f"t{i:02d}", "bandwidthGuarantee": "1Gbps", "priority": (i % 7) * 10,
                    "match": {"cidrs": [f"{ipaddress.IPv4Address(base + j)}/32" for j in range(i, prefixes, tenants)]}})
    return {"node": {"interfaces": [DEVICE], "capacity": "100Gbps"}, "tenants": out}


def vmrss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def med(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefixes", type=int, default=50_000)
    p.add_argument("--tenants", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from shaperd.core import config as config_mod
    from shaperd.core import log
    from shaperd.backends.htb.diff import diff_device
    from shaperd.backends.htb.render import device_commands
    from shaperd.engine.reconciler import Reconciler, default_backends
    from shaperd.kernel import tc
    from shaperd.engine.probe import probe_capabilities
    from shaperd.kernel.rtnl import CachedReads, RtnlReader

    log.configure(json=True, level="warning")
    import dataclasses

    # The u32 path (the 3,000-filter hang; the eBPF map classifier has its own benchmark).
    caps = dataclasses.replace(probe_capabilities(), bpf_maps=False)
    os.environ["SHAPERD_CLASSIFIER"] = "u32"  # the same for the `shaperd apply` children
    doc = config_dict(a.tenants, a.prefixes)
    cfg = config_mod.from_dict(doc)
    work = tempfile.mkdtemp(prefix="shaperd-bw-")
    cfg_file = os.path.join(work, "tenants.yaml")
    Path(cfg_file).write_text(json.dumps(doc))
    batch_file = os.path.join(work, "tc.batch")
    shaperd_bin = os.path.join(os.path.dirname(sys.executable), "shaperd")
    load_before = Path("/proc/loadavg").read_text().strip()
    rows: list[dict] = []
    bench = ap.Bench()
    try:
        ns = bench.new_netns("bw")
        for run in range(a.runs):
            r: dict = {"run": run}
            # (b) in process
            ap.fresh_veth(ns, DEVICE)
            with tc.open_writer(ns) as w, RtnlReader(ns) as reader:
                rec = Reconciler(reader, default_backends(w), caps)
                t = time.perf_counter()
                rep = rec.apply(cfg)
                r["inproc_first_s"] = time.perf_counter() - t
                r["inproc_first_changes"], r["inproc_ok"] = rep.changes, rep.ok
                r["batches"] = w.nl.batches_sent
                r["batch_messages"] = w.nl.batch_messages
                t = time.perf_counter()
                rep2 = rec.apply(cfg)
                r["inproc_resync_s"] = time.perf_counter() - t
                r["inproc_resync_changes"] = rep2.changes
                r["inproc_vmrss_kib"] = vmrss_kib()
                dp = rec.plan(cfg).desired["htb"].device(DEVICE)
            if run == 0:
                with open(batch_file, "w") as f:
                    f.writelines(" ".join(c) + "\n" for c in device_commands(dp))
                r["objects"] = 1 + len(dp.classes) + len(dp.leaves) + len(dp.filters)
            # (a) whole process, first and in-sync
            ap.fresh_veth(ns, DEVICE)
            wall, rc, _rss, err = ap.run_child([shaperd_bin, "apply", "--netns", ns, "--config", cfg_file])
            r["cli_first_s"], r["cli_first_rc"] = wall, rc
            if rc != 0:
                r["cli_first_err"] = err.strip()[-300:]
            wall, rc, _rss, _err = ap.run_child([shaperd_bin, "apply", "--netns", ns, "--config", cfg_file])
            r["cli_resync_s"], r["cli_resync_rc"] = wall, rc
            r["cli_maxrss_kib"] = ap.child_maxrss_kib([shaperd_bin, "apply", "--netns", ns, "--config", cfg_file])
            # (c) tc -batch of the same objects
            ap.fresh_veth(ns, DEVICE)
            wall, rc, _rss, err = ap.run_child(["tc", "-n", ns, "-batch", batch_file])
            r["tc_batch_s"], r["tc_batch_rc"] = wall, rc
            with RtnlReader(ns) as reader:
                from shaperd.backends.htb.observe import device_state

                idx = next(l.ifindex for l in reader.links() if l.name == DEVICE)
                reads = CachedReads(reader)
                st = device_state(reads, DEVICE, idx, reads.all_qdiscs())
                r["tc_built_diff_ops"] = len(diff_device(dp, st, False).ops)
            ap.fresh_veth(ns, DEVICE)
            r["tc_maxrss_kib"] = ap.child_maxrss_kib(["tc", "-n", ns, "-batch", batch_file])
            r["loadavg"] = Path("/proc/loadavg").read_text().strip()
            rows.append(r)
            print(json.dumps(r), flush=True)
    finally:
        bench.cleanup()
    load_after = Path("/proc/loadavg").read_text().strip()
    print(f"\n{a.tenants} tenants x {a.prefixes} /32 prefixes, {rows[0].get('objects')} objects, {a.runs} runs; "
          f"median (min-max) seconds; loadavg before {load_before!r} after {load_after!r}")
    print(f"  shaperd apply, whole process, first   : {med([r['cli_first_s'] for r in rows])}")
    print(f"  shaperd apply, whole process, in-sync : {med([r['cli_resync_s'] for r in rows])}")
    print(f"  Reconciler.apply in process, first    : {med([r['inproc_first_s'] for r in rows])}")
    print(f"  Reconciler.apply in process, in-sync  : {med([r['inproc_resync_s'] for r in rows])}")
    print(f"  tc -batch of the same objects         : {med([r['tc_batch_s'] for r in rows])}")
    print(f"  peak RSS: shaperd apply {med([r['cli_maxrss_kib'] / 1024 for r in rows])} MiB, "
          f"in-process VmRSS {med([r['inproc_vmrss_kib'] / 1024 for r in rows])} MiB, "
          f"tc {med([(r['tc_maxrss_kib'] or 0) / 1024 for r in rows])} MiB")
    return 0 if all(r["cli_first_rc"] == 0 and r["inproc_ok"] and r["inproc_resync_changes"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
