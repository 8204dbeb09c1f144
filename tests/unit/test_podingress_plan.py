"""The pod ingress caps, pure: the plan (who gets a tbf where, how it is sized), the diff (ownership), render.

Pods come as the Kubernetes watcher and discovery hand them over (inventory Pods with their host interface
and raw annotation); the tenancy is the engine's (core/tenancy.py), so the caps are what podcaps parsed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from shaperd.backends.podingress import diff as pdiff
from shaperd.backends.podingress.backend import PodIngressBackend
from shaperd.backends.podingress.objects import (CniEgress, ObservedRoot, PodIngressObserved, ROOT_HANDLE)
from shaperd.backends.podingress.ops import DeletePodTbf, SetPodTbf
from shaperd.backends.podingress.plan import MIN_BURST_BYTES, plan, tbf_for
from shaperd.backends.podingress.render import render
from shaperd.core.config import load_text
from shaperd.core.inventory import Inventory, Link, Pod
from shaperd.core.protocol import PlanInput
from shaperd.core.tenancy import tenancy
from shaperd.kernel.rtnl_rows import QdiscCounters, TbfParams

CFG = """
node: {interfaces: [up0], capacity: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 400Mbps, bandwidthLimit: 800Mbps, match: {namespaces: [team-a]}}
"""
LINKS = (Link("up0", 2, speed_bps=10**9), Link("cali1", 7, kind="veth"), Link("vethb1", 8, kind="veth"),
         Link("cali3", 9, kind="veth"), Link("bwp0123456789ab", 10, kind="ifb"))


def pod(uid, ns, name, ifindex=None, ifname=None, ingress="50M", egress=None, **kw) -> Pod:
    return Pod(uid=uid, namespace=ns, name=name, ips=("198.18.20.2",), host_ifindex=ifindex, host_ifname=ifname,
               ingress_bandwidth=ingress, egress_bandwidth=egress, **kw)


def planned(pods, cfg=CFG, take_over=False, remembered=None):
    c = load_text(cfg)
    inv = Inventory(links=LINKS, default_route_devices=("up0",), pods=tuple(pods))
    return plan(c, inv, tenancy(c, inv), take_over, remembered)


def kernel_tbf(cap_bps: int, **change) -> TbfParams:
    """What the kernel dumps after shaperd's request for ``cap_bps``: the bucket as exact ticks of time."""
    t = tbf_for(cap_bps)
    ticks = round(t.burst_bytes * 1e9 / t.rate_Bps / 64)
    p = TbfParams(rate_Bps=t.rate_Bps, peakrate_Bps=0, limit_bytes=t.limit_bytes, buffer_ticks=ticks, mtu_ticks=0,
                  linklayer=1)
    return p._replace(**change)


def ours(ifindex, cap_bps=50_000_000, **change) -> ObservedRoot:
    return ObservedRoot(ifindex, "tbf", ROOT_HANDLE, kernel_tbf(cap_bps, **change), QdiscCounters(bytes=1000))


# -- sizing ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cap_bps, rate, burst, limit", [
    (50_000_000, 6_250_000, 65_536, 65_536 + 156_250),  # the 50M: the 64 KiB floor rules (10.5 ms)
    (1_500_000, 187_500, 65_536, 65_536 + 4_688),
    (100_000_000, 12_500_000, 65_536, 65_536 + 312_500),
    (1_000_000_000, 125_000_000, 625_000, 625_000 + 3_125_000),  # 5 ms of the rate above ~105 Mbit/s
    (40_000_000_000, 5_000_000_000, 25_000_000, 25_000_000 + 125_000_000),  # above 2^32 bytes/s: RATE64
    (1_001, 125, 34_358, 34_358 + 4),  # the kubelet's 1 kbit/s floor: the bucket is as long as u32 ticks go
])
def test_tbf_sizing(cap_bps, rate, burst, limit):
    t = tbf_for(cap_bps)
    assert (t.rate_Bps, t.burst_bytes, t.limit_bytes) == (rate, burst, limit)


@given(st.integers(min_value=1_000, max_value=10**15))
def test_every_cap_gets_a_bucket_that_takes_a_full_frame_and_fits_the_kernels_fields(cap_bps):
    t = tbf_for(cap_bps)
    assert t.rate_Bps * 8 <= cap_bps  # never above the cap
    assert t.burst_bytes >= 9000 + 14  # a jumbo frame passes (tbf drops a non-GSO packet above its bucket)
    # the 64 KiB floor, where the u32 tick count can say it (below ~2 kbit/s it cannot)
    assert t.burst_bytes >= MIN_BURST_BYTES or t.burst_bytes == t.rate_Bps * 2**32 * 64 // 10**9 - 1
    assert t.limit_bytes >= t.burst_bytes  # the queue takes at least one full bucket
    assert t.burst_bytes * 1e9 / t.rate_Bps / 64 < 2**32 and t.limit_bytes < 2**32  # tc_tbf_qopt's u32 fields


# -- the plan ----------------------------------------------------------------------------------------------

def test_routed_and_bridged_pods_get_a_tbf_on_their_host_interface_and_a_pod_of_no_tenant_too():
    p = planned([pod("u1", "team-a", "web-0", 7, "cali1"), pod("u2", "team-b", "loader-0", 8, "vethb1", "1.5M")])
    assert [(x.ifname, x.ref, x.tenant, x.cap_bps, x.tbf) for x in p.pods] == [
        ("cali1", "team-a/web-0", "tenant-a", 50_000_000, tbf_for(50_000_000)),
        ("vethb1", "team-b/loader-0", None, 1_500_000, tbf_for(1_500_000))]
    assert p.warnings == ()


def test_an_egress_only_annotation_plans_no_ingress_cap():
    assert planned([pod("u1", "team-a", "web-0", 7, "cali1", ingress=None, egress="100M")]).pods == ()


def test_a_host_network_pod_gets_a_warning_that_names_it():
    p = planned([pod("u1", "team-a", "agent-0", host_network=True)])
    assert p.pods == ()
    assert p.warnings == ("pod team-a/agent-0: kubernetes.io/ingress-bandwidth=50M is not enforced: a hostNetwork "
                          "pod has no interface of its own (what it receives is the node's traffic)",)


def test_a_pod_without_a_host_interface_yet_waits_and_keeps_what_it_had():
    waiting = pod("u1", "team-a", "web-0", problems=("198.18.20.2 is behind bridge cni0 but its port is not known yet",))
    p = planned([waiting])
    assert p.pods == () and p.held == ()
    assert p.warnings == ("pod team-a/web-0: kubernetes.io/ingress-bandwidth=50M waits for the pod's host interface "
                          "(198.18.20.2 is behind bridge cni0 but its port is not known yet); retried next reconcile",)
    # Planned on cali1 last time: cali1 is held (its tbf neither changed nor removed) until the pod resolves.
    p = planned([waiting], remembered={"u1": (7, "cali1")})
    assert [(h.ifindex, h.ifname, h.ref) for h in p.held] == [(7, "cali1", "team-a/web-0")]
    td = pdiff.diff(p, PodIngressObserved(roots={7: ours(7)}, names={7: "cali1"}))
    assert td == []


def test_pods_sharing_an_interface_and_a_pod_on_an_uplink_are_not_capped():
    p = planned([pod("u1", "team-a", "a", 9, "cali3"), pod("u2", "team-a", "b", 9, "cali3", "20M"),
                 pod("u3", "team-a", "c", 2, "up0")])
    assert p.pods == ()
    assert p.warnings == (
        "pod team-a/c: kubernetes.io/ingress-bandwidth=50M is not enforced: its host interface up0 is a shaped uplink",
        "pods team-a/a, team-a/b share host interface cali3: a cap there would cap them together; none of their "
        "ingress caps is enforced")


def test_a_refused_value_plans_nothing_and_take_over_comes_from_the_file_or_the_flag():
    assert planned([pod("u1", "team-a", "web-0", 7, "cali1", ingress="fast")]).pods == ()
    assert planned([pod("u1", "team-a", "web-0", 7, "cali1")], take_over=True).take_over
    assert planned([pod("u1", "team-a", "web-0", 7, "cali1")], cfg=CFG.replace("capacity: 1Gbps",
                                                                             "capacity: 1Gbps, takeOver: true")).take_over


# -- the diff -------------------------------------------------------------------------------------------------

def _one(p, observed):
    (td,) = pdiff.diff(p, observed)
    return td


def test_a_default_root_is_replaced_and_the_kernels_read_back_is_in_sync():
    p = planned([pod("u1", "team-a", "web-0", 7, "cali1")])
    td = _one(p, PodIngressObserved(roots={7: ObservedRoot(7, "noqueue", 0)}, names={7: "cali1"}))
    (op,) = td.ops
    assert isinstance(op, SetPodTbf) and (op.device, op.ifindex, op.tenant) == ("cali1", 7, "tenant-a")
    assert op.describe() == ("set tbf 7368: rate 50Mbps burst 65536b limit 221786b (ingress cap of pod team-a/web-0) "
                             "on cali1 (tenant tenant-a): replacing default root qdisc noqueue")
    # Read back as the kernel keeps it: nothing more to do (a second reconcile sends no write).
    assert pdiff.diff(p, PodIngressObserved(roots={7: ours(7)}, names={7: "cali1"})) == []


def test_a_changed_cap_is_changed_in_place():
    p = planned([pod("u1", "team-a", "web-0", 7, "cali1", "200M")])
    (op,) = _one(p, PodIngressObserved(roots={7: ours(7)}, names={7: "cali1"})).ops
    assert isinstance(op, SetPodTbf) and op.pod.tbf == tbf_for(200_000_000)
    assert op.reason == "was rate 50Mbps burst 65536b limit 221786b"
    for change in ({"limit_bytes": 1}, {"buffer_ticks": 1}, {"peakrate_Bps": 1}):
        assert _one(planned([pod("u1", "team-a", "web-0", 7, "cali1")]),
                    PodIngressObserved(roots={7: ours(7, **change)}, names={7: "cali1"})).ops


def test_a_removed_cap_or_a_gone_pod_removes_shaperds_tbf_and_nothing_else():
    p = planned([pod("u1", "team-a", "web-0", 7, "cali1", ingress=None)])
    observed = PodIngressObserved(roots={7: ours(7), 8: ObservedRoot(8, "tbf", 0x10000), 2: ObservedRoot(2, "htb", ROOT_HANDLE)},
                                  names={7: "cali1", 8: "vethb1", 2: "up0"})
    (td,) = pdiff.diff(p, observed)
    assert td.target == "cali1" and [type(o) for o in td.ops] == [DeletePodTbf]
    assert td.ops[0].describe() == "delete tbf 7368: (a pod's ingress cap) on cali1: no capped pod on it any more"


def test_a_foreign_root_is_left_alone_with_the_reason_unless_take_over():
    foreign = ObservedRoot(7, "tbf", 0x10000)
    p = planned([pod("u1", "team-a", "web-0", 7, "cali1")])
    td = _one(p, PodIngressObserved(roots={7: foreign}, names={7: "cali1"}))
    assert td.ops == [] and td.blocked == ("pod team-a/web-0: root qdisc tbf 1: is not shaperd's; left alone, its "
                                           "ingress cap 50Mbps is not enforced (set node.takeOver or pass "
                                           "--take-over to replace it)")
    p = planned([pod("u1", "team-a", "web-0", 7, "cali1")], take_over=True)
    (op,) = _one(p, PodIngressObserved(roots={7: foreign}, names={7: "cali1"})).ops
    assert isinstance(op, SetPodTbf) and op.reason == "taking over root qdisc tbf 1: (take-over requested)"


def test_the_cni_plugins_ingress_qdisc_is_said_with_its_ifb_and_never_touched():
    p = planned([pod("u1", "team-a", "web-0", 7, "cali1")])
    cni = CniEgress(7, ("bwp0123456789ab",))
    td = _one(p, PodIngressObserved(roots={7: ours(7)}, ingress={7: cni}, names={7: "cali1"}))
    assert td.ops == [] and td.blocked is None
    assert td.note == ("pod team-a/web-0: cali1 has an ingress qdisc redirecting to bwp0123456789ab (the CNI bandwidth "
                       "plugin's shaping of what the pod sends); left alone. It holds the ingress hook shaperd's "
                       "mark program needs (no clsact can be added): the pod is recognised by its addresses only")


def test_teardown_removes_only_shaperds_tbf_and_an_unreadable_node_is_an_error():
    observed = PodIngressObserved(roots={7: ours(7), 8: ObservedRoot(8, "tbf", 0x10000), 9: ObservedRoot(9, "noqueue", 0),
                                         2: ObservedRoot(2, "htb", ROOT_HANDLE)}, names={7: "cali1"})
    assert [(td.target, [type(o) for o in td.ops]) for td in pdiff.teardown(observed)] == [("cali1", [DeletePodTbf])]
    bad = PodIngressObserved(error="dump qdiscs on node: Operation not permitted")
    assert [(td.target, td.error) for td in pdiff.teardown(bad)] == [("(pod interfaces)", bad.error)]
    assert [(td.target, td.error) for td in pdiff.diff(planned([]), bad)] == [("(pod interfaces)", bad.error)]


def test_the_backend_remembers_where_a_pod_was_across_an_unresolved_reconcile():
    c = load_text(CFG)
    b = PodIngressBackend(None)

    def ctx(*pods):
        inv = Inventory(links=LINKS, default_route_devices=("up0",), pods=pods)
        return PlanInput(c, inv, tenancy(c, inv))

    b.plan(ctx(pod("u1", "team-a", "web-0", 7, "cali1")))
    lost = b.plan(ctx(pod("u1", "team-a", "web-0", problems=("no pod IP yet",))))
    assert [h.ifname for h in lost.held] == ["cali1"]
    assert [h.ifname for h in b.plan(ctx(pod("u1", "team-a", "web-0", problems=("no pod IP yet",)))).held] == ["cali1"]
    b.plan(ctx())  # the pod is gone: forgotten
    assert b.plan(ctx(pod("u1", "team-a", "web-0", problems=("no pod IP yet",)))).held == ()


def test_render_is_the_tc_command_that_sends_the_same_bytes():
    p = planned([pod("u1", "team-a", "web-0", 7, "cali1")])
    assert render(p) == ("# pod ingress caps (kubernetes.io/ingress-bandwidth): tbf at the root of each pod's host "
                         "interface\n# pod team-a/web-0 (tenant tenant-a): 50000000 bit/s\n"
                         "tc qdisc replace dev cali1 root handle 7368: tbf rate 50000000bit burst 65536 limit 221786\n")
    assert render(planned([])) == ""


def test_a_restarted_backend_holds_what_its_predecessor_recorded_for_a_pod_not_resolved_yet(tmp_path):
    from shaperd.backends.podingress import labels

    c = load_text(CFG)
    record = tmp_path / "podingress-host.json"
    first = PodIngressBackend(None, record=record)
    inv = Inventory(links=LINKS, default_route_devices=("up0",), pods=(pod("u1", "team-a", "web-0", 7, "cali1"),))
    labels.write(record, labels.rows(first.plan(PlanInput(c, inv, tenancy(c, inv)))))
    again = PodIngressBackend(None, record=record)  # the agent restarted; the pod's IP is not back yet
    inv = Inventory(links=LINKS, default_route_devices=("up0",),
                    pods=(pod("u1", "team-a", "web-0", problems=("no pod IP yet",)),))
    p = again.plan(PlanInput(c, inv, tenancy(c, inv)))
    assert [(h.ifindex, h.ifname) for h in p.held] == [(7, "cali1")]
    assert again.diff(p, PodIngressObserved(roots={7: ours(7)}, names={7: "cali1"})) == []
    record.write_text("not json")
    assert PodIngressBackend(None, record=record).plan(PlanInput(c, inv, tenancy(c, inv))).held == ()
