"""The eBPF map classifier end to end in namespaces: real traffic lands in the tenant's HTB class,
a restarted agent adopts the maps, an in-sync resync writes nothing, one pod IP is one map write,
and the u32 path stays available (SHAPERD_CLASSIFIER=u32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from shaperd.backends.common import mapcls
from shaperd.backends.common.objects import ROOT_HANDLE
from shaperd.core.ids import assign_minors
from shaperd.core.config import load_file as load_config
from shaperd.engine.reconciler import open_node
from shaperd.kernel import bpf_maps
from shaperd.engine.probe import probe_capabilities

from .conftest import needs_root

pytestmark = needs_root

MINORS = assign_minors(["tenant-a", "tenant-b"])
A, B = ROOT_HANDLE | MINORS["tenant-a"], ROOT_HANDLE | MINORS["tenant-b"]
CFG = """
node:
  interfaces: [up0]
  capacity: 100Gbps
tenants:
  - name: "tenant-a"
    bandwidthGuarantee: 40Gbps
    bandwidthLimit: 60Gbps
    priority: 100
    match: {cidrs: [198.18.1.0/24, "2001:db8:1::/64"]}
  - name: "tenant-b"
    bandwidthGuarantee: 20Gbps
    bandwidthLimit: 40Gbps
    priority: 50
    match: {cidrs: [198.18.2.0/24, 198.18.2.1/32]}
"""


def class_packets(bed) -> dict[int, int]:
    with IPRoute(netns=bed.node) as ipr:
        idx = ipr.link_lookup(ifname="up0")[0]
        return {c["handle"]: c.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")["packets"]
                for c in ipr.get_classes(index=idx)}


def egress_filters(bed) -> list[dict]:
    return json.loads(bed.exec("tc", "-j", "filter", "show", "dev", "up0", "egress").stdout or "[]")


@pytest.fixture
def cfg_file(tmp_path) -> Path:
    p = tmp_path / "tenants.yaml"
    p.write_text(CFG)
    return p


def test_traffic_lands_in_tenant_classes_via_skb_priority(bed, cfg_file):
    r = bed.shaperd("apply", "--config", str(cfg_file))
    assert r.returncode == 0, r.stderr
    ours = [f for f in egress_filters(bed) if f.get("options", {}).get("bpf_name", "").startswith("shpd_c")]
    assert len(ours) == 1 and ours[0]["pref"] == mapcls.PRIO_EGRESS_CLASSIFY
    assert "direct-action" in json.dumps(ours[0])
    # No classifying filter left on the HTB root: unmatched packets walk nothing.
    assert bed.exec("tc", "filter", "show", "dev", "up0", "parent", "7368:").stdout.strip() == ""
    before = class_packets(bed)
    bed.send("198.18.1.1", "198.18.0.2", 100, 40)  # tenant-a /24
    bed.send("198.18.2.1", "198.18.0.2", 100, 30)  # tenant-b /32 (and /24)
    bed.send("2001:db8:1::1", "2001:db8:1::2", 100, 20)  # tenant-a v6
    bed.send("198.18.3.1", "198.18.0.2", 100, 10)  # no tenant -> default class
    after = class_packets(bed)
    d = {k: after[k] - before.get(k, 0) for k in after}
    assert d[A] >= 60 and d[B] >= 30 and d[ROOT_HANDLE | 2] >= 10
    assert d[A] < 60 + 5 and d[B] < 30 + 5  # nothing else classified into the tenants
    st = bed.shaperd("status", "--config", str(cfg_file), "--json", "--interval", "0.05")
    assert st.returncode == 0, st.stderr
    paths = json.loads(st.stdout.splitlines()[-1])["classifier"]
    assert paths["up0"]["path"] == "ebpf" and paths["up0"]["program"].startswith("shpd_c")


class Counting:
    """Counts bpf() commands and netlink requests (the writes a reconcile sends)."""

    WRITE_CMDS = {2: "update", 3: "delete", 26: "update_batch", 27: "delete_batch", 0: "map_create", 5: "prog_load"}

    def __init__(self, monkeypatch, writer):
        self.bpf: list[int] = []
        self.netlink = 0
        real_bpf = bpf_maps._bpf

        def counting_bpf(cmd, attr):
            self.bpf.append(cmd)
            return real_bpf(cmd, attr)

        monkeypatch.setattr(bpf_maps, "_bpf", counting_bpf)
        real_req = writer.nlm_request_batch

        def counting_req(msgs, *a, **kw):
            self.netlink += len(msgs)
            return real_req(msgs, *a, **kw)

        monkeypatch.setattr(writer, "nlm_request_batch", counting_req)

    def writes(self) -> list[str]:
        return [self.WRITE_CMDS[c] for c in self.bpf if c in self.WRITE_CMDS]

    def reset(self) -> None:
        self.bpf.clear()
        self.netlink = 0


def test_restart_adopts_maps_resync_writes_nothing_and_one_pod_ip_is_one_write(bed, cfg_file, monkeypatch):
    caps = probe_capabilities()
    assert caps.bpf_maps, caps.notes
    first = open_node(caps, netns=bed.node)
    rep = first.apply(load_config(cfg_file))
    assert rep.ok and rep.changes > 0
    (prog_before,) = [f["options"]["prog"]["id"] for f in egress_filters(bed) if "prog" in f.get("options", {})]

    # A "restarted agent": a fresh reconciler (new sockets, no state) finds and adopts the classifier.
    again = open_node(caps, netns=bed.node)
    htb = next(b for b in again.backends if b.name == "htb")
    count = Counting(monkeypatch, htb.writer)
    rep = again.apply(load_config(cfg_file))
    assert rep.ok and rep.changes == 0
    assert count.writes() == [] and count.netlink == 0
    ids = [f.get("options", {}).get("prog", {}).get("id") for f in egress_filters(bed)]
    assert prog_before in ids  # the same program: adopted, not recreated

    # One more source prefix (a pod IP): exactly one bpf() map write, no netlink at all.
    count.reset()
    cfg_file.write_text(CFG.replace("198.18.2.1/32]", "198.18.2.1/32, 198.18.3.1/32]"))
    rep = again.apply(load_config(cfg_file))
    assert rep.ok and rep.changes == 1
    assert count.writes() == ["update_batch"] and count.netlink == 0
    before = class_packets(bed)
    bed.send("198.18.3.1", "198.18.0.2", 100, 10)
    assert class_packets(bed)[B] - before[B] >= 10


def test_u32_path_when_forced(bed, cfg_file):
    r = bed.exec("env", "SHAPERD_CLASSIFIER=u32", *bed_shaperd_argv(), "apply", "--config", str(cfg_file),
                 check=False)
    assert r.returncode == 0, r.stderr
    assert not [f for f in egress_filters(bed) if "shpd_c" in json.dumps(f)]
    assert "u32" in bed.exec("tc", "filter", "show", "dev", "up0", "parent", "7368:").stdout
    before = class_packets(bed)
    bed.send("198.18.1.1", "198.18.0.2", 100, 20)
    assert class_packets(bed)[A] - before[A] >= 20


def bed_shaperd_argv():
    from .conftest import PY

    return (PY, "-m", "shaperd", "--log-json")
