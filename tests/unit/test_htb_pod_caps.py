"""Per-pod egress caps on htb, pure: the tree (pods.py), the classification, the marks, the diff's transitions."""

from __future__ import annotations

import dataclasses
import ipaddress
import random

from hypothesis import given, settings, strategies as st

from shaperd.backends.common import mapcls
from shaperd.backends.common.objects import (
    DEFAULT_CLASS_MINOR, ETH_P_ALL, ROOT_CLASS_MINOR, ROOT_HANDLE, BpfFilter, DeviceState, ObservedClass,
    ObservedFilter, RootQdisc, U32Filter, classid, fmt_handle, src_prefix_keys,
)
from shaperd.backends.htb import plan as htb_plan
from shaperd.backends.htb.diff import diff_device
from shaperd.backends.htb.observe import _with_class_chains
from shaperd.backends.htb.pods import MIN_POD_RATE_BPS
from shaperd.backends.marks import plan as marks_plan
from shaperd.core import config, units
from shaperd.core.ids import assign_minors
from shaperd.core.inventory import Capabilities, Inventory, Link, Pod
from shaperd.core.tenancy import tenancy

U32_CAPS = Capabilities(bpf=True, bpf_maps=False, leaf_kinds=frozenset({"bfifo"}))
MAP_CAPS = Capabilities(bpf=True, bpf_maps=True, leaf_kinds=frozenset({"bfifo"}))
TEXT = """
node: {interfaces: [up0], capacity: 1Gbps, reserve: 20Mbps}
tenants:
  - {name: a, bandwidthGuarantee: 400Mbps, bandwidthLimit: 800Mbps, priority: 100, match: {namespaces: [team-a]}}
  - {name: b, bandwidthGuarantee: 200Mbps, priority: 50, match: {namespaces: [team-b]}}
"""
SCOPED = TEXT.replace("match: {namespaces: [team-b]}}",
                      "match: {namespaces: [team-b]}, destinations: [{cidrs: [198.19.0.0/16], bandwidthLimit: 100Mbps}]}")
MINORS = assign_minors(["a", "b"])
A, B = classid(MINORS["a"]), classid(MINORS["b"])
ROOT_CLS, DEFAULT = classid(ROOT_CLASS_MINOR), classid(DEFAULT_CLASS_MINOR)


def pod(uid, ns, ip, ifindex, cap=None, name=None, ifname=None):
    return Pod(uid, ns, name or uid, ips=(ip,), host_ifindex=ifindex, host_ifname=ifname or f"veth{ifindex}",
               egress_bandwidth=cap)


PODS = (pod("u1", "team-a", "198.18.5.1", 10, "100M"), pod("u2", "team-a", "198.18.5.2", 11),
        pod("u3", "team-b", "198.18.5.3", 12, "50M"), pod("u4", "other", "198.18.5.4", 13, "10M"))


def inv(pods=PODS, caps=MAP_CAPS, links=(Link("up0", 2, speed_bps=10**9),)):
    return Inventory(links=links, default_route_devices=tuple(l.name for l in links), pods=tuple(pods),
                     capabilities=caps)


def planned(text=TEXT, pods=PODS, caps=MAP_CAPS):
    cfg = config.load_text(text)
    i = inv(pods, caps)
    return htb_plan.plan(cfg, i, ten=tenancy(cfg, i))


def by_id(dp):
    return {c.classid: c for c in dp.classes}


def cls_of(plan, uid):
    return next(p.classid for p in plan.pods if p.uid == uid)


# ------------------------------------------------------------------ the tree


def test_a_tenant_with_a_capped_pod_becomes_inner_with_a_rest_leaf_and_the_pods_leaf():
    p = planned()
    dp = p.devices[0]
    c = by_id(dp)
    kids = [k for k in dp.classes if k.parent == A]
    pod1 = cls_of(p, "u1")
    assert {k.classid for k in kids} == {pod1, next(k.classid for k in kids if k.classid != pod1)}
    assert (c[pod1].ceil_bps, c[pod1].rate_bps, c[pod1].prio) == (100 * 10**6, 100 * 10**6, c[A].prio)
    rest = next(k for k in kids if k.classid != pod1)
    assert rest.ceil_bps == 800 * 10**6 and rest.rate_bps == 300 * 10**6  # g - the pod's share
    assert sum(k.rate_bps for k in kids) == c[A].rate_bps == 400 * 10**6
    leaves = {q.parent for q in dp.leaves}
    assert A not in leaves and {pod1, rest.classid} <= leaves
    # The rest leaf's identity is the one scopes use: "<tenant>\0rest".
    from shaperd.backends.htb.scopes import scope_minors

    smins = scope_minors(config.load_text(TEXT).tenants, MINORS)
    assert rest.classid == classid(assign_minors(["a\0rest"], frozenset(
        set(MINORS.values()) | set(smins.values()) | {pc.classid & 0xFFFF for pc in p.pods}))["a\0rest"])
    # Uncapped traffic the classifier sends to the (now inner) tenant class goes on to rest.
    assert any(isinstance(f, U32Filter) and f.parent == A and f.protocol == ETH_P_ALL and f.classid == rest.classid
               for f in dp.filters)


def test_the_pods_ceil_is_never_above_its_tenants():
    p = planned(pods=(pod("u1", "team-a", "198.18.5.1", 10, "900M"),))
    assert by_id(p.devices[0])[cls_of(p, "u1")].ceil_bps == 800 * 10**6


def test_a_capped_pod_of_no_tenant_sits_beside_the_default_class_which_stays_a_leaf():
    p = planned()
    dp = p.devices[0]
    c = by_id(dp)
    lone = cls_of(p, "u4")
    assert c[lone].parent == ROOT_CLS and c[lone].prio == htb_plan.DEFAULT_CLASS_PRIO
    assert c[lone].ceil_bps == 10 * 10**6
    assert dp.root.default_minor == DEFAULT_CLASS_MINOR and DEFAULT in {q.parent for q in dp.leaves}
    assert not [k for k in dp.classes if k.parent == DEFAULT]
    # Carved out of the reserve: the default class keeps the rest.
    assert c[lone].rate_bps + c[DEFAULT].rate_bps == 20 * 10**6 and c[lone].rate_bps == 10 * 10**6


def test_without_capped_pods_the_tree_is_as_before():
    plain = planned(pods=tuple(dataclasses.replace(x, egress_bandwidth=None) for x in PODS))
    dp = plain.devices[0]
    assert plain.pods == () and {c.parent for c in dp.classes} == {ROOT_HANDLE, ROOT_CLS}
    assert by_id(dp)[DEFAULT].rate_bps == 20 * 10**6


def test_an_invalid_annotation_leaves_the_pod_uncapped_in_its_tenant():
    p = planned(pods=(pod("u1", "team-a", "198.18.5.1", 10, "fast"),))
    assert p.pods == () and A in {q.parent for q in p.devices[0].leaves}


@settings(max_examples=40, deadline=None)
@given(g_mbps=st.integers(1, 900), caps_k=st.lists(st.integers(1, 1_000_000), min_size=1, max_size=24),
       scopes=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_children_rates_never_oversubscribe_the_guarantee_and_each_pod_has_one_class(g_mbps, caps_k, scopes, seed):
    dests = "".join(f"{{cidrs: [198.19.{i}.0/24], bandwidthLimit: {10 * (i + 1)}Mbps}}," for i in range(scopes))
    text = (f"node: {{interfaces: [up0], capacity: 1Gbps, reserve: 10Mbps}}\ntenants:\n"
            f"  - {{name: a, bandwidthGuarantee: {g_mbps}Mbps, match: {{namespaces: [team-a]}}"
            + (f", destinations: [{dests}]" if scopes else "") + "}\n")
    pods = [pod(f"uid-{i}", "team-a", f"198.18.{i // 200}.{i % 200 + 1}", 100 + i, f"{k}k")
            for i, k in enumerate(caps_k)]
    for caps in (MAP_CAPS, U32_CAPS):
        p = planned(text, pods, caps)
        assert not p.problems, p.problems
        dp = p.devices[0]
        c = by_id(dp)
        kids = [k for k in dp.classes if k.parent == A]
        assert len(kids) == len(pods) + scopes + 1
        warned = any("add up to more than the guarantee" in w for w in p.warnings)
        assert sum(k.rate_bps for k in kids) <= c[A].rate_bps or warned
        if g_mbps * 10**6 // len(kids) >= 8000:  # every share above the floors: the guarantee exactly
            assert sum(k.rate_bps for k in kids) == c[A].rate_bps and not warned
        assert all(k.rate_bps >= MIN_POD_RATE_BPS and k.rate_bps <= k.ceil_bps for k in kids)
        ids = [pc.classid for pc in p.pods]
        assert len(set(ids)) == len(pods) and set(ids) <= {k.classid for k in kids}
        assert len({k.classid for k in dp.classes}) == len(dp.classes)
    # ids stable under input order
    shuffled = list(pods)
    random.Random(seed).shuffle(shuffled)
    assert planned(text, shuffled).devices == planned(text, pods).devices


def test_ids_do_not_depend_on_input_order_or_on_other_pods_of_the_tenant():
    a = planned()
    b = planned(pods=tuple(reversed(PODS)))
    assert a.devices == b.devices and a.pods == b.pods
    alone = planned(pods=(PODS[0],))
    assert cls_of(alone, "u1") == cls_of(a, "u1")


def test_the_tenant_classes_do_not_move_when_pods_are_capped():
    a = planned()
    plain = planned(pods=tuple(dataclasses.replace(x, egress_bandwidth=None) for x in PODS))
    assert a.devices[0].tenant_classes == plain.devices[0].tenant_classes == {"a": A, "b": B}


# ------------------------------------------------------------------ classification


def test_map_path_the_pods_address_interface_and_mark_map_to_its_own_class():
    cfg = config.load_text(TEXT)
    i = inv()
    ten = tenancy(cfg, i)
    p = htb_plan.plan(cfg, i, ten=ten)
    e = p.devices[0].map_classifier.entries
    own = cls_of(p, "u1")
    assert e["src4"][mapcls.src_key(ipaddress.ip_network("198.18.5.1/32"))] == mapcls.value(own)
    assert e["src4"][mapcls.src_key(ipaddress.ip_network("198.18.5.2/32"))] == mapcls.value(A)  # its uncapped mate
    assert e["ifindex"][mapcls.u32_key(10)] == mapcls.value(own)
    assert mapcls.u32_key(11) not in e["ifindex"]  # an uncapped pod is classified by address and mark, as before
    assert e["mark"][mapcls.u32_key(ten.pod_marks["u1"])] == mapcls.value(own)
    assert e["mark"][mapcls.u32_key(ten.marks["a"])] == mapcls.value(A)
    assert e["src4"][mapcls.src_key(ipaddress.ip_network("198.18.5.4/32"))] == mapcls.value(cls_of(p, "u4"))


def test_u32_path_the_pods_address_filter_and_classic_bpf_point_at_its_class():
    p = planned(caps=U32_CAPS)
    dp = p.devices[0]
    own = cls_of(p, "u1")
    f = next(f for f in dp.filters if isinstance(f, U32Filter) and f.prefix == "198.18.5.1/32")
    assert (f.parent, f.classid, f.keys) == (ROOT_HANDLE, own, src_prefix_keys(ipaddress.ip_network("198.18.5.1/32")))
    ifx = next(f for f in dp.filters if isinstance(f, BpfFilter) and f.kind == "ifindex")
    assert (10, own) in ifx.mapping
    assert dp.map_classifier is None


def test_a_scoped_tenants_capped_pod_still_goes_through_the_scopes_on_both_paths():
    m = planned(SCOPED)
    u = planned(SCOPED, caps=U32_CAPS)
    own = cls_of(m, "u3")
    assert cls_of(u, "u3") == own
    scope_leaf = next(d.classid for d in m.devices[0].dst_scopes if d.tenant_classid == B)
    # map path: the pod's own class, and a destination entry keyed by it
    e = m.devices[0].map_classifier.entries
    assert e["src4"][mapcls.src_key(ipaddress.ip_network("198.18.5.3/32"))] == mapcls.value(own)
    assert e["dst4"][mapcls.dst_key(own, ipaddress.ip_network("198.19.0.0/16"))] == mapcls.value(scope_leaf)
    # u32 path: the root sends it to its tenant's chain: scopes first, then its address, then rest
    dp = u.devices[0]
    root = next(f for f in dp.filters if isinstance(f, U32Filter) and f.prefix == "198.18.5.3/32"
                and f.parent == ROOT_HANDLE)
    assert root.classid == B
    chain = sorted((f for f in dp.filters if isinstance(f, U32Filter) and f.parent == B), key=lambda f: f.prio)
    assert [f.classid for f in chain] == [scope_leaf, own, next(k.classid for k in chain if k.protocol == ETH_P_ALL)]
    assert any("tenant b has destination scopes" in w and "team-b/u3" in w for w in u.warnings)


def test_a_shared_host_interface_is_no_capped_pods_own():
    shared = (pod("u1", "team-a", "198.18.5.1", 10, "100M"), pod("u2", "team-a", "198.18.5.2", 10))
    p = planned(pods=shared)
    assert mapcls.u32_key(10) not in p.devices[0].map_classifier.entries["ifindex"]
    # still its own class by address
    assert p.devices[0].map_classifier.entries["src4"][mapcls.src_key(
        ipaddress.ip_network("198.18.5.1/32"))] == mapcls.value(cls_of(p, "u1"))


# ------------------------------------------------------------------ marks


def test_marks_a_capped_pod_carries_its_own_mark_its_mates_their_tenants():
    cfg = config.load_text(TEXT)
    i = inv()
    ten = tenancy(cfg, i)
    got = {m.ifname: m for m in marks_plan.plan(cfg, i, ten).marks}
    assert got["veth10"].value == ten.pod_marks["u1"] and got["veth10"].pod == "team-a/u1"
    assert got["veth11"].value == ten.marks["a"] and got["veth11"].pod == ""
    assert got["veth13"].value == ten.pod_marks["u4"]  # a capped pod of no tenant gets its own mark too
    assert len(set(ten.pod_marks.values()) | set(ten.marks.values())) == len(ten.pod_marks) + len(ten.marks)


def test_a_capped_pod_the_mask_has_no_mark_for_gets_none_and_a_warning():
    text = TEXT.replace("reserve: 20Mbps}", "reserve: 20Mbps, markMask: 0x3}")  # 3 values: a, b and one pod
    cfg = config.load_text(text)
    pods = (pod("u1", "team-a", "198.18.5.1", 10, "100M"), pod("u5", "team-a", "198.18.5.5", 14, "100M"))
    i = inv(pods)
    ten = tenancy(cfg, i)
    assert len(ten.pod_marks) == 1
    lacking = next(x for x in pods if x.uid not in ten.pod_marks)
    p = htb_plan.plan(cfg, i, ten=ten)
    assert any(f"pod {lacking.ref}: no skb->mark value left" in w for w in p.warnings), p.warnings
    marks = {m.ifindex for m in marks_plan.plan(cfg, i, ten).marks}
    assert lacking.host_ifindex not in marks  # not its tenant's either: that would win over its address
    # ... and it is still classified to its own class by interface and address
    e = p.devices[0].map_classifier.entries
    assert e["ifindex"][mapcls.u32_key(lacking.host_ifindex)] == mapcls.value(cls_of(p, lacking.uid))


def test_marks_leave_an_interface_whose_ingress_hook_holds_an_ingress_qdisc_alone_and_say_so():
    """The CNI bandwidth plugin's egress side puts a classic ingress qdisc on the pod's veth: clsact cannot be
    added beside it (EEXIST), so no write is planned there; the target is blocked with the reason, and the
    other interfaces get their marks as before. Once the ingress qdisc is gone, the mark is planned again."""
    from shaperd.backends.marks.objects import MarksObserved

    cfg = config.load_text(TEXT)
    i = inv()
    desired = marks_plan.plan(cfg, i, tenancy(cfg, i))
    by_name = {m.ifname: m for m in desired.marks}
    held = by_name["veth10"].ifindex
    observed = MarksObserved(ingress_qdisc=frozenset({held}))
    ops = marks_plan.diff(desired, observed).ops
    assert ops and all(op.ifindex != held for op in ops)
    assert {op.ifindex for op in ops} == {m.ifindex for m in desired.marks} - {held}
    (blocked,) = marks_plan.blocked(desired, observed)
    assert blocked.target == "veth10" and not blocked.ops
    assert "ingress qdisc (not clsact)" in blocked.blocked and "team-a/u1" in blocked.blocked
    free = marks_plan.diff(desired, MarksObserved())
    assert held in {op.ifindex for op in free.ops} and not marks_plan.blocked(desired, MarksObserved())


# ------------------------------------------------------------------ diff and observe


def observed(dp) -> DeviceState:
    """The kernel's view of an applied plan, u32's dump quirk included (every chain's dump lists every node)."""
    st = DeviceState(device=dp.device, ifindex=dp.ifindex, root=RootQdisc("htb", ROOT_HANDLE, dp.root.default_minor))
    for c in dp.classes:
        st.classes[c.classid] = ObservedClass(c.classid, c.parent, units.bps_to_Bps(c.rate_bps),
                                              units.bps_to_Bps(c.ceil_bps), *c.kernel_fields()[3:])
    st.leaves = {q.parent: q for q in dp.leaves}
    u32 = [ObservedFilter("u32", f.prio, f.protocol, 0x80000800 + i, ROOT_HANDLE, f.classid, f.keys)
           for i, f in enumerate(dp.filters) if isinstance(f, U32Filter)]
    bpf = [ObservedFilter("bpf", f.prio, ETH_P_ALL, 1, ROOT_HANDLE, 0, (), f.name)
           for f in dp.filters if isinstance(f, BpfFilter)]
    inner = sorted({c.parent for c in dp.classes} - {ROOT_HANDLE, ROOT_CLS})
    st.filters = _with_class_chains(st, inner, [r._replace(parent=p) for p in inner for r in u32]) + bpf
    st.filters = [f for f in st.filters if f.kind == "u32"] + bpf
    if dp.map_classifier is not None:
        st.map_classifier = mapcls.ObservedMapClassifier(dp.map_classifier.name, 7, 0x7368, 0x7368,
                                                         {r: dict(v) for r, v in dp.map_classifier.entries.items()})
    return st


def kinds(ops):
    return [type(o).__name__ for o in ops]


def test_an_applied_plan_with_capped_pods_is_in_sync_on_both_paths():
    for caps in (MAP_CAPS, U32_CAPS):
        for text in (TEXT, SCOPED):
            dp = planned(text, caps=caps).devices[0]
            assert diff_device(dp, observed(dp)).ops == [], (caps.bpf_maps, text)


def test_observe_keeps_a_root_filter_to_a_pods_leaf_in_the_root_chain():
    dp = planned(caps=U32_CAPS).devices[0]
    st = observed(dp)
    own = next(f for f in st.filters if f.kind == "u32" and f.keys == src_prefix_keys(
        ipaddress.ip_network("198.18.5.1/32")))
    assert own.parent == ROOT_HANDLE  # its target's parent is the inner tenant class, but its prio is the root's


def test_first_capped_pod_turns_the_tenant_inner_in_place():
    plain = planned(pods=(PODS[1],), caps=U32_CAPS).devices[0]
    p = planned(pods=PODS[:2], caps=U32_CAPS)
    ops = diff_device(p.devices[0], observed(plain)).ops
    k = kinds(ops)
    assert "DeleteRoot" not in k and "DeleteClass" not in k
    created = {op.cls.classid for op in ops if type(op).__name__ == "CreateClass"}
    assert cls_of(p, "u1") in created and len(created) == 2  # the pod's leaf and the rest leaf
    assert A not in {op.cls.classid for op in ops if hasattr(op, "cls")}  # the tenant class is kept as it is


def test_a_changed_cap_is_a_class_change_and_a_removed_one_makes_the_tenant_a_leaf_again():
    before = planned(pods=PODS[:2], caps=U32_CAPS)
    own = cls_of(before, "u1")
    changed = planned(pods=(dataclasses.replace(PODS[0], egress_bandwidth="200M"), PODS[1]), caps=U32_CAPS)
    ops = diff_device(changed.devices[0], observed(before.devices[0])).ops
    rest = next(c.classid for c in before.devices[0].classes if c.parent == A and c.classid != own)
    assert set(kinds(ops)) == {"ChangeClass"} and {op.cls.classid for op in ops} == {own, rest}  # its share moved
    assert next(op.cls for op in ops if op.cls.classid == own).ceil_bps == 200 * 10**6
    removed = planned(pods=(dataclasses.replace(PODS[0], egress_bandwidth=None), PODS[1]), caps=U32_CAPS)
    ops = diff_device(removed.devices[0], observed(before.devices[0])).ops
    k = kinds(ops)
    assert "DeleteRoot" not in k
    assert {op.classid for op in ops if type(op).__name__ == "DeleteClass"} == {
        own, next(c.classid for c in before.devices[0].classes if c.parent == A and c.classid != own)}
    assert any(type(op).__name__ == "SetLeaf" and op.leaf.parent == A for op in ops)
    # filters go before the classes they point at (the kernel refuses to delete a bound class)
    assert max(i for i, x in enumerate(k) if x.startswith("DeleteFilter")) < k.index("DeleteClass")


def test_a_deleted_pods_class_filters_and_map_entries_all_go():
    for caps in (MAP_CAPS, U32_CAPS):
        before = planned(caps=caps)
        own = cls_of(before, "u1")
        after = planned(pods=PODS[1:], caps=caps)
        ops = diff_device(after.devices[0], observed(before.devices[0])).ops
        deleted = {op.classid for op in ops if type(op).__name__ == "DeleteClass"}
        assert own in deleted
        if caps.bpf_maps:
            dels = {(op.role, k) for op in ops if isinstance(op, mapcls.UpdateClassifierMap) for k in op.deletes}
            assert ("ifindex", mapcls.u32_key(10)) in dels
            ups = {(op.role, k): v for op in ops if isinstance(op, mapcls.UpdateClassifierMap) for k, v in op.upserts}
            assert not any(v == mapcls.value(own) for v in ups.values())
        else:
            gone = [op.filter for op in ops if type(op).__name__ == "DeleteFilter"]
            assert any(f.classid == own for f in gone), kinds(ops)
        assert diff_device(after.devices[0], observed(after.devices[0])).ops == []


def test_render_names_each_capped_pod():
    from shaperd.backends.htb.render import render

    text = render(planned())
    assert f"# capped pod team-a/u1 (tenant a): egress-bandwidth 100mbit -> class {fmt_handle(cls_of(planned(), 'u1'))}" \
        in text


def test_a_capped_host_network_pod_is_classified_by_its_cgroup_to_its_class_and_needs_no_mark():
    from shaperd.core.inventory import CgroupRef

    hn = Pod("u9", "team-a", "nccl-0", host_network=True, cgroup=CgroupRef("/kubepods/pod-u9", 3, 4242),
             egress_bandwidth="100M")
    for caps in (MAP_CAPS, U32_CAPS):
        p = planned(pods=(hn,), caps=caps)
        own = cls_of(p, "u9")
        dp = p.devices[0]
        if caps.bpf_maps:
            assert dp.map_classifier.entries["cgroup"][mapcls.cgroup_key(4242)] == mapcls.value(own)
        else:
            cg = next(f for f in dp.filters if isinstance(f, BpfFilter) and f.kind == "cgroup")
            assert (3, 4242, own) in cg.mapping
        assert not any("no skb->mark" in w for w in p.warnings)
