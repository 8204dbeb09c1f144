"""Pods to packets, whatever the CNI: real namespaces as pods, real packets, class counters.

Each test builds a node namespace with an uplink to a peer, one "pod" wired
the way a CNI would, and lets the reconciler (fed the pod as the Kubernetes
watcher would) classify it. The bytes must land in the tenant's class.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shaperd.core.config import load_text
from shaperd.discovery.cgroups import cgroup2_root
from shaperd.kernel import tc
from shaperd.engine.probe import probe_capabilities
from shaperd.backends.common.objects import ROOT_HANDLE
from shaperd.core.ids import assign_minors
from shaperd.backends.marks.ops import SetMark
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.kernel.rtnl import RtnlReader

from .conftest import PY, SENDER, needs_root, run, wait_for

pytestmark = needs_root

CFG = """
node: {interfaces: [up0], capacity: 10Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 6Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 2Gbps, bandwidthLimit: 4Gbps, priority: 50, match: {namespaces: [team-b]}}
"""
MINORS = assign_minors(["tenant-a", "tenant-b"])
A, B = ROOT_HANDLE | MINORS["tenant-a"], ROOT_HANDLE | MINORS["tenant-b"]


@dataclass
class FakePod:
    """What the Kubernetes watcher hands the reconciler (PodInfo's fields)."""

    uid: str
    namespace: str
    name: str
    labels: dict = field(default_factory=dict)
    ips: tuple = ()
    host_network: bool = False
    qos_class: str | None = "BestEffort"
    phase: str = "Running"
    node: str = "node-1"
    annotations: dict = field(default_factory=dict)


@pytest.fixture
def node(bed):
    caps = probe_capabilities()
    if not caps.bpf:
        pytest.skip("cls_bpf not available: pods are recognised by address only on this kernel")
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    bed.exec("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    pods: list[FakePod] = []
    ipr = tc.open_writer(bed.node)
    reader = RtnlReader(bed.node)
    rec = Reconciler(reader, default_backends(ipr), caps, pods_source=lambda: pods)
    cfg = load_text(CFG)

    class Node:
        def __init__(self):
            self.bed, self.pods, self.rec, self.cfg = bed, pods, rec, cfg

        def apply(self):
            rep = rec.apply(self.cfg)
            assert not any(d.failed or d.error for d in rep.devices), rep.devices
            return rep

        def counters(self):
            stats = reader.htb_classes(ipr.link_lookup(ifname="up0")[0], "up0")
            return {s.classid: (s.packets, s.bytes) for s in stats}

        def pod_ns(self, name):
            return bed.ns(f"{bed.tag}-{name}")

        def send(self, ns, dst, size, count, src="-"):
            bed.exec(PY, "-c", SENDER, src, dst, str(size), str(count), ns=ns)

    try:
        yield Node()
    finally:
        ipr.close()
        reader.close()


def delta(before, after, cid):
    b, a = before.get(cid, (0, 0)), after[cid]
    return a[0] - b[0], a[1] - b[1]


def veth_pod(n, name, host_if, pod_addrs, host_addrs=(), routes=()):
    ns = n.pod_ns(name)
    run("ip", "-n", n.bed.node, "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    for a in pod_addrs:
        run("ip", "-n", ns, "addr", "add", a, "dev", "eth0", *(["nodad"] if ":" in a else []))
    for a in host_addrs:
        run("ip", "-n", n.bed.node, "addr", "add", a, "dev", host_if, *(["nodad"] if ":" in a else []))
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", n.bed.node, "link", "set", host_if, "up")
    for r in routes:
        fam = ["-6"] if r.startswith("-6 ") else []
        run("ip", *fam, "-n", ns, "route", "add", *r.removeprefix("-6 ").split())
    return ns


def test_routed_veth_pod_calico_style(node):
    # One /32 per pod routed to its host-side veth; the pod reaches the world via 169.254.1.1 (proxy ARP).
    ns = veth_pod(node, "r", "cali1", ["198.18.20.2/32"],
                  routes=["169.254.1.1 dev eth0 scope link", "default via 169.254.1.1 dev eth0"])
    node.bed.exec("sysctl", "-qw", "net.ipv4.conf.cali1.proxy_arp=1", "net.ipv4.neigh.cali1.proxy_delay=0")
    run("ip", "-n", node.bed.node, "route", "add", "198.18.20.2/32", "dev", "cali1", "scope", "link")
    node.pods.append(FakePod("uid-r", "team-a", "trainer-0", {"training-tenant": "tenant-a"}, ("198.18.20.2",)))
    rep = node.apply()
    assert any(isinstance(op, SetMark) and op.device == "cali1" for d in rep.devices for op in d.ops)
    before = node.counters()
    node.send(ns, "198.18.0.2", 900, 80)
    assert delta(before, node.counters(), A) == (80, 80 * (900 + 42))


def test_bridged_dual_stack_pod(node):
    n = node
    run("ip", "-n", n.bed.node, "link", "add", "cni0", "type", "bridge")
    run("ip", "-n", n.bed.node, "addr", "add", "198.18.21.1/24", "dev", "cni0")
    run("ip", "-n", n.bed.node, "addr", "add", "2001:db8:21::1/64", "dev", "cni0", "nodad")
    run("ip", "-n", n.bed.node, "link", "set", "cni0", "up")
    ns = veth_pod(n, "b", "vethb1", ["198.18.21.2/24", "2001:db8:21::2/64"],
                  routes=["default via 198.18.21.1", "-6 default via 2001:db8:21::1"])
    run("ip", "-n", n.bed.node, "link", "set", "vethb1", "master", "cni0")
    # The pod talks once (as every pod does: DNS, probes), so the bridge learns where it is.
    n.bed.exec("ping", "-c", "1", "-W", "1", "198.18.21.1", ns=ns, check=False)
    n.pods.append(FakePod("uid-b", "team-b", "loader-0", {}, ("198.18.21.2", "2001:db8:21::2")))
    rep = n.apply()
    assert any(isinstance(op, SetMark) and op.device == "vethb1" for d in rep.devices for op in d.ops), rep.plan.warnings
    before = n.counters()
    n.send(ns, "198.18.0.2", 700, 50)
    n.send(ns, "2001:db8:1::2", 600, 30)
    got = delta(before, n.counters(), B)
    assert got[0] >= 80 and got[1] >= 50 * (700 + 42) + 30 * (600 + 62)
    assert got[0] <= 82  # at most a neighbour message of the pod's own on top


@pytest.mark.skipif(not shutil.which("nft"), reason="needs nft for masquerade")
def test_masqueraded_pod_is_recognised_by_mark_not_address(node):
    n = node
    ns = veth_pod(n, "m", "vethm1", ["198.18.22.2/24"], ["198.18.22.1/24"], ["default via 198.18.22.1"])
    rules = "table ip shpdtest { chain post { type nat hook postrouting priority 100; oifname \"up0\" masquerade; }; }"
    subprocess.run(["ip", "netns", "exec", n.bed.node, "nft", "-f", "-"], input=rules, text=True, check=True)
    n.pods.append(FakePod("uid-m", "team-b", "ckpt-0", {}, ("198.18.22.2",)))
    n.apply()
    before = n.counters()
    n.send(ns, "198.18.0.2", 500, 40)
    assert delta(before, n.counters(), B) == (40, 40 * (500 + 42))


def test_vxlan_encapsulated_pod_traffic(node):
    n = node
    ns = veth_pod(n, "v", "vethv1", ["198.18.23.2/24"], ["198.18.23.1/24"], ["default via 198.18.23.1"])
    run("ip", "-n", n.bed.node, "link", "add", "vx0", "type", "vxlan", "id", "42", "local", "198.18.0.1",
        "remote", "198.18.0.2", "dstport", "4789", "dev", "up0")
    run("ip", "-n", n.bed.node, "addr", "add", "198.18.99.1/24", "dev", "vx0")
    run("ip", "-n", n.bed.node, "link", "set", "vx0", "up")
    run("ip", "-n", n.bed.node, "neigh", "replace", "198.18.99.2", "lladdr", "02:00:00:00:99:02", "dev", "vx0",
        "nud", "permanent")
    n.pods.append(FakePod("uid-v", "team-a", "worker-1", {"training-tenant": "tenant-a"}, ("198.18.23.2",)))
    n.apply()
    before = n.counters()
    n.send(ns, "198.18.99.2", 400, 30)  # to a "remote pod" behind the overlay
    # Outer headers: Ethernet 14 + IP 20 + UDP 8 + VXLAN 8 + inner Ethernet 14, then inner IP+UDP 28.
    assert delta(before, n.counters(), A) == (30, 30 * (400 + 28 + 14 + 50))


def _pod_class(n, uid):
    """The capped pod's own class id, as the htb plan made it (the same on every uplink)."""
    htb = n.rec.plan(n.cfg).desired["htb"]
    return next(p.classid for p in htb.pods if p.uid == uid)


@pytest.mark.parametrize("layout", ["bridged-dual-stack", "masqueraded", "vxlan"])
def test_a_capped_pod_lands_in_its_own_class_in_every_layout(node, layout):
    """The layouts above, the pod annotated kubernetes.io/egress-bandwidth: its bytes (IPv4 and IPv6 where it
    has both; masqueraded, so only its mark tells it; encapsulated, so only its interface or mark survive) land
    in its own class under its tenant's, and none in the tenant's rest leaf."""
    n = node
    ann = {"kubernetes.io/egress-bandwidth": "100M"}
    if layout == "bridged-dual-stack":
        run("ip", "-n", n.bed.node, "link", "add", "cni0", "type", "bridge")
        run("ip", "-n", n.bed.node, "addr", "add", "198.18.21.1/24", "dev", "cni0")
        run("ip", "-n", n.bed.node, "addr", "add", "2001:db8:21::1/64", "dev", "cni0", "nodad")
        run("ip", "-n", n.bed.node, "link", "set", "cni0", "up")
        ns = veth_pod(n, "b", "vethb1", ["198.18.21.2/24", "2001:db8:21::2/64"],
                      routes=["default via 198.18.21.1", "-6 default via 2001:db8:21::1"])
        run("ip", "-n", n.bed.node, "link", "set", "vethb1", "master", "cni0")
        n.bed.exec("ping", "-c", "1", "-W", "1", "198.18.21.1", ns=ns, check=False)
        n.pods.append(FakePod("uid-b", "team-b", "loader-0", {}, ("198.18.21.2", "2001:db8:21::2"), annotations=ann))
        sends, uid, tenant = [("198.18.0.2", 700, 50), ("2001:db8:1::2", 600, 30)], "uid-b", B
    elif layout == "masqueraded":
        if not shutil.which("nft"):
            pytest.skip("needs nft for masquerade")
        ns = veth_pod(n, "m", "vethm1", ["198.18.22.2/24"], ["198.18.22.1/24"], ["default via 198.18.22.1"])
        rules = "table ip shpdtest { chain post { type nat hook postrouting priority 100; oifname \"up0\" masquerade; }; }"
        subprocess.run(["ip", "netns", "exec", n.bed.node, "nft", "-f", "-"], input=rules, text=True, check=True)
        n.pods.append(FakePod("uid-m", "team-b", "ckpt-0", {}, ("198.18.22.2",), annotations=ann))
        sends, uid, tenant = [("198.18.0.2", 500, 40)], "uid-m", B
    else:
        ns = veth_pod(n, "v", "vethv1", ["198.18.23.2/24"], ["198.18.23.1/24"], ["default via 198.18.23.1"])
        run("ip", "-n", n.bed.node, "link", "add", "vx0", "type", "vxlan", "id", "42", "local", "198.18.0.1",
            "remote", "198.18.0.2", "dstport", "4789", "dev", "up0")
        run("ip", "-n", n.bed.node, "addr", "add", "198.18.99.1/24", "dev", "vx0")
        run("ip", "-n", n.bed.node, "link", "set", "vx0", "up")
        run("ip", "-n", n.bed.node, "neigh", "replace", "198.18.99.2", "lladdr", "02:00:00:00:99:02", "dev", "vx0",
            "nud", "permanent")
        n.pods.append(FakePod("uid-v", "team-a", "worker-1", {"training-tenant": "tenant-a"}, ("198.18.23.2",),
                              annotations=ann))
        sends, uid, tenant = [("198.18.99.2", 400, 30)], "uid-v", A
    n.apply()
    assert not any(d.ops for d in n.apply().devices)  # in sync: the second reconcile writes nothing
    pod_cls = _pod_class(n, uid)
    before = n.counters()
    for dst, size, count in sends:
        n.send(ns, dst, size, count)
    after = n.counters()
    sent = sum(c for _, _, c in sends)
    got = delta(before, after, pod_cls)
    assert sent <= got[0] <= sent + 2, (layout, got)  # at most a neighbour message of the pod's own on top
    htb = n.rec.plan(n.cfg).desired["htb"]
    dev = htb.device("up0")
    assert next(c for c in dev.classes if c.classid == pod_cls).parent == tenant
    rest = [c.classid for c in dev.classes if c.parent == tenant and c.classid != pod_cls]
    assert rest and all(delta(before, after, r)[0] <= 2 for r in rest if r in after), (layout, rest)


def test_host_network_pod_by_cgroup(node):
    root = cgroup2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted")
    uid = "0b9c8f2e-1111-4222-8333-944455556666"
    pod_dir = root / "kubepods.slice" / "kubepods-besteffort.slice" / f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
    ctr = pod_dir / "cri-containerd-abc.scope"
    made = []
    try:
        for d in (root / "kubepods.slice", pod_dir.parent, pod_dir, ctr):
            if not d.exists():
                d.mkdir()
                made.append(d)
        node.pods.append(FakePod(uid, "team-a", "nccl-0", {"training-tenant": "tenant-a"}, (), host_network=True))
        rep = node.apply()
        assert any(f.kind == "cgroup" for dp in rep.plan.desired["htb"].devices for f in dp.filters if hasattr(f, "kind")) \
            or any(dp.map_classifier is not None and dp.map_classifier.entries["cgroup"]
                   for dp in rep.plan.desired["htb"].devices)
        before = node.counters()
        # A process of the pod (in its container cgroup) sends from the node's own address. It joins
        # the cgroup before entering the namespace: `ip netns exec` remounts /sys without cgroup2.
        join = (f"import os,sys; open('{ctr}/cgroup.procs','w').write(str(os.getpid())); "
                "os.execvp(sys.argv[1], sys.argv[1:])")
        run(PY, "-c", join, "ip", "netns", "exec", node.bed.node, PY, "-c", SENDER,
            "198.18.3.1", "198.18.0.2", "300", "25")
        assert delta(before, node.counters(), A) == (25, 25 * (300 + 42))
        # The same sender outside the pod's cgroup is not the tenant's.
        before = node.counters()
        node.bed.exec(PY, "-c", SENDER, "198.18.3.1", "198.18.0.2", "300", "25")
        assert delta(before, node.counters(), A) == (0, 0)
    finally:
        for d in reversed(made):
            wait_for(lambda: _rmdir(d), 5)


def _rmdir(d: Path) -> bool:
    try:
        os.rmdir(d)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def test_deleted_pod_leaves_nothing_and_label_change_moves_it(node):
    n = node
    ns = veth_pod(n, "d", "vethd1", ["198.18.24.2/24"], ["198.18.24.1/24"], ["default via 198.18.24.1"])
    pod = FakePod("uid-d", "team-x", "p", {"training-tenant": "tenant-a"}, ("198.18.24.2",))
    n.pods.append(pod)
    n.apply()
    assert "shpdm_" in n.bed.exec("tc", "filter", "show", "dev", "vethd1", "ingress").stdout
    # Label change: the pod now belongs to tenant-b.
    pod.labels = {"training-tenant": "tenant-b"}
    n.apply()
    before = n.counters()
    n.send(ns, "198.18.0.2", 200, 10)
    assert delta(before, n.counters(), B) == (10, 10 * 242)
    # Deleted: no mark program, no address filter left; a fresh start would make the same state.
    n.pods.clear()
    n.apply()
    assert "shpdm_" not in n.bed.exec("tc", "filter", "show", "dev", "vethd1", "ingress").stdout
    assert "c6121802" not in n.bed.exec("tc", "filter", "show", "dev", "up0").stdout
    assert n.apply().changes == 0


def test_bad_pods_are_reported_and_never_cost_the_others(node, monkeypatch):
    n = node
    ns = veth_pod(n, "g", "vethg1", ["198.18.25.2/24"], ["198.18.25.1/24"], ["default via 198.18.25.1"])
    veth_pod(n, "h", "vethh1", ["198.18.26.2/24"], ["198.18.26.1/24"], ["default via 198.18.26.1"])
    n.pods.extend([
        FakePod("uid-good", "team-a", "good", {"training-tenant": "tenant-a"}, ("198.18.25.2",)),
        FakePod("uid-noip", "team-a", "pending", {"training-tenant": "tenant-a"}, ()),
        FakePod("uid-gone", "team-a", "gone", {"training-tenant": "tenant-a"}, ("198.18.77.7",)),  # IP vanished
        FakePod("uid-both", "team-b", "both", {"training-tenant": "tenant-a"}, ("198.18.26.2",)),  # two tenants
        FakePod("uid-h", "team-a", "vanishing", {"training-tenant": "tenant-a"}, ("198.18.26.2",)),
    ])
    # The vanishing pod's interface disappears between the read and the write.
    marks = next(b for b in n.rec.backends if b.name == "marks")
    real_observe = marks.observe

    def observe_then_delete(*args):
        out = real_observe(*args)
        run("ip", "-n", n.bed.node, "link", "del", "vethh1", check=False)
        return out

    monkeypatch.setattr(marks, "observe", observe_then_delete)
    rep = n.rec.apply(n.cfg)
    monkeypatch.setattr(marks, "observe", real_observe)
    warnings = "\n".join(rep.plan.warnings)
    assert "pending" in warnings and "no pod IP yet" in warnings
    assert "gone" in warnings and "198.18.77.7" in warnings
    assert "team-b/both matches tenants tenant-a, tenant-b" in warnings
    before = n.counters()
    n.send(ns, "198.18.0.2", 100, 10)
    assert delta(before, n.counters(), A) == (10, 10 * 142)  # the good pod is enforced regardless
    again = n.apply()  # the next reconcile converges without the vanished interface
    assert n.apply().changes == 0, again.devices
