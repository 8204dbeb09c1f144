"""Per-pod egress caps on htb in the kernel: a capped pod's own class under its tenant's, on both classifier paths.

Fresh namespaces (tests/integration/conftest.py): routed-veth "pods" as Calico makes them, fed to a
Reconciler as the Kubernetes watcher would, with ``kubernetes.io/egress-bandwidth`` annotations. The tree
is read back through netlink (pyroute2, our own socket) and ``tc -j``; packets of the capped pod are
counted in its class by the kernel, those of its uncapped tenant-mate in the tenant's rest leaf. Each
transition (first capped pod, changed cap, removed cap, deleted pod) converges and a second reconcile
sends no write.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pytest

from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.common.objects import ROOT_HANDLE, fmt_handle
from shaperd.core.config import load_text
from shaperd.core.ids import assign_minors, bpf_program_name
from shaperd.engine.probe import probe_capabilities
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.kernel import tc
from shaperd.kernel.rtnl import RtnlReader

from .conftest import PY, SENDER, needs_root, run
from .test_core import classes

pytestmark = needs_root

CFG = """
node: {interfaces: [up0], capacity: 10Gbps, reserve: 100Mbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 6Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 2Gbps, bandwidthLimit: 4Gbps, priority: 50, match: {namespaces: [team-b]},
     destinations: [{cidrs: [198.19.0.0/24], bandwidthLimit: 1Gbps}]}
"""
MINORS = assign_minors(["tenant-a", "tenant-b"])
A, B = ROOT_HANDLE | MINORS["tenant-a"], ROOT_HANDLE | MINORS["tenant-b"]
EGRESS = "kubernetes.io/egress-bandwidth"


@dataclass
class FakePod:
    """What the Kubernetes watcher hands the reconciler (PodInfo's fields)."""

    uid: str
    namespace: str
    name: str
    labels: dict = field(default_factory=dict)
    ips: tuple = ()
    annotations: dict = field(default_factory=dict)
    host_network: bool = False
    qos_class: str | None = "BestEffort"
    phase: str = "Running"
    node: str = "node-1"


@pytest.fixture(params=["ebpf", "u32"])
def node(bed, request):
    caps = probe_capabilities()
    if not caps.bpf:
        pytest.skip("cls_bpf not available: no mark programs on this kernel")
    if request.param == "ebpf" and not caps.bpf_maps:
        pytest.skip("no eBPF map classifier on this kernel")
    if request.param == "u32":
        caps = dataclasses.replace(caps, bpf_maps=False)
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    bed.addr(bed.peer, "up1", "198.19.0.2/24")
    pods: list[FakePod] = []
    ipr = tc.open_writer(bed.node)
    reader = RtnlReader(bed.node)
    rec = Reconciler(reader, default_backends(ipr), caps, pods_source=lambda: pods)

    class Node:
        path = request.param

        def __init__(self):
            self.bed, self.pods, self.cfg = bed, pods, load_text(CFG)

        def apply(self):
            rep = rec.apply(self.cfg)
            assert not any(d.failed or d.error for d in rep.devices), rep.devices
            assert not rep.problems, rep.problems
            return rep

        def converged(self):
            """Apply until nothing changes, then prove a further reconcile sends no write."""
            rep = self.apply()
            again = self.apply()
            assert again.changes == 0, [op.describe() for d in again.devices for op in d.ops]
            return rep

        def pod(self, i, tenant_label="tenant-a", cap=None, ns="team-a"):
            """A routed veth pod ``cali<i>`` with 198.18.20.<i>/32, as Calico wires it."""
            pns = bed.ns(f"{bed.tag}-p{i}")
            ip = f"198.18.20.{i}"
            run("ip", "-n", bed.node, "link", "add", f"cali{i}", "type", "veth", "peer", "name", "eth0", "netns", pns)
            run("ip", "-n", pns, "addr", "add", f"{ip}/32", "dev", "eth0")
            run("ip", "-n", pns, "link", "set", "eth0", "up")
            run("ip", "-n", bed.node, "link", "set", f"cali{i}", "up")
            run("ip", "-n", pns, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
            run("ip", "-n", pns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
            bed.exec("sysctl", "-qw", f"net.ipv4.conf.cali{i}.proxy_arp=1", f"net.ipv4.neigh.cali{i}.proxy_delay=0")
            run("ip", "-n", bed.node, "route", "add", f"{ip}/32", "dev", f"cali{i}", "scope", "link")
            p = FakePod(f"uid-{i}", ns, f"pod-{i}", {"training-tenant": tenant_label} if tenant_label else {},
                        (ip,), {EGRESS: cap} if cap else {})
            pods.append(p)
            return p, pns

        def annotate(self, p, cap):
            i = pods.index(p)
            pods[i] = dataclasses.replace(p, annotations={EGRESS: cap} if cap else {})
            return pods[i]

        def send(self, ns, n, dst="198.18.0.2", size=300):
            bed.exec(PY, "-c", SENDER, "-", dst, str(size), str(n), ns=ns)

        def lands(self, ns, n, dst="198.18.0.2"):
            """Class -> packets counted while ``ns`` sent ``n`` packets."""
            before = classes(bed)
            self.send(ns, n, dst)
            after = classes(bed)
            return {k: after[k]["packets"] - before.get(k, {"packets": 0})["packets"] for k in after}

    try:
        yield Node()
    finally:
        ipr.close()
        reader.close()


def tc_classes(bed) -> dict[str, dict]:
    """``tc class show dev up0`` (iproute2 prints HTB classes as text only): handle -> parent ("root" at the
    top), whether it has a leaf queue, and rate/ceil in bytes per second from pyroute2 (our own socket)."""
    nums = {fmt_handle(k): v for k, v in classes(bed).items()}
    out = {}
    for line in bed.exec("tc", "class", "show", "dev", "up0").stdout.splitlines():
        w = line.split()
        if w[:2] != ["class", "htb"]:
            continue
        out[w[2]] = {"handle": w[2], "parent": w[w.index("parent") + 1] if "parent" in w else "root",
                     "leaf": "leaf" in w, "rate": nums[w[2]]["rate"], "ceil": nums[w[2]]["ceil"]}
    return out


def pod_class(rep, uid) -> int:
    return next(p.classid for p in rep.plan.desired["htb"].pods if p.uid == uid)


def minor_of(handle: str) -> int:
    return ROOT_HANDLE | int(handle.split(":")[1], 16)


def rest_of(bed, tenant_cid, but=()) -> int:
    """The tenant's rest leaf: its child that is no pod's (nor a scope's: the one with the tenant's ceil)."""
    got = tc_classes(bed)
    ceil = got[fmt_handle(tenant_cid)]["ceil"]
    (rest,) = [h for h, c in got.items() if c["parent"] == fmt_handle(tenant_cid) and h not in but and c["ceil"] == ceil]
    return minor_of(rest)


def mark_program(bed, dev) -> str | None:
    out = json.loads(bed.exec("tc", "-j", "filter", "show", "dev", dev, "ingress", check=False).stdout or "[]")
    names = [f["options"].get("bpf_name", "") for f in out if "options" in f]
    return next((n for n in names if n.startswith("shpdm_")), None)


def classifier_entries(bed) -> dict[str, dict[bytes, bytes]]:
    """The eBPF map classifier's entries on up0, by map role, read from the maps by program id ({} on u32)."""
    out = json.loads(bed.exec("tc", "-j", "filter", "show", "dev", "up0", "egress", check=False).stdout or "[]")
    ids = [f["options"]["prog"]["id"] for f in out
           if f.get("options", {}).get("bpf_name", "").startswith("shpd_c") and "prog" in f["options"]]
    if not ids:
        return {}
    with bpf_classify.ClassifierMaps.adopt(ids[0]) as maps:
        return {role: m.items() for role, m in maps.maps.items()}


def u32_on(bed, parent="7368:") -> list[dict]:
    out = json.loads(bed.exec("tc", "-j", "filter", "show", "dev", "up0", "parent", parent, check=False).stdout or "[]")
    return [f for f in out if f.get("kind") == "u32" and "options" in f and "flowid" in f["options"]]


def test_a_capped_pods_packets_land_in_its_class_its_mates_in_rest(node):
    capped, cns = node.pod(2, cap="100M")
    mate, mns = node.pod(3)
    rep = node.converged()
    own = pod_class(rep, capped.uid)
    got = tc_classes(node.bed)
    c = got[fmt_handle(own)]
    assert c["parent"] == fmt_handle(A) and c["ceil"] == 100 * 10**6 // 8  # tc -j: bytes per second
    assert c["leaf"] and not got[fmt_handle(A)]["leaf"]  # the tenant class is inner now
    rest = rest_of(node.bed, A, but=(fmt_handle(own),))
    d = node.lands(cns, 40)
    assert d[own] == 40 and d[A] == 40 and d[rest] == 0
    d = node.lands(mns, 30)
    assert d[rest] == 30 and d[A] == 30 and d[own] == 0
    # Its host interface carries its own mark, the mate's its tenant's.
    ten = rep.plan.tenancy
    mask = node.cfg.node.mark_mask
    assert mark_program(node.bed, "cali2") == bpf_program_name(((ten.pod_marks[capped.uid], mask),), "mark")
    assert mark_program(node.bed, "cali3") == bpf_program_name(((ten.marks["tenant-a"], mask),), "mark")
    if node.path == "ebpf":
        assert u32_on(node.bed) == []  # nothing classifying on the HTB root: the map classifier did it
        e = classifier_entries(node.bed)
        assert own.to_bytes(4, "little") in e["src4"].values() and own.to_bytes(4, "little") in e["ifindex"].values()
    else:
        assert any(f["options"]["flowid"] == fmt_handle(own) for f in u32_on(node.bed))


def test_a_capped_pod_of_no_tenant_is_capped_beside_the_default_class(node):
    lone, ns = node.pod(4, tenant_label=None, cap="50M", ns="other")
    rep = node.converged()
    own = pod_class(rep, lone.uid)
    got = tc_classes(node.bed)
    assert got[fmt_handle(own)]["parent"] == "7368:1" and got[fmt_handle(own)]["ceil"] == 50 * 10**6 // 8
    assert got["7368:2"]["leaf"]  # the default class stays a leaf ...
    qd = json.loads(node.bed.exec("tc", "-j", "qdisc", "show", "dev", "up0").stdout)
    assert next(q for q in qd if q["kind"] == "htb" and q.get("root"))["options"]["default"] == "0x2"  # ... and default
    # Its rate is carved out of the reserve.
    assert got[fmt_handle(own)]["rate"] + got["7368:2"]["rate"] == 100 * 10**6 // 8
    d = node.lands(ns, 25)
    # All 25 in its own class (so none in the default class, which may count the node's own IPv6 chatter).
    assert d[own] == 25


def test_transitions_converge_then_are_silent(node):
    capped, cns = node.pod(5)
    node.pod(6)
    node.converged()
    assert tc_classes(node.bed)[fmt_handle(A)]["leaf"]
    node.send(cns, 10)
    packets_before = classes(node.bed)[A]["packets"]

    # First capped pod: the tenant's leaf becomes inner in place (same class, counters intact).
    capped = node.annotate(capped, "100M")
    rep = node.converged()
    own = pod_class(rep, capped.uid)
    got = classes(node.bed)
    assert got[A]["packets"] >= packets_before >= 10 and own in got
    assert node.lands(cns, 10)[own] == 10

    # A changed cap: the class changes, it is not recreated (its counters stay).
    capped = node.annotate(capped, "200M")
    rep = node.apply()
    ops = [type(op).__name__ for d in rep.devices for op in d.ops]
    assert "ChangeClass" in ops and "CreateClass" not in ops and "DeleteClass" not in ops, ops
    assert node.apply().changes == 0
    got = classes(node.bed)
    assert got[own]["ceil"] * 8 == 200 * 10**6 and got[own]["packets"] >= 10

    # The cap removed: the tenant is a leaf again, its packets land in it.
    capped = node.annotate(capped, None)
    node.converged()
    got = tc_classes(node.bed)
    assert fmt_handle(own) not in got and got[fmt_handle(A)]["leaf"]
    assert [c for c in got.values() if c["parent"] == fmt_handle(A)] == []
    assert node.lands(cns, 10)[A] == 10


def test_a_deleted_pod_leaves_nothing_behind(node):
    capped, _ = node.pod(7, cap="100M")
    node.pod(8, cap="300M")
    rep = node.converged()
    own = pod_class(rep, capped.uid)
    node.pods.remove(capped)
    node.converged()
    got = tc_classes(node.bed)
    assert fmt_handle(own) not in got
    leaves = [q for q in json.loads(node.bed.exec("tc", "-j", "qdisc", "show", "dev", "up0").stdout)
              if q.get("parent") == fmt_handle(own)]
    assert leaves == []
    assert all(f["options"]["flowid"] != fmt_handle(own) for p in ("7368:", fmt_handle(A)) for f in u32_on(node.bed, p))
    assert own.to_bytes(4, "little") not in [v for m in classifier_entries(node.bed).values() for v in m.values()]
    assert mark_program(node.bed, "cali7") is None  # its veth is still there (the API deleted it first)


def test_a_scoped_tenants_capped_pod_goes_to_the_scope_towards_it_and_to_its_own_leaf_elsewhere(node):
    capped, ns = node.pod(9, tenant_label=None, cap="100M", ns="team-b")
    rep = node.converged()
    own = pod_class(rep, capped.uid)
    got = tc_classes(node.bed)
    scope = next(minor_of(h) for h, c in got.items() if c["parent"] == fmt_handle(B) and c["ceil"] == 10**9 // 8)
    assert got[fmt_handle(own)]["parent"] == fmt_handle(B)
    d = node.lands(ns, 20, dst="198.19.0.2")
    assert d[scope] == 20 and d[own] == 0 and d[B] == 20
    d = node.lands(ns, 15)
    assert d[own] == 15 and d[scope] == 0
    assert any("tenant tenant-b has destination scopes" in w for w in rep.plan.warnings)
