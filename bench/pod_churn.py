#!/usr/bin/env python3
"""Benchmark: memory and timing of pod create/delete churn through the daemon.

    sudo .venv/bin/python bench/pod_churn.py [--cycles 1000] [--steady 20] [--mode daemon|inprocess]
                                             [--order alternate|api-first|veth-first] [--no-annotations]
                                             [--no-tracemalloc] [--kubelet] [--json]

The issue's target: "a churn benchmark of 1,000 pod create/delete cycles ends
with exactly the kernel state a fresh start would make, and with flat memory".
The end-state half is a test with asserts
(tests/integration/test_pod_churn.py); this measures the memory half.

Bed: a node namespace with an uplink ``up0`` (to a peer namespace) shaped by
shaperd, and routed-veth "pods" as Calico makes them (tests/routed_pods.py:
host side in the node namespace with a /32 and a /128 route, pod side in one
shared pods namespace; no traffic is sent). ``--steady`` pods (default 20:
tenant-a by label, tenant-b by namespace, every fifth in no tenant) stay the
whole run. Namespaces and processes through shaperd_bed.netns.

``--mode daemon`` (default): the real daemon (``shaperd run --netns NODE
--node-name node-1 --kubeconfig K --metrics-address ...``) follows a fake
Kubernetes API server (tests/k8s_fake.py) in this process. Each cycle creates
one pod: veth + routes, then the pod in the API; waits until the daemon has
put its mark program on the veth and its address filters on up0; deletes it
(API delete then veth removal, or the reverse, alternating by default: the
CNI and the API server race in real clusters) and waits until its filters are
gone. RSS, open fds and threads of the daemon are sampled every 50 cycles;
tracemalloc runs inside the daemon (a wrapper started as this file with
bench/churn_daemon.py) and its top growth between the end of the warm-up (first
50 cycles) and the end is reported. ``--mode inprocess``: the same cycles
through a Reconciler in this process fed a mutable pod list (test_pods.py's
way), memory of this process; it isolates the reconcile path from the
watcher, HTTP and sampler threads.

Annotations (unless ``--no-annotations``): a share of the pods carries
``kubernetes.io/egress-bandwidth`` (tests/routed_pods.py ``annotation_plan``:
a third of the churn pods are created capped, some of them change value or
lose the cap while they live, every fourth of the others gains one; every
third steady pod is capped and the steady pods' annotations change half-way).
A capped pod is enforced once its addresses map to a class of its own with
its cap as ceil. At the end ``checks.leftovers`` lists what of the deleted
pods is still on the node (a class, a u32 filter or map entry pointing at one,
a source entry of one of their addresses, a mark program): empty when none
is (tests/integration/test_pod_churn.py shows the check catches a planted one).

Nothing is asserted; the results are printed (or one JSON document). All
namespaces and the daemon are removed even on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shaperd_bed import netns  # noqa: E402
from tests.routed_pods import (CFG, EGRESS_ANNOTATION, NODE_NAME, Kernel, PodSpec, add_routed_pods,  # noqa: E402
                               annotation_plan, build_node, enforced, gone, leftovers, own_class, remove_routed_pod,
                               steady_annotation, tenant_for)

PY = sys.executable
SAMPLE_EVERY = 50
DAEMON_DEADLINE_S = 4 * 3600.0  # 1,000 cycles take minutes; only a hung run reaches this


# ------------------------------------------------------------------ small helpers


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    s = sorted(xs)

    def pct(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]

    return {"n": len(s), "median": statistics.median(s), "p90": pct(90), "p99": pct(99), "min": s[0], "max": s[-1],
            "mean": statistics.fmean(s)}


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def wait_until(pred, timeout: float, interval: float = 0.005):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ itself, also when loaded by path
from _signals import sigterm_as_exit  # noqa: E402


# ------------------------------------------------------------------ the daemon (bench/churn_daemon.py wraps it)


class Daemon:
    """``shaperd run`` against the fake API, in the host namespace acting in the node's."""

    def __init__(self, node_ns: str, workdir: Path, api_url: str, tracemalloc_frames: int = 0,
                 resync_s: float = 30.0, kubelet_root: Path | None = None):
        from tests.k8s_fake import write_kubeconfig

        self.workdir = workdir
        self.cfg = workdir / "tenants.yaml"
        self.cfg.write_text(CFG)
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", api_url)
        self.port = free_port()
        self.log_path = workdir / "daemon.log"
        self.log = open(self.log_path, "w")
        args = ["--log-json", "run", "--config", str(self.cfg), "--netns", node_ns, "--node-name", NODE_NAME,
                "--kubeconfig", str(kubeconfig), "--resync-interval", str(resync_s),
                "--metrics-address", f"127.0.0.1:{self.port}"]
        if kubelet_root is not None:  # a fake kubelet's pod-resources socket: the daemon loads grpc and calls it
            args += ["--kubelet-root", str(kubelet_root)]
        # Own process group, SIGKILLed if the benchmark dies (a killed run leaves no daemon behind:
        # pyroute2 would even re-create its deleted namespace) or passes the deadline.
        # The wrapper is a script of its own that imports only shaperd: this module's imports (the bed,
        # tests.routed_pods, urllib, statistics) would otherwise be counted as the daemon's memory.
        self.proc = netns.spawn([PY, str(Path(__file__).resolve().with_name("churn_daemon.py")), str(tracemalloc_frames),
                                 "--", *args], deadline_s=DAEMON_DEADLINE_S,
                                stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT)
        import psutil

        self.ps = psutil.Process(self.proc.pid)
        self._snaps = 0

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30.0) -> None:
        if not wait_until(lambda: self.ready() or self.proc.poll() is not None, timeout, 0.05) or not self.ready():
            raise RuntimeError(f"daemon never became ready; log tail:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()[-n:]

    def memory(self) -> dict:
        m = self.ps.memory_full_info()
        return {"rss": m.rss, "uss": m.uss, "fds": self.ps.num_fds(), "threads": self.ps.num_threads(),
                "children": len(self.ps.children(recursive=True))}

    def mappings(self, top: int = 12) -> list[dict]:
        """The daemon's RSS by mapping (/proc/PID/smaps): each file (a library, a .so) and the anonymous rest."""
        return rss_by_mapping(Path(f"/proc/{self.proc.pid}/smaps").read_text(), top)

    def command(self, cmd: str, timeout: float = 60.0) -> dict:
        self._snaps += 1
        path = self.workdir / f"tm{self._snaps}.json"
        self.proc.stdin.write(f"{cmd} {path}\n")
        self.proc.stdin.flush()
        if not wait_until(path.exists, timeout, 0.05):
            raise RuntimeError(f"daemon did not answer {cmd!r}")
        return json.loads(path.read_text())

    def reconciles(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "reconciled":
                out.append(rec)
        return out

    def stop(self) -> int | None:
        """SIGTERM (the daemon's own exit, its code is reported), then its whole group goes."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        netns.stop(self.proc, 0)
        self.log.close()
        return self.proc.returncode


# ------------------------------------------------------------------ the churn


@dataclass
class Result:
    mode: str
    cycles: int = 0
    steady: int = 0
    order: str = ""
    duration_s: float = 0.0
    cycle_s: list[float] = field(default_factory=list)
    add_s: list[float] = field(default_factory=list)
    del_s: list[float] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    tracemalloc: dict = field(default_factory=dict)
    timeouts: int = 0
    annotated: int = 0  # churn pods capped at some point of their life
    annotation_changes: int = 0
    checks: dict = field(default_factory=dict)
    reconciles: dict = field(default_factory=dict)
    kubelet_calls: int | None = None  # --kubelet: List calls the fake kubelet answered
    mappings: list[dict] = field(default_factory=list)  # the daemon's RSS by mapping at the end


def churn(args, node: str, pods_ns: str, caps, workdir: Path, out: Result) -> None:
    from shaperd.core.config import load_text

    cfg = load_text(CFG)
    ann = args.annotations
    steady = [PodSpec("s", i, tenant_for(i), egress=steady_annotation(i, True) if ann else None)
              for i in range(args.steady)]
    add_routed_pods(node, pods_ns, steady)
    api = daemon = kubelet = None
    k = Kernel(node)
    pods: list = []  # inprocess: what the "watcher" reports
    rec = None
    try:
        if args.mode == "daemon":
            from tests.k8s_fake import FakeKubeAPI

            api = FakeKubeAPI()
            for p in steady:
                api.add_pod(p.api_object())
            kubelet_root = None
            if args.kubelet:  # in a process of its own: this one forks, which gRPC's threads do not survive
                kubelet_root = workdir / "kubelet"
                kubelet = netns.spawn([PY, "-m", "tests.podresources_fake",
                                       str(kubelet_root / "pod-resources" / "kubelet.sock")],
                                      deadline_s=DAEMON_DEADLINE_S, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL,
                                      text=True, cwd=str(ROOT))
                if kubelet.stdout.readline().strip() != "serving":
                    raise RuntimeError("the fake kubelet did not start")
            daemon = Daemon(node, workdir, api.url, args.tracemalloc_frames, kubelet_root=kubelet_root)
            daemon.wait_ready()
        else:
            rec = k.reconciler(caps, lambda: pods)
            pods.extend(p.info() for p in steady)
            rec.apply(cfg)
        def annotate(pod: PodSpec, value: str | None) -> None:
            """The pod's annotation changes while it lives (in the API, or in the in-process pod list)."""
            pod.egress = value
            out.annotation_changes += 1
            if api is not None:
                def fn(obj):
                    a = obj["metadata"].setdefault("annotations", {})
                    if value is None:
                        a.pop(EGRESS_ANNOTATION, None)
                    else:
                        a[EGRESS_ANNOTATION] = value
                api.modify_pod(pod.uid, fn)
            else:
                pods[:] = [pod.info() if p.uid == pod.uid else p for p in pods]
                rec.apply(cfg)

        deleted: dict[int, str] = {}  # classid -> name, of every class a capped churn pod had
        deleted_pods: list[PodSpec] = []
        tenant_steady = [p for p in steady if p.tenant or p.egress]
        if not wait_until(lambda: all(enforced(k, p) for p in tenant_steady), 30, 0.05):
            raise RuntimeError("steady pods never enforced" + (f"\n{daemon.tail()}" if daemon else ""))
        time.sleep(0.5 if daemon else 0)  # start-up reconciles and their echoes pass before the first sample

        if args.mode == "inprocess" and args.tracemalloc_frames:
            import tracemalloc

            tracemalloc.start(args.tracemalloc_frames)

        def memory() -> dict:
            if daemon is not None:
                return daemon.memory()
            import psutil

            m = psutil.Process().memory_full_info()
            return {"rss": m.rss, "uss": m.uss, "fds": psutil.Process().num_fds(),
                    "threads": psutil.Process().num_threads()}

        def tm(cmd: str) -> dict:
            if not args.tracemalloc_frames:
                return {}
            if daemon is not None:
                return daemon.command(cmd)
            return _inprocess_tm(cmd, args.tracemalloc_frames)

        out.samples.append({"cycle": 0, "t": 0.0, **memory()})
        start = time.perf_counter()
        order_api_first = {"api-first": lambda c: True, "veth-first": lambda c: False,
                           "alternate": lambda c: c % 2 == 0}[args.order]
        for c in range(1, args.cycles + 1):
            t_cycle = time.perf_counter()
            if ann and c == args.cycles // 2:  # half-way: the steady pods' annotations change
                for i, p in enumerate(steady):
                    if steady_annotation(i, False) != p.egress:
                        annotate(p, steady_annotation(i, False))
                if not wait_until(lambda: all(enforced(k, p) for p in tenant_steady), 10):
                    out.timeouts += 1
            first, then = annotation_plan(c) if ann else (None, None)
            pod = PodSpec("c", c, "tenant-a" if c % 2 else "tenant-b", egress=first)
            add_routed_pods(node, pods_ns, [pod])
            t_add = time.perf_counter()
            if api is not None:
                api.add_pod(pod.api_object())
            else:
                pods.append(pod.info())
                rec.apply(cfg)
            if not wait_until(lambda: enforced(k, pod), 10):
                out.timeouts += 1
            out.add_s.append(time.perf_counter() - t_add)
            if first is not None or then is not None:
                out.annotated += 1
            if pod.egress is not None and (cid := own_class(k, pod)) is not None:
                deleted[cid] = pod.name
            if then != first:
                annotate(pod, then)
                if not wait_until(lambda: enforced(k, pod), 10):
                    out.timeouts += 1
                if pod.egress is not None and (cid := own_class(k, pod)) is not None:
                    deleted[cid] = pod.name
            t_del = time.perf_counter()
            api_first = order_api_first(c)
            if not api_first:
                remove_routed_pod(node, pod)
                k.forget(pod.host_if)
                if rec is not None:
                    rec.apply(cfg)  # the link event
            if api is not None:
                api.delete_pod(pod.uid)
            else:
                pods[:] = [p for p in pods if p.uid != pod.uid]
                rec.apply(cfg)
            if not wait_until(lambda: gone(k, pod, api_first), 10):
                out.timeouts += 1
            if api_first:
                remove_routed_pod(node, pod)
                k.forget(pod.host_if)
                if rec is not None:
                    rec.apply(cfg)  # the link event
            out.del_s.append(time.perf_counter() - t_del)
            out.cycle_s.append(time.perf_counter() - t_cycle)
            deleted_pods.append(pod)
            if c % SAMPLE_EVERY == 0 or c == args.cycles:
                out.samples.append({"cycle": c, "t": time.perf_counter() - start, **memory()})
                if c == min(SAMPLE_EVERY, args.cycles):
                    out.tracemalloc["warmup_end"] = tm("base")
                    out.tracemalloc["warmup_cycle"] = c
                if c == (args.cycles // 2) // SAMPLE_EVERY * SAMPLE_EVERY and c > SAMPLE_EVERY:
                    out.tracemalloc["middle"] = tm("snap")
            if not args.json and c % 100 == 0:
                s = out.samples[-1]
                print(f"  cycle {c}: {c / (time.perf_counter() - start):.1f} cycles/s, rss {s['rss'] / 2**20:.1f} MiB,"
                      f" fds {s['fds']}, timeouts {out.timeouts}", file=sys.stderr, flush=True)
        out.duration_s = time.perf_counter() - start
        out.tracemalloc["end"] = tm("snap")
        out.cycles = args.cycles
        # Let the daemon settle (the last veth removal is a link event, debounced 0.2 s).
        time.sleep(1.0)
        live = {own_class(k, p) for p in steady if p.egress}
        out.checks["leftovers"] = leftovers(k, deleted, deleted_pods, live - {None})
        out.checks["capped_classes_churned"] = len(deleted)
        out.checks["steady_enforced"] = all(enforced(k, p) for p in tenant_steady)
        if daemon is not None:
            recs = daemon.reconciles()
            durs = [r.get("duration_ms", 0.0) for r in recs]
            out.reconciles = {"count": len(recs), "duration_ms": summary(durs),
                              "with_changes": sum(1 for r in recs if r.get("changes")),
                              "not_ok": sum(1 for r in recs if not r.get("ok", True))}
            out.mappings = daemon.mappings()
            rc = daemon.stop()
            out.checks["daemon_exit"] = rc
            if rc != 0:
                out.checks["daemon_log_tail"] = daemon.tail()
        elif args.tracemalloc_frames:
            import tracemalloc

            tracemalloc.stop()
    finally:
        if daemon is not None and daemon.proc.poll() is None:
            daemon.stop()
        if api is not None:
            api.close()
        if kubelet is not None:
            try:
                out.kubelet_calls = int(kubelet.communicate("", timeout=30)[0].split()[-1])
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                out.kubelet_calls = None
            netns.stop(kubelet, 0)
        k.close()


def rss_by_mapping(smaps: str, top: int = 12) -> list[dict]:
    """Rss per mapped file from smaps text; anonymous mappings and [heap] together as "anonymous"."""
    by: dict[str, int] = {}
    name = ""
    for line in smaps.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
            path = head[5].strip() if len(head) == 6 else ""
            name = path.replace(str(ROOT) + "/", "") if path.startswith("/") else "anonymous"
        elif line.startswith("Rss:"):
            by[name] = by.get(name, 0) + int(line.split()[1]) * 1024
    rows = sorted(by.items(), key=lambda kv: -kv[1])
    return [{"mapping": k, "rss": v} for k, v in rows[:top]] + [
        {"mapping": f"({len(rows) - top} more)", "rss": sum(v for _, v in rows[top:])}]


_TM: dict = {}


def _inprocess_tm(cmd: str, frames: int) -> dict:
    import gc
    import tracemalloc

    gc.collect()
    snap = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),
                                                      tracemalloc.Filter(False, "<unknown>")))
    cur, peak = tracemalloc.get_traced_memory()
    out: dict = {"traced_current": cur, "traced_peak": peak}
    if cmd == "base":
        _TM["base"] = snap
    elif "base" in _TM:
        stats = snap.compare_to(_TM["base"], "traceback")
        out["top_growth"] = [
            {"size_diff": s.size_diff, "count_diff": s.count_diff, "size": s.size, "count": s.count,
             "where": [f"{fr.filename.replace(str(ROOT) + '/', '')}:{fr.lineno}" for fr in s.traceback][:frames]}
            for s in stats[:12]]
        out["total_diff"] = sum(s.size_diff for s in stats)
    return out


# ------------------------------------------------------------------ report


def memory_summary(samples: list[dict], warmup_cycle: int) -> dict:
    after = [s for s in samples if s["cycle"] >= warmup_cycle] or samples
    xs = [s["cycle"] for s in after]
    mid = samples[len(samples) // 2]
    return {
        "rss_start_mib": samples[0]["rss"] / 2**20,
        "rss_warm_mib": after[0]["rss"] / 2**20,
        "rss_middle_mib": mid["rss"] / 2**20, "middle_cycle": mid["cycle"],
        "rss_end_mib": samples[-1]["rss"] / 2**20,
        "rss_slope_kib_per_100_cycles": slope(xs, [s["rss"] / 1024 for s in after]) * 100,
        "uss_slope_kib_per_100_cycles": slope(xs, [s["uss"] / 1024 for s in after]) * 100,
        "rss_max_mib": max(s["rss"] for s in samples) / 2**20,
        "fds": sorted({s["fds"] for s in samples}), "threads": sorted({s["threads"] for s in samples}),
    }


def report(res: Result, args) -> dict:
    warm = res.tracemalloc.get("warmup_cycle", SAMPLE_EVERY)
    doc = {
        "mode": res.mode, "cycles": res.cycles, "steady_pods": res.steady, "order": res.order,
        "tracemalloc_frames": args.tracemalloc_frames,
        "duration_s": res.duration_s, "cycles_per_s": res.cycles / res.duration_s if res.duration_s else 0,
        "cycle_ms": summary([x * 1000 for x in res.cycle_s]),
        "create_to_enforced_ms": summary([x * 1000 for x in res.add_s]),
        "delete_to_removed_ms": summary([x * 1000 for x in res.del_s]),
        "timeouts": res.timeouts, "annotated_pods": res.annotated, "annotation_changes": res.annotation_changes,
        "memory": memory_summary(res.samples, warm), "samples": res.samples,
        "tracemalloc": res.tracemalloc, "reconciles": res.reconciles, "checks": res.checks,
        "kernel": os.uname().release, "python": sys.version.split()[0],
        "kubelet_list_calls": res.kubelet_calls, "rss_by_mapping": res.mappings,
    }
    return doc


def print_human(doc: dict) -> None:
    m, ch = doc["memory"], doc["checks"]
    print(f"pod churn: {doc['cycles']} cycles, {doc['steady_pods']} steady pods, mode {doc['mode']}, "
          f"order {doc['order']}, tracemalloc frames {doc['tracemalloc_frames']} (kernel {doc['kernel']})")
    print(f"  duration {doc['duration_s']:.1f} s = {doc['cycles_per_s']:.2f} cycles/s; timeouts {doc['timeouts']}"
          + (f"; fake kubelet answered {doc['kubelet_list_calls']} List calls" if doc["kubelet_list_calls"] is not None else ""))
    print(f"  annotated churn pods {doc['annotated_pods']}, annotation changes {doc['annotation_changes']}, "
          f"capped classes churned {ch.get('capped_classes_churned', 0)}; steady pods enforced at the end: "
          f"{ch.get('steady_enforced')}; leftovers of deleted pods: {len(ch.get('leftovers', []))}")
    for what in ch.get("leftovers", [])[:20]:
        print(f"    left: {what}")
    for key in ("cycle_ms", "create_to_enforced_ms", "delete_to_removed_ms"):
        s = doc[key]
        if s.get("n"):
            print(f"  {key:24} median {s['median']:.1f}  p90 {s['p90']:.1f}  max {s['max']:.1f}  min {s['min']:.1f}")
    if doc["reconciles"]:
        r = doc["reconciles"]
        print(f"  daemon reconciles: {r['count']} ({r['with_changes']} with changes, {r['not_ok']} not ok), "
              f"duration median {r['duration_ms'].get('median', 0):.1f} ms p90 {r['duration_ms'].get('p90', 0):.1f}"
              f" max {r['duration_ms'].get('max', 0):.1f}")
    print(f"  RSS start {m['rss_start_mib']:.1f} MiB, after warm-up {m['rss_warm_mib']:.1f}, "
          f"middle (cycle {m['middle_cycle']}) {m['rss_middle_mib']:.1f}, end {m['rss_end_mib']:.1f}; "
          f"slope after warm-up {m['rss_slope_kib_per_100_cycles']:+.1f} KiB/100 cycles "
          f"(USS {m['uss_slope_kib_per_100_cycles']:+.1f}); fds {m['fds']}, threads {m['threads']}")
    print("  samples (cycle: RSS MiB / fds):", ", ".join(f"{s['cycle']}: {s['rss'] / 2**20:.1f}/{s['fds']}"
                                                         for s in doc["samples"]))
    tmd = doc["tracemalloc"]
    if tmd.get("end"):
        e, b = tmd["end"], tmd.get("warmup_end", {})
        print(f"  tracemalloc: traced {b.get('traced_current', 0) / 1024:.0f} KiB after warm-up, "
              f"{tmd.get('middle', {}).get('traced_current', 0) / 1024:.0f} KiB middle, "
              f"{e.get('traced_current', 0) / 1024:.0f} KiB end; net growth {e.get('total_diff', 0) / 1024:+.1f} KiB")
        for g in e.get("top_growth", [])[:8]:
            print(f"    {g['size_diff'] / 1024:+8.1f} KiB {g['count_diff']:+6d} blocks  {' <- '.join(g['where'][:3])}")
        print("  tracemalloc at the end, by file (allocated after the imports):")
        for g in e.get("top_size", [])[:10]:
            print(f"    {g['size'] / 1024:8.1f} KiB {g['count']:6d} blocks  {g['where']}")
    if doc["rss_by_mapping"]:
        print("  daemon RSS at the end by mapping (/proc/PID/smaps):")
        for m in doc["rss_by_mapping"]:
            print(f"    {m['rss'] / 2**20:6.1f} MiB  {m['mapping']}")
    if ch.get("daemon_exit") not in (None, 0):
        print(f"  daemon exit {ch['daemon_exit']}:\n{ch.get('daemon_log_tail', '')}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--steady", type=int, default=20, help="pods present the whole run (default 20)")
    ap.add_argument("--mode", choices=["daemon", "inprocess"], default="daemon")
    ap.add_argument("--order", choices=["alternate", "api-first", "veth-first"], default="alternate",
                    help="on delete: pod from the API first, its veth first, or alternating (default)")
    ap.add_argument("--no-annotations", dest="annotations", action="store_false",
                    help="no pod carries kubernetes.io/egress-bandwidth (the churn as before per-pod caps)")
    ap.add_argument("--tracemalloc-frames", type=int, default=5, help="0 = no tracemalloc (default 5)")
    ap.add_argument("--no-tracemalloc", dest="tracemalloc_frames", action="store_const", const=0)
    ap.add_argument("--kubelet", action="store_true",
                    help="serve a fake kubelet pod-resources socket (empty List): the daemon loads grpc and calls "
                         "it every reconcile, as on a real node; without it the daemon finds no socket")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep-log", metavar="PATH", help="copy the daemon's log here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from shaperd.core import log
    from shaperd.engine.probe import probe_capabilities

    log.configure(json=True, level="error")  # veth-first deletes warn by design (pod without interface)
    caps = probe_capabilities()  # before any other netlink socket of ours is open
    if not caps.bpf:
        print("cls_bpf unavailable: no mark programs to churn", file=sys.stderr)
        return 2
    res = Result(mode=args.mode, steady=args.steady, order=args.order)
    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="shpd-churn-") as tmp, netns.Namespaces() as nets:
        try:
            node, _peer, pods_ns = build_node(nets, f"shpc{os.getpid() % 100000}")
            churn(args, node, pods_ns, caps, Path(tmp), res)
        finally:
            if args.keep_log and (Path(tmp) / "daemon.log").exists():
                Path(args.keep_log).write_text((Path(tmp) / "daemon.log").read_text())
    doc = report(res, args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print_human(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
