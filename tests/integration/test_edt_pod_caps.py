"""Per-pod egress caps in a real stamper's maps (root): the edt backend's observe, diff and apply of capped
pods' keys, read back from the kernel.

The host kernel has no sch_fq, so not the whole edt backend: the kernel functions it uses build its root (mq
7365: on a 4-queue veth) and attach its stamper on clsact egress, pinned on a private bpffs as the backend pins
it; the backend then observes that device (its pod entries read from the attached stamper's maps, through the
pins) and applies only its pod-key operations. Traffic is UDP with SO_PRIORITY = the pod's class id (what the map
classifier writes for the pod's addresses), from the namespace to its peer (198.18.0.0/15). Checked: a pod's
key gets its parent and rate, its packets are counted under its key and its tenant's, a changed cap rewrites
one rate entry, a reconcile in sync writes nothing (twice), and a removed cap or pod leaves no parent, rate,
clock or counter behind.
"""

from __future__ import annotations

import os
import struct

import pytest

from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.edt import controller
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.backends.edt import ops as edt_ops
from shaperd.backends.edt import plan as edt_plan
from shaperd.backends.edt.backend import EdtBackend
from shaperd.backends.edt.kernel_tc import CODEC as EDT_CODEC
from shaperd.backends.edt.objects import ROOT_HANDLE
from shaperd.core import config
from shaperd.core.inventory import Capabilities, Inventory, Link, Pod
from shaperd.core.protocol import TargetDiff
from shaperd.core.tenancy import tenancy
from shaperd.kernel import bpf_pins, tc
from shaperd.kernel.rtnl import CachedReads, RtnlReader
from shaperd_bed import netns
from tests import procs

from .conftest import PY, needs_root

pytestmark = needs_root
CFG = config.from_dict({"node": {"interfaces": ["st0"], "dataplane": "edt", "capacity": "10Gbps"}, "tenants": [
    {"name": "train", "bandwidthGuarantee": "3Gbps", "bandwidthLimit": "8Gbps", "match": {"namespaces": ["train"]}},
    {"name": "batch", "bandwidthGuarantee": "1Gbps", "match": {"namespaces": ["batch"]}}]})
CAPS = Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True)
PACKETS, PAYLOAD = 20, 1000
WIRE = PAYLOAD + 8 + 20 + 14
SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, int(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    s.sendto(b"x" * int(sys.argv[3]), ("198.18.0.2", 9))
"""


def pods(cap_a="100M", with_b=True, cap_c="20M"):
    out = [Pod("uid-a", "train", "a", ips=("198.18.4.1",), egress_bandwidth=cap_a),
           Pod("uid-m", "train", "mate", ips=("198.18.4.2",))]
    if with_b:
        out.append(Pod("uid-b", "batch", "b", ips=("198.18.4.3",), egress_bandwidth="50M"))
    out.append(Pod("uid-c", "nobody", "c", ips=("198.18.4.4",), egress_bandwidth=cap_c))
    return tuple(out)


@pytest.fixture
def node(pinfs):
    """Namespace with veth st0 (4 TX queues), the edt root and a stamper with no pod entries yet, pinned under
    ``pinfs``; yields (namespace, link, reader, the backend)."""
    with netns.Namespaces(stop_grace_s=0) as nets:
        ns, peer = nets.add(f"edtpod-{os.getpid()}"), nets.add(f"edtpp-{os.getpid()}")
        netns.run(["ip", "-n", ns, "link", "add", "st0", "numtxqueues", "4", "type", "veth", "peer", "name", "st1",
                   "numtxqueues", "4", "netns", peer])
        netns.addr(ns, "st0", "198.18.0.1/24")
        netns.addr(peer, "st1", "198.18.0.2/24")
        for n, dev in ((ns, "st0"), (peer, "st1")):
            netns.run(["ip", "-n", n, "link", "set", dev, "up"])
        netns.run(["ip", "-n", ns, "neigh", "replace", "198.18.0.2", "lladdr", "02:00:00:00:00:02", "dev", "st0"])
        with RtnlReader(ns) as reader:
            row = next(l for l in reader.links() if l.name == "st0")
            link = Link("st0", row.ifindex, "veth", mtu=row.mtu, tx_queues=row.tx_queues)
            writer = tc.open_writer(ns)
            try:
                backend = EdtBackend(writer, pins=bpf_pins.PinStore(str(pinfs), "host"))
                dp = planned(link, ())
                kw = dict(device="st0", ifindex=link.ifindex)
                res = tc.apply_ops(writer, [
                    edt_ops.SetRoot(kind="mq", handle=ROOT_HANDLE, **kw), AddClsact(**kw),
                    edt_ops.SetStamper(stamper=dp.stamper, initial_q16=edt_plan.initial_q16(dp), **kw),
                ], pins=backend.stamper_pins, codec=EDT_CODEC)
                assert res.failed == [] and not res.batch_failed, res.failed
                yield ns, link, reader, backend
            finally:
                writer.close()


def planned(link, pod_list):
    inv = Inventory(links=(link,), pods=pod_list, capabilities=CAPS)
    (dp,) = edt_plan.plan(CFG, inv, tenancy(CFG, inv)).devices
    return dp


def reconcile_pods(backend, reader, link, pod_list):
    """One reconcile of the pods' keys: plan, observe (maps read through the pins), diff, apply the pod ops.
    Returns the pod ops applied (the rest, sch_fq this kernel lacks, is not this test's)."""
    inv = Inventory(links=(link,), pods=pod_list, capabilities=CAPS)
    desired = edt_plan.plan(CFG, inv, tenancy(CFG, inv))
    (td,) = [d for d in backend.diff(desired, backend.observe(CachedReads(reader), inv)) if d.target == "st0"]
    ops = [o for o in td.ops if isinstance(o, (edt_ops.SetPodKey, edt_ops.ClearPodKey))]
    res = backend.apply(TargetDiff("st0", ops))
    assert res.failed == [] and len(res.applied) == len(ops), res.failed
    return ops


def maps_of(backend, reader, link):
    dp = planned(link, ())
    return edt_prog.open_for_device(reader, link.ifindex, "st0", dp.stamper.name, backend.stamper_pins)


def _send(ns: str, key: int) -> None:
    procs.run(["ip", "netns", "exec", ns, PY, "-c", SEND, str(0x7368 << 16 | key), str(PACKETS), str(PAYLOAD)],
              timeout_s=30)


def test_capped_pods_get_their_keys_and_their_packets_count_under_the_pod_and_its_tenant(node):
    ns, link, reader, backend = node
    ops = reconcile_pods(backend, reader, link, pods())
    dp = planned(link, pods())
    want = {p.key: (p.parent, p.ns_per_byte_q16) for p in dp.pods}
    assert sorted(o.key for o in ops) == sorted(want) and all(isinstance(o, edt_ops.SetPodKey) for o in ops)
    with maps_of(backend, reader, link) as maps:
        assert edt_prog.read_pod_entries(maps) == want
        rates = {p.uid: controller.rate_bps_of_q16(maps.read_rates([p.key])[p.key]) for p in dp.pods}
    assert abs(rates["uid-a"] - 100_000_000) < 1000 and abs(rates["uid-c"] - 20_000_000) < 1000
    # In sync: the next two reconciles write nothing.
    assert reconcile_pods(backend, reader, link, pods()) == [] == reconcile_pods(backend, reader, link, pods())
    a = next(p for p in dp.pods if p.uid == "uid-a")
    _send(ns, a.key)
    with maps_of(backend, reader, link) as maps:
        stats = maps.read_stats()
        clocks = maps.read_clocks([a.key, a.parent])
    assert stats[a.key] == (PACKETS * WIRE, PACKETS, 0)
    assert stats[a.parent].bytes == PACKETS * WIRE and stats[a.parent].packets == PACKETS  # the tenant's total
    assert clocks[a.key] > 0 and clocks[a.parent] > 0  # both clocks stepped


def test_a_changed_cap_rewrites_one_rate_entry_and_a_removed_cap_or_pod_leaves_nothing(node):
    ns, link, reader, backend = node
    reconcile_pods(backend, reader, link, pods())
    dp = planned(link, pods())
    key = {p.uid: p.key for p in dp.pods}
    _send(ns, key["uid-b"])
    _send(ns, key["uid-c"])
    (op,) = reconcile_pods(backend, reader, link, pods(cap_a="200M"))
    assert (type(op), op.key, op.parent) == (edt_ops.SetPodKey, key["uid-a"], None)
    with maps_of(backend, reader, link) as maps:
        q16 = maps.read_rates([key["uid-a"]])[key["uid-a"]]
        assert abs(controller.rate_bps_of_q16(q16) - 200_000_000) < 1000
        assert maps.read_parents()[key["uid-a"]] == dp.tenant_keys["train"]
    # batch's pod is deleted and c's annotation removed: both keys cleared, everything else kept.
    ops = reconcile_pods(backend, reader, link, pods(cap_a="200M", with_b=False, cap_c=None))
    assert sorted((type(o), o.key) for o in ops) == sorted([(edt_ops.ClearPodKey, key["uid-b"]),
                                                           (edt_ops.ClearPodKey, key["uid-c"])])
    with maps_of(backend, reader, link) as maps:
        assert set(maps.read_parents()) == {key["uid-a"]}
        gone = [key["uid-b"], key["uid-c"]]
        assert maps.read_rates(gone) == {k: 0 for k in gone} and maps.read_clocks(gone) == {k: 0 for k in gone}
        stats = maps.read_stats()
        assert not set(gone) & set(stats)  # no counters left behind
        assert stats[dp.tenant_keys["batch"]].packets == PACKETS  # the tenant keeps what its pod sent
        raw = maps.parents.lookup(struct.pack("<I", key["uid-b"]))
        assert struct.unpack("<I", raw)[0] == 0
    assert reconcile_pods(backend, reader, link, pods(cap_a="200M", with_b=False, cap_c=None)) == []
