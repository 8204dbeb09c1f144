"""The edt backend's pure planner and diff: what it plans per uplink, and what a resync writes (nothing in sync)."""

from shaperd.core import config
from shaperd.backends.edt import plan as edt_plan
from shaperd.backends.edt.backend import EdtBackend, EdtObserved
from shaperd.backends.edt.diff import diff_device
from shaperd.backends.edt.objects import DEFAULT_KEY, PRIO_STAMPER, ROOT_HANDLE, EdtDeviceState
from shaperd.backends.edt.ops import DeleteRoot, DeleteStamper, SetFq, SetRoot, SetStamper
from shaperd.backends.common.mapcls import AttachMapClassifier, DetachMapClassifier, ObservedMapClassifier
from shaperd.backends.common.objects import ROOT_HANDLE as HTB_ROOT
from shaperd.core.ids import assign_minors
from shaperd.backends.common.clsact import AddClsact
from shaperd.core.inventory import Capabilities, Inventory, Link
from shaperd.core.tenancy import tenancy

CAPS = Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True)
G = 1_000_000_000


def cfg(**node):
    return config.from_dict({"node": {"interfaces": ["eth0"], "dataplane": "edt", **node}, "tenants": [
        {"name": "train", "bandwidthGuarantee": "60Gbps", "priority": 100},
        {"name": "batch", "bandwidthGuarantee": "10Gbps", "bandwidthLimit": "50Gbps", "priority": 50},
    ]})


def planned(link, c=None):
    c = c or cfg()
    inv = Inventory(links=(link,), capabilities=CAPS)
    return edt_plan.plan(c, inv, tenancy(c, inv))


LINK = Link("eth0", 2, speed_bps=100 * G, tx_queues=4)


def test_mq_root_with_one_fq_per_tx_queue_sized_for_the_rate():
    p = planned(LINK)
    (dp,) = p.devices
    assert dp.root_kind == "mq" and dp.capacity_bps == 98 * G
    assert [f.parent for f in dp.fqs] == [ROOT_HANDLE | q for q in (1, 2, 3, 4)]
    assert len({f.handle >> 16 for f in dp.fqs}) == 4
    assert dp.stamper.horizon_ns == edt_plan.STAMPER_HORIZON_NS == 100_000_000
    fq = dp.fqs[0]
    # fq's backstop: 1.25 x (100 ms + one 64 KiB packet at the smallest guarantee, the reserve: 980 Mbit/s).
    assert fq.horizon_us == (100_000_000 + 65536 * 8 * 10**9 // (98 * G // 100)) * 5 // 4 // 1000 and fq.horizon_drop
    assert fq.flow_limit_packets == 10_000  # 98 Gbit x 100 ms is ~800k frames: capped
    assert fq.limit_packets == 100_000
    minors = assign_minors(["train", "batch"])
    assert {s.key: (s.guarantee_bps, s.limit_bps) for s in dp.shares} == {
        DEFAULT_KEY: (98 * G // 100, 98 * G), minors["train"]: (60 * G, 98 * G), minors["batch"]: (10 * G, 50 * G)}


def test_single_queue_device_gets_fq_at_the_root_and_slow_rates_a_longer_fq_horizon():
    c = config.from_dict({"node": {"interfaces": ["eth0"], "dataplane": "edt", "capacity": "100Mbps"},
                          "tenants": [{"name": "a", "bandwidthGuarantee": "1Mbps"}]})
    (dp,) = planned(Link("eth0", 2, tx_queues=1), c).devices
    assert dp.root_kind == "fq" and len(dp.fqs) == 1 and dp.fqs[0].handle == ROOT_HANDLE
    # One 64 KiB packet at 1 Mbit/s (the reserve) is 524 ms: fq keeps it; 1.25 x (100 + 524.288) ms.
    assert dp.fqs[0].horizon_us == 780_360
    # 100 Mbit for 100 ms is 4883 packets of 256 bytes: the flow limit; the queue limit is at its floor.
    assert (dp.fqs[0].limit_packets, dp.fqs[0].flow_limit_packets) == (10_000, 4_883)


def in_sync_state(dp):
    mc = dp.map_classifier  # edt needs the map classifier (select.edt_missing): the stamper keys by its class ids
    observed = ObservedMapClassifier(mc.name, prog_id=7, handle=0x7368, prio=0x7368,
                                     entries={r: dict(v) for r, v in mc.entries.items()})
    return EdtDeviceState(dp.device, dp.ifindex, root_kind=dp.root_kind, root_handle=ROOT_HANDLE,
                          fqs={f.parent: f for f in dp.fqs}, clsact=True, stamper_name=dp.stamper.name,
                          stamper_prog_id=41, map_classifier=observed,
                          pod_entries={p.key: (p.parent, p.ns_per_byte_q16) for p in dp.pods})


def test_fresh_device_gets_root_fqs_clsact_and_stamper_then_a_resync_writes_nothing():
    (dp,) = planned(LINK).devices
    td = diff_device(dp, EdtDeviceState("eth0", 2, root_kind="mq", root_handle=0))
    assert [type(o) for o in td.ops] == [SetRoot] + [SetFq] * 4 + [AddClsact, AttachMapClassifier, SetStamper]
    stamper = td.ops[-1]
    assert dict(stamper.initial_q16)[DEFAULT_KEY] > 0
    assert diff_device(dp, in_sync_state(dp)).ops == []


def test_a_changed_fq_is_the_only_write():
    (dp,) = planned(LINK).devices
    st = in_sync_state(dp)
    f = dp.fqs[2]
    st.fqs[f.parent] = type(f)(f.parent, f.handle, f.limit_packets, 100, f.horizon_us)
    assert [(type(o), o.fq.parent) for o in diff_device(dp, st).ops] == [(SetFq, f.parent)]


def test_foreign_root_is_left_alone_and_shaperds_htb_root_is_replaced():
    (dp,) = planned(LINK).devices
    td = diff_device(dp, EdtDeviceState("eth0", 2, root_kind="prio", root_handle=0x10000))
    assert td.blocked and "not shaperd's" in td.blocked and not td.ops
    td = diff_device(dp, EdtDeviceState("eth0", 2, root_kind="htb", root_handle=HTB_ROOT))
    assert isinstance(td.ops[0], SetRoot)


def test_device_back_to_htb_loses_only_the_stamper_and_a_dropped_device_everything():
    (dp,) = planned(LINK).devices
    b = EdtBackend(writer=None)
    st = in_sync_state(dp)
    back_to_htb = planned(LINK, cfg(dataplane="htb"))
    (td,) = b.diff(back_to_htb, EdtObserved({2: st}))
    assert [type(o) for o in td.ops] == [DeleteStamper]
    assert td.ops[0].prio == PRIO_STAMPER
    gone = edt_plan.EdtPlan()
    (td,) = b.diff(gone, EdtObserved({2: in_sync_state(dp)}))
    # HTB keeps the map classifier on a device it takes back (above); a device dropped altogether loses it too.
    assert [type(o) for o in td.ops] == [DeleteStamper, DetachMapClassifier, DeleteRoot]
    assert td.ops[2].describe() == "delete root qdisc 7365: on eth0: device no longer on the edt data plane"


def test_shaperd_plan_shows_the_edt_tree_as_tc_commands():
    from shaperd.backends.edt.render import render

    text = render(planned(LINK))
    assert "tc qdisc replace dev eth0 root handle 7365: mq" in text
    assert "tc qdisc replace dev eth0 parent 7365:4 handle 8004: fq limit 100000 flow_limit 10000" in text
    assert "edt stamper shpe_" in text and "train" in text and "batch" in text


def test_edt_uplinks_get_the_same_map_classifier_htb_would_install():
    from shaperd.backends.htb.plan import plan as htb_plan

    c = config.from_dict({"node": {"interfaces": ["eth0"], "dataplane": "edt"}, "tenants": [
        {"name": "train", "bandwidthGuarantee": "60Gbps", "match": {"cidrs": ["198.18.1.0/24"]}}]})
    caps = Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True)
    inv = Inventory(links=(LINK,), capabilities=caps)
    (dp,) = edt_plan.plan(c, inv, tenancy(c, inv)).devices
    c_htb = config.from_dict({"node": {"interfaces": ["eth0"]}, "tenants": [
        {"name": "train", "bandwidthGuarantee": "60Gbps", "match": {"cidrs": ["198.18.1.0/24"]}}]})
    inv_htb = Inventory(links=(LINK,), capabilities=caps)
    (hp,) = htb_plan(c_htb, inv_htb).devices
    assert dp.map_classifier is not None and dp.map_classifier == hp.map_classifier
    ops = diff_device(dp, EdtDeviceState("eth0", 2, root_kind="mq", root_handle=0)).ops
    assert any(type(o).__name__.startswith("Attach") or "classifier" in o.describe() for o in ops), \
        [o.describe() for o in ops]


def _scoped_cfg():
    return config.from_dict({"node": {"interfaces": ["eth0"], "dataplane": "edt"}, "tenants": [
        {"name": "train", "bandwidthGuarantee": "60Gbps", "priority": 100,
         "match": {"cidrs": ["198.18.1.0/24", "2001:db8:1::/48"]},
         "destinations": [{"cidrs": ["198.19.0.0/16"], "bandwidthLimit": "5Gbps"}]},
        {"name": "batch", "bandwidthGuarantee": "10Gbps", "priority": 50, "match": {"cidrs": ["198.18.2.0/24"]}},
    ]})


def test_edt_classifies_like_htb_without_destination_scopes_and_says_the_scope_limit_is_not_enforced():
    from shaperd.backends.htb import plan as htb_plan

    c = _scoped_cfg()
    caps = Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True)
    inv = Inventory(links=(LINK,), capabilities=caps)
    p = edt_plan.plan(c, inv, tenancy(c, inv))
    mc = p.devices[0].map_classifier
    assert mc is not None
    # No scope entry: the stamper keys by tenant class minor, a scope's classid would leave unpaced.
    assert mc.entries["dst4"] == {} and mc.entries["dst6"] == {}
    assert any("destination scopes of train are not enforced on eth0 (dataplane edt)" in w for w in p.warnings), p.warnings
    # Every other decision is HTB's own: the same entries as HTB's classifier for the same tenants.
    c_h = config.from_dict({"node": {"interfaces": ["eth0"]}, "tenants": [
        {"name": "train", "bandwidthGuarantee": "60Gbps", "priority": 100,
         "match": {"cidrs": ["198.18.1.0/24", "2001:db8:1::/48"]}},
        {"name": "batch", "bandwidthGuarantee": "10Gbps", "priority": 50, "match": {"cidrs": ["198.18.2.0/24"]}},
    ]})
    (hdp,) = htb_plan.plan(c_h, inv, ten=tenancy(c_h, inv)).devices
    for role in ("src4", "src6", "ifindex", "cgroup", "mark"):
        assert mc.entries[role] == hdp.map_classifier.entries[role], role
    minors = assign_minors(["train", "batch"])
    assert len(mc.entries["src4"]) == 2 and len(mc.entries["src6"]) == 1
    assert sorted(mc.entries["src4"].values()) == sorted(
        int(0x7368 << 16 | minors[n]).to_bytes(4, "little") for n in ("train", "batch"))


def test_classification_lists_configured_prefixes_then_pod_addresses_each_network_once():
    from ipaddress import ip_network

    from shaperd.backends.htb.plan import classification
    from shaperd.core.inventory import Pod

    c = _scoped_cfg()
    minors = assign_minors(["train", "batch"])
    pods = (Pod("u1", "ns", "p1", ips=("198.18.2.0", "198.18.9.9")),  # 198.18.2.0/32 is not batch's /24: its own
            Pod("u2", "ns", "p2", ips=("198.18.9.8",), host_network=True),  # hostNetwork: by cgroup, not address
            Pod("u3", "ns", "p3", ips=("198.18.9.9",)))  # the same /32 as p1's: the first claim stays
    inv = Inventory(links=(LINK,), pods=pods, capabilities=Capabilities(bpf=False))
    who = classification(c, inv, {}, minors, by_pod={"u1": "train", "u2": "train", "u3": "batch"})
    assert who.bpf_filters == ()  # without cls_bpf: no interface/cgroup/mark mapping at all
    train, batch = (0x7368 << 16 | minors[n] for n in ("train", "batch"))
    assert who.src_prefixes == (
        (ip_network("198.18.1.0/24"), train), (ip_network("2001:db8:1::/48"), train),
        (ip_network("198.18.2.0/24"), batch),
        (ip_network("198.18.2.0/32"), train), (ip_network("198.18.9.9/32"), train))
