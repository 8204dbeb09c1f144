"""The planner's destination scopes: the inner tenant class, its leaves, its filter chain, DstScope entries."""

from __future__ import annotations

import ipaddress

from shaperd.core import config
from shaperd.backends.htb import plan as htb_plan
from shaperd.backends.htb.diff import diff_device
from shaperd.backends.common.objects import (
    ETH_P_ALL, ROOT_HANDLE, DeviceState, ObservedClass, ObservedFilter, RootQdisc, U32Key, classid,
)
from shaperd.backends.htb.observe import _with_class_chains
from shaperd.core.ids import assign_minors
from shaperd.core.inventory import Capabilities, Inventory, Link

INV = Inventory(links=(Link("eth0", 2, speed_bps=100 * 10**9),), default_route_devices=("eth0",),
                capabilities=Capabilities(bpf=False, leaf_kinds=frozenset({"bfifo"})))
TEXT = """
tenants:
  - name: a
    bandwidthGuarantee: 30Gbps
    bandwidthLimit: 60Gbps
    match: {cidrs: [198.18.1.0/24]}
    destinations:
      - {cidrs: [10.244.0.0/16, "2001:db8:44::/48"], bandwidthLimit: 40Gbps}
      - {cidrs: [10.245.0.0/24], bandwidthLimit: 80Gbps}
  - name: b
    bandwidthGuarantee: 10Gbps
"""


def _plan(text=TEXT):
    cfg = config.load_text(text)
    return cfg, htb_plan.plan(cfg, INV).devices[0]


def test_the_scoped_tenant_becomes_inner_with_a_rest_leaf_and_one_leaf_per_scope():
    cfg, dp = _plan()
    a = dp.tenant_classes["a"]
    kids = [c for c in dp.classes if c.parent == a]
    assert len(kids) == 3
    by_ceil = sorted((c.ceil_bps, c.rate_bps) for c in kids)
    # scope 1: its own 40G cap; scope 2: 80G is above the tenant's 60G, so the tenant's limit binds;
    # rest: the tenant's limit. Guarantee split in equal shares, the rest gets what is left.
    assert by_ceil == [(40 * 10**9, 10 * 10**9), (60 * 10**9, 10 * 10**9), (60 * 10**9, 10 * 10**9)]
    assert a not in {q.parent for q in dp.leaves} and {c.classid for c in kids} <= {q.parent for q in dp.leaves}
    # b is untouched: a leaf directly under the root class.
    assert dp.tenant_classes["b"] in {q.parent for q in dp.leaves}


def test_filters_of_the_chain_and_the_dst_scopes_agree():
    _, dp = _plan()
    a = dp.tenant_classes["a"]
    chain = [f for f in dp.filters if getattr(f, "parent", ROOT_HANDLE) == a]
    rest = [f for f in chain if f.protocol == ETH_P_ALL]
    assert len(rest) == 1 and rest[0].keys == (U32Key(0, 0, 0),) and rest[0].prio == max(f.prio for f in chain)
    dst = {(str(d.prefix), d.classid) for d in dp.dst_scopes}
    assert {p for p, _ in dst} == {"10.244.0.0/16", "2001:db8:44::/48", "10.245.0.0/24"}
    assert {(f.prefix.removeprefix("dst "), f.classid) for f in chain if f.protocol != ETH_P_ALL} == dst
    v4 = next(f for f in chain if f.prefix == "dst 10.244.0.0/16")
    assert v4.keys == (U32Key(int(ipaddress.ip_address("10.244.0.0")), 0xFFFF0000, 16),)
    # longest first: the /24 runs before the /16
    assert next(f.prio for f in chain if f.prefix == "dst 10.245.0.0/24") < v4.prio
    # the root chain's source filter still sends the tenant to its (now inner) class
    assert any(f.parent == ROOT_HANDLE and f.classid == a and f.prefix == "198.18.1.0/24" for f in dp.filters)


def test_adding_a_scope_moves_no_tenant_class():
    _, with_scopes = _plan()
    _, plain = _plan("tenants: [{name: a, bandwidthGuarantee: 30Gbps}, {name: b, bandwidthGuarantee: 10Gbps}]")
    assert with_scopes.tenant_classes == plain.tenant_classes == {
        n: classid(m) for n, m in assign_minors(["a", "b"]).items()}
    assert plain.dst_scopes == ()


def _observed(dp) -> DeviceState:
    """The kernel's view of an applied plan, u32 dump quirk included (each chain's dump lists all)."""
    from shaperd.core import units

    st = DeviceState(device=dp.device, ifindex=dp.ifindex, root=RootQdisc("htb", ROOT_HANDLE, 2))
    for c in dp.classes:
        st.classes[c.classid] = ObservedClass(c.classid, c.parent, units.bps_to_Bps(c.rate_bps),
                                              units.bps_to_Bps(c.ceil_bps), *c.kernel_fields()[3:])
    st.leaves = {q.parent: q for q in dp.leaves}
    rows = [ObservedFilter("u32", f.prio, f.protocol, 0x80000800 + i, ROOT_HANDLE, f.classid, f.keys)
            for i, f in enumerate(dp.filters)]
    st.filters = rows
    inner = [dp.tenant_classes["a"]]
    st.filters = _with_class_chains(st, inner, [r._replace(parent=inner[0]) for r in rows])
    return st


def test_an_applied_scoped_plan_is_in_sync():
    _, dp = _plan()
    assert diff_device(dp, _observed(dp)).ops == []


def test_a_removed_scope_deletes_its_filters_before_its_classes():
    _, dp = _plan()
    _, plain = _plan(TEXT.split("    destinations:")[0] + "  - name: b\n    bandwidthGuarantee: 10Gbps\n")
    ops = diff_device(plain, _observed(dp)).ops
    kinds = [type(o).__name__ for o in ops]
    assert "DeleteClass" in kinds and kinds.index("DeleteClass") > max(
        i for i, k in enumerate(kinds) if k.startswith("DeleteFilter"))


def test_status_labels_the_scope_leaves():
    from shaperd.backends.htb.status import class_labels

    cfg, dp = _plan()
    path = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "kubeflow-source-design.yaml"
    labels = class_labels(str(path))
    assert sorted(v for v in labels.values() if "tenant-a" in v) == ["tenant-a", "tenant-a->10.244.0.0/16",
                                                                      "tenant-a/rest"]


def test_a_scoped_tenants_counters_include_its_leaves_queues():
    from shaperd.backends.htb.observe import with_leaf_queues
    from shaperd.kernel.rtnl_rows import HtbClassRow

    def row(cid, parent, drops, backlog):
        return HtbClassRow(2, ROOT_HANDLE | cid, parent, 0, 1, 1, 1, 1, 1, 0, bytes=100, drops=drops,
                           backlog_bytes=backlog, qlen=backlog // 100)

    root = ROOT_HANDLE | 1
    t = ROOT_HANDLE | 0x10
    rows = {r.classid: r for r in (row(1, ROOT_HANDLE, 0, 0), row(0x10, root, 0, 0), row(0x11, t, 3, 200),
                                   row(0x12, t, 4, 300), row(0x20, root, 5, 100))}
    got = with_leaf_queues(rows)
    assert (got[t].drops, got[t].backlog_bytes, got[t].qlen) == (7, 500, 5)
    assert got[root] == rows[root] and got[ROOT_HANDLE | 0x20] == rows[ROOT_HANDLE | 0x20]
