#!/usr/bin/env python3
"""Per-pod caps and tenant ingress on a 1 Gbit/s emulated link, through a stand-in API server.

    sudo .venv/bin/python bench/pod_caps.py [--repeats 3] [--duration 8] [--scenarios ...]
        [--shaperd-root DIR] [--json-out FILE]

The layout of the issue: the namespace bed of bench/isolation.py (shaperd_bed: routed veth pods,
the node's uplink, a ``wire`` namespace whose TBF at the link rate emulates the NIC, ``recv``
beyond it), with the same TBF on the wire's side towards the node as well (``inbound_link``), so
what the pods receive from ``recv`` crosses a 1 Gbit/s link too. The node is shaped by the real
daemon, ``shaperd run --kubeconfig K --node-name node-1 --netns NODE`` in the host namespace,
following the fake Kubernetes API server of the tests (tests/k8s_fake.py), which serves the pods
with their ``kubernetes.io/egress-bandwidth`` / ``ingress-bandwidth`` annotations. Traffic is
iperf3, TCP, ``--flows`` (4) flows per pod; goodput is the receiver's. Each figure is the median of
``--repeats`` rounds (min..max beside it); a fresh bed, API server, private bpffs and daemon per
scenario and round.

Scenarios (the issue's "Must show"):

- ``alone``: a pod annotated egress 100M sends alone (its tenant has no limit, so only the
  annotation caps it): 90–103 Mbit/s.
- ``beside``: the same pod beside an unannotated pod of its tenant (limit 800 Mbit/s), both
  sending: capped 90–103, the other >= 600.
- ``change``: the pod sends for ``--duration`` s at 100M, the annotation is changed to 200M through
  the API (one MODIFIED event; the pod, its veth and the flows untouched), it sends
  ``--duration`` s more. What the receiver's sockets have received (``ss -ti`` bytes_received) is
  sampled every 0.1 s; settled = the end of the first 0.5 s window after the change from which
  every 0.5 s window lies in 180–206 Mbit/s. Target: within 3 s. Also: when the class's ceil
  changed in the kernel (``tc class show`` polled every 0.1 s), and the rate after settling.
- ``tenant-ingress``: a tenant with ``ingress: {bandwidthLimit: 150Mbps}``; its pod receives from
  ``recv`` (iperf3 -R): <= 155.
- ``pod-ingress``: a pod annotated ``ingress-bandwidth: 50M`` receives from ``recv``: 40–52.
- ``isolation``: bench/isolation.py's scenarios that check guarantees (together, pressure, udp), in
  the shaperd mode, on htb, with both tenants carrying an ingress block and each tenant holding one
  more pod, idle, annotated egress 100M and ingress 50M (so the tenant classes are inner classes
  with a pod leaf, the IFB and the per-pod veth caps are all in place).

Before measuring, the bench waits (``--enforce-wait``) until the kernel shows what the scenario
asks for (a class with the pod's ceil on the uplink, a rate on the pod's veth, the tenant's limit
on an IFB); what never appeared is reported in the "in the kernel" column, and the figure is
measured all the same: on a shaperd that ignores the annotations that is the "before" figure.
``--shaperd-root DIR`` runs the daemon from another checkout (PYTHONPATH=DIR for the daemon and
teardown only; the harness stays this one), e.g. a worktree of the commit before the feature.

Needs root, iproute2, iperf3. Measures, asserts nothing. About (5 + 3 x 2) x duration s of traffic per
round plus set-up: 3 rounds of 8 s take about 10 min.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "bench"), str(ROOT / "testbed")):
    if p not in sys.path:
        sys.path.insert(0, p)

from shaperd_bed import netns, shaping  # noqa: E402
from shaperd_bed.netns import TC, run  # noqa: E402
from shaperd_bed.parse import Sample, mean_rate, window_rates  # noqa: E402
from shaperd_bed.scenarios import Settings, Shaper, run_all  # noqa: E402
from shaperd_bed.topology import Bed, BedConfig, TenantSpec  # noqa: E402
from shaperd_bed.traffic import TcpLoad, measure  # noqa: E402
from _signals import sigterm_as_exit  # noqa: E402

PY = sys.executable
NODE_NAME = "node-1"
EGRESS, INGRESS = "kubernetes.io/egress-bandwidth", "kubernetes.io/ingress-bandwidth"
M = 10**6
DAEMON_DEADLINE_S = 3600.0  # one scenario takes seconds; only a hung run reaches this
ISOLATION_SCENARIOS = ("together", "pressure", "udp")

# The pods of scenarios alone..pod-ingress (TenantSpec: the bed's pod namespaces; shaperd's tenants
# are the bench's own config, the pods join them through the API by label).
POD1 = TenantSpec("p1", "p1", 1, 0.0, 0.0, 0, 5201)
POD2 = TenantSpec("p2", "p2", 2, 0.0, 0.0, 0, 5202)
# The extra annotated pods of the isolation scenario, one per tenant.
EXTRA = (TenantSpec("ac", "ac", 3, 0.0, 0.0, 0, 5203), TenantSpec("bc", "bc", 4, 0.0, 0.0, 0, 5204))


class HarnessError(RuntimeError):
    """The daemon could not be started or the bed misbehaved (reported as the scenario's error)."""


# ------------------------------------------------------------------ the kernel, read independently


_RATE_RE = re.compile(r"\b(rate|ceil) (\d+(?:\.\d+)?)([KMGT]?)bit\b")
_SI = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def htb_ceils(ns: str, dev: str) -> set[int]:
    """Every HTB class ceil on ``dev``, bit/s (``tc class show`` text: tc -j is not JSON for HTB classes)."""
    out = run([TC, "class", "show", "dev", dev], ns, check=False).stdout
    return {round(float(v) * _SI[u]) for k, v, u in _RATE_RE.findall(out) if k == "ceil"}


def tbf_rates(ns: str, dev: str) -> set[int]:
    out = run([TC, "-j", "qdisc", "show", "dev", dev], ns, check=False).stdout
    try:
        qs = json.loads(out or "[]")
    except ValueError:
        return set()
    return {int(q["options"]["rate"]) * 8 for q in qs if q.get("kind") == "tbf" and "rate" in q.get("options", {})}


def ifb_devices(ns: str) -> list[str]:
    out = run(["ip", "-j", "link", "show", "type", "ifb"], ns, check=False).stdout
    try:
        return [link["ifname"] for link in json.loads(out or "[]")]
    except ValueError:
        return []


def uplink_ceil(bed: Bed, bps: int):
    """A check: some HTB class on the bed's uplink has this ceil."""
    return lambda: bps in htb_ceils(bed.ns["node"], bed.uplink)


_RECEIVED_RE = re.compile(r"\bbytes_received:(\d+)")


def tcp_bytes_received(ns: str, port: int) -> int:
    """Payload bytes received so far by the TCP sockets on local ``port`` (``ss -ti``): goodput, exactly,
    whatever GSO/GRO did to the packets (interface byte counters count aggregates, not frames)."""
    out = run(["ss", "-Htin", "state", "established", f"sport = :{port}"], ns).stdout
    return sum(int(x) for x in _RECEIVED_RE.findall(out))


# ------------------------------------------------------------------ the daemon and the API


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _git_describe(path: Path) -> str:
    p = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h %s"], capture_output=True, text=True,
                       timeout=30)
    return p.stdout.strip()[:80] or str(path)


def daemon_package(shaperd_root: Path | None) -> str:
    """Where the daemon's ``import shaperd`` resolves with the environment it is started with."""
    env = dict(os.environ, **({"PYTHONPATH": str(shaperd_root)} if shaperd_root else {}))
    p = subprocess.run([PY, "-c", "import shaperd, os; print(os.path.dirname(shaperd.__file__))"], env=env,
                       cwd=str(shaperd_root) if shaperd_root else None, capture_output=True, text=True, timeout=60)
    return p.stdout.strip() or p.stderr.strip()[-200:]


def pod_object(bed: Bed, spec: TenantSpec, tenant: str | None, annotations: dict | None = None) -> dict:
    from tests.k8s_fake import make_pod

    obj = make_pod(f"pod-{spec.short}", NODE_NAME, namespace="bench", ips=(spec.pod_addr,),
                   labels={"training-tenant": tenant} if tenant else {})
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    return obj


class Shaperd:
    """``shaperd run --kubeconfig`` against a fresh fake API server, acting in the bed's node namespace.

    The daemon runs in the host namespace (the fake listens on loopback), in its own process group
    with a deadline (the bed's process list ends it on any exit), pinning under a private bpffs."""

    def __init__(self, bed: Bed, config: dict, pods: list[dict], shaperd_root: Path | None):
        from tests.k8s_fake import FakeKubeAPI, write_kubeconfig

        self.bed, self.shaperd_root = bed, shaperd_root
        self.tmp = Path(tempfile.mkdtemp(prefix="shpd-podcaps-"))
        self.cfg_path = self.tmp / "tenants.yaml"
        self.cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.api = FakeKubeAPI()
        self.kubeconfig = write_kubeconfig(self.tmp / "kubeconfig", self.api.url)
        self.pods = {p["metadata"]["uid"]: p for p in pods}
        self.bpffs = self.tmp / "bpffs"
        self.port = _free_port()
        self.log_path = self.tmp / "daemon.log"
        self.proc: subprocess.Popen | None = None
        self._mounted = False
        # ``python -m`` puts the working directory first on sys.path: in another checkout's root, that
        # checkout's shaperd is the one imported (PYTHONPATH alone would lose to this one's).
        self.cwd = str(shaperd_root) if shaperd_root else None

    def env(self) -> dict:
        env = dict(os.environ, SHAPERD_BPFFS_ROOT=str(self.bpffs) if self._mounted else "")
        if self.shaperd_root is not None:
            env["PYTHONPATH"] = str(self.shaperd_root)
        return env

    def __enter__(self) -> "Shaperd":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.bpffs.mkdir()
        self._mounted = subprocess.run(["mount", "-t", "bpf", "bpf", str(self.bpffs)], capture_output=True,
                                       timeout=30).returncode == 0
        for p in self.pods.values():
            self.api.add_pod(p)
        with open(self.log_path, "w") as log:
            self.proc = self.bed.procs.spawn(
                [PY, "-m", "shaperd", "--log-json", "run", "--config", str(self.cfg_path), "--netns",
                 self.bed.ns["node"], "--node-name", NODE_NAME, "--kubeconfig", str(self.kubeconfig),
                 "--resync-interval", "30", "--metrics-address", f"127.0.0.1:{self.port}", "--no-pod-resources"],
                None, deadline_s=DAEMON_DEADLINE_S, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=self.cwd)
        if not wait_until(lambda: self.ready() or self.proc.poll() is not None, 60) or not self.ready():
            raise HarnessError(f"daemon not ready (exit {self.proc.poll()}): {self.refusal()}")

    def refusal(self) -> str:
        """The daemon's last error-ish log line (why it did not start), else the log's tail."""
        lines = self.log_path.read_text().splitlines() if self.log_path.exists() else []
        for line in reversed(lines):
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if rec.get("level") in ("error", "critical"):
                    return " ".join(str(rec.get(k)) for k in ("event", "error") if rec.get(k))[:300]
        return " | ".join(lines[-3:])[:300]

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5).status == 200
        except OSError:
            return False

    def sample(self, name: str, **labels):
        """The first sample of ``name`` with these labels on /metrics, or None."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        except OSError:
            return None
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s
        return None

    def metric(self, name: str, **labels) -> float | None:
        s = self.sample(name, **labels)
        return None if s is None else s.value

    def annotate(self, uid: str, key: str, value: str | None) -> None:
        def change(obj: dict) -> None:
            ann = obj["metadata"].setdefault("annotations", {})
            if value is None:
                ann.pop(key, None)
            else:
                ann[key] = value

        self.pods[uid] = self.api.modify_pod(uid, change)

    def wait_pods(self, by_tenant: dict[str, int], timeout: float) -> None:
        """Until the daemon has reconciled with every tenant's pods (shaperd_tenant_pods)."""
        ok = wait_until(lambda: all(self.metric("shaperd_tenant_pods", tenant=t) == n for t, n in by_tenant.items()),
                        timeout, 0.1)
        if not ok:
            raise HarnessError(f"pods never reached their tenants {by_tenant}: {self.refusal()}")

    def stop(self) -> None:
        self.stop_daemon()
        self.api.close()
        if self._mounted:
            subprocess.run(["umount", str(self.bpffs)], capture_output=True, timeout=30)
            self._mounted = False
        with contextlib.suppress(OSError):
            for f in self.tmp.iterdir():
                if f.is_file():
                    f.unlink()
            self.bpffs.rmdir()
            self.tmp.rmdir()

    def stop_daemon(self) -> None:
        """SIGTERM (the daemon's own exit), then its whole group; the kernel state stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=15)
        if self.proc is not None:
            netns.stop(self.proc, 0)
            self.bed.procs.forget(self.proc)

    def teardown(self) -> str | None:
        """``shaperd teardown`` in the node, after stop_daemon (the same shaperd and pins); None when it
        succeeded, else what it said."""
        argv = [PY, "-m", "shaperd", "teardown", "--netns", self.bed.ns["node"], "--bpffs-root",
                str(self.bpffs) if self._mounted else ""]
        p = netns.spawn(argv, deadline_s=120, env=self.env(), cwd=self.cwd)
        out, err = p.communicate()  # the deadline ends its group if it hangs
        return None if p.returncode == 0 else (err or out).strip()[:300]


def wait_until(pred, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def enforcement(checks: dict[str, object], timeout: float) -> dict[str, bool]:
    """Wait (one shared deadline) until every check holds; report which did."""
    deadline = time.monotonic() + timeout
    got: dict[str, bool] = {}
    for label, pred in checks.items():
        got[label] = bool(wait_until(pred, max(0.0, deadline - time.monotonic()), 0.1))
    return got


# ------------------------------------------------------------------ configuration


def node_config(bed: Bed, a) -> dict:
    return {"interfaces": [bed.uplink], "capacity": f"{a.capacity}Mbps", "reserve": "10Mbps"}


def tenant_a(limit_mbit: int | None = None, ingress: dict | None = None) -> dict:
    t: dict = {"name": "tenant-a", "bandwidthGuarantee": "400Mbps", "priority": 100}
    if limit_mbit is not None:
        t["bandwidthLimit"] = f"{limit_mbit}Mbps"
    if ingress is not None:
        t["ingress"] = ingress
    return t


@dataclass
class Args:
    duration: float
    flows: int
    capacity: int
    enforce_wait: float
    shaperd_root: Path | None
    link: int


@dataclass
class Outcome:
    """One scenario in one round: figures (Mbit/s or s), what the kernel showed, or the error."""

    scenario: str
    figures: dict[str, float | None] = field(default_factory=dict)
    enforced: dict[str, bool] = field(default_factory=dict)
    error: str | None = None
    teardown: str | None = None


def _bed(a: Args, pods=(POD1, POD2)) -> Bed:
    return Bed(BedConfig(link_mbit=a.link, tenants=tuple(pods), inbound_link=True))


def _load(short: str, a: Args, duration: float | None = None, reverse: bool = False) -> TcpLoad:
    return TcpLoad(short, a.flows, duration or a.duration, interval=0.1, reverse=reverse)


def sc_alone(a: Args, log) -> Outcome:
    out = Outcome("alone")
    with _bed(a) as bed:
        cfg = {"node": node_config(bed, a), "tenants": [tenant_a()]}
        pods = [pod_object(bed, POD1, "tenant-a", {EGRESS: "100M"})]
        with Shaperd(bed, cfg, pods, a.shaperd_root) as sd:
            sd.wait_pods({"tenant-a": 1}, 60)
            out.enforced = enforcement({"pod class ceil 100M": uplink_ceil(bed, 100 * M)}, a.enforce_wait)
            r = measure(bed, [_load("p1", a)], name="alone")
        out.figures["capped"] = r["p1"].received_bps / M
    return out


def sc_beside(a: Args, log) -> Outcome:
    out = Outcome("beside")
    with _bed(a) as bed:
        cfg = {"node": node_config(bed, a), "tenants": [tenant_a(800)]}
        pods = [pod_object(bed, POD1, "tenant-a", {EGRESS: "100M"}), pod_object(bed, POD2, "tenant-a")]
        with Shaperd(bed, cfg, pods, a.shaperd_root) as sd:
            sd.wait_pods({"tenant-a": 2}, 60)
            out.enforced = enforcement({"pod class ceil 100M": uplink_ceil(bed, 100 * M)}, a.enforce_wait)
            r = measure(bed, [_load("p1", a), _load("p2", a)], name="beside")
        out.figures["capped"] = r["p1"].received_bps / M
        out.figures["other"] = r["p2"].received_bps / M
    return out


class RxSampler:
    """What the receiver's sockets on ``port`` have received, every ``every`` s, on this process's clock."""

    def __init__(self, ns: str, port: int, every: float = 0.1):
        self.ns, self.port, self.every = ns, port, every
        self.points: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="rx-sampler", daemon=True)

    def _loop(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                t = time.monotonic()
                got = tcp_bytes_received(self.ns, self.port)
                self.points.append(((t + time.monotonic()) / 2, got))  # the read is somewhere in between
            nxt += self.every
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def samples(self) -> list[Sample]:
        """0.1 s goodput samples (bit/s), times on the monotonic clock; none once sockets close."""
        pts = self.points
        return [Sample(t0, t1, (b1 - b0) * 8 / (t1 - t0))
                for (t0, b0), (t1, b1) in zip(pts, pts[1:]) if t1 > t0 and b1 >= b0]

    def flowing(self, bps: float = 10 * M) -> float | None:
        """When the goodput first passed ``bps``."""
        return next((s.start for s in self.samples() if s.bps >= bps), None)

    def __enter__(self) -> "RxSampler":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(timeout=10)


def settle_time(samples: list[Sample], t_change: float, lo: float, hi: float, window: float = 0.5) -> float | None:
    """Seconds from ``t_change`` to the end of the first ``window`` from which every window is in [lo, hi]."""
    idx = [i for i, s in enumerate(samples) if s.start >= t_change]
    for i in idx:
        rolls = window_rates(samples[i:], window)
        if rolls and all(lo <= r <= hi for r in rolls):
            return samples[i].start + window - t_change
    return None


def sc_change(a: Args, log) -> Outcome:
    out = Outcome("change")
    with _bed(a) as bed:
        cfg = {"node": node_config(bed, a), "tenants": [tenant_a()]}
        pod = pod_object(bed, POD1, "tenant-a", {EGRESS: "100M"})
        uid = pod["metadata"]["uid"]
        node, up = bed.ns["node"], bed.uplink
        with Shaperd(bed, cfg, [pod], a.shaperd_root) as sd:
            sd.wait_pods({"tenant-a": 1}, 60)
            out.enforced = enforcement({"pod class ceil 100M": lambda: 100 * M in htb_ceils(node, up)}, a.enforce_wait)
            marks: dict[str, float] = {}
            stop = threading.Event()

            def change() -> None:
                """Once the flows run, ``duration`` s at 100M; then the MODIFIED event; then poll the ceil."""
                if not wait_until(lambda: stop.is_set() or sampler.flowing() is not None, 30, 0.05) or stop.is_set():
                    return
                if stop.wait(max(0.0, sampler.flowing() + a.duration - time.monotonic())):
                    return
                marks["change"] = time.monotonic()
                sd.annotate(uid, EGRESS, "200M")
                while not stop.is_set() and time.monotonic() - marks["change"] < a.duration:
                    c = htb_ceils(node, up)
                    if 200 * M in c and 100 * M not in c:
                        marks["ceil"] = time.monotonic()
                        return
                    time.sleep(0.1)

            with RxSampler(bed.ns["recv"], 5201) as sampler:  # measure()'s first iperf3 server
                changer = threading.Thread(target=change, name="annotate", daemon=True)
                changer.start()
                try:
                    r = measure(bed, [_load("p1", a, duration=2 * a.duration + 1.0)], name="change")
                finally:
                    stop.set()
                    changer.join(timeout=30)
            out.enforced["class ceil 200M after the change"] = "ceil" in marks
        samples = sampler.samples()
        start = sampler.flowing()
        out.figures["whole run"] = r["p1"].received_bps / M
        if "change" not in marks or start is None:
            out.error = "the annotation was never changed (no traffic seen)"
            return out
        t_change = marks["change"]
        # the flows' last 0.5 s (iperf3 ending) are no steady state
        end = max((s.end for s in samples if s.bps >= 10 * M), default=t_change) - 0.5
        samples = [s for s in samples if s.end <= end]
        before = mean_rate([s for s in samples if start + 1.0 <= s.start and s.end <= t_change])
        after = mean_rate([s for s in samples if s.start >= t_change + 3.0])
        out.figures["before the change"] = before / M if before else None
        out.figures["after the change (from +3 s)"] = after / M if after else None
        out.figures["settled (s)"] = settle_time(samples, t_change, 180 * M, 206 * M)
        out.figures["kernel ceil changed (s)"] = marks["ceil"] - t_change if "ceil" in marks else None
    return out


def sc_tenant_ingress(a: Args, log) -> Outcome:
    out = Outcome("tenant-ingress")
    with _bed(a) as bed:
        cfg = {"node": node_config(bed, a), "tenants": [tenant_a(ingress={"bandwidthLimit": "150Mbps"})]}
        pods = [pod_object(bed, POD1, "tenant-a")]
        node = bed.ns["node"]
        with Shaperd(bed, cfg, pods, a.shaperd_root) as sd:
            sd.wait_pods({"tenant-a": 1}, 60)
            out.enforced = enforcement({"IFB class ceil 150M": lambda: any(150 * M in htb_ceils(node, d)
                                                                           for d in ifb_devices(node))},
                                       a.enforce_wait)
            r = measure(bed, [_load("p1", a, reverse=True)], name="tenant-ingress")
        out.figures["received"] = r["p1"].received_bps / M
    return out


def sc_pod_ingress(a: Args, log) -> Outcome:
    out = Outcome("pod-ingress")
    with _bed(a) as bed:
        cfg = {"node": node_config(bed, a), "tenants": [tenant_a()]}
        pods = [pod_object(bed, POD1, "tenant-a", {INGRESS: "50M"})]
        node, veth = bed.ns["node"], bed.node_if["p1"]
        with Shaperd(bed, cfg, pods, a.shaperd_root) as sd:
            sd.wait_pods({"tenant-a": 1}, 60)
            out.enforced = enforcement({"50M on the pod's veth": lambda: 50 * M in (tbf_rates(node, veth)
                                                                                   | htb_ceils(node, veth))},
                                       a.enforce_wait)
            r = measure(bed, [_load("p1", a, reverse=True)], name="pod-ingress")
        out.figures["received"] = r["p1"].received_bps / M
    return out


def sc_isolation(a: Args, log, with_ingress: bool = True) -> tuple[Outcome, list[dict]]:
    """bench/isolation.py's guarantee scenarios, shaperd mode, with annotated pods and ingress blocks."""
    out = Outcome("isolation")
    ingress = {"tenant-a": {"bandwidthGuarantee": "300Mbps", "bandwidthLimit": "600Mbps"},
               "tenant-b": {"bandwidthGuarantee": "200Mbps", "bandwidthLimit": "400Mbps"}}
    results: list[dict] = []
    bed = Bed(BedConfig(link_mbit=a.link, extra_pods=EXTRA, inbound_link=True))
    with bed:
        a_spec, b_spec = bed.tenant("a"), bed.tenant("b")
        running: dict = {}

        def program(bed_: Bed, cfg: dict) -> None:
            cfg = copy.deepcopy(cfg)
            for t in cfg["tenants"]:
                if with_ingress:
                    t["ingress"] = ingress[t["name"]]
            caps = {EGRESS: "100M", INGRESS: "50M"}
            pods = [pod_object(bed_, a_spec, "tenant-a"), pod_object(bed_, b_spec, "tenant-b"),
                    pod_object(bed_, EXTRA[0], "tenant-a", caps), pod_object(bed_, EXTRA[1], "tenant-b", caps)]
            sd = Shaperd(bed_, cfg, pods, a.shaperd_root)
            running["sd"] = sd
            try:
                sd.start()
                sd.wait_pods({"tenant-a": 2, "tenant-b": 2}, 60)
            except BaseException as e:
                unprogram(bed_)  # the scenario never yields: its finally would not run
                raise shaping.ShaperdError(str(e)) from e
            node = bed_.ns["node"]
            checks = {"pod classes ceil 100M": lambda: 100 * M in htb_ceils(node, bed_.uplink),
                      "50M on both pods' veths": lambda: all(
                          50 * M in (tbf_rates(node, bed_.node_if[p.short]) | htb_ceils(node, bed_.node_if[p.short]))
                          for p in EXTRA)}
            if with_ingress:
                checks["IFB class ceils 600M and 400M"] = lambda: any(
                    {600 * M, 400 * M} <= htb_ceils(node, d) for d in ifb_devices(node))
            for k, v in enforcement(checks, a.enforce_wait).items():
                out.enforced[k] = out.enforced.get(k, True) and v

        def unprogram(bed_: Bed) -> None:
            sd = running.pop("sd", None)
            if sd is None:
                return
            try:
                sd.stop_daemon()
                out.teardown = sd.teardown() or out.teardown
            finally:
                sd.stop()
                bed_.clear_node_shaping()

        s = Settings(duration=a.duration, capacity_bps=a.capacity * M, reserve_bps=10 * M)
        res = run_all(bed, s, scenarios=ISOLATION_SCENARIOS, modes=("shaperd",),
                      shaper=Shaper(program_node=program, unprogram_node=unprogram), progress=log)
        results = [r.to_dict() for r in res]
        errors = [f"{r['scenario']}: {r['error']}" for r in results if r.get("error")]
        out.error = "; ".join(errors) or None
    return out, results


SCENARIOS = {"alone": sc_alone, "beside": sc_beside, "change": sc_change, "tenant-ingress": sc_tenant_ingress,
             "pod-ingress": sc_pod_ingress}
ALL = (*SCENARIOS, "isolation")

# (scenario, figure, what the issue asks, lo, hi) in the order of the "Must show"
TARGETS = (
    ("alone", "capped", "a pod annotated egress 100M, alone", 90, 103),
    ("beside", "capped", "the same, beside an unannotated tenant-mate (tenant limit 800 Mbit/s)", 90, 103),
    ("beside", "other", "the unannotated tenant-mate", 600, None),
    ("change", "before the change", "annotation 100M, before the change", 90, 103),
    ("change", "settled (s)", "annotation changed to 200M through the API: settled after (s)", None, 3),
    ("change", "after the change (from +3 s)", "after the change, from 3 s on", 180, 206),
    ("change", "kernel ceil changed (s)", "the class's ceil changed in the kernel after (s)", None, None),
    ("tenant-ingress", "received", "a tenant with ingress.bandwidthLimit 150Mbps receives", None, 155),
    ("pod-ingress", "received", "a pod annotated ingress-bandwidth 50M receives", 40, 52),
)


# ------------------------------------------------------------------ report


def _med(vals: list[float | None], nd: int = 0) -> str:
    xs = [v for v in vals if v is not None]
    if not xs:
        return "-"
    m = statistics.median(xs)
    return f"{m:.{nd}f}" if len(xs) == 1 else f"{m:.{nd}f} ({min(xs):.{nd}f}..{max(xs):.{nd}f})"


def _target(lo, hi) -> str:
    if lo is None and hi is None:
        return "(reported)"
    if lo is None:
        return f"<= {hi:g}"
    if hi is None:
        return f">= {lo:g}"
    return f"{lo:g}–{hi:g}"


def _verdict(vals: list[float | None], lo, hi) -> str:
    xs = [v for v in vals if v is not None]
    if not xs or (lo is None and hi is None):
        return ""
    m = statistics.median(xs)
    return "ok" if (lo is None or m >= lo) and (hi is None or m <= hi) else "MISSED"


def report(rounds: list[dict[str, Outcome]], iso_rounds: list[list[dict]], cmd: str, a: Args, repeats: int,
           label: str) -> str:
    import isolation as iso  # bench/isolation.py: its tables for the isolation scenarios

    iperf = subprocess.run(["iperf3", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    under = f"{_git_describe(a.shaperd_root or ROOT)} (the daemon imports {daemon_package(a.shaperd_root)})"
    lines = [f"### Per-pod caps and ingress{f' ({label})' if label else ''}: {a.link} Mbit/s emulated link, htb", "",
             f"Reproduce (root): `{cmd}`  ",
             f"shaperd under test: {under}. {repeats} round(s), {a.duration:g} s per measurement, TCP, {a.flows} "
             f"flows per pod (iperf3 -P), node.capacity {a.capacity} Mbit/s; {os.cpu_count()} cores, Linux "
             f"{platform.release()}, {iperf}. Goodput in Mbit/s (the receiver's), median (min..max) over rounds.", ""]
    rows: list[str] = []
    for sc, fig, text, lo, hi in TARGETS:
        outs = [r[sc] for r in rounds if sc in r]
        if not outs:
            continue
        errs = [o.error for o in outs if o.error and not o.figures]
        if errs and len(errs) == len(outs):
            rows.append(f"| {text} | {_target(lo, hi)} | error: {errs[0]} | | |")
            continue
        vals = [o.figures.get(fig) for o in outs]
        nd = 2 if "(s)" in fig else 0
        kernel = "; ".join(f"{k}: {sum(o.enforced.get(k, False) for o in outs)}/{len(outs)}"
                           for k in dict.fromkeys(k for o in outs for k in o.enforced))
        rows.append(f"| {text} | {_target(lo, hi)} | {_med(vals, nd)} | {_verdict(vals, lo, hi)} | {kernel} |")
    if rows:
        lines += ["| must show | target | measured | verdict | in the kernel before traffic |", "|---|---|---|---|---|",
                  *rows]
    notes = sorted({f"{o.scenario}: {o.error}" for r in rounds for o in r.values() if o.error and o.figures})
    notes += sorted({f"{o.scenario}: teardown: {o.teardown}" for r in rounds for o in r.values() if o.teardown})
    if notes:
        lines += ["", "Notes: " + "; ".join(notes)]
    if iso_rounds:
        iso_outs = [r["isolation"] for r in rounds if "isolation" in r]
        kernel = "; ".join(f"{k}: {sum(o.enforced.get(k, False) for o in iso_outs)}/{len(iso_outs)}"
                           for k in dict.fromkeys(k for o in iso_outs for k in o.enforced))
        lines += ["", "Isolation guarantees with all of it in place (bench/isolation.py's scenarios together, "
                  "pressure, udp; shaperd mode; both tenants with an ingress block, each with one more pod, idle, "
                  f"annotated egress 100M and ingress 50M; in the kernel: {kernel or '-'}; mean ± stdev "
                  "(min..max) over rounds):", "",
                  # the targets these scenarios judge (guarantee, limit); the others need the rest of isolation.py
                  "\n".join(row for row in iso.targets_table(iso_rounds, ("shaperd",)).splitlines()
                            if not row.endswith("| - |")), "",
                  iso.detail_table(iso_rounds)]
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per measurement (default 8)")
    ap.add_argument("--flows", type=int, default=4, help="TCP flows per pod (default 4)")
    ap.add_argument("--link", type=int, default=1000, help="emulated link, Mbit/s (default 1000)")
    ap.add_argument("--capacity", type=int, default=990,
                    help="shaperd node.capacity, Mbit/s (default 990: 1 %% below the link, as the demo)")
    ap.add_argument("--scenarios", default=",".join(ALL), help=f"comma-separated, of {','.join(ALL)}")
    ap.add_argument("--enforce-wait", type=float, default=20.0,
                    help="seconds to wait for the kernel to show a scenario's caps before measuring (default 20)")
    ap.add_argument("--shaperd-root", type=Path, default=None,
                    help="run the daemon from this checkout (PYTHONPATH for the daemon only), e.g. the commit before")
    ap.add_argument("--no-ingress-block", action="store_true",
                    help="isolation scenario without the tenants' ingress blocks (for a shaperd that refuses them)")
    ap.add_argument("--label", default="", help="a word for the heading, e.g. before / after")
    ap.add_argument("--json-out", help="also write every raw result here")
    ns = ap.parse_args(argv)
    problems = shaping.prerequisites()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 3
    chosen = [s.strip() for s in ns.scenarios.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in ALL]
    if unknown:
        print(f"unknown scenario(s) {unknown}; choose from {','.join(ALL)}", file=sys.stderr)
        return 2
    a = Args(ns.duration, ns.flows, ns.capacity, ns.enforce_wait,
             ns.shaperd_root.resolve() if ns.shaperd_root else None, ns.link)
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    rounds: list[dict[str, Outcome]] = []
    iso_rounds: list[list[dict]] = []
    with sigterm_as_exit():  # between beds too (a bed turns SIGTERM into its own teardown while it stands)
        collect(ns, a, chosen, rounds, iso_rounds, log)
    cmd = " ".join(shlex.quote(x) for x in ["sudo", ".venv/bin/python", "bench/pod_caps.py",
                                            *(argv if argv is not None else sys.argv[1:])])
    print(report(rounds, [r for r in iso_rounds if r], cmd, a, ns.repeats, ns.label))
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            json.dump({"rounds": [{k: vars(o) for k, o in r.items()} for r in rounds], "isolation": iso_rounds},
                      f, default=str, indent=1)
    log("done")
    return 0


def collect(ns, a: Args, chosen: list[str], rounds: list, iso_rounds: list, log) -> None:
    for i in range(ns.repeats):
        got: dict[str, Outcome] = {}
        for sc in chosen:
            log(f"round {i + 1}/{ns.repeats}: {sc}")
            try:
                if sc == "isolation":
                    got[sc], res = sc_isolation(a, log, with_ingress=not ns.no_ingress_block)
                    iso_rounds.append(res)
                else:
                    got[sc] = SCENARIOS[sc](a, log)
            except (HarnessError, shaping.ShaperdError, netns.CommandError, RuntimeError) as e:
                got[sc] = Outcome(sc, error=str(e)[:300])
            o = got[sc]
            log(f"  {sc}: {json.dumps(o.figures, default=str)} kernel {o.enforced}"
                + (f" error {o.error}" if o.error else ""))
        rounds.append(got)


if __name__ == "__main__":
    sys.exit(main())
