"""Per-pod egress caps on the edt data plane, pure: the plan's pod keys, parents and static rates, and the diff
of the stamper's pod entries (only what differs; leftovers cleared; nothing when in sync)."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from shaperd.backends.common import classify
from shaperd.backends.common.objects import classid
from shaperd.backends.edt import controller
from shaperd.backends.edt import plan as edt_plan
from shaperd.backends.edt.backend import EdtBackend, EdtObserved
from shaperd.backends.edt.diff import diff_device
from shaperd.backends.edt.objects import DEFAULT_KEY, EdtDeviceState
from shaperd.backends.edt.ops import ClearPodKey, SetPodKey, SetStamper
from shaperd.backends.edt.render import render
from shaperd.core import config
from shaperd.core.ids import assign_minors
from shaperd.core.inventory import Capabilities, Inventory, Link, Pod
from shaperd.core.tenancy import tenancy

from .test_edt_plan import in_sync_state

CAPS = Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True)
LINK = Link("eth0", 2, speed_bps=10**9, tx_queues=4)  # 980 Mbit/s shaped
M = 1_000_000


def cfg(scoped: bool = False, dataplane: str = "edt"):
    batch = {"name": "batch", "bandwidthGuarantee": "100Mbps", "bandwidthLimit": "300Mbps",
             "match": {"namespaces": ["batch"]}}
    if scoped:
        batch["destinations"] = [{"cidrs": ["198.19.0.0/16"], "bandwidthLimit": "50Mbps"}]
    return config.from_dict({"node": {"interfaces": ["eth0"], "dataplane": dataplane}, "tenants": [
        {"name": "train", "bandwidthGuarantee": "500Mbps", "bandwidthLimit": "800Mbps",
         "match": {"namespaces": ["train"]}}, batch]})


def pod(uid, ns, egress=None, ip="198.18.5.1", ifindex=None):
    return Pod(uid, ns, f"p-{uid}", ips=(ip,), host_ifindex=ifindex, host_ifname=f"veth{uid}" if ifindex else None,
               egress_bandwidth=egress)


PODS = (pod("a", "train", "100M", "198.18.5.1", 11), pod("b", "train", None, "198.18.5.2", 12),
        pod("c", "batch", "900M", "198.18.5.3"), pod("d", "default", "50M", "198.18.5.4"))


def planned(pods=PODS, c=None):
    c = c or cfg()
    inv = Inventory(links=(LINK,), pods=pods, capabilities=CAPS)
    ten = tenancy(c, inv)
    return edt_plan.plan(c, inv, ten), ten


def test_each_capped_pod_gets_its_own_key_under_its_tenant_at_min_of_cap_limit_and_capacity():
    p, ten = planned()
    (dp,) = p.devices
    minors = assign_minors(["train", "batch"])
    keys = classify.pod_minors(["a", "c", "d"], set(minors.values()))
    got = {q.uid: (q.key, q.parent, q.rate_bps, q.ref, q.tenant) for q in dp.pods}
    assert got == {
        "a": (keys["a"], minors["train"], 100 * M, "train/p-a", "train"),
        "c": (keys["c"], minors["batch"], 300 * M, "batch/p-c", "batch"),  # 900M capped at batch's 300M limit
        "d": (keys["d"], DEFAULT_KEY, 50 * M, "default/p-d", None),  # a pod of no tenant: under the default key
    }
    # The stamper's unit, converted as the controller converts; never a share of the controller's.
    assert all(q.ns_per_byte_q16 == controller.ns_per_byte_q16(q.rate_bps) for q in dp.pods)
    assert {s.key for s in dp.shares}.isdisjoint(q.key for q in dp.pods)
    assert {s.key for s in edt_plan.controller_shares(dp)} == {DEFAULT_KEY, *minors.values()}
    # The uncapped pod "b" has no key of its own; its tenant-mate's key is no tenant's.
    assert len({q.key for q in dp.pods} | set(minors.values()) | {DEFAULT_KEY}) == 6


def test_the_map_classifier_sends_a_capped_pods_interface_and_address_to_its_own_class():
    p, _ = planned()
    (dp,) = p.devices
    keys = {q.uid: q.key for q in dp.pods}
    minors = assign_minors(["train", "batch"])
    mc = dp.map_classifier.entries
    u32 = lambda b: struct.unpack("<I", b)[0]  # noqa: E731
    ifindex = {u32(k): u32(v) for k, v in mc["ifindex"].items()}
    src4 = {ipaddress.ip_address(k[4:]): u32(v) for k, v in mc["src4"].items()}
    assert ifindex == {11: classid(keys["a"])}  # the capped pod's host veth; the uncapped one's is not named
    assert src4 == {ipaddress.ip_address("198.18.5.1"): classid(keys["a"]),
                    ipaddress.ip_address("198.18.5.2"): classid(minors["train"]),  # uncapped: its tenant's class
                    ipaddress.ip_address("198.18.5.3"): classid(keys["c"]),
                    ipaddress.ip_address("198.18.5.4"): classid(keys["d"])}


def test_a_pod_key_is_the_one_htb_would_give_it_scopes_included():
    """The shared decision: every tenant minor and every scope leaf minor taken, on both data planes."""
    from shaperd.backends.htb.scopes import scope_minors, scope_names

    c = cfg(scoped=True)
    minors = assign_minors([t.name for t in c.tenants])
    assert classify.scope_leaf_names(c.tenants) == [n for t in c.tenants for n in scope_names(t)]
    taken = set(minors.values()) | set(scope_minors(c.tenants, minors).values())
    p, _ = planned(c=c)
    (dp,) = p.devices
    assert {q.uid: q.key for q in dp.pods} == classify.pod_minors(["a", "c", "d"], taken)
    assert not taken & {q.key for q in dp.pods}


def test_a_fresh_stamper_carries_every_pods_rate_and_parent_before_it_is_attached():
    p, _ = planned()
    (dp,) = p.devices
    td = diff_device(dp, EdtDeviceState("eth0", 2, root_kind="mq", root_handle=0))
    (st,) = [o for o in td.ops if isinstance(o, SetStamper)]
    q16 = dict(st.initial_q16)
    assert all(q16[q.key] == q.ns_per_byte_q16 for q in dp.pods)
    assert dict(st.initial_parents) == {q.key: q.parent for q in dp.pods}
    assert not [o for o in td.ops if isinstance(o, (SetPodKey, ClearPodKey))]  # all in the fresh maps


def test_in_sync_pod_entries_write_nothing_and_a_changed_cap_rewrites_one_rate():
    p, _ = planned()
    (dp,) = p.devices
    st = in_sync_state(dp)
    assert diff_device(dp, st).ops == []
    changed = tuple(q if q.uid != "a" else pod("a", "train", "200M", "198.18.5.1", 11) for q in PODS)
    (dp2,) = planned(changed)[0].devices
    ops = diff_device(dp2, st).ops
    key_a = next(q.key for q in dp2.pods if q.uid == "a")
    assert [(type(o), o.key, o.parent, o.ns_per_byte_q16) for o in ops] == [
        (SetPodKey, key_a, None, controller.ns_per_byte_q16(200 * M))]
    assert ops[0].prog_id == st.stamper_prog_id
    assert ops[0].describe().startswith(f"set edt pod key {key_a} of pod train/p-a (rate 200Mbps) on eth0")


def test_a_new_pod_writes_its_parent_and_rate_and_a_removed_cap_or_pod_clears_its_key():
    p, _ = planned()
    (dp,) = p.devices
    st = in_sync_state(dp)
    key = {q.uid: q.key for q in dp.pods}
    # "a" loses its annotation, "d" is deleted; "e" is a new capped pod of batch.
    now = (pod("a", "train", None, "198.18.5.1", 11), PODS[1], PODS[2], pod("e", "batch", "10M", "198.18.5.9"))
    (dp2,) = planned(now)[0].devices
    ops = diff_device(dp2, st).ops
    (new,) = [o for o in ops if isinstance(o, SetPodKey)]
    e = next(q for q in dp2.pods if q.uid == "e")
    assert (new.key, new.parent, new.ns_per_byte_q16) == (e.key, e.parent, e.ns_per_byte_q16)
    assert sorted(o.key for o in ops if isinstance(o, ClearPodKey)) == sorted([key["a"], key["d"]])
    # After those writes the kernel holds exactly the plan: the next diff is empty.
    st.pod_entries = {q.key: (q.parent, q.ns_per_byte_q16) for q in dp2.pods}
    assert [o for o in diff_device(dp2, st).ops if isinstance(o, (SetPodKey, ClearPodKey))] == []


def test_a_key_with_a_parent_but_the_wrong_rate_or_parent_gets_only_what_differs():
    p, _ = planned()
    (dp,) = p.devices
    st = in_sync_state(dp)
    a = next(q for q in dp.pods if q.uid == "a")
    st.pod_entries[a.key] = (DEFAULT_KEY, a.ns_per_byte_q16)  # parent wrong, rate right
    (op,) = diff_device(dp, st).ops
    assert (op.parent, op.ns_per_byte_q16) == (a.parent, None)


@pytest.mark.parametrize("with_pods", [True, False])
def test_unreadable_maps_replace_the_stamper_only_where_caps_must_be_enforced(with_pods):
    p, _ = planned(PODS if with_pods else PODS[1:2])
    (dp,) = p.devices
    st = in_sync_state(dp)
    st.pod_entries, st.maps_error = None, "read edt stamper maps on eth0: pin gone"
    td = diff_device(dp, st)
    if with_pods:
        (op,) = td.ops
        assert isinstance(op, SetStamper) and dict(op.initial_parents) == {q.key: q.parent for q in dp.pods}
        assert "pin gone" in op.reason
    else:
        assert td.ops == [] and "pin gone" in td.note


def test_the_backend_orders_new_pod_keys_before_the_classifier_and_clears_after_it():
    from shaperd.backends.common import mapcls
    from shaperd.core.protocol import ApplyResult, TargetDiff

    b = EdtBackend(writer=None)
    calls = []
    b._apply_pods = lambda ops: calls.append([type(o).__name__ for o in ops]) or ApplyResult(applied=list(ops))
    b._apply_classifier = lambda ops: calls.append(["classifier"]) or ApplyResult(applied=list(ops))
    kw = dict(device="eth0", ifindex=2)
    upd = mapcls.UpdateClassifierMap(role="src4", upserts=(), deletes=(), prog_id=7, **kw)
    td = TargetDiff("eth0", [ClearPodKey(key=9, **kw), upd, SetPodKey(key=8, parent=3, ns_per_byte_q16=5, **kw)])
    res = b.apply(td)
    assert calls == [["SetPodKey"], ["classifier"], ["ClearPodKey"]] and len(res.applied) == 3


def test_plan_renders_each_capped_pod_under_its_tenant():
    text = render(planned()[0])
    assert "pod train/p-a: key" in text and "rate 100Mbps" in text and "parent train" in text
    assert "pod default/p-d" in text and "(no tenant)" in text


def test_observe_reads_the_pod_entries_of_the_attached_stamper_and_says_why_not():
    from shaperd.backends.edt.backend import read_pod_entries

    class Maps:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def read_parents(self):
            return {9: 3}

        def read_rates(self, keys):
            return {k: 77 for k in keys}

    st = EdtDeviceState("eth0", 2, stamper_name="shpe_0123456789", stamper_prog_id=5)
    read_pod_entries(st, None, lambda dev, prog, pins: Maps())
    assert st.pod_entries == {9: (3, 77)} and st.maps_error is None
    st = EdtDeviceState("eth0", 2, stamper_name="other", stamper_prog_id=5)
    read_pod_entries(st, None, lambda *a: pytest.fail("opened a program that is not shaperd's"))
    assert st.pod_entries is None and "no program of shaperd" in st.maps_error

    def refuse(*_a):
        from shaperd.kernel.bpf_maps import BpfMapError
        raise BpfMapError("adopt: Operation not permitted", 1)

    st = EdtDeviceState("eth0", 2, stamper_name="shpe_0123456789", stamper_prog_id=5)
    read_pod_entries(st, None, refuse)
    assert st.pod_entries is None and st.maps_error == "read edt stamper maps on eth0: adopt: Operation not permitted"


def test_an_in_sync_node_with_capped_pods_reconciles_to_no_write_twice():
    """Plan, diff against the state the first diff's writes leave, twice: nothing to write either time."""
    p, _ = planned()
    (dp,) = p.devices
    b = EdtBackend(writer=None)
    for _ in range(2):
        (td,) = b.diff(p, EdtObserved({2: in_sync_state(dp)}))
        assert td.ops == []


from hypothesis import given, settings
from hypothesis import strategies as hs


@settings(max_examples=40, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from(["train", "batch", "default"]), hs.integers(1, 980)),  # <= the link
                min_size=0, max_size=12), hs.randoms(use_true_random=False))
def test_pod_keys_are_unique_never_a_tenants_within_limits_and_independent_of_pod_order(caps, rnd):
    pod_list = [pod(f"u{i}", ns, f"{mbit}M", f"198.18.6.{i + 1}") for i, (ns, mbit) in enumerate(caps)]
    (dp,) = planned(tuple(pod_list))[0].devices
    shuffled = list(pod_list)
    rnd.shuffle(shuffled)
    (dp2,) = planned(tuple(shuffled))[0].devices
    assert dp2.pods == dp.pods and dp2.map_classifier == dp.map_classifier
    keys = [q.key for q in dp.pods]
    assert len(set(keys)) == len(keys) == len(pod_list)
    shares = {s.key: s for s in dp.shares}
    assert not set(keys) & set(shares)
    for q in dp.pods:
        assert q.parent in shares and q.rate_bps <= min(q.cap_bps, shares[q.parent].limit_bps, dp.capacity_bps)
        assert q.rate_bps == min(q.cap_bps, shares[q.parent].limit_bps, dp.capacity_bps)


@pytest.mark.parametrize("scoped", [False, True])
def test_the_same_pod_gets_the_same_class_id_on_htb_and_on_edt(scoped):
    """The shared decision, across the two planners: a pod's class id does not depend on its uplink's plane."""
    from shaperd.backends.htb.plan import plan as htb_plan

    c, c_htb = cfg(scoped=scoped), cfg(scoped=scoped, dataplane="htb")
    inv = Inventory(links=(LINK,), pods=PODS, capabilities=CAPS)
    hp = htb_plan(c_htb, inv, ten=tenancy(c_htb, inv))
    (dp,) = edt_plan.plan(c, inv, tenancy(c, inv)).devices
    assert len(hp.pods) == 3
    assert {p.uid: p.classid for p in hp.pods} == {q.uid: classid(q.key) for q in dp.pods}
