"""The tenant-ingress planner: the IFB's name, its tree, classification on the destination, admission."""

from __future__ import annotations

import ipaddress

from hypothesis import given, strategies as st

from shaperd.backends.common import mapcls
from shaperd.backends.common.objects import ETH_P_IP, ETH_P_IPV6, U32Key
from shaperd.backends.ingress import plan as planner
from shaperd.backends.ingress.objects import (
    INGRESS_DEFAULT_CLASS, INGRESS_ROOT, INGRESS_ROOT_CLASS, ingress_classid,
)
from shaperd.backends.ingress.render import render
from shaperd.core import config
from shaperd.core.ids import IFNAME_MAX, assign_minors, ifb_name, is_ifb_name
from shaperd.core.inventory import Capabilities, Inventory, Link, Pod
from shaperd.core.tenancy import tenancy

M, G = 10**6, 10**9
SOURCE = """
node: {interfaces: [eth0, eth1], capacity: 1Gbps}
tenants:
  - name: tenant-a
    bandwidthGuarantee: 100Mbps
    priority: 100
    match: {cidrs: [198.18.1.0/24, "2001:db8:1::/64"], namespaces: [team-a]}
    ingress: {bandwidthGuarantee: 200Mbps, bandwidthLimit: 400Mbps}
  - name: tenant-b
    bandwidthGuarantee: 100Mbps
    priority: 50
    match: {cidrs: [198.18.2.0/24]}
    ingress: {bandwidthLimit: 150Mbps}
  - name: tenant-c
    bandwidthGuarantee: 100Mbps
    priority: 10
    match: {cidrs: [198.18.3.0/24]}
"""


def pod(uid, ns, ips, host=False):
    return Pod(uid=uid, namespace=ns, name=uid, ips=tuple(ips), host_network=host)


def inv(bpf_maps=True, pods=(), links=None) -> Inventory:
    links = links or (Link("eth0", 2), Link("eth1", 3), Link("lo", 1))
    return Inventory(links=tuple(links), capabilities=Capabilities(bpf=bpf_maps, bpf_maps=bpf_maps), pods=tuple(pods))


def make(text=SOURCE, **kw):
    cfg = config.load_text(text)
    i = inv(**kw)
    return cfg, planner.plan(cfg, i, tenancy(cfg, i))


def test_ifb_names_derive_from_the_uplink_and_fit_the_kernels_limit():
    assert ifb_name("eth0") == "shpi-eth0" and is_ifb_name("shpi-eth0") and not is_ifb_name("eth0")
    assert ifb_name("abcdefghij") == "shpi-abcdefghij"  # 15 characters: still the name itself
    long = ifb_name("enp175s0f0np0")
    assert len(long) == IFNAME_MAX and long.startswith("shpi-enp1") and long == ifb_name("enp175s0f0np0")
    assert ifb_name("enp175s0f0np0") != ifb_name("enp175s0f0np1")  # the hash tells long names apart


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-_", min_size=1, max_size=15))
def test_every_uplink_name_gives_a_valid_stable_ifb_name(name):
    n = ifb_name(name)
    assert 0 < len(n) <= IFNAME_MAX and is_ifb_name(n) and n == ifb_name(name)


def test_no_ingress_block_no_plan():
    _, p = make(SOURCE.replace("    ingress: {bandwidthGuarantee: 200Mbps, bandwidthLimit: 400Mbps}\n", "")
                .replace("    ingress: {bandwidthLimit: 150Mbps}\n", ""))
    assert p.devices == () and p.problems == ()


def test_one_ifb_per_shaped_uplink_with_a_class_per_tenant_with_an_ingress_block():
    cfg, p = make()
    assert [(d.uplink, d.ifb) for d in p.devices] == [("eth0", "shpi-eth0"), ("eth1", "shpi-eth1")]
    dp = p.devices[0]
    assert dp.root.handle == INGRESS_ROOT and dp.root.default_minor == 2
    minors = assign_minors([t.name for t in cfg.tenants])  # the egress minors (none hits 0x7369 here)
    a, b = ingress_classid(minors["tenant-a"]), ingress_classid(minors["tenant-b"])
    by = {c.classid: c for c in dp.classes}
    assert set(by) == {INGRESS_ROOT_CLASS, INGRESS_DEFAULT_CLASS, a, b}  # tenant-c has no ingress block
    assert (by[INGRESS_ROOT_CLASS].rate_bps, by[INGRESS_ROOT_CLASS].ceil_bps) == (G, G)
    assert (by[a].rate_bps, by[a].ceil_bps, by[a].prio) == (200 * M, 400 * M, 0)
    # No guarantee: HTB's least rate; the limit as ceil; prio by rank of the priority, as on egress.
    assert (by[b].rate_bps, by[b].ceil_bps, by[b].prio) == (planner.MIN_RATE_BPS, 150 * M, 1)
    # The default class: the capacity less the ingress guarantees, borrowing last.
    assert (by[INGRESS_DEFAULT_CLASS].rate_bps, by[INGRESS_DEFAULT_CLASS].ceil_bps) == (800 * M, G)
    assert by[INGRESS_DEFAULT_CLASS].prio == planner.DEFAULT_CLASS_PRIO
    assert all(c.parent == INGRESS_ROOT_CLASS for c in dp.classes if c.classid != INGRESS_ROOT_CLASS)
    assert {q.parent for q in dp.leaves} == {INGRESS_DEFAULT_CLASS, a, b}
    assert [(t.tenant, t.guarantee_bps, t.limit_bps) for t in sorted(dp.tenants, key=lambda t: t.tenant)] == [
        ("tenant-a", 200 * M, 400 * M), ("tenant-b", None, 150 * M)]


def test_the_least_rate_fits_htbs_buffer():
    from shaperd.core.units import xmit_ticks

    c = planner.htb_class(planner.IngressSettings(), 1, 0, planner.MIN_RATE_BPS, G, 0, 1500, None)
    assert xmit_ticks(c.burst_bytes, c.rate_bps) < 2**32


def test_default_class_keeps_at_least_the_reserve():
    text = SOURCE.replace("bandwidthGuarantee: 200Mbps, bandwidthLimit: 400Mbps", "bandwidthGuarantee: 990Mbps")
    _, p = make(text)
    by = {c.classid: c for c in p.devices[0].classes}
    assert by[INGRESS_DEFAULT_CLASS].rate_bps == 10 * M  # 1 % of 1 Gbit/s: the default reserve


def test_classification_is_keyed_on_the_destination_pods_and_prefixes_ebpf_path():
    pods = [pod("p1", "team-a", ["198.18.9.5", "2001:db8:9::5"]), pod("p2", "team-a", ["198.18.9.6"], host=True),
            pod("p3", "other", ["198.18.9.7"])]
    cfg, p = make(pods=pods)
    dp = p.devices[0]
    mc = dp.map_classifier
    assert dp.classifier_path == "ebpf" and dp.filters == () and mc.key == "dst"
    assert mc.name == mapcls.dst_program_name() and mapcls.is_ours_dst(mc.name) and not mapcls.is_ours(mc.name)
    a = next(t.classid for t in dp.tenants if t.tenant == "tenant-a")
    b = next(t.classid for t in dp.tenants if t.tenant == "tenant-b")
    n = ipaddress.ip_network
    assert set(mc.entries) == {"src4", "src6"}  # the variant's maps: the address tries only
    assert mc.entries["src4"] == {mapcls.src_key(n("198.18.1.0/24")): mapcls.value(a),
                                  mapcls.src_key(n("198.18.9.5/32")): mapcls.value(a),
                                  mapcls.src_key(n("198.18.2.0/24")): mapcls.value(b)}
    assert mc.entries["src6"] == {mapcls.src_key(n("2001:db8:1::/64")): mapcls.value(a),
                                  mapcls.src_key(n("2001:db8:9::5/128")): mapcls.value(a)}
    # tenant-c (no ingress block), the hostNetwork pod and the pod of no tenant: the default class.
    assert all(int.from_bytes(v, "little") != 0 for v in mc.entries["src4"].values())
    assert any("hostNetwork" in w and "team-a/p2" in w for w in p.warnings)
    assert next(t.destinations for t in dp.tenants if t.tenant == "tenant-a") == 4


def test_u32_path_destination_filters_on_the_ifb_root_longest_prefix_first():
    cfg, p = make(bpf_maps=False, pods=[pod("p1", "team-a", ["198.18.9.5"])])
    dp = p.devices[0]
    assert dp.classifier_path == "u32" and dp.map_classifier is None
    a = next(t.classid for t in dp.tenants if t.tenant == "tenant-a")
    got = [(f.prefix, f.prio, f.protocol, f.parent, f.classid, f.keys) for f in dp.filters]
    assert got[0] == ("dst 198.18.9.5/32", 1000, ETH_P_IP, INGRESS_ROOT, a, (U32Key(0xC6120905, 0xFFFFFFFF, 16),))
    assert ("dst 198.18.1.0/24", 1008, ETH_P_IP, INGRESS_ROOT, a, (U32Key(0xC6120100, 0xFFFFFF00, 16),)) in got
    v6 = next(g for g in got if g[2] == ETH_P_IPV6)
    assert v6[0] == "dst 2001:db8:1::/64" and all(k.offset in (24, 28) for k in v6[5])
    assert [g[1] for g in got] == sorted(g[1] for g in got)


def test_a_configured_prefix_wins_over_a_pod_address_of_the_same_length():
    text = SOURCE.replace("cidrs: [198.18.2.0/24]", "cidrs: [198.18.2.0/24, 198.18.9.5/32]")
    _, p = make(text, pods=[pod("p1", "team-a", ["198.18.9.5"])])
    dp = p.devices[0]
    b = next(t.classid for t in dp.tenants if t.tenant == "tenant-b")
    key = mapcls.src_key(ipaddress.ip_network("198.18.9.5/32"))
    assert dp.map_classifier.entries["src4"][key] == mapcls.value(b)


SPEEDS = SOURCE.replace("node: {interfaces: [eth0, eth1], capacity: 1Gbps}", "node: {interfaces: [eth0, eth1]}") \
    .replace("bandwidthGuarantee: 100Mbps", "bandwidthGuarantee: 10Mbps")
TWO_SPEEDS = (Link("eth0", 2, speed_bps=10 * G), Link("eth1", 3, speed_bps=G))  # 9.8 and 0.98 Gbit/s usable


def test_admission_a_limit_above_the_capacity_skips_that_uplink_only():
    cfg = config.load_text(SPEEDS.replace("bandwidthLimit: 150Mbps", "bandwidthLimit: 2Gbps"))
    i = inv(links=TWO_SPEEDS)
    p = planner.plan(cfg, i, tenancy(cfg, i))
    assert [d.uplink for d in p.devices] == ["eth0"] and p.skipped == ("eth1",)
    (pr,) = p.problems
    assert pr.path == "tenants[1].ingress.bandwidthLimit"
    assert "above capacity" in pr.message and "(device eth1, ingress)" in pr.message


def test_admission_guarantees_plus_reserve_above_capacity_per_uplink():
    cfg = config.load_text(SPEEDS.replace("bandwidthGuarantee: 200Mbps, bandwidthLimit: 400Mbps",
                                          "bandwidthGuarantee: 975Mbps"))
    i = inv(links=TWO_SPEEDS)
    p = planner.plan(cfg, i, tenancy(cfg, i))
    # eth0 admits 975 Mbit/s of ingress guarantees; eth1 (980 Mbit/s usable, 1 % reserve) does not.
    assert [d.uplink for d in p.devices] == ["eth0"] and p.skipped == ("eth1",)
    (pr,) = p.problems
    assert pr.path == "tenants[].ingress.bandwidthGuarantee" and "ingress guarantees" in pr.message
    assert "device eth1" in pr.message
    # The same guarantees fit where node.reserve leaves room for them.
    cfg2 = config.load_text(SPEEDS.replace("bandwidthGuarantee: 200Mbps, bandwidthLimit: 400Mbps",
                                           "bandwidthGuarantee: 975Mbps").replace(
        "node: {interfaces: [eth0, eth1]}", "node: {interfaces: [eth0, eth1], reserve: 5Mbps}"))
    p2 = planner.plan(cfg2, i, tenancy(cfg2, i))
    assert p2.problems == () and len(p2.devices) == 2


def test_no_capacity_is_a_problem_naming_node_capacity():
    text = SOURCE.replace("node: {interfaces: [eth0, eth1], capacity: 1Gbps}", "node: {interfaces: [eth0]}")
    cfg = config.load_text(text)
    i = inv(links=(Link("eth0", 2, kind="veth"),))
    p = planner.plan(cfg, i, tenancy(cfg, i))
    assert p.devices == () and p.skipped == ("eth0",) and p.problems[0].path == "node.capacity"


def test_an_ifb_of_shaperds_is_never_an_uplink_even_under_a_glob():
    text = SOURCE.replace("interfaces: [eth0, eth1]", "interfaces: ['*']")
    links = (Link("eth0", 2), Link("shpi-eth0", 9, kind="ifb"), Link("ifb0", 10, kind="ifb"), Link("lo", 1))
    cfg = config.load_text(text)
    i = inv(links=links)
    ten = tenancy(cfg, i)
    assert "shpi-eth0" not in ten.uplink_names and {"eth0", "ifb0"} <= ten.uplink_names
    assert "shpi-eth0" not in {d.uplink for d in planner.plan(cfg, i, ten).devices}


def test_plan_is_independent_of_tenant_and_pod_order():
    pods = [pod("p1", "team-a", ["198.18.9.5"]), pod("p2", "team-a", ["198.18.9.6", "2001:db8:9::6"])]
    cfg, p = make(pods=pods)
    lines = SOURCE.split("  - name: ")
    text_rev = lines[0] + "".join("  - name: " + x for x in reversed(lines[1:]))
    cfg2 = config.load_text(text_rev)
    i2 = inv(pods=list(reversed(pods)))
    p2 = planner.plan(cfg2, i2, tenancy(cfg2, i2))
    assert p2.devices == p.devices
    assert p2.devices[0].map_classifier.entries == p.devices[0].map_classifier.entries


def test_render_says_what_tc_and_ip_would_do():
    _, p = make(bpf_maps=False)
    text = render(p)
    assert "ip link add name shpi-eth0 up type ifb" in text
    assert "tc qdisc replace dev shpi-eth0 root handle 7369: htb default 2" in text
    assert ("tc filter add dev eth0 ingress prio 29545 protocol all u32 match u32 0 0 action mirred egress "
            "redirect dev shpi-eth0") in text
    assert "tc filter add dev shpi-eth0 parent 7369: protocol ip prio 1008 u32 match ip dst 198.18.1.0/24" in text
    _, pe = make()
    assert "destination-keyed" in render(pe) and "map src4: dst 198.18.1.0/24" in render(pe)
