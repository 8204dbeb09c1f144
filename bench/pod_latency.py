#!/usr/bin/env python3
"""Benchmark: time from a pod's API event to its classification in the kernel.

    sudo /tmp/venv/bin/python bench/pod_latency.py [--trials 30] [--background 0,100] [--json]

The issue's target: "a new tenant pod's traffic is classified within 1 s of
the API event". Measured, not asserted.

For each background size B (default 0 and 100): a node namespace with an
uplink ``up0``, B + T routed veth "pods" created before the daemon starts
(host side in the node namespace with /32 and /128 routes, pod side in a
shared pods namespace; tests/routed_pods.py), the B background pods in a
fake Kubernetes API server (tests/k8s_fake.py), and the real daemon
(``shaperd run --netns NODE --node-name node-1 --kubeconfig K
--metrics-address ...``, resync 30 s, as deployed). Once it is ready and has
enforced the background pods, each of T trials (default 30):

1. adds one tenant pod (alternately tenant-a by label and tenant-b by
   namespace) to the API at t0 (the fake has it in its history and has woken
   its watches when add_pod returns);
2. polls the kernel every 5 ms through this process's own netlink socket in
   the node namespace, decoded with pyroute2 (not shaperd's reader): t_mark =
   first poll that sees shaperd's mark program (bpf ``shpdm_*`` at prio 0x7368
   on the veth's clsact ingress), t_u32 = first poll that sees the u32
   filters for both of the pod's addresses on up0 with the tenant's class;
   classified = max of both;
3. deletes the pod from the API at t2 and polls until the mark program and
   the u32 filters are gone (t_gone);
4. waits 0.3 s before the next trial.

Each poll costs time itself (a filter dump of one veth plus one of up0); its
median is printed, so the resolution of every number is "5 ms + one poll".
The daemon's own "reconciled" log lines over the trials give the reconcile
duration, which with the 50 ms pod-event debounce and the watch delivery
makes up the latency. Namespaces and the daemon are removed even on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pod_churn as pc  # noqa: E402  (the daemon and summaries: shared with the churn benchmark)
from shaperd_bed import netns  # noqa: E402
from tests.routed_pods import (CFG, Kernel, PodSpec, add_routed_pods, build_node, enforced,  # noqa: E402
                               expected_u32, tenant_for)

POLL_S = 0.005


def trial(api, k: Kernel, pod: PodSpec, poll_costs: list[float], timeout: float = 10.0) -> dict:
    want = expected_u32(pod)
    idx = k.ifindex(pod.host_if)
    out: dict = {}
    t0 = time.perf_counter()
    api.add_pod(pod.api_object())
    t_mark = t_u32 = None
    while time.perf_counter() - t0 < timeout and (t_mark is None or t_u32 is None):
        p0 = time.perf_counter()
        if t_mark is None and k.mark_name(idx) is not None:
            t_mark = time.perf_counter()
        if t_u32 is None and want <= k.u32_on_uplink():
            t_u32 = time.perf_counter()
        poll_costs.append(time.perf_counter() - p0)
        time.sleep(POLL_S)
    out["mark_s"] = t_mark - t0 if t_mark else None
    out["u32_s"] = t_u32 - t0 if t_u32 else None
    out["classified_s"] = max(out["mark_s"], out["u32_s"]) if t_mark and t_u32 else None
    time.sleep(0.1)
    t2 = time.perf_counter()
    api.delete_pod(pod.uid)
    t_mark_gone = t_u32_gone = None
    while time.perf_counter() - t2 < timeout and (t_mark_gone is None or t_u32_gone is None):
        if t_mark_gone is None and k.mark_name(idx) is None:
            t_mark_gone = time.perf_counter()
        if t_u32_gone is None and not (want & k.u32_on_uplink()):
            t_u32_gone = time.perf_counter()
        time.sleep(POLL_S)
    out["mark_gone_s"] = t_mark_gone - t2 if t_mark_gone else None
    out["u32_gone_s"] = t_u32_gone - t2 if t_u32_gone else None
    out["gone_s"] = max(out["mark_gone_s"], out["u32_gone_s"]) if t_mark_gone and t_u32_gone else None
    return out


def run_variant(background: int, trials: int, caps, workdir: Path, quiet: bool) -> dict:
    from shaperd.core.config import load_text
    from tests.k8s_fake import FakeKubeAPI

    nets = netns.Namespaces()
    api = daemon = k = None
    res: dict = {"background": background, "trials": []}
    try:
        node, _peer, pods_ns = build_node(nets, f"shpl{os.getpid() % 100000}b{background}")
        bg = [PodSpec("s", i, tenant_for(i)) for i in range(background)]
        tr = [PodSpec("t", i, "tenant-a" if i % 2 == 0 else "tenant-b") for i in range(trials)]
        t = time.perf_counter()
        add_routed_pods(node, pods_ns, bg + tr)
        res["veth_setup_s"] = time.perf_counter() - t
        api = FakeKubeAPI()
        for p in bg:
            api.add_pod(p.api_object())
        k = Kernel(node)
        daemon = pc.Daemon(node, workdir, api.url, tracemalloc_frames=0)
        t = time.perf_counter()
        daemon.wait_ready(60)
        res["ready_s"] = time.perf_counter() - t
        tenant_bg = [p for p in bg if p.tenant]
        if not pc.wait_until(lambda: all(enforced(k, p) for p in tenant_bg), 60, 0.05):
            raise RuntimeError(f"background pods never enforced\n{daemon.tail()}")
        res["background_enforced_s"] = time.perf_counter() - t
        time.sleep(1.0)  # let the start-up reconciles and their echoes pass
        n_before = len(daemon.reconciles())
        poll_costs: list[float] = []
        for i, pod in enumerate(tr):
            r = trial(api, k, pod, poll_costs)
            res["trials"].append(r)
            if not quiet:
                fmt = lambda x: f"{x * 1000:7.1f}" if x is not None else "   (timeout)"  # noqa: E731
                print(f"  B={background} trial {i + 1:2d}: classified {fmt(r['classified_s'])} ms "
                      f"(mark {fmt(r['mark_s'])}, u32 {fmt(r['u32_s'])}); removed {fmt(r['gone_s'])} ms",
                      file=sys.stderr, flush=True)
            time.sleep(0.3)
        recs = daemon.reconciles()[n_before:]
        res["reconciles"] = {"count": len(recs),
                             "duration_ms": pc.summary([r.get("duration_ms", 0.0) for r in recs]),
                             "not_ok": sum(1 for r in recs if not r.get("ok", True))}
        res["poll_ms"] = pc.summary([x * 1000 for x in poll_costs])
        res["daemon_rss_mib"] = daemon.memory()["rss"] / 2**20
        res["daemon_exit"] = daemon.stop()
        # Afterwards: a fresh Reconciler finds nothing to do (the trial pods left nothing behind).
        infos = [p.info() for p in bg]
        rep = k.reconciler(caps, lambda: infos).diff(load_text(CFG))
        res["fresh_diff_ops"] = [f"{op.device}: {op.describe()} ({op.reason})" for d in rep.devices for op in d.ops]
    finally:
        if daemon is not None and daemon.proc.poll() is None:
            daemon.stop()
        if api is not None:
            api.close()
        if k is not None:
            k.close()
        nets.cleanup()
    for key in ("classified_s", "mark_s", "u32_s", "gone_s", "mark_gone_s", "u32_gone_s"):
        xs = [r[key] * 1000 for r in res["trials"] if r[key] is not None]
        res[key.replace("_s", "_ms")] = pc.summary(xs)
    res["timeouts"] = sum(1 for r in res["trials"] if r["classified_s"] is None or r["gone_s"] is None)
    res["over_1s"] = sum(1 for r in res["trials"] if r["classified_s"] is None or r["classified_s"] > 1.0)
    return res


def print_human(doc: dict) -> None:
    print(f"pod event -> kernel latency, {doc['trials']} trials per variant (kernel {doc['kernel']}, "
          f"poll every {POLL_S * 1000:.0f} ms)")
    for v in doc["variants"]:
        print(f"  {v['background']} pods already present (daemon ready {v.get('ready_s', 0):.1f} s, background "
              f"enforced {v.get('background_enforced_s', 0):.1f} s after start; RSS {v.get('daemon_rss_mib', 0):.1f} MiB)")
        for key, label in (("classified_ms", "classified (mark and u32)"), ("mark_ms", "  mark program attached"),
                           ("u32_ms", "  u32 filters on up0"), ("gone_ms", "removed after delete"),
                           ("mark_gone_ms", "  mark program gone"), ("u32_gone_ms", "  u32 filters gone")):
            s = v[key]
            if s.get("n"):
                print(f"    {label:28} median {s['median']:6.1f}  p90 {s['p90']:6.1f}  max {s['max']:6.1f}  "
                      f"min {s['min']:6.1f} ms")
        r = v.get("reconciles", {})
        if r:
            d = r["duration_ms"]
            print(f"    daemon reconciles during trials: {r['count']} ({r['not_ok']} not ok), duration median "
                  f"{d.get('median', 0):.1f} p90 {d.get('p90', 0):.1f} max {d.get('max', 0):.1f} ms")
        print(f"    one poll (mark + u32 dump) median {v['poll_ms'].get('median', 0):.2f} ms, "
              f"max {v['poll_ms'].get('max', 0):.2f}; over 1 s or timed out: {v['over_1s']}/{len(v['trials'])}; "
              f"fresh diff afterwards: {len(v.get('fresh_diff_ops', []))} op(s); daemon exit {v.get('daemon_exit')}")
        for op in v.get("fresh_diff_ops", [])[:10]:
            print(f"      {op}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--background", default="0,100", help="comma-separated pod counts already present (default 0,100)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from shaperd.core import log
    from shaperd.engine.probe import probe_capabilities

    log.configure(json=True, level="error")  # veth-first deletes warn by design (pod without interface)
    caps = probe_capabilities()  # before any other netlink socket of ours is open
    if not caps.bpf:
        print("cls_bpf unavailable: no mark programs", file=sys.stderr)
        return 2
    doc = {"trials": args.trials, "kernel": os.uname().release, "python": sys.version.split()[0], "variants": []}
    with pc.sigterm_as_exit():
        for b in (int(x) for x in args.background.split(",") if x.strip()):
            with tempfile.TemporaryDirectory(prefix="shpd-lat-") as tmp:
                doc["variants"].append(run_variant(b, args.trials, caps, Path(tmp), args.json))
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print_human(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
