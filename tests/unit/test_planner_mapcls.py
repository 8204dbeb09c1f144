"""The planner's eBPF path: the same decisions as the u32 path, carried as map entries."""

import dataclasses
import ipaddress

from shaperd.core import config
from shaperd.backends.common import mapcls
from shaperd.backends.htb import plan as planner
from shaperd.backends.htb.diff import diff_device
from shaperd.backends.common.objects import (
    DstScope, DeviceState, RootQdisc, ROOT_HANDLE, U32Filter, classid,
)
from shaperd.backends.htb.render import render
from shaperd.core.inventory import Capabilities, Inventory, Link

G = 10**9
SOURCE = """
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, bandwidthLimit: 60Gbps, priority: 100,
     match: {cidrs: [198.18.1.0/24, "2001:db8:1::/64"], interfaces: ["veth-a*"]}}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, bandwidthLimit: 40Gbps, priority: 50,
     match: {cidrs: [198.18.2.0/24, 198.18.1.7/32]}}
"""


def inv(bpf_maps: bool) -> Inventory:
    return Inventory(links=(Link("eth0", 2, speed_bps=100 * G), Link("veth-a1", 7, "veth"), Link("lo", 1)),
                     default_route_devices=("eth0",), capabilities=Capabilities(bpf=True, bpf_maps=bpf_maps))


def plans():
    cfg = config.load_text(SOURCE)
    return planner.plan(cfg, inv(False)).devices[0], planner.plan(cfg, inv(True)).devices[0]


def test_ebpf_path_carries_every_u32_and_bpf_decision_as_entries_and_no_root_filter():
    u32, ebpf = plans()
    assert u32.classifier_path == "u32" and ebpf.classifier_path == "ebpf"
    assert ebpf.filters == () and ebpf.classes == u32.classes
    mc = ebpf.map_classifier
    want_src = {mapcls.src_key(ipaddress.ip_network(f.prefix)): mapcls.value(f.classid)
                for f in u32.filters if isinstance(f, U32Filter)}
    assert {**mc.entries["src4"], **mc.entries["src6"]} == want_src
    a = u32.tenant_classes["tenant-a"]
    assert mc.entries["ifindex"] == {mapcls.u32_key(7): mapcls.value(a)}
    # Longest prefix wins in the trie as in u32 prio order: the /32 of tenant-b inside tenant-a's /24.
    b = u32.tenant_classes["tenant-b"]
    assert mc.entries["src4"][mapcls.src_key(ipaddress.ip_network("198.18.1.7/32"))] == mapcls.value(b)


def test_dst_scopes_on_the_plan_become_dst_entries():
    cfg = config.load_text(SOURCE)
    dp = planner.plan(cfg, inv(False)).devices[0]
    a = dp.tenant_classes["tenant-a"]
    scoped = dataclasses.replace(dp, dst_scopes=(DstScope(a, ipaddress.ip_network("198.19.0.0/16"), classid(0x20)),))
    warnings: list[str] = []
    got = planner.with_map_classifier(scoped, 0xFF, warnings)
    assert got.map_classifier.entries["dst4"] == {
        mapcls.dst_key(a, ipaddress.ip_network("198.19.0.0/16")): mapcls.value(classid(0x20))}
    assert warnings == []


def test_fresh_device_gets_one_attach_and_render_names_the_classifier():
    _, ebpf = plans()
    observed = DeviceState("eth0", 2, RootQdisc("noqueue", 0))
    ops = diff_device(ebpf, observed).ops
    attach = [op for op in ops if isinstance(op, mapcls.AttachMapClassifier)]
    assert len(attach) == 1 and ops[-1] is attach[0]  # after the classes it points at
    text = render(planner.plan(config.load_text(SOURCE), inv(True)))
    assert "eBPF map classifier shpd_c" in text and "198.18.1.7/32 -> 7368:" in text
    assert "u32" not in text


def test_adopted_in_sync_classifier_and_tree_diff_to_nothing():
    _, ebpf = plans()
    from shaperd.backends.common.objects import ObservedClass, LeafQdisc  # noqa: F401
    observed = DeviceState("eth0", 2, RootQdisc("htb", ROOT_HANDLE, 2))
    for c in ebpf.classes:
        k = c.kernel_fields()
        observed.classes[c.classid] = ObservedClass(c.classid, *k)
    for q in ebpf.leaves:
        observed.leaves[q.parent] = q
    mc = ebpf.map_classifier
    observed.map_classifier = mapcls.ObservedMapClassifier(mc.name, 5, 0x7368, 0x7368,
                                                           {r: dict(e) for r, e in mc.entries.items()})
    assert diff_device(ebpf, observed).ops == []
