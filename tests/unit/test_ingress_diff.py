"""The tenant-ingress diff: order of a fresh build, nothing when in sync, minimal repairs, ownership, removal, teardown."""

from __future__ import annotations

import dataclasses

import pytest

from shaperd.backends.common import mapcls
from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.common.objects import ObservedClass, ObservedFilter, RootQdisc
from shaperd.backends.ingress import diff as differ
from shaperd.backends.ingress import ops
from shaperd.backends.ingress.backend import IngressBackend, owns_filter
from shaperd.backends.ingress.objects import (
    INGRESS_ROOT, PRIO_REDIRECT, IfbState, IngressObserved, IngressPlan, Redirect, UplinkState,
)
from shaperd.kernel.rtnl_rows import FilterRow

from .test_ingress_plan import make, pod

IFB_IDX = {"shpi-eth0": 20, "shpi-eth1": 21}


def observed_ifb(dp, ifindex: int, prog_id: int = 77) -> IfbState:
    """What the kernel holds once ``dp`` is applied (as the reader decodes it)."""
    st = IfbState(dp.ifb, ifindex, up=True, root=RootQdisc("htb", INGRESS_ROOT, dp.root.default_minor),
                  clsact=dp.map_classifier is not None)
    for c in dp.classes:
        st.classes[c.classid] = ObservedClass(c.classid, *c.kernel_fields(), leaf_handle=0)
    st.leaves = {q.parent: q for q in dp.leaves}
    st.filters = [ObservedFilter("u32", f.prio, f.protocol, 0x800000 + i, INGRESS_ROOT, f.classid, f.keys)
                  for i, f in enumerate(dp.filters, start=1)]
    mc = dp.map_classifier
    if mc is not None:
        st.map_classifier = mapcls.ObservedMapClassifier(mc.name, prog_id, mapcls.HANDLE_DST_CLASSIFY,
                                                         mapcls.PRIO_DST_CLASSIFY, {r: dict(e) for r, e in mc.entries.items()})
    return st


def in_sync(p: IngressPlan) -> IngressObserved:
    obs = IngressObserved()
    for dp in p.devices:
        idx = IFB_IDX[dp.ifb]
        obs.ifbs[dp.ifb] = observed_ifb(dp, idx)
        obs.uplinks[dp.uplink] = UplinkState(dp.uplink, dp.uplink_ifindex, clsact=True,
                                             redirects=[Redirect(PRIO_REDIRECT, 3, 0x800800, ((0, 0, 0),), (1, idx))])
    return obs


@pytest.fixture(params=[True, False], ids=["ebpf", "u32"])
def plan(request):
    return make(bpf_maps=request.param, pods=[pod("p1", "team-a", ["198.18.9.5", "2001:db8:9::5"])])[1]


def kinds(td) -> list[str]:
    return [type(op).__name__ for op in td.ops]


def test_fresh_uplink_builds_the_ifb_its_tree_and_the_redirect_last(plan):
    tds = differ.diff(plan, IngressObserved())
    assert [td.target for td in tds] == ["shpi-eth0", "shpi-eth1"]
    td = tds[0]
    names = kinds(td)
    assert names[0] == "CreateIfb" and names[1] == "CreateRoot"
    assert names[-2:] == ["AddClsact", "AddRedirect"]
    n_classes = len(plan.devices[0].classes)
    assert names.count("CreateClass") == n_classes and names.count("SetLeaf") == n_classes - 1
    if plan.devices[0].map_classifier is not None:
        assert "AttachMapClassifier" in names and "AddDstFilter" not in names
    else:
        assert names.count("AddDstFilter") == len(plan.devices[0].filters) and "AttachMapClassifier" not in names
    # The IFB is not there yet: its ops wait for its ifindex (0), and so does the redirect's target.
    ifb_ops = [op for op in td.ops if op.device == "shpi-eth0"]
    assert all(op.ifindex == 0 for op in ifb_ops)
    red = td.ops[-1]
    assert (red.device, red.ifindex, red.ifb, red.ifb_ifindex) == ("eth0", 2, "shpi-eth0", 0)


def test_in_sync_node_gets_no_operation(plan):
    tds = differ.diff(plan, in_sync(plan))
    assert [td.ops for td in tds] == [[], []] and not any(td.blocked or td.error for td in tds)


def test_a_changed_limit_is_one_class_change(plan):
    obs = in_sync(plan)
    dp = plan.devices[0]
    tenant = next(c for c in dp.classes if c.tenant == "tenant-b")
    have = obs.ifbs["shpi-eth0"].classes[tenant.classid]
    obs.ifbs["shpi-eth0"].classes[tenant.classid] = dataclasses.replace(have, ceil_Bps=have.ceil_Bps * 2)
    td = differ.diff(plan, obs)[0]
    assert kinds(td) == ["ChangeClass"] and td.ops[0].cls == tenant and "ceil" in td.ops[0].reason


def test_a_down_ifb_is_set_up_first(plan):
    obs = in_sync(plan)
    obs.ifbs["shpi-eth0"].up = False
    assert kinds(differ.diff(plan, obs)[0]) == ["SetIfbUp"]


def test_a_foreign_root_on_the_ifb_is_replaced_and_the_tree_built(plan):
    obs = in_sync(plan)
    st = obs.ifbs["shpi-eth0"]
    obs.ifbs["shpi-eth0"] = IfbState(st.name, st.ifindex, True, RootQdisc("pfifo_fast", 0))
    td = differ.diff(plan, obs)[0]
    assert kinds(td)[0] == "CreateRoot" and all(op.ifindex == st.ifindex for op in td.ops if op.device == st.name)
    assert "AddRedirect" not in kinds(td)  # the redirect is right already


def test_a_redirect_to_an_older_ifb_is_replaced(plan):
    obs = in_sync(plan)
    obs.uplinks["eth0"].redirects = [Redirect(PRIO_REDIRECT, 3, 0x800800, ((0, 0, 0),), (1, 99))]
    td = differ.diff(plan, obs)[0]
    assert kinds(td) == ["DeleteRedirect", "AddRedirect"]
    assert td.ops[1].ifb_ifindex == IFB_IDX["shpi-eth0"] and "ifindex 99" in td.ops[0].reason
    obs.uplinks["eth0"].redirects = []
    obs.uplinks["eth0"].clsact = False
    assert kinds(differ.diff(plan, obs)[0]) == ["AddClsact", "AddRedirect"]


def test_a_device_with_the_ifbs_name_that_is_not_an_ifb_is_left_alone(plan):
    obs = IngressObserved(squatters={"shpi-eth0": "veth"})
    td = differ.diff(plan, obs)[0]
    assert td.ops == [] and "veth" in td.blocked and "not shaperd's" in td.blocked


def test_a_classic_ingress_qdisc_on_the_uplink_blocks_it(plan):
    obs = in_sync(plan)
    obs.uplinks["eth0"] = UplinkState("eth0", 2, ingress_qdisc=True)
    td = differ.diff(plan, obs)[0]
    assert td.ops == [] and "ingress qdisc" in td.blocked


def test_no_ingress_block_left_removes_the_redirect_first_then_the_ifb(plan):
    obs = in_sync(plan)
    tds = differ.diff(IngressPlan(), obs)
    assert [(td.target, kinds(td)) for td in tds] == [("shpi-eth0", ["DeleteRedirect", "DeleteIfb"]),
                                                      ("shpi-eth1", ["DeleteRedirect", "DeleteIfb"])]
    assert tds[0].ops[0].device == "eth0" and tds[0].ops[1].ifindex == IFB_IDX["shpi-eth0"]


def test_an_uplink_that_failed_to_plan_keeps_its_ifb(plan):
    obs = in_sync(plan)
    kept = IngressPlan(devices=plan.devices[:1], skipped=("eth1",))
    assert [td.ops for td in differ.diff(kept, obs)] == [[]]


def test_a_dangling_redirect_without_its_ifb_is_removed():
    obs = IngressObserved(uplinks={"eth3": UplinkState("eth3", 5, clsact=True,
                                                        redirects=[Redirect(PRIO_REDIRECT, 3, 1, (), (1, 0))])})
    (td,) = differ.diff(IngressPlan(), obs)
    assert (td.target, kinds(td)) == ("eth3", ["DeleteRedirect"])


def test_stale_u32_filters_go_and_missing_ones_come():
    _, p = make(bpf_maps=False, pods=[pod("p1", "team-a", ["198.18.9.5"])])
    obs = in_sync(p)
    st = obs.ifbs["shpi-eth0"]
    first = st.filters[0]
    st.filters.append(first._replace(handle=0x800fff))  # a duplicate: the first by handle is kept
    missing = st.filters.pop(1)
    st.filters.append(first._replace(handle=0x800ffe, classid=0x73690002))  # towards another class: stale
    td = differ.diff(p, obs)[0]
    assert kinds(td) == ["DeleteFilter", "DeleteFilter", "AddDstFilter"]
    assert {op.filter.handle for op in td.ops[:2]} == {0x800fff, 0x800ffe}
    assert (td.ops[2].filter.prio, td.ops[2].filter.keys) == (missing.prio, missing.keys)


def test_switching_classifier_path_detaches_the_map_classifier():
    _, ebpf = make(bpf_maps=True)
    _, u32 = make(bpf_maps=False)
    td = differ.diff(u32, in_sync(ebpf))[0]
    names = kinds(td)
    assert "DetachMapClassifier" in names and names.count("AddDstFilter") == len(u32.devices[0].filters)
    det = next(op for op in td.ops if isinstance(op, mapcls.DetachMapClassifier))
    assert (det.prio, det.handle) == (mapcls.PRIO_DST_CLASSIFY, mapcls.HANDLE_DST_CLASSIFY)


def test_a_new_pod_address_is_one_map_write():
    _, p = make(pods=[pod("p1", "team-a", ["198.18.9.5"])])
    _, p2 = make(pods=[pod("p1", "team-a", ["198.18.9.5"]), pod("p2", "team-a", ["198.18.9.6"])])
    td = differ.diff(p2, in_sync(p))[0]
    assert kinds(td) == ["UpdateClassifierMap"]
    op = td.ops[0]
    assert (op.role, len(op.upserts), op.deletes, op.key) == ("src4", 1, (), "dst")


def test_teardown_removes_shaperds_and_says_what_it_leaves():
    _, p = make()
    obs = in_sync(p)
    obs.foreign_ifbs = ("bwp1234",)
    obs.squatters = {"shpi-eth9": "veth"}
    obs.pin_entries = ["shpi-eth0"]
    tds = differ.teardown(obs)
    byt = {td.target: td for td in tds}
    assert kinds(byt["shpi-eth0"]) == ["DeleteRedirect", "DeleteIfb"]
    assert kinds(byt["shpi-eth0 (bpffs pins)"]) == ["UnpinMapClassifier"]
    assert "not shaperd's" in byt["bwp1234"].note and not byt["bwp1234"].ops
    assert "veth" in byt["shpi-eth9"].note and not byt["shpi-eth9"].ops


def test_teardown_of_an_unreadable_device_fails_on_it():
    obs = IngressObserved(errors={"eth0": "read filters on eth0: Operation not permitted"})
    (td,) = differ.teardown(obs)
    assert td.target == "eth0" and "not permitted" in td.error


def test_the_backend_owns_only_its_redirect_on_a_shared_clsact():
    ours = FilterRow(2, 0xFFFFFFF2, PRIO_REDIRECT, 3, 0x800800, "u32")
    assert owns_filter(ours) and IngressBackend(None).owns_clsact_filter(ours)
    assert not owns_filter(ours._replace(prio=1)) and not owns_filter(ours._replace(parent=0xFFFFFFF3))
    assert not owns_filter(ours._replace(kind="bpf"))
    # The IFB's own classifier is never claimed: the IFB's clsact goes with the IFB.
    cls = FilterRow(20, 0xFFFFFFF3, mapcls.PRIO_DST_CLASSIFY, 3, mapcls.HANDLE_DST_CLASSIFY, "bpf",
                    name=mapcls.dst_program_name())
    assert not IngressBackend(None).owns_clsact_filter(cls)
    # ... and neither htb nor edt takes it for their classifier.
    assert not mapcls.owns_clsact_filter(cls)


def test_operations_describe_themselves():
    op = ops.AddRedirect(device="eth0", ifindex=2, ifb="shpi-eth0", ifb_ifindex=20, reason="missing")
    assert op.describe() == ("add ingress redirect to shpi-eth0 (u32 prio 0x7369, mirred egress redirect) on eth0: "
                             "missing")
    assert str(op.error("File exists")).endswith("on eth0: File exists")
    assert ops.CreateIfb(device="shpi-eth0", ifindex=0, uplink="eth0").describe() == \
        "create ifb device (fed from eth0) on shpi-eth0"
    assert isinstance(AddClsact(device="eth0", ifindex=2), ops.AddClsact)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["team-a", "team-b", "other"]), st.integers(0, 250), st.booleans()),
                max_size=12), st.booleans())
def test_any_node_is_in_sync_after_its_own_plan_and_every_destination_has_one_tenant_class(pods, bpf):
    from .test_ingress_plan import SOURCE

    text = SOURCE.replace("match: {cidrs: [198.18.2.0/24]}", "match: {cidrs: [198.18.2.0/24], namespaces: [team-b]}")
    ps = [pod(f"u{i}", ns, [f"198.18.9.{last}", f"2001:db8:9::{last:x}"], host=host)
          for i, (ns, last, host) in enumerate(pods)]
    _, p = make(text, bpf_maps=bpf, pods=ps)
    assert [td.ops for td in differ.diff(p, in_sync(p))] == [[], []]
    for dp in p.devices:
        tenant_classes = {t.classid for t in dp.tenants}
        if dp.map_classifier is not None:
            values = [int.from_bytes(v, "little") for e in dp.map_classifier.entries.values() for v in e.values()]
        else:
            values = [f.classid for f in dp.filters]
        assert set(values) <= tenant_classes
        rates = sum(c.rate_bps for c in dp.classes if c.parent != INGRESS_ROOT)
        assert rates <= dp.capacity_bps + len(dp.tenants) * 8_000  # guarantees never above the capacity
