"""Tenant ingress end to end in namespaces: a sender outside, the uplink, routed veth pods inside.

The reconciler (fed the pods as the Kubernetes watcher would) builds the IFB, its tree and the redirect;
they are read back through netlink and ``tc -j`` / ``ip -j``; a second reconcile writes nothing; what the
sender sends towards a tenant's pod is counted in its class on the IFB (and reaches the pod); removing
the ingress blocks and tearing down leave nothing of shaperd's and everything of others'. No rates.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from shaperd.backends.common import mapcls
from shaperd.backends.ingress.metrics import IngressCollector
from shaperd.backends.ingress.objects import INGRESS_DEFAULT_CLASS, INGRESS_ROOT, PRIO_REDIRECT, ingress_classid
from shaperd.backends.ingress.plan import ingress_minors
from shaperd.core.config import load_text
from shaperd.engine.probe import probe_capabilities
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.kernel import bpf_maps, tc
from shaperd.kernel.rtnl import RtnlReader

from .conftest import needs_root, run
from .test_pods import FakePod

pytestmark = needs_root

CFG = """
node: {interfaces: [up0], capacity: 10Gbps}
tenants:
  - name: tenant-a
    bandwidthGuarantee: 2Gbps
    priority: 100
    ingress: {bandwidthGuarantee: 1Gbps, bandwidthLimit: 3Gbps}
  - name: tenant-b
    bandwidthGuarantee: 1Gbps
    priority: 50
    match: {namespaces: [team-b]}
    ingress: {bandwidthLimit: 2Gbps}
  - name: tenant-c
    bandwidthGuarantee: 1Gbps
    priority: 10
    match: {cidrs: [198.18.3.0/24]}
"""
NO_INGRESS = "\n".join(line for line in CFG.splitlines() if "ingress:" not in line) + "\n"
MINORS = ingress_minors(load_text(CFG))
A, B = ingress_classid(MINORS["tenant-a"]), ingress_classid(MINORS["tenant-b"])
IFB = "shpi-up0"


class Node:
    def __init__(self, bed, caps):
        self.bed, self.caps = bed, caps
        self.pods: list[FakePod] = []
        self.writer = tc.open_writer(bed.node)
        self.reader = RtnlReader(bed.node)
        self.rec = self.reconciler()

    def reconciler(self, caps=None) -> Reconciler:
        return Reconciler(self.reader, default_backends(self.writer, netns=self.bed.node), caps or self.caps,
                          pods_source=lambda: self.pods)

    def apply(self, text=CFG, rec=None):
        rep = (rec or self.rec).apply(load_text(text))
        assert not any(d.failed or d.error for d in rep.devices), [(d.device, d.failed, d.error) for d in rep.devices]
        return rep

    def ifb_counters(self) -> dict[int, int]:
        idx = self.writer.link_lookup(ifname=IFB)[0]
        return {c.classid: c.packets for c in self.reader.htb_classes(idx, IFB)}

    def htb_parms(self) -> dict[int, tuple[int, int, int]]:
        """classid -> (parent, rate, ceil in bytes/s) of the IFB's classes, decoded by pyroute2."""
        from pyroute2 import IPRoute

        with IPRoute(netns=self.bed.node) as ipr:
            idx = ipr.link_lookup(ifname=IFB)[0]
            out = {}
            for c in ipr.get_classes(index=idx):
                p = c.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
                out[c["handle"]] = (INGRESS_ROOT if c["parent"] == 0xFFFFFFFF else c["parent"], p["rate"], p["ceil"])
            return out

    def tc(self, *what) -> list:
        return self.bed.tc_json(*what)

    def links(self) -> dict[str, dict]:
        out = json.loads(self.bed.exec("ip", "-j", "-d", "link", "show").stdout)
        return {l["ifname"]: l for l in out}

    def close(self):
        self.writer.close()
        self.reader.close()


def routed_pod(n: Node, name: str, host_if: str, v4: str, v6: str) -> str:
    """A pod as Calico wires one: a /32 (and /128) routed to its host-side veth."""
    ns = n.bed.ns(f"{n.bed.tag}-{name}")
    run("ip", "-n", n.bed.node, "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    run("ip", "-n", ns, "addr", "add", f"{v4}/32", "dev", "eth0")
    run("ip", "-n", ns, "addr", "add", f"{v6}/128", "dev", "eth0", "nodad")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", n.bed.node, "link", "set", host_if, "up")
    host_mac = json.loads(run("ip", "-n", n.bed.node, "-j", "link", "show", host_if).stdout)[0]["address"]
    run("ip", "-n", ns, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
    run("ip", "-n", ns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
    run("ip", "-n", ns, "neigh", "replace", "169.254.1.1", "lladdr", host_mac, "dev", "eth0", "nud", "permanent")
    run("ip", "-6", "-n", ns, "route", "add", "default", "via", "fe80::1", "dev", "eth0")
    run("ip", "-6", "-n", ns, "neigh", "replace", "fe80::1", "lladdr", host_mac, "dev", "eth0", "nud", "permanent")
    run("ip", "-n", n.bed.node, "route", "add", f"{v4}/32", "dev", host_if, "scope", "link")
    run("ip", "-6", "-n", n.bed.node, "route", "add", f"{v6}/128", "dev", host_if)
    return ns


@pytest.fixture
def node(bed):
    caps = probe_capabilities()
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    bed.exec("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    # The sender outside reaches the pods through the node; no ARP for the node's address in the counters.
    node_mac = json.loads(run("ip", "-n", bed.node, "-j", "link", "show", "up0").stdout)[0]["address"]
    run("ip", "-n", bed.peer, "neigh", "replace", "198.18.0.1", "lladdr", node_mac, "dev", "up1", "nud", "permanent")
    run("ip", "-n", bed.peer, "neigh", "replace", "2001:db8:1::1", "lladdr", node_mac, "dev", "up1", "nud",
        "permanent")
    run("ip", "-n", bed.peer, "route", "add", "198.18.20.0/22", "via", "198.18.0.1")
    run("ip", "-6", "-n", bed.peer, "route", "add", "2001:db8:20::/47", "via", "2001:db8:1::1")
    n = Node(bed, caps)
    pa = routed_pod(n, "pa", "calia", "198.18.20.2", "2001:db8:20::2")
    pb = routed_pod(n, "pb", "calib", "198.18.21.2", "2001:db8:21::2")
    n.pods += [FakePod("uid-a", "team-a", "trainer-0", {"training-tenant": "tenant-a"}, ("198.18.20.2", "2001:db8:20::2")),
               FakePod("uid-b", "team-b", "loader-0", {}, ("198.18.21.2", "2001:db8:21::2"))]
    n.pod_ns = {"a": pa, "b": pb}
    try:
        yield n
    finally:
        n.close()


def redirects(n: Node) -> list[dict]:
    return [f for f in n.tc("filter", "show", "dev", "up0", "ingress") if "options" in f and f["options"].get("actions")]


def test_apply_builds_the_ifb_tree_and_redirect_and_a_second_reconcile_writes_nothing(node, monkeypatch):
    rep = node.apply()
    assert rep.ok and any(d.backend == "ingress" and d.ops for d in rep.devices)
    link = node.links()[IFB]
    assert link["linkinfo"]["info_kind"] == "ifb" and "UP" in link["flags"]
    roots = [q for q in node.tc("qdisc", "show", "dev", IFB) if q.get("root")]
    assert [(q["kind"], q["handle"]) for q in roots] == [("htb", "7369:")]
    classes = node.htb_parms()  # pyroute2's decoder: a reader independent of shaperd's (tc -j has no htb classes)
    assert set(classes) == {INGRESS_ROOT | 1, INGRESS_DEFAULT_CLASS, A, B}
    assert classes[A] == (INGRESS_ROOT | 1, 125_000_000, 375_000_000)  # bytes per second: 1 and 3 Gbit/s
    assert classes[B][2] == 250_000_000 and classes[INGRESS_DEFAULT_CLASS][1:] == (1_125_000_000, 1_250_000_000)
    (red,) = redirects(node)
    assert red["pref"] == PRIO_REDIRECT and red["protocol"] == "all"
    (act,) = red["options"]["actions"]
    assert (act["kind"], act["mirred_action"], act["direction"], act["to_dev"]) == ("mirred", "redirect", "egress",
                                                                                   IFB)
    if node.caps.bpf_maps:
        egress = node.tc("filter", "show", "dev", IFB, "egress")
        names = [f["options"].get("bpf_name", "") for f in egress if "options" in f]
        assert names == [mapcls.dst_program_name()] and egress[-1]["pref"] == mapcls.PRIO_DST_CLASSIFY

    # A second reconcile: nothing to change, not one netlink request nor bpf() write sent.
    sent, bpf_calls = [], []
    real_request, real_bpf = node.writer.nl.request, bpf_maps._bpf
    monkeypatch.setattr(node.writer.nl, "request", lambda enc, *a, **kw: sent.append(len(enc)) or real_request(enc, *a, **kw))
    monkeypatch.setattr(bpf_maps, "_bpf", lambda cmd, attr: bpf_calls.append(cmd) or real_bpf(cmd, attr))
    rep = node.apply()
    assert rep.changes == 0 and sent == []
    assert not [c for c in bpf_calls if c in (0, 2, 3, 5, 26, 27)]  # map create/update/delete, prog load

    # A restarted agent (fresh sockets, no state) adopts the IFB, its tree and its classifier.
    again = node.reconciler()
    assert node.apply(rec=again).changes == 0 and sent == []


def test_traffic_towards_a_tenants_pod_lands_in_its_ifb_class_and_reaches_the_pod(node, tmp_path):
    node.apply()
    before = node.ifb_counters()
    node.bed.send("198.18.0.2", "198.18.20.2", 200, 40, ns=node.bed.peer)  # tenant-a's pod
    node.bed.send("2001:db8:1::2", "2001:db8:20::2", 200, 20, ns=node.bed.peer)  # its IPv6 address
    node.bed.send("198.18.0.2", "198.18.21.2", 200, 30, ns=node.bed.peer)  # tenant-b's pod
    node.bed.send("198.18.0.2", "198.18.0.1", 200, 10, ns=node.bed.peer)  # the node itself: no tenant
    after = node.ifb_counters()
    d = {k: after[k] - before.get(k, 0) for k in after}
    assert 60 <= d[A] < 60 + 5 and 30 <= d[B] < 30 + 5 and d[INGRESS_DEFAULT_CLASS] >= 10
    # Through the IFB and back into the node: the pod answers.
    node.bed.exec("ping", "-c", "2", "-W", "2", "198.18.20.2", ns=node.bed.peer)
    node.bed.exec("ping", "-6", "-c", "2", "-W", "2", "2001:db8:21::2", ns=node.bed.peer)

    # The receive metrics, read at scrape time from the same counters.
    backend = next(b for b in node.rec.backends if b.name == "ingress")
    fams = {f.name: f for f in IngressCollector(backend).collect()}
    got = {(s.labels["tenant"], s.labels["device"]): s.value for s in fams["shaperd_tenant_receive_packets"].samples
           if s.name.endswith("_total")}
    assert got[("tenant-a", "up0")] >= 60 and got[("tenant-b", "up0")] >= 30 and ("tenant-c", "up0") not in got
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(CFG)
    st = node.bed.shaperd("status", "--config", str(cfg), "-o", "json", "--interval", "0.05")
    rows = {r["tenant"]: r for r in json.loads(st.stdout.splitlines()[-1])["ingress"]}
    assert rows["tenant-a"]["packets"] >= 60 and rows["tenant-a"]["device"] == "up0"


def test_u32_path_where_there_are_no_ebpf_maps(node):
    caps = dataclasses.replace(node.caps, bpf_maps=False)
    rec = node.reconciler(caps)
    node.apply(rec=rec)
    assert node.bed.exec("tc", "filter", "show", "dev", IFB, "egress").stdout.strip() == ""
    filters = [f for f in node.tc("filter", "show", "dev", IFB, "parent", "7369:") if "options" in f
               and f["options"].get("match")]
    assert len(filters) == 4  # two pods, two addresses each
    before = node.ifb_counters()
    node.bed.send("198.18.0.2", "198.18.21.2", 200, 25, ns=node.bed.peer)
    node.bed.send("2001:db8:1::2", "2001:db8:20::2", 200, 15, ns=node.bed.peer)
    after = node.ifb_counters()
    assert after[B] - before.get(B, 0) >= 25 and after[A] - before.get(A, 0) >= 15
    assert node.apply(rec=rec).changes == 0


def test_removing_every_ingress_block_removes_the_redirect_and_the_ifb_only(node):
    node.apply()
    node.apply(NO_INGRESS)
    assert IFB not in node.links() and redirects(node) == []
    # The uplink keeps its egress tree and its clsact (htb's map classifier, or nothing to remove there).
    assert [q["handle"] for q in node.tc("qdisc", "show", "dev", "up0") if q.get("root")] == ["7368:"]
    node.bed.exec("ping", "-c", "1", "-W", "2", "198.18.20.2", ns=node.bed.peer)  # inbound still flows


def test_an_ifb_deleted_behind_shaperds_back_is_rebuilt_and_the_redirect_follows(node):
    node.apply()
    old = node.links()[IFB]["ifindex"]
    node.bed.exec("ip", "link", "add", "filler0", "type", "ifb")  # so the new IFB gets another ifindex
    node.bed.exec("ip", "link", "del", IFB)
    node.apply()
    new = node.links()[IFB]["ifindex"]
    assert new != old
    (red,) = redirects(node)
    assert red["options"]["actions"][0]["to_dev"] == IFB
    before = node.ifb_counters()
    node.bed.send("198.18.0.2", "198.18.20.2", 200, 10, ns=node.bed.peer)
    assert node.ifb_counters()[A] - before.get(A, 0) >= 10


def test_a_device_with_the_ifbs_name_is_left_alone_and_said(node):
    node.bed.exec("ip", "link", "add", IFB, "type", "veth", "peer", "name", "other0")
    rep = node.rec.apply(load_text(CFG))
    (t,) = [d for d in rep.devices if d.backend == "ingress"]
    assert t.device == IFB and "veth" in t.blocked and not t.ops
    assert redirects(node) == [] and node.links()[IFB]["linkinfo"]["info_kind"] == "veth"


def test_teardown_removes_shaperds_and_leaves_others_ifbs_and_filters(node):
    node.apply()
    # Someone else's IFB, fed by someone else's filter on the same clsact (it matches nothing of ours).
    node.bed.exec("ip", "link", "add", "ifb7", "up", "type", "ifb")
    node.bed.exec("tc", "filter", "add", "dev", "up0", "ingress", "prio", "5", "protocol", "ip", "u32", "match",
                  "ip", "dst", "198.19.255.255/32", "action", "mirred", "egress", "mirror", "dev", "ifb7")
    rep = node.rec.teardown()
    assert all(not d.failed and not d.error for d in rep.devices), rep.devices
    links = node.links()
    assert IFB not in links and "ifb7" in links
    left = {f["pref"] for f in node.tc("filter", "show", "dev", "up0", "ingress")}
    assert left == {5}
    notes = " ".join(d.note or "" for d in rep.devices)
    assert "ifb7" in notes and "clsact qdisc on up0 left in place" in notes
    assert [q["handle"] for q in node.tc("qdisc", "show", "dev", "up0") if q.get("root")] != ["7368:"]
    assert not any(q["kind"] == "htb" for q in node.tc("qdisc", "show"))


DAEMON_CFG = CFG.replace("    priority: 100\n", "    priority: 100\n    match: {cidrs: [198.18.20.0/24]}\n")


def test_the_daemon_serves_receive_metrics_and_top_shows_the_ingress_plane(node, tmp_path):
    """``shaperd run`` (no Kubernetes: tenant-a's pod by its prefix) scraped as Prometheus does."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests import procs

    from .conftest import PY, wait_for
    from .test_metrics import PORT, SCRAPE

    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(DAEMON_CFG)
    log = tmp_path / "daemon.log"

    def received() -> float | None:
        out = procs.run(["ip", "netns", "exec", node.bed.node, PY, "-c", SCRAPE, str(PORT), "/metrics"],
                        check=False).stdout
        code, _, body = out.partition("\n")
        if code != "200":
            return None
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                if s.name == "shaperd_tenant_receive_packets_total" and s.labels == {"tenant": "tenant-a",
                                                                                     "device": "up0"}:
                    return s.value
        return None

    with open(log, "w") as logf, procs.running(
            ["ip", "netns", "exec", node.bed.node, PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg),
             "--metrics-address", f"127.0.0.1:{PORT}", "--resync-interval", "600"],
            stdout=logf, stderr=subprocess.STDOUT):
        assert wait_for(lambda: received() is not None, 30.0, 0.2), log.read_text()[-3000:]
        start = received()
        node.bed.send("198.18.0.2", "198.18.20.2", 300, 50, ns=node.bed.peer)
        assert wait_for(lambda: (received() or 0) >= start + 50, 30.0, 0.2), log.read_text()[-3000:]
        out = node.bed.exec(PY, "-m", "shaperd", "--log-json", "top", "--config", str(cfg), "-n", "2",
                            "--interval", "0.3", check=False)
        assert out.returncode == 0, out.stderr
        view = out.stdout.split("shaperd top")[-1]
        rows = [line.split() for line in view.splitlines() if line.startswith("tenant-a ")]
        assert {r[1] for r in rows} >= {"htb", "ingress"}  # its egress and its inbound rows, side by side
        assert any(r[1] == "ingress" and r[3] == f"7369:{A & 0xFFFF:x}" for r in rows)
