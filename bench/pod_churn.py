#!/usr/bin/env python3
"""Benchmark: pod create/delete churn ends with fresh-start kernel state and flat memory.

    sudo /tmp/venv/bin/python bench/pod_churn.py [--cycles 1000] [--steady 20] [--mode daemon|inprocess]
                                                 [--order alternate|api-first|veth-first] [--no-tracemalloc] [--json]

The issue's target: "a churn benchmark of 1,000 pod create/delete cycles ends
with exactly the kernel state a fresh start would make, and with flat memory".

Bed: a node namespace with an uplink ``up0`` (to a peer namespace) shaped by
shaperd, and routed-veth "pods" as Calico makes them: host side ``cs<i>`` /
``cc<i>`` in the node namespace with a /32 and a /128 route to the pod's
addresses, pod side in one shared pods namespace (no traffic is sent, so the
pods need no namespace of their own). ``--steady`` pods (default 20: tenant-a
by label, tenant-b by namespace, every fifth in no tenant) stay the whole run.

``--mode daemon`` (default): the real daemon (``shaperd run --netns NODE
--node-name node-1 --kubeconfig K --metrics-address ...``) follows a fake
Kubernetes API server (tests/k8s_fake.py) in this process. Each cycle creates
one pod: veth + routes, then the pod in the API; waits until the daemon has
put its mark program on the veth and its address filters on up0; deletes it
(API delete then veth removal, or the reverse, alternating by default: the
CNI and the API server race in real clusters) and waits until its filters are
gone. RSS, open fds and threads of the daemon are sampled every 50 cycles;
tracemalloc runs inside the daemon (a wrapper started as this file with
``--daemon-child``) and its top growth between the end of the warm-up (first
50 cycles) and the end is reported. ``--mode inprocess``: the same cycles
through a Reconciler in this process fed a mutable pod list (test_pods.py's
way), memory of this process; it isolates the reconcile path from the
watcher, HTTP and sampler threads.

At the end (daemon stopped, enforcement left in place):
a. a fresh Reconciler's diff of the churned node against the steady pods must
   be empty (0 operations);
b. the normalised kernel state of the node (every qdisc, HTB class with its
   parameters, filter by (device, parent, prio, protocol, kind, u32 keys,
   classid, bpf name, flags) with kernel-chosen u32 handles dropped but empty
   u32 hash tables and bare filter chains kept, mark programs per interface)
   is snapshotted, shaperd's tree is torn down, a fresh Reconciler applies the
   same config and pods, and the state is snapshotted again: both must be
   equal. The state right after the steady pods converged (before churn) is
   compared too.

Nothing is asserted; the results are printed (or one JSON document). All
namespaces and the daemon are removed even on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import ipaddress
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PY = sys.executable
NODE_NAME = "node-1"
CFG = """
node: {interfaces: [up0], capacity: 10Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 6Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 2Gbps, bandwidthLimit: 4Gbps, priority: 50, match: {namespaces: [team-b]}}
"""
SAMPLE_EVERY = 50


# ------------------------------------------------------------------ small helpers


def run(*argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    cp = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and cp.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {cp.returncode}: {cp.stderr.strip()[-2000:]}")
    return cp


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


# ------------------------------------------------------------------ pods


@dataclass
class PodSpec:
    """One pod: its API object and its routed veth (host side ``host_if`` in the node namespace)."""

    kind: str  # "s" steady/background, "c" churn, "t" latency trial
    idx: int
    tenant: str | None
    uid: str = ""
    ip4: str = ""
    ip6: str = ""

    def __post_init__(self):
        self.uid = self.uid or f"{self.kind}{self.idx:06d}-0000-4000-8000-{os.getpid():012d}"
        if not self.ip4:
            # steady/trial pods: 198.19.0.1.. ; churn pods reuse a pool of 200 addresses (as clusters do)
            n = self.idx % 200 if self.kind == "c" else self.idx
            base = {"s": 0, "t": 150, "c": 250}[self.kind] * 200 + n
            self.ip4 = f"198.19.{base // 200}.{base % 200 + 1}"
            self.ip6 = f"2001:db8:19:{ {'s': 0, 't': 1, 'c': 2}[self.kind] }::{n + 1:x}"

    @property
    def name(self) -> str:
        return f"{ {'s': 'steady', 't': 'trial', 'c': 'churn'}[self.kind] }-{self.idx}"

    @property
    def host_if(self) -> str:
        return f"c{self.kind}{self.idx}"

    @property
    def peer_if(self) -> str:
        return f"p{self.kind}{self.idx}"

    @property
    def namespace(self) -> str:
        return "team-b" if self.tenant == "tenant-b" else "team-a"

    @property
    def labels(self) -> dict:
        return {"training-tenant": "tenant-a"} if self.tenant == "tenant-a" else {"app": "x"}

    @property
    def ips(self) -> tuple[str, str]:
        return (self.ip4, self.ip6)

    def api_object(self) -> dict:
        from tests.k8s_fake import make_pod

        return make_pod(self.name, NODE_NAME, namespace=self.namespace, ips=self.ips, labels=self.labels,
                        uid=self.uid)

    def info(self):
        from shaperd.discovery.kubernetes import PodInfo

        return PodInfo.from_dict(self.api_object())


def tenant_for(i: int) -> str | None:
    """Steady pods: every fifth in no tenant, the others alternating tenant-a / tenant-b."""
    if i % 5 == 4:
        return None
    return "tenant-a" if i % 2 == 0 else "tenant-b"


# ------------------------------------------------------------------ namespaces


class Bed:
    """node namespace (up0 shaped), peer namespace (up1), pods namespace (pod ends of the veths)."""

    def __init__(self, tag: str):
        self.tag = tag
        self.node, self.peer, self.pods = f"{tag}-node", f"{tag}-peer", f"{tag}-pods"
        self.created: list[str] = []
        self.owner = os.getpid()

    def ns(self, name: str) -> str:
        run("ip", "netns", "add", name)
        self.created.append(name)
        for key in ("all", "default"):
            run("ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{key}.accept_dad=0")
        run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def build(self) -> "Bed":
        for n in (self.node, self.peer, self.pods):
            self.ns(n)
        run("ip", "netns", "exec", self.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        run("ip", "-n", self.node, "link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", self.peer)
        run("ip", "-n", self.node, "addr", "add", "198.18.0.1/24", "dev", "up0")
        run("ip", "-n", self.node, "addr", "add", "2001:db8:1::1/64", "dev", "up0", "nodad")
        run("ip", "-n", self.peer, "addr", "add", "198.18.0.2/24", "dev", "up1")
        run("ip", "-n", self.node, "link", "set", "up0", "up")
        run("ip", "-n", self.peer, "link", "set", "up1", "up")
        run("ip", "-n", self.node, "route", "add", "default", "via", "198.18.0.2")
        return self

    def add_veths(self, pods: list[PodSpec]) -> None:
        """Routed veths for ``pods``: two ip(8) batches whatever their number."""
        if not pods:
            return
        node = []
        for p in pods:
            node += [f"link add {p.host_if} type veth peer name {p.peer_if} netns {self.pods}",
                     f"link set {p.host_if} up",
                     f"route add {p.ip4}/32 dev {p.host_if} scope link",
                     f"route add {p.ip6}/128 dev {p.host_if}"]
        run("ip", "-n", self.node, "-batch", "-", input="\n".join(node) + "\n")
        run("ip", "-n", self.pods, "-batch", "-", input="\n".join(f"link set {p.peer_if} up" for p in pods) + "\n")

    def del_veth(self, pod: PodSpec) -> None:
        run("ip", "-n", self.node, "link", "del", pod.host_if)

    def cleanup(self) -> None:
        if os.getpid() != self.owner:
            return
        for n in reversed(self.created):
            run("ip", "netns", "del", n, check=False)
        self.created.clear()


# ------------------------------------------------------------------ kernel probes (bench side)


class Kernel:
    """The bench's own rtnetlink socket in the node namespace: polls and snapshots (one socket only:
    two pyroute2 sockets open at once in one thread can hang pyroute2 0.9's event loop)."""

    def __init__(self, netns: str):
        from shaperd.kernel import tc

        self.netns = netns
        self.ipr = tc.open_netlink(netns)
        self._idx: dict[str, int] = {}
        self._readers: list = []

    def close(self) -> None:
        for r in self._readers:
            r.close()
        self.ipr.close()

    def reconciler(self, caps, pods_source):
        """A new Reconciler acting in the node namespace (writes on our pyroute2 socket; reads, where the
        Reconciler takes a reader, on a new raw reader in the same namespace: its default is this process's)."""
        import inspect

        from shaperd.reconciler import Reconciler

        kw = {}
        if "reader" in inspect.signature(Reconciler).parameters:
            from shaperd.kernel.tcstats import StatsReader

            kw["reader"] = StatsReader(self.netns)
            self._readers.append(kw["reader"])
        return Reconciler(self.ipr, caps, pods_source=pods_source, **kw)

    def ifindex(self, name: str) -> int | None:
        if name not in self._idx:
            found = self.ipr.link_lookup(ifname=name)
            if not found:
                return None
            self._idx[name] = found[0]
        return self._idx[name]

    def forget(self, name: str) -> None:
        self._idx.pop(name, None)

    def mark_name(self, ifindex: int | None) -> str | None:
        """shaperd's mark program on ``ifindex``'s clsact ingress, or None."""
        from pyroute2.netlink.exceptions import NetlinkError

        if ifindex is None:
            return None
        try:
            filters = list(self.ipr.get_filters(index=ifindex, parent=INGRESS))
        except NetlinkError:
            return None  # no clsact qdisc yet, or the interface is gone
        for f in filters:
            d = decode_filter(f)
            if d["kind"] == "bpf" and d.get("name", "").startswith("shpdm_") and d["prio"] == PRIO_MARK:
                return d["name"]
        return None

    def u32_on_uplink(self) -> set[tuple]:
        """(keys, classid) of every u32 node on up0's root."""
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            filters = list(self.ipr.get_filters(index=self.ifindex("up0"), parent=HTB_ROOT))
        except NetlinkError:
            return set()
        return {(d["keys"], d["classid"]) for d in map(decode_filter, filters) if "keys" in d}

    def state(self) -> dict[str, list]:
        """Normalised kernel state of the node: comparable across a teardown and a fresh apply.

        Decoded here with pyroute2 (not shaperd's reader), so the check does not trust what it checks."""
        from pyroute2.netlink.exceptions import NetlinkError

        names = {l["index"]: l.get_attr("IFLA_IFNAME") for l in self.ipr.get_links()}
        qdiscs, classes, filters = [], [], []
        parents: dict[int, set[int]] = collections.defaultdict(set)
        for q in self.ipr.get_qdiscs():
            kind, dev = q.get_attr("TCA_KIND"), names.get(q["index"], str(q["index"]))
            h = q["handle"]
            handle = "auto" if 0x8000 <= (h >> 16) < 0xFFFF else f"{h:x}"  # kernel-numbered (mq children)
            opts = q.get_attr("TCA_OPTIONS")
            extra: tuple = ()
            if kind == "htb":
                init = opts.get_attr("TCA_HTB_INIT") if opts is not None else None
                extra = ("defcls", init["defcls"] if init else None)
                parents[q["index"]].add(h)
            elif kind in ("bfifo", "pfifo"):
                extra = ("limit", int(opts.get("limit", 0)) if opts is not None else None)
            elif kind == "fq_codel":
                extra = ("limit", opts.get_attr("TCA_FQ_CODEL_LIMIT") if opts is not None else None)
            elif kind == "clsact":
                parents[q["index"]].update((INGRESS, EGRESS))
            qdiscs.append((dev, f"{q['parent']:x}", handle, kind, extra))
        htb_devs = sorted({q["index"] for q in self.ipr.get_qdiscs() if q.get_attr("TCA_KIND") == "htb"})
        for c in (c for idx in htb_devs for c in self.ipr.get_classes(index=idx)):
            if c.get_attr("TCA_KIND") != "htb":
                continue
            opts = c.get_attr("TCA_OPTIONS")
            parms = opts.get_attr("TCA_HTB_PARMS") if opts is not None else None
            if parms is None:
                continue
            rate = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
            ceil = opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
            classes.append((names.get(c["index"]), f"{c['handle']:x}", f"{c['parent']:x}", rate, ceil,
                            parms["buffer"], parms["cbuffer"], parms["quantum"], parms["prio"]))
        for idx, ps in sorted(parents.items()):
            for parent in sorted(ps):
                try:
                    dump = list(self.ipr.get_filters(index=idx, parent=parent))
                except NetlinkError:
                    continue
                for f in dump:
                    d = decode_filter(f)
                    base = (names.get(idx), f"{parent:x}", d["prio"], f"{d['protocol']:04x}", d["kind"])
                    if d["node"] == "node" and d["kind"] == "u32":
                        filters.append(base + ("node", d["keys"], f"{d['classid']:x}", d.get("mark")))
                    elif d["node"] == "node" and d["kind"] == "bpf":
                        filters.append(base + (f"{d['handle']:x}", d["name"], f"{d['classid']:x}", d["flags"]))
                    elif d["node"] == "node":
                        filters.append(base + (f"{d['handle']:x}",))
                    else:  # the bare chain (tcf_proto) or a u32 hash table: kept, so a leftover empty one shows
                        filters.append(base + (d["node"], d.get("divisor")))
        return {"qdiscs": sorted(qdiscs, key=repr), "classes": sorted(classes, key=repr),
                "filters": sorted(filters, key=repr)}


HTB_ROOT = 0x73680000
INGRESS, EGRESS = 0xFFFFFFF2, 0xFFFFFFF3
PRIO_MARK = 0x7368


def decode_filter(f) -> dict:
    """The fields of one filter message the comparison needs (u32 selector decoded from raw bytes:
    pyroute2 0.9 misaligns its keys)."""
    kind = f.get_attr("TCA_KIND")
    info = f["info"]
    d = {"kind": kind, "prio": info >> 16, "protocol": socket.ntohs(info & 0xFFFF), "handle": f["handle"]}
    opts = f.get_attr("TCA_OPTIONS")
    if f["handle"] == 0 or opts is None:
        d["node"] = "chain"
        return d
    if kind == "u32":
        if f["handle"] & 0xFFF == 0:
            d["node"] = "hashtable"
            d["divisor"] = opts.get_attr("TCA_U32_DIVISOR")
            return d
        d["node"] = "node"
        d["classid"] = opts.get_attr("TCA_U32_CLASSID") or 0
        mark = opts.get_attr("TCA_U32_MARK")
        d["mark"] = (mark["val"], mark["mask"]) if mark else None
        sel = opts.get_attr("TCA_U32_SEL")
        keys = []
        if sel is not None:
            raw = bytes(sel.data[sel.offset + 4: sel.offset + sel.length])
            for i in range(raw[2]):
                chunk = raw[16 + 16 * i: 32 + 16 * i]
                mask, val = struct.unpack("!II", chunk[:8])
                off, _offmask = struct.unpack("=ii", chunk[8:])
                keys.append((val, mask, off))
        d["keys"] = tuple(sorted(keys, key=lambda k: k[2]))
        return d
    d["node"] = "node"
    if kind == "bpf":
        d["name"] = opts.get_attr("TCA_BPF_NAME") or ""
        d["classid"] = opts.get_attr("TCA_BPF_CLASSID") or 0
        d["flags"] = opts.get_attr("TCA_BPF_FLAGS")
    return d


def state_diff(a: dict, b: dict) -> dict:
    """Multiset difference per section: what only ``a`` has and what only ``b`` has."""
    out = {}
    for k in a:
        ca, cb = collections.Counter(map(repr, a[k])), collections.Counter(map(repr, b[k]))
        only_a, only_b = sorted((ca - cb).elements()), sorted((cb - ca).elements())
        if only_a or only_b:
            out[k] = {"only_first": only_a, "only_second": only_b}
    return out


def state_counts(s: dict) -> dict:
    return {k: len(v) for k, v in s.items()}


# ------------------------------------------------------------------ the daemon (and its tracemalloc wrapper)


def daemon_child(argv: list[str]) -> int:
    """Run as ``pod_churn.py --daemon-child FRAMES -- <shaperd args>``: tracemalloc (FRAMES > 0), a stdin
    command thread ("base" / "snap PATH"), then shaperd's CLI in the main thread."""
    import faulthandler
    import tracemalloc

    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack into the log
    frames = int(argv[0])
    args = argv[argv.index("--") + 1:]
    # Import first: compiling modules under tracemalloc is very slow, and imports are not the churn.
    import importlib

    from shaperd.cli import main

    for mod in ("shaperd.daemon", "shaperd.reconciler", "shaperd.discovery.kubernetes", "shaperd.kernel.events",
                "shaperd.kernel.bpf", "shaperd.kernel.tcstats", "shaperd.kernel.probe", "shaperd.report.metrics",
                "shaperd.report.http", "shaperd.report.sampler", "kubernetes.client", "kubernetes.watch",
                "prometheus_client"):
        importlib.import_module(mod)
    from kubernetes.client import ApiClient, Configuration, CoreV1Api  # noqa: F401  (lazy: pydantic models)

    if frames > 0:
        tracemalloc.start(frames)
    holder: dict = {}

    def snapshot():
        return tracemalloc.take_snapshot().filter_traces((
            tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, "<unknown>")))

    def commands():
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            out: dict = {"rss": _self_rss()}
            if frames > 0:
                import gc

                gc.collect()
                cur, peak = tracemalloc.get_traced_memory()
                out.update(traced_current=cur, traced_peak=peak)
                if cmd == "base":
                    holder["base"] = snapshot()
                elif cmd == "snap":
                    snap = snapshot()
                    base = holder.get("base")
                    if base is not None:
                        stats = snap.compare_to(base, "traceback")
                        out["top_growth"] = [
                            {"size_diff": s.size_diff, "count_diff": s.count_diff, "size": s.size, "count": s.count,
                             "where": [f"{fr.filename.replace(str(ROOT) + '/', '')}:{fr.lineno}"
                                       for fr in s.traceback][:frames]}
                            for s in stats[:12]]
                        out["total_diff"] = sum(s.size_diff for s in stats)
            if arg:
                tmp = arg + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(out, f)
                os.replace(tmp, arg)

    threading.Thread(target=commands, name="bench-tracemalloc", daemon=True).start()

    return main(args)


def _die_with_parent() -> None:
    """In the daemon child before exec: SIGKILL it if the benchmark dies (PR_SET_PDEATHSIG), so a killed
    run leaves no daemon behind (pyroute2 would even re-create its deleted namespace)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _self_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Daemon:
    """``shaperd run`` against the fake API, in the host namespace acting in the node's."""

    def __init__(self, bed: Bed, workdir: Path, api_url: str, tracemalloc_frames: int = 0,
                 resync_s: float = 30.0):
        from tests.k8s_fake import write_kubeconfig

        self.workdir = workdir
        self.cfg = workdir / "tenants.yaml"
        self.cfg.write_text(CFG)
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", api_url)
        self.port = free_port()
        self.log_path = workdir / "daemon.log"
        self.log = open(self.log_path, "w")
        args = ["--log-json", "run", "--config", str(self.cfg), "--netns", bed.node, "--node-name", NODE_NAME,
                "--kubeconfig", str(kubeconfig), "--resync-interval", str(resync_s),
                "--metrics-address", f"127.0.0.1:{self.port}"]
        self.proc = subprocess.Popen([PY, str(Path(__file__).resolve()), "--daemon-child", str(tracemalloc_frames),
                                      "--", *args],
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=_die_with_parent)
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
        self.log.flush()
        return self.log_path.read_text()[-n:]

    def memory(self) -> dict:
        m = self.ps.memory_full_info()
        return {"rss": m.rss, "uss": m.uss, "fds": self.ps.num_fds(), "threads": self.ps.num_threads(),
                "children": len(self.ps.children(recursive=True))}

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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.log.close()
        return self.proc.returncode


# ------------------------------------------------------------------ waiting for shaperd


def expected_u32(pod: PodSpec) -> set[tuple]:
    from shaperd.planner import assign_minors
    from shaperd.state import ROOT_HANDLE, src_prefix_keys

    minors = assign_minors(["tenant-a", "tenant-b"])
    cid = ROOT_HANDLE | minors[pod.tenant]
    return {(tuple(sorted(((k.value, k.mask, k.offset) for k in src_prefix_keys(ipaddress.ip_network(ip))),
                          key=lambda k: k[2])), cid) for ip in pod.ips}


def enforced(k: Kernel, pod: PodSpec) -> bool:
    return k.mark_name(k.ifindex(pod.host_if)) is not None and expected_u32(pod) <= k.u32_on_uplink()


def gone(k: Kernel, pod: PodSpec, veth_present: bool) -> bool:
    if veth_present and k.mark_name(k.ifindex(pod.host_if)) is not None:
        return False
    return not (expected_u32(pod) & k.u32_on_uplink())


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
    checks: dict = field(default_factory=dict)
    reconciles: dict = field(default_factory=dict)


def churn(args, bed: Bed, caps, workdir: Path, out: Result) -> None:
    from shaperd.config import load_text

    cfg = load_text(CFG)
    steady = [PodSpec("s", i, tenant_for(i)) for i in range(args.steady)]
    bed.add_veths(steady)
    api = daemon = None
    k = Kernel(bed.node)
    pods: list = []  # inprocess: what the "watcher" reports
    rec = None
    try:
        if args.mode == "daemon":
            from tests.k8s_fake import FakeKubeAPI

            api = FakeKubeAPI()
            for p in steady:
                api.add_pod(p.api_object())
            daemon = Daemon(bed, workdir, api.url, args.tracemalloc_frames)
            daemon.wait_ready()
        else:
            rec = k.reconciler(caps, lambda: pods)
            pods.extend(p.info() for p in steady)
            rec.apply(cfg)
        tenant_steady = [p for p in steady if p.tenant]
        if not wait_until(lambda: all(enforced(k, p) for p in tenant_steady), 30, 0.05):
            raise RuntimeError("steady pods never enforced" + (f"\n{daemon.tail()}" if daemon else ""))
        time.sleep(0.5 if daemon else 0)
        before_churn = k.state()

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
            pod = PodSpec("c", c, "tenant-a" if c % 2 else "tenant-b")
            bed.add_veths([pod])
            t_add = time.perf_counter()
            if api is not None:
                api.add_pod(pod.api_object())
            else:
                pods.append(pod.info())
                rec.apply(cfg)
            if not wait_until(lambda: enforced(k, pod), 10):
                out.timeouts += 1
            out.add_s.append(time.perf_counter() - t_add)
            t_del = time.perf_counter()
            api_first = order_api_first(c)
            if not api_first:
                bed.del_veth(pod)
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
                bed.del_veth(pod)
                k.forget(pod.host_if)
                if rec is not None:
                    rec.apply(cfg)  # the link event
            out.del_s.append(time.perf_counter() - t_del)
            out.cycle_s.append(time.perf_counter() - t_cycle)
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
        if daemon is not None:
            recs = daemon.reconciles()
            durs = [r.get("duration_ms", 0.0) for r in recs]
            out.reconciles = {"count": len(recs), "duration_ms": summary(durs),
                              "with_changes": sum(1 for r in recs if r.get("changes")),
                              "not_ok": sum(1 for r in recs if not r.get("ok", True))}
            rc = daemon.stop()
            out.checks["daemon_exit"] = rc
            if rc != 0:
                out.checks["daemon_log_tail"] = daemon.tail()
        elif args.tracemalloc_frames:
            import tracemalloc

            tracemalloc.stop()

        # ---- the end state against a fresh start
        infos = [p.info() for p in steady]
        fresh = k.reconciler(caps, lambda: infos)
        rep = fresh.diff(cfg)
        ops = [f"{op.device}: {op.describe()} ({op.reason})" for d in rep.devices for op in d.ops]
        out.checks["fresh_diff_ops"] = len(ops)
        out.checks["fresh_diff"] = ops
        churned = k.state()
        out.checks["state_counts"] = state_counts(churned)
        out.checks["vs_before_churn"] = state_diff(before_churn, churned)
        td = k.reconciler(caps, lambda: infos).teardown()
        out.checks["teardown_ops"] = sum(len(d.ops) for d in td.devices)
        torn = k.state()
        out.checks["after_teardown_shaperd_left"] = [
            f for f in torn["filters"] if "shpd" in repr(f)] + [c for c in torn["classes"]] + [
            q for q in torn["qdiscs"] if q[3] == "htb"]
        rep2 = k.reconciler(caps, lambda: infos).apply(cfg)
        out.checks["fresh_apply_ops"] = rep2.changes
        out.checks["fresh_apply_ok"] = rep2.ok and not any(d.failed or d.error for d in rep2.devices)
        restarted = k.state()
        out.checks["vs_fresh_start"] = state_diff(churned, restarted)
        out.checks["state_equal"] = not out.checks["vs_fresh_start"]
        out.checks["fresh_diff_empty"] = not ops
    finally:
        if daemon is not None and daemon.proc.poll() is None:
            daemon.stop()
        if api is not None:
            api.close()
        k.close()


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
        "timeouts": res.timeouts, "memory": memory_summary(res.samples, warm), "samples": res.samples,
        "tracemalloc": res.tracemalloc, "reconciles": res.reconciles, "checks": res.checks,
        "kernel": os.uname().release, "python": sys.version.split()[0],
    }
    return doc


def print_human(doc: dict) -> None:
    m, ch = doc["memory"], doc["checks"]
    print(f"pod churn: {doc['cycles']} cycles, {doc['steady_pods']} steady pods, mode {doc['mode']}, "
          f"order {doc['order']}, tracemalloc frames {doc['tracemalloc_frames']} (kernel {doc['kernel']})")
    print(f"  duration {doc['duration_s']:.1f} s = {doc['cycles_per_s']:.2f} cycles/s; timeouts {doc['timeouts']}")
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
    print(f"  (a) fresh Reconciler diff on the churned node: {ch.get('fresh_diff_ops')} operation(s)")
    for op in ch.get("fresh_diff", [])[:20]:
        print(f"      {op}")
    print(f"  (b) churned state {ch.get('state_counts')} vs teardown ({ch.get('teardown_ops')} ops) + fresh apply "
          f"({ch.get('fresh_apply_ops')} ops, ok {ch.get('fresh_apply_ok')}): "
          f"{'EQUAL' if ch.get('state_equal') else 'DIFFERENT'}")
    for sect, d in ch.get("vs_fresh_start", {}).items():
        for x in d["only_first"][:20]:
            print(f"      {sect} only after churn:  {x}")
        for x in d["only_second"][:20]:
            print(f"      {sect} only after restart: {x}")
    if ch.get("after_teardown_shaperd_left"):
        print(f"      left after teardown: {ch['after_teardown_shaperd_left'][:10]}")
    vb = ch.get("vs_before_churn", {})
    print(f"  state after churn vs before churn: {'EQUAL' if not vb else 'DIFFERENT'}")
    for sect, d in vb.items():
        for x in d["only_first"][:10]:
            print(f"      {sect} only before: {x}")
        for x in d["only_second"][:10]:
            print(f"      {sect} only after:  {x}")
    if ch.get("daemon_exit") not in (None, 0):
        print(f"  daemon exit {ch['daemon_exit']}:\n{ch.get('daemon_log_tail', '')}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--daemon-child":
        return daemon_child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--steady", type=int, default=20, help="pods present the whole run (default 20)")
    ap.add_argument("--mode", choices=["daemon", "inprocess"], default="daemon")
    ap.add_argument("--order", choices=["alternate", "api-first", "veth-first"], default="alternate",
                    help="on delete: pod from the API first, its veth first, or alternating (default)")
    ap.add_argument("--tracemalloc-frames", type=int, default=5, help="0 = no tracemalloc (default 5)")
    ap.add_argument("--no-tracemalloc", dest="tracemalloc_frames", action="store_const", const=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep-log", metavar="PATH", help="copy the daemon's log here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from shaperd import log
    from shaperd.kernel.probe import probe_capabilities

    log.configure(json=True, level="error")  # veth-first deletes warn by design (pod without interface)
    caps = probe_capabilities()  # before any other netlink socket of ours is open
    if not caps.bpf:
        print("cls_bpf unavailable: no mark programs to churn", file=sys.stderr)
        return 2
    bed = Bed(f"shpc{os.getpid() % 100000}")
    res = Result(mode=args.mode, steady=args.steady, order=args.order)
    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="shpd-churn-") as tmp:
        try:
            bed.build()
            churn(args, bed, caps, Path(tmp), res)
        finally:
            if args.keep_log and (Path(tmp) / "daemon.log").exists():
                Path(args.keep_log).write_text((Path(tmp) / "daemon.log").read_text())
            bed.cleanup()
    doc = report(res, args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print_human(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
