"""Per-pod ingress caps in a real kernel: a routed veth pod and a bridged pod, each behind shaperd's tbf 7368:.

Each test builds the bed's node and peer namespaces (tests/integration/conftest.py), one or two "pods" wired
as a CNI would (a /32 routed to a host veth, Calico style; a veth enslaved to a bridge), hands them to the
reconciler as the Kubernetes watcher would, with ``kubernetes.io/ingress-bandwidth``, and reads what it
did back through netlink (kernel/rtnl.py) and ``tc -j``. Shaping is checked by what the tbf counted against
what its bucket allows (tests/integration/counted.py), never by a rate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from shaperd.backends.podingress.metrics import PodIngressCollector
from shaperd.backends.podingress.ops import DeletePodTbf, SetPodTbf
from shaperd.backends.podingress.plan import tbf_for
from shaperd.backends.podingress.backend import PodIngressBackend
from shaperd.core.config import load_text
from shaperd.core.roots import Roots
from shaperd.engine.probe import probe_capabilities
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.kernel import tc
from shaperd.kernel.rtnl import CachedReads, RtnlReader

from . import counted
from .conftest import PY, SENDER, needs_root, run

pytestmark = needs_root

CFG = """
node: {interfaces: [up0], capacity: 1Gbps%s}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 400Mbps, bandwidthLimit: 800Mbps, match: {namespaces: [team-a]}}
"""
ANN = "kubernetes.io/ingress-bandwidth"
TBF = 0x73680000


@dataclass
class FakePod:
    """What the Kubernetes watcher hands the reconciler (PodInfo's fields)."""

    uid: str
    namespace: str
    name: str
    labels: dict = field(default_factory=dict)
    ips: tuple = ()
    host_network: bool = False
    annotations: dict = field(default_factory=dict)
    qos_class: str | None = "BestEffort"
    phase: str = "Running"
    node: str = "node-1"


class Node:
    def __init__(self, bed, tmp_path):
        self.bed, self.tmp = bed, tmp_path
        self.pods: list[FakePod] = []
        self.caps = probe_capabilities()
        self.writer = tc.open_writer(bed.node)
        self.reader = RtnlReader(bed.node)
        self.writes = 0
        request = self.writer.nl.request

        def counting(encoders, *a, **kw):
            self.writes += len(encoders)
            return request(encoders, *a, **kw)

        self.writer.nl.request = counting
        self.cfg = load_text(CFG % "")

    def reconciler(self, take_over: bool = False) -> Reconciler:
        roots = Roots.of(run=str(self.tmp))  # the labels record goes under the test's run root, not /run
        return Reconciler(self.reader, default_backends(self.writer, take_over, roots=roots), self.caps,
                          roots=roots, pods_source=lambda: self.pods)

    def apply(self, rec: Reconciler | None = None):
        rep = (rec or self.reconciler()).apply(self.cfg)
        assert not rep.problems, rep.problems
        return rep

    def ops(self, rep, kind=None) -> list:
        return [op for d in rep.devices if d.backend == "podingress" for op in d.ops
                if kind is None or isinstance(op, kind)]

    def target(self, rep, device):
        return next(d for d in rep.devices if d.backend == "podingress" and d.device == device)

    def root(self, device):
        """The root qdisc of ``device`` as netlink reads it (the decoders shaperd observes with)."""
        (link,) = [l for l in self.reader.links() if l.name == device]
        (q,) = [q for q in self.reader.qdiscs(link.ifindex, device) if q.parent == 0xFFFFFFFF]
        return q

    def tc_json(self, device, *what):
        return json.loads(self.bed.exec("tc", "-j", "-s", *what, "qdisc", "show", "dev", device).stdout or "[]")

    def close(self):
        self.writer.close()
        self.reader.close()


@pytest.fixture
def node(bed, tmp_path):
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    n = Node(bed, tmp_path)
    try:
        yield n
    finally:
        n.close()


def routed_pod(bed, host_if: str, ip: str, name: str) -> str:
    """A Calico-style pod: one /32 routed to its host-side veth, the world via 169.254.1.1 (proxy ARP)."""
    ns = bed.ns(f"{bed.tag}-{name}")
    run("ip", "-n", bed.node, "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    run("ip", "-n", ns, "addr", "add", f"{ip}/32", "dev", "eth0")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", bed.node, "link", "set", host_if, "up")
    run("ip", "-n", ns, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
    run("ip", "-n", ns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
    bed.exec("sysctl", "-qw", f"net.ipv4.conf.{host_if}.proxy_arp=1", f"net.ipv4.neigh.{host_if}.proxy_delay=0")
    run("ip", "-n", bed.node, "route", "add", f"{ip}/32", "dev", host_if, "scope", "link")
    return ns


def bridged_pod(n: Node, host_if: str, ip: str, name: str) -> str:
    """A bridge-plugin pod: its host veth is a port of cni0 (198.18.21.1/24); shaperd finds it by FDB."""
    if n.bed.exec("ip", "link", "show", "cni0", check=False).returncode:
        run("ip", "-n", n.bed.node, "link", "add", "cni0", "type", "bridge")
        run("ip", "-n", n.bed.node, "addr", "add", "198.18.21.1/24", "dev", "cni0")
        run("ip", "-n", n.bed.node, "link", "set", "cni0", "up")
    ns = n.bed.ns(f"{n.bed.tag}-{name}")
    run("ip", "-n", n.bed.node, "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", n.bed.node, "link", "set", host_if, "master", "cni0")
    run("ip", "-n", n.bed.node, "link", "set", host_if, "up")
    run("ip", "-n", ns, "route", "add", "default", "via", "198.18.21.1")
    n.bed.exec("ping", "-c", "1", "-W", "1", "198.18.21.1", ns=ns, check=False)  # the bridge learns the pod
    return ns


def two_pods(n: Node) -> None:
    routed_pod(n.bed, "cali1", "198.18.20.2", "r")
    bridged_pod(n, "vethb1", "198.18.21.2", "b")
    n.pods += [FakePod("uid-r", "team-a", "web-0", ips=("198.18.20.2",), annotations={ANN: "50M"}),
               FakePod("uid-b", "team-b", "loader-0", ips=("198.18.21.2",), annotations={ANN: "20M"})]


def test_routed_and_bridged_pods_get_their_tbf_and_a_second_reconcile_writes_nothing(node):
    two_pods(node)
    rep = node.apply()
    sets = {op.device: op for op in node.ops(rep, SetPodTbf)}
    assert sorted(sets) == ["cali1", "vethb1"], rep.plan.warnings
    assert sets["cali1"].tenant == "tenant-a" and sets["vethb1"].tenant is None  # a pod of no tenant is capped too
    for dev, cap in (("cali1", 50_000_000), ("vethb1", 20_000_000)):
        want = tbf_for(cap)
        q = node.root(dev)
        assert (q.kind, q.handle) == ("tbf", TBF)
        assert (q.tbf.rate_Bps, q.tbf.limit_bytes, q.tbf.peakrate_Bps) == (want.rate_Bps, want.limit_bytes, 0)
        (j,) = [x for x in node.tc_json(dev) if x.get("root")]  # an independent reader: iproute2
        assert (j["kind"], j["handle"], j["options"]["rate"]) == ("tbf", "7368:", want.rate_Bps)
    # In sync: the second reconcile (a fresh reconciler, as a restarted agent adopts) sends no write at all.
    before = node.writes
    again = node.apply()
    assert again.changes == 0 and node.writes == before, [op.describe() for d in again.devices for op in d.ops]
    assert node.apply(node.reconciler()).changes == 0 and node.writes == before


def test_a_changed_cap_is_changed_in_place_a_removed_one_and_a_gone_pod_remove_the_tbf(node):
    two_pods(node)
    rec = node.reconciler()
    node.apply(rec)
    node.bed.exec(PY, "-c", SENDER, "-", "198.18.20.2", "500", "10")  # some bytes through cali1's tbf
    sent_before = node.root("cali1").counters.bytes
    assert sent_before > 0
    node.pods[0].annotations[ANN] = "200M"
    rep = node.apply(rec)
    (op,) = node.ops(rep)
    assert isinstance(op, SetPodTbf) and op.device == "cali1" and op.reason.startswith("was rate 50Mbps")
    q = node.root("cali1")
    assert (q.handle, q.tbf.rate_Bps) == (TBF, 25_000_000)
    assert q.counters.bytes >= sent_before  # changed in place, not replaced: its counters went on
    del node.pods[0].annotations[ANN]
    (op,) = node.ops(node.apply(rec))
    assert isinstance(op, DeletePodTbf) and op.device == "cali1"
    assert node.root("cali1").kind == "noqueue"  # the kernel's default is back
    node.pods.pop()  # the bridged pod is deleted (its veth still there for a moment)
    (op,) = node.ops(node.apply(rec))
    assert isinstance(op, DeletePodTbf) and op.device == "vethb1" and node.root("vethb1").kind == "noqueue"
    assert node.apply(rec).changes == 0


def cni_plugin_layout(n: Node, dev: str, ifb: str) -> None:
    """What the CNI bandwidth plugin leaves on a pod veth with both annotations: tbf 1: at the root, and an
    ingress qdisc whose filter redirects what the pod sends to its bwp IFB (itself shaped by a tbf)."""
    b = n.bed
    b.exec("ip", "link", "add", ifb, "type", "ifb")
    b.exec("ip", "link", "set", ifb, "up")
    b.exec("tc", "qdisc", "add", "dev", ifb, "root", "handle", "1:", "tbf", "rate", "30mbit", "burst", "536870911",
           "latency", "25ms")
    b.exec("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", "50mbit", "burst", "536870911",
           "latency", "25ms")
    b.exec("tc", "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress")
    b.exec("tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "prio", "1", "u32", "match",
           "u32", "0", "0", "flowid", "1:1", "action", "mirred", "egress", "redirect", "dev", ifb)


def _plugin_state(n: Node, dev: str, ifb: str):
    """The plugin's qdiscs on the veth and its IFB, and its filter (pref 1) on the ingress qdisc."""
    filters = json.loads(n.bed.exec("tc", "-j", "filter", "show", "dev", dev, "parent", "ffff:").stdout)
    # tc prints "ingress": true on each row once the block also holds a filter at parent ffff:fff2: not a change.
    return (n.tc_json(dev), [{k: v for k, v in f.items() if k != "ingress"} for f in filters if f.get("pref") == 1],
            n.tc_json(ifb))


def _no_counters(state):
    qd, filters, ifb = state
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("bytes", "packets", "drops", "overlimits",
                                                                     "requeues", "backlog", "qlen", "refcnt")}
                          for r in rows]
    return strip(qd), filters, strip(ifb)


def test_the_cni_plugins_qdisc_is_left_alone_with_the_reason_and_taken_over_only_when_asked(node):
    routed_pod(node.bed, "cali1", "198.18.20.2", "r")
    node.pods.append(FakePod("uid-r", "team-a", "web-0", ips=("198.18.20.2",), annotations={ANN: "50M"}))
    cni_plugin_layout(node, "cali1", "bwp0123456789ab")
    before = _no_counters(_plugin_state(node, "cali1", "bwp0123456789ab"))
    rec = node.reconciler()
    rep = node.apply(rec)
    t = node.target(rep, "cali1")
    assert t.ops == [] and t.blocked == ("pod team-a/web-0: root qdisc tbf 1: is not shaperd's; left alone, its "
                                         "ingress cap 50Mbps is not enforced (set node.takeOver or pass --take-over "
                                         "to replace it)")
    assert not rep.ok  # left alone counts as degraded
    assert _no_counters(_plugin_state(node, "cali1", "bwp0123456789ab")) == before
    # The plugin's egress side is named (IFB and all) where the backend reports it.
    b = next(b for b in rec.backends if b.name == "podingress")
    with RtnlReader(node.bed.node) as r:
        observed = b.observe(CachedReads(r), rec.inventory(node.cfg))
    (ifindex,) = [l.ifindex for l in node.reader.links() if l.name == "cali1"]
    assert observed.ingress[ifindex].ifbs == ("bwp0123456789ab",)
    # The ingress qdisc holds the ingress hook: clsact cannot be added beside it, so the marks backend leaves
    # that interface alone and says so (no write attempted, none failing every reconcile); the pod is
    # recognised by its address on the uplink. The plugin's filters are unchanged (checked above).
    if node.caps.bpf:
        marks = [d for d in rep.devices if d.backend == "marks"]
        assert not [e for d in marks for _op, e in d.failed], marks
        (blocked,) = [d for d in marks if d.device == "cali1"]
        assert blocked.blocked.startswith("an ingress qdisc (not clsact) holds the ingress hook of cali1") \
            and "team-a/web-0" in blocked.blocked and "by address only" in blocked.blocked
        assert not [d for d in node.apply(node.reconciler()).devices if d.backend == "marks" and d.ops]
    # Taken over when asked: shaperd's tbf replaces the plugin's root; its ingress qdisc, filter and IFB stay.
    rep = node.apply(node.reconciler(take_over=True))
    (op,) = node.ops(rep, SetPodTbf)
    assert op.reason == "taking over root qdisc tbf 1: (take-over requested)"
    q = node.root("cali1")
    assert (q.kind, q.handle, q.tbf.rate_Bps) == ("tbf", TBF, 6_250_000)
    _qd, filters, ifb = _no_counters(_plugin_state(node, "cali1", "bwp0123456789ab"))
    assert filters == before[1] and ifb == before[2]
    assert [x["kind"] for x in _qd if not x.get("root")] == ["ingress"]


def test_teardown_removes_shaperds_tbf_and_nothing_else(node):
    two_pods(node)
    routed_pod(node.bed, "cali2", "198.18.20.3", "f")
    node.pods.append(FakePod("uid-f", "team-a", "foreign-0", ips=("198.18.20.3",), annotations={ANN: "10M"}))
    node.bed.exec("tc", "qdisc", "add", "dev", "cali2", "root", "handle", "1:", "tbf", "rate", "10mbit", "burst",
                  "32k", "latency", "25ms")
    rec = node.reconciler()
    node.apply(rec)
    assert (tmp := node.tmp / "shaperd" / "podingress-host.json").exists()
    rep = rec.teardown()
    deleted = sorted(op.device for d in rep.devices if d.backend == "podingress" for op in d.ops)
    assert deleted == ["cali1", "vethb1"] and not any(d.error for d in rep.devices), rep.devices
    assert node.root("cali1").kind == "noqueue" and node.root("vethb1").kind == "noqueue"
    q = node.root("cali2")
    assert (q.kind, q.handle) == ("tbf", 0x10000)  # the operator's, untouched
    assert not tmp.exists()  # the labels record goes with the qdiscs
    again = rec.teardown()
    assert not [op for d in again.devices if d.backend == "podingress" for op in d.ops]


def test_traffic_towards_the_pod_is_held_to_its_bucket_and_counted_in_the_metrics(node):
    ns = routed_pod(node.bed, "cali1", "198.18.20.2", "r")
    node.pods.append(FakePod("uid-r", "team-a", "web-0", ips=("198.18.20.2",), annotations={ANN: "10M"}))
    rec = node.reconciler()
    node.apply(rec)
    run("ip", "-n", node.bed.peer, "route", "add", "198.18.20.0/24", "via", "198.18.0.1")
    a = counted.tbf_root(node.bed.node, "cali1")
    # From outside, through the uplink, at far more than 10 Mbit/s: what the tbf let through is bounded by
    # its bucket, whatever the machine's load, and it had to hold packets back.
    node.bed.send("-", "198.18.20.2", 1200, 3000, ns=node.bed.peer)
    b = counted.tbf_root(node.bed.node, "cali1")
    assert counted.sent(a, b, "root") > 0
    assert counted.over_limit(a, b) == {}
    assert counted.pressed(a, b, "root")
    # The metrics read the same counter at scrape time.
    from prometheus_client import CollectorRegistry, generate_latest

    backend = next(x for x in rec.backends if x.name == "podingress")
    assert isinstance(backend, PodIngressBackend)
    reg = CollectorRegistry()
    reg.register(PodIngressCollector(backend, lambda: RtnlReader(node.bed.node)))
    text = generate_latest(reg).decode()
    line = next(l for l in text.splitlines() if l.startswith("shaperd_pod_receive_bytes_total{"))
    assert 'pod="web-0"' in line and 'device="cali1"' in line and float(line.split()[-1]) >= counted.sent(a, b, "root")
    assert ('shaperd_pod_receive_limit_bytes_per_second{device="cali1",namespace="team-a",pod="web-0",'
            'tenant="tenant-a"} 1.25e+06') in text
    assert ns


def test_a_host_network_pod_and_a_pod_not_resolved_yet_get_a_warning_and_no_write(node):
    node.pods += [FakePod("uid-h", "team-a", "agent-0", host_network=True, annotations={ANN: "50M"}),
                  FakePod("uid-x", "team-a", "late-0", ips=("198.18.20.9",), annotations={ANN: "50M"})]
    rep = node.apply()
    assert node.ops(rep) == []
    warn = "\n".join(rep.plan.warnings)
    assert "pod team-a/agent-0: kubernetes.io/ingress-bandwidth=50M is not enforced: a hostNetwork pod" in warn
    assert "pod team-a/late-0: kubernetes.io/ingress-bandwidth=50M waits for the pod's host interface" in warn
    routed_pod(node.bed, "cali9", "198.18.20.9", "l")  # the pod's interface appears: the next reconcile caps it
    (op,) = node.ops(node.apply())
    assert isinstance(op, SetPodTbf) and op.device == "cali9"


def test_status_and_top_name_the_pods_and_show_what_they_received(node):
    two_pods(node)
    cni_plugin_layout(node, "vethb1", "bwp0123456789ab")  # the bridged pod's veth is the plugin's
    node.apply()
    node.bed.exec(PY, "-c", SENDER, "-", "198.18.20.2", "500", "10")
    cfg = node.tmp / "t.yaml"
    cfg.write_text(CFG % "")
    common = ["--config", str(cfg), "--run-root", str(node.tmp), "--interval", "0.2"]
    r = node.bed.shaperd("status", "-o", "json", *common)
    doc = json.loads(r.stdout)
    rows = {x["device"]: x for x in doc["pod_ingress"]}
    assert (rows["cali1"]["namespace"], rows["cali1"]["pod"], rows["cali1"]["tenant"], rows["cali1"]["state"]) == (
        "team-a", "web-0", "tenant-a", "in sync")
    assert rows["cali1"]["cap_bps"] == 50_000_000 and rows["cali1"]["received_bytes"] > 0
    assert rows["vethb1"]["state"] == "left alone: root qdisc tbf 1: is not shaperd's"
    assert "redirecting to bwp0123456789ab" in rows["vethb1"]["note"]
    # (status's exit code says "left alone" from a plan and diff without pods: the labelled state is the word here)
    text = node.bed.shaperd("status", *common).stdout
    assert "Pod ingress caps (tbf on each pod's host interface):" in text and "team-a/web-0" in text
    top = node.bed.shaperd("top", "-n", "1", "-o", "json", *common)
    assert top.returncode == 0, top.stderr
    view = json.loads(top.stdout.splitlines()[-1])
    rows = [x for x in view["tenants"] if x["plane"] == "pod ingress"]
    # Only the enforced cap has a row (vethb1 is the plugin's), under its tenant, with the cap as its limit.
    assert [(x["tenant"], x["device"], x["classid"], x["limit_bps"]) for x in rows] == [
        ("tenant-a", "cali1", "7368:", 50_000_000)]


def test_the_daemon_follows_the_annotation_through_the_api(bed, tmp_path, api):
    """``shaperd run --kubeconfig`` against the fake API server: the cap appears, changes live, and goes with the
    pod; /metrics has the pod's series while its tbf is there."""
    import subprocess
    import urllib.request

    from shaperd.backends.podingress import labels
    from tests import procs
    from tests.k8s_fake import make_pod, write_kubeconfig

    from .conftest import wait_for
    from .test_k8s_e2e import DEADLINE, _free_port

    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG % "")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    routed_pod(bed, "cali7", "198.18.20.7", "k")
    port = _free_port()
    log = tmp_path / "daemon.log"
    reader = RtnlReader(bed.node)

    def root():
        (link,) = [l for l in reader.links() if l.name == "cali7"]
        (q,) = [q for q in reader.qdiscs(link.ifindex, "cali7") if q.parent == 0xFFFFFFFF]
        return q

    def rate_is(bps):
        q = root()
        return q.kind == "tbf" and q.handle == TBF and q.tbf.rate_Bps * 8 == bps

    def scrape() -> str:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20).read().decode()
        except OSError:
            return ""

    pod = make_pod("web-0", "node-1", namespace="team-a", ips=("198.18.20.7",))
    pod["metadata"]["annotations"] = {ANN: "50M", "unrelated": "x"}
    try:
        with open(log, "w") as logf, procs.running(
            [PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--netns", bed.node,
             "--node-name", "node-1", "--kubeconfig", str(kubeconfig), "--resync-interval", "30",
             "--metrics-address", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=logf):
            uid = api.add_pod(pod)["metadata"]["uid"]
            assert wait_for(lambda: rate_is(50_000_000), DEADLINE), log.read_text()[-3000:]
            series = 'shaperd_pod_receive_limit_bytes_per_second{device="cali7",namespace="team-a",pod="web-0",' \
                     'tenant="tenant-a"} 6.25e+06'
            assert wait_for(lambda: series in scrape(), DEADLINE), scrape()[-2000:]
            assert labels.read(labels.path_for("/run", bed.node))[root().ifindex]["name"] == "web-0"
            # Changed live (the resync is 30 s away: the pod event does it), in place.
            api.modify_pod(uid, lambda p: p["metadata"]["annotations"].__setitem__(ANN, "200M"))
            assert wait_for(lambda: rate_is(200_000_000), DEADLINE), log.read_text()[-3000:]
            # The pod goes: so does its cap, and its series.
            api.delete_pod(uid)
            assert wait_for(lambda: root().kind == "noqueue", DEADLINE), log.read_text()[-3000:]
            assert wait_for(lambda: "shaperd_pod_receive_bytes_total{" not in scrape(), DEADLINE)
    finally:
        reader.close()
        labels.remove(labels.path_for("/run", bed.node))


@pytest.mark.parametrize("cap_bps", [333_000, 7_000_000, 50_000_000, 123_456_789, 2_500_000_000, 35_000_000_000])
def test_the_request_is_what_this_machines_tc_sends_for_the_same_tbf(bed, cap_bps):
    """The recorded contract (tests/unit/test_podingress_bytes.py) for caps it does not hold, against the tc
    installed here: each of tc's truncations in the rate table and the buffer, and RATE64 above 2^32 bytes/s."""
    import shutil
    import struct

    from shaperd.backends.podingress import kernel_tc
    from shaperd.backends.podingress.objects import PodIngress
    from shaperd.kernel import nlmsg
    from tests.strace_dump import sent

    if not shutil.which("strace"):
        pytest.fail("strace missing: scripts/setup installs it")
    t = tbf_for(cap_bps)
    out = bed.exec("strace", "-e", "trace=sendmsg", "-e", "write=all", "-xx", "tc", "qdisc", "replace", "dev", "up0",
                   "root", "handle", "7368:", "tbf", "rate", f"{t.rate_Bps * 8}bit", "burst", str(t.burst_bytes),
                   "limit", str(t.limit_bytes))
    (theirs,) = [b for b in sent(out.stderr) if nlmsg.HDR.unpack_from(b)[1] == 36]
    ifindex = struct.unpack_from("=i", theirs, 20)[0]
    op = SetPodTbf(device="up0", ifindex=ifindex,
                   pod=PodIngress(ifindex, "up0", "u", "team-a", "web-0", None, cap_bps, t))
    ours = tc._encoder(tc.build_message(op, codec=kernel_tc.CODEC))(7)
    assert nlmsg.HDR.unpack_from(ours)[:3] == nlmsg.HDR.unpack_from(theirs)[:3] and ours[16:] == theirs[16:]
