"""The pure planner and diff: class ids, HTB sizing, priorities, filters, no-op resync."""

import ipaddress
import random

from hypothesis import given, settings, strategies as st

from shaperd.core import config
from shaperd.core import ids
from shaperd.backends.htb import ops, plan as planner
from shaperd.backends.htb import ops as ops_mod
from shaperd.backends.htb.diff import diff_device, diff_teardown
from shaperd.backends.htb.render import render
from shaperd.core.inventory import Capabilities, Inventory, Link
from shaperd.backends.common.objects import (
    DEFAULT_CLASS_MINOR, HANDLE_MAJOR, ROOT_HANDLE, DeviceState, ObservedClass, ObservedFilter, RootQdisc,
    U32Filter, classid, src_prefix_keys,
)

G = 10**9
UPLINK = Link("eth0", 2, speed_bps=100 * G)
INV = Inventory(links=(UPLINK, Link("veth-a1", 7, "veth"), Link("lo", 1)), default_route_devices=("eth0",),
                capabilities=Capabilities(bpf=True))
SOURCE = """
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, bandwidthLimit: 60Gbps, priority: 100,
     match: {cidrs: [198.18.1.0/24, "2001:db8:1::/64"], interfaces: ["veth-a*"]}}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, bandwidthLimit: 40Gbps, priority: 50,
     match: {cidrs: [198.18.2.0/24, 198.18.1.7/32]}}
"""


def source_plan():
    return planner.plan(config.load_text(SOURCE), INV)


def test_source_design_plan_on_100g_uplink():
    p = source_plan()
    assert not p.problems and [d.device for d in p.devices] == ["eth0"]
    dp = p.devices[0]
    by_tenant = {c.tenant: c for c in dp.classes if c.tenant}
    a, b = by_tenant["tenant-a"], by_tenant["tenant-b"]
    assert (a.rate_bps, a.ceil_bps, a.prio) == (40 * G, 60 * G, 0)
    assert (b.rate_bps, b.ceil_bps, b.prio) == (20 * G, 40 * G, 1)
    root = dp.classes[0]
    # Capacity from the reported 100 Gbit link speed, less 2 % framing headroom.
    assert (root.classid, root.rate_bps, root.ceil_bps) == (classid(1), 98 * G, 98 * G)
    default = next(c for c in dp.classes if c.classid == classid(DEFAULT_CLASS_MINOR))
    assert default.rate_bps == 980 * 10**6 and default.ceil_bps == 98 * G and default.prio == 7  # 1 % reserve
    # Burst sized from rate (10 ms: a paused tenant catches up), cburst from ceil (1 ms: the limit
    # holds), quantum proportional to rate.
    assert a.burst_bytes == 50_000_000 and a.cburst_bytes == 7_500_000
    assert a.quantum_bytes == 2 * b.quantum_bytes


def test_default_route_device_is_shaped_when_interfaces_unset_and_loopback_never():
    p = source_plan()
    assert [d.device for d in p.devices] == ["eth0"]
    cfg = config.load_text("node: {interfaces: ['*']}\n" + SOURCE)
    names = {d.device for d in planner.plan(cfg, INV).devices} | set(planner.plan(cfg, INV).skipped)
    assert "lo" not in names


def test_virtual_device_without_capacity_is_a_problem_naming_the_field():
    inv = Inventory(links=(Link("up0", 3, "veth"),), capabilities=Capabilities())
    p = planner.plan(config.load_text("node: {interfaces: [up0]}\n" + SOURCE), inv)
    assert not p.devices and p.skipped == ("up0",)
    assert "node.capacity" in str(p.problems[0]) and "up0" in str(p.problems[0])


def test_limit_above_link_speed_is_caught_by_the_planner():
    inv = Inventory(links=(Link("eth0", 2, speed_bps=50 * G),), default_route_devices=("eth0",))
    p = planner.plan(config.load_text(SOURCE), inv)
    assert not p.devices
    assert any("tenants[0].bandwidthLimit" in str(x) for x in p.problems)


def test_filters_longest_prefix_first_and_interface_match_before_prefixes():
    dp = source_plan().devices[0]
    kinds = [type(f).__name__ for f in dp.filters]
    assert kinds[0] == "BpfFilter" and dp.filters[0].mapping == ((7, dp.tenant_classes["tenant-a"]),)
    u32 = [f for f in dp.filters if isinstance(f, U32Filter)]
    host = next(f for f in u32 if f.prefix == "198.18.1.7/32")
    net = next(f for f in u32 if f.prefix == "198.18.1.0/24")
    assert host.prio < net.prio and host.classid == dp.tenant_classes["tenant-b"]


def test_ipv6_prefix_keys():
    keys = src_prefix_keys(ipaddress.ip_network("2001:db8:1::/64"))
    assert [(k.value, k.mask, k.offset) for k in keys] == [(0x20010DB8, 0xFFFFFFFF, 8), (0x00010000, 0xFFFFFFFF, 12)]
    assert [k.mask for k in src_prefix_keys(ipaddress.ip_network("2001:db8::/36"))] == [0xFFFFFFFF, 0xF0000000]
    assert src_prefix_keys(ipaddress.ip_network("0.0.0.0/0")) == ()


def test_priority_rank_mapping_ties_and_overflow():
    ts = config.load_text(
        "tenants:\n" + "".join(f"- {{name: t{i}, bandwidthGuarantee: 1Mbps, priority: {p}}}\n"
                               for i, p in enumerate([100, 50, 50, 10, 9, 8, 7, 6, 5, 4]))
    ).tenants
    prios = planner.htb_prios(ts)
    assert prios["t0"] == 0 and prios["t1"] == prios["t2"] == 1 and prios["t3"] == 2
    assert prios["t9"] == prios["t8"] == planner.MAX_TENANT_PRIO  # past the 7th distinct value


def test_class_ids_depend_only_on_the_set_of_names():
    names = [f"tenant-{i}" for i in range(200)]
    a = ids.assign_minors(names)
    shuffled = names[:]
    random.Random(1).shuffle(shuffled)
    assert ids.assign_minors(shuffled) == a
    assert len(set(a.values())) == 200 and HANDLE_MAJOR not in a.values()
    assert all(0x10 <= m <= 0xFFF0 for m in a.values())
    # Adding a tenant moves nobody unless its hash slot collides.
    b = ids.assign_minors(names + ["newcomer"])
    moved = [n for n in names if a[n] != b[n]]
    assert len(moved) <= 1


def observed_from_plan(dp) -> DeviceState:
    """What the kernel would dump after applying dp exactly (the reader's view)."""
    st = DeviceState(dp.device, dp.ifindex, RootQdisc("htb", ROOT_HANDLE, dp.root.default_minor))
    for c in dp.classes:
        f = c.kernel_fields()
        st.classes[c.classid] = ObservedClass(c.classid, *f)
    for q in dp.leaves:
        st.leaves[q.parent] = q
    for i, f in enumerate(dp.filters):
        if isinstance(f, U32Filter):
            st.filters.append(ObservedFilter("u32", f.prio, f.protocol, 0x80000800 + i, ROOT_HANDLE, f.classid, f.keys))
        else:
            st.filters.append(ObservedFilter("bpf", f.prio, 3, 1, ROOT_HANDLE, name=f.name))
    return st


def test_fresh_device_gets_full_tree_and_in_sync_device_gets_nothing():
    dp = source_plan().devices[0]
    fresh = diff_device(dp, DeviceState("eth0", 2, RootQdisc("mq", 0)))
    assert isinstance(fresh.ops[0], ops.CreateRoot)
    assert sum(isinstance(op, ops.CreateClass) for op in fresh.ops) == len(dp.classes)
    assert sum(isinstance(op, (ops.AddU32Filter, ops.AddBpfFilter)) for op in fresh.ops) == len(dp.filters)
    assert diff_device(dp, observed_from_plan(dp)).ops == []


def test_drift_is_repaired_minimally():
    dp = source_plan().devices[0]
    obs = observed_from_plan(dp)
    a = dp.tenant_classes["tenant-a"]
    obs.classes[a] = ObservedClass(a, *((ROOT_HANDLE | 1, 1, 1) + obs.classes[a].kernel_fields()[3:]))
    obs.classes[classid(0x55)] = ObservedClass(classid(0x55), classid(1), 1, 1, 1, 1, 1, 0)
    dropped = obs.filters.pop()
    obs.filters.append(ObservedFilter("u32", 5, 0x0800, 0x80100800, ROOT_HANDLE, classid(2), ()))
    ops = diff_device(dp, obs).ops
    kinds = [(type(op), op.reason.split(":")[0]) for op in ops]
    assert kinds == [
        (ops_mod.DeleteFilterGroup, "stale"), (ops_mod.DeleteClass, "stale"), (ops_mod.ChangeClass, "differs"),
        (ops_mod.AddU32Filter, "missing"),
    ]
    assert ops[-1].filter.keys == dropped.keys


def test_duplicate_filters_are_removed():
    dp = source_plan().devices[0]
    obs = observed_from_plan(dp)
    dup = obs.filters[-1]
    obs.filters.append(ObservedFilter(dup.kind, dup.prio, dup.protocol, dup.handle + 100, ROOT_HANDLE, dup.classid, dup.keys))
    ops = diff_device(dp, obs).ops
    assert [type(op) for op in ops] == [ops_mod.DeleteFilter] and ops[0].filter.handle == dup.handle + 100


def test_foreign_root_is_left_alone_unless_take_over():
    dp = source_plan().devices[0]
    obs = DeviceState("eth0", 2, RootQdisc("tbf", 0x10000))
    d = diff_device(dp, obs)
    assert d.ops == [] and "tbf 1:" in d.blocked and "takeOver" in d.blocked
    assert isinstance(diff_device(dp, obs, take_over=True).ops[0], ops.CreateRoot)
    assert diff_device(dp, DeviceState("eth0", 2, RootQdisc("htb", 0x10000))).blocked


def test_teardown_only_touches_our_root():
    assert diff_teardown(DeviceState("eth0", 2, RootQdisc("fq_codel", 0))).ops == []
    assert [type(op) for op in diff_teardown(DeviceState("eth0", 2, RootQdisc("htb", ROOT_HANDLE))).ops] == [ops.DeleteRoot]


def test_render_golden():
    text = render(source_plan())
    dp = source_plan().devices[0]
    a = f"7368:{dp.tenant_classes['tenant-a'] & 0xFFFF:x}"
    assert "tc qdisc replace dev eth0 root handle 7368: htb default 2" in text
    assert (f"tc class replace dev eth0 parent 7368:1 classid {a} htb rate 40gbit ceil 60gbit "
            "burst 50000000b cburst 7500000b quantum 500000 prio 0") in text
    assert f"tc filter add dev eth0 parent 7368: protocol ipv6 prio 2064 u32 match ip6 src 2001:db8:1::/64 flowid {a}" in text
    assert "# cls_bpf shpd_" in text and "[veth-a1]" in text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 3), st.integers(0, 255)), min_size=1, max_size=12,
                unique_by=lambda t: t[2]))
def test_plan_invariants(specs):
    # Random tenants that fit: guarantees below capacity, each prefix in exactly one class.
    lines = ["node: {capacity: 100Gbps}", "tenants:"]
    for i, (g, p, net) in enumerate(specs):
        lines.append(f"- {{name: t{i}, bandwidthGuarantee: {g}Gbps, priority: {p}, match: {{cidrs: [198.18.{net}.0/24]}}}}")
    try:
        cfg = config.load_text("\n".join(lines))
    except config.ConfigError:
        return  # sum above capacity: rejected, as it must be
    p1 = planner.plan(cfg, INV)
    reversed_cfg = config.Config(cfg.node, tuple(reversed(cfg.tenants)))
    p2 = planner.plan(reversed_cfg, INV)
    dp = p1.devices[0]
    assert render(p1) == render(p2)  # independent of input order
    tenant_classes = [c for c in dp.classes if c.tenant]
    assert sum(c.rate_bps for c in dp.classes[1:]) <= dp.capacity_bps
    assert all(c.rate_bps <= c.ceil_bps <= dp.capacity_bps for c in tenant_classes)
    prefixes = [f.prefix for f in dp.filters if isinstance(f, U32Filter) and f.mark is None]
    assert len(prefixes) == len(set(prefixes)) == len(specs)
    (mark_filter,) = [f for f in dp.filters if getattr(f, "kind", "") == "mark"]
    values = [v for v, _, _ in mark_filter.mapping]
    assert len(values) == len(set(values)) == len(specs)  # one distinct mark per tenant
    assert diff_device(dp, observed_from_plan(dp)).ops == []


def test_capacity_from_link_speed_keeps_framing_headroom():
    dp = source_plan().devices[0]  # eth0 reports 100 Gbit, node.capacity unset
    assert dp.capacity_bps == 98 * G and dp.classes[0].ceil_bps == 98 * G
    cfg = config.load_text("node: {capacity: 100Gbps}\n" + SOURCE)
    assert planner.plan(cfg, INV).devices[0].capacity_bps == 100 * G  # an explicit capacity is taken as given


def test_operations_describe_themselves_and_build_their_errors():
    dp = source_plan().devices[0]
    a = dp.tenant_classes["tenant-a"]
    c = next(c for c in dp.classes if c.classid == a)
    op = ops.CreateClass(device="eth0", ifindex=2, cls=c, reason="missing", tenant="tenant-a")
    assert op.describe() == f"create class 7368:{a & 0xFFFF:x} on eth0 (tenant tenant-a): missing"
    err = op.error("Operation not permitted", 1)
    assert str(err) == f"create class 7368:{a & 0xFFFF:x} on eth0: Operation not permitted"
    assert (err.verb, err.obj, err.device, err.errno) == ("create", f"class 7368:{a & 0xFFFF:x}", "eth0", 1)
    gone = ops.DeleteFilterGroup(device="eth0", ifindex=2, prio=5, protocol=0x0800, reason="stale")
    assert gone.deletes and gone.describe() == "delete filters at prio 5 protocol 0x0800 on eth0: stale"
    assert not op.deletes
