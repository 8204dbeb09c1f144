"""HTB offload (mlx5) in the pure planner and the diff: the verdict's reasons, auto|on|off, the offload shape,
a kernel refusal falling back to software HTB, and an in-sync offloaded tree sending nothing."""

import errno

from shaperd.core import config
from shaperd.core.protocol import ApplyResult, PlanInput
from shaperd.backends.common import mapcls
from shaperd.backends.htb.backend import HtbBackend, OffloadRefused
from shaperd.backends.htb.diff import diff_device
from shaperd.backends.common.objects import (DEFAULT_CLASS_MINOR, ROOT_HANDLE, DeviceState, ObservedClass,
                                          RootQdisc, classid)
from shaperd.backends.htb.offload import MLX5_MAX_LEAVES, mlx5_bw_share, verdict
from shaperd.backends.htb.ops import CreateClass, CreateRoot, DeleteRoot
from shaperd.backends.htb.plan import plan
from shaperd.backends.htb.render import render
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, HtbOffloadSupport, Inventory, Link
from shaperd.core.tenancy import tenancy
from shaperd.core import units

MAPS = Capabilities(bpf=True, bpf_maps=True, bpf_adopt="id")
CAPABLE = HtbOffloadSupport(True, "mlx5_core, hw-tc-offload on", "mlx5_core")
NOT_CAPABLE = HtbOffloadSupport(False, "driver veth is not known to offload HTB; hw-tc-offload is off", "veth")
EQUAL = [{"name": "a", "bandwidthGuarantee": "30Gbps", "match": {"cidrs": ["198.18.0.0/24"]}},
         {"name": "b", "bandwidthGuarantee": "20Gbps", "match": {"cidrs": ["198.18.1.0/24"]}}]


def cfg(tenants=EQUAL, mode=None, capacity="100Gbps"):
    node = {"interfaces": ["eth0"], "capacity": capacity}
    if mode is not None:
        node["htbOffload"] = mode
    return config.from_dict({"node": node, "tenants": tenants})


def inv(probe=CAPABLE, caps=MAPS, ifindex=2):
    return Inventory(links=(Link("eth0", ifindex, htb_offload=probe),), capabilities=caps)


def device(c, i, refused=None):
    p = plan(c, i, offload_refused=refused)
    (dp,) = p.devices
    return dp, p


def test_equal_priority_tenants_on_a_capable_device_are_offloaded_in_offload_shape():
    dp, p = device(cfg(), inv())
    assert dp.root.offload and dp.root.default_minor == DEFAULT_CLASS_MINOR
    assert classid(DEFAULT_CLASS_MINOR) in {c.classid for c in dp.classes}  # the default class is kept
    assert {(c.prio, c.quantum_bytes) for c in dp.classes} == {(0, 0)}  # mlx5 refuses both; the kernel picks quantum
    assert dp.filters == () and dp.map_classifier is not None  # classified on clsact egress only
    assert "mlx5_core, hw-tc-offload on" in dp.offload_why and "default class shares spare" in dp.offload_why
    assert p.warnings == ()
    text = render(p)
    assert "tc qdisc replace dev eth0 root handle 7368: htb default 2 offload" in text
    assert "quantum" not in text and "# htb offload: on" in text


def test_the_software_plan_is_unchanged_where_offload_is_off():
    dp, _ = device(cfg(mode="off"), inv())
    assert not dp.root.offload and dp.offload_why == "node.htbOffload is off"
    assert {c.prio for c in dp.classes} == {0, 7} and all(c.quantum_bytes > 0 for c in dp.classes)
    assert "offload" not in render(plan(cfg(mode="off"), inv()))


def test_auto_follows_the_device_probe_and_on_ignores_it():
    dp, p = device(cfg(), inv(NOT_CAPABLE))
    assert not dp.root.offload and "driver veth is not known" in dp.offload_why
    assert p.warnings == ()  # a NIC that cannot offload, under auto: normal, status says why
    dp, _ = device(cfg(), inv(None))
    assert not dp.root.offload and "the device was not probed" in dp.offload_why
    dp, _ = device(cfg(mode="on"), inv(NOT_CAPABLE))
    assert dp.root.offload and "node.htbOffload is on (device probe: driver veth" in dp.offload_why


def test_every_reason_is_named_and_becomes_a_warning_naming_the_device():
    tenants = [{"name": f"t{i}", "bandwidthGuarantee": "100Mbps", "priority": i % 3,
                "match": {"cidrs": [f"198.18.{i // 250}.{i % 250}/32"]}} for i in range(MLX5_MAX_LEAVES + 1)]
    dp, p = device(cfg(tenants), inv(caps=Capabilities(bpf=True)))  # no bpf_maps: the u32/classic path
    v = verdict(dp, supported=False, why_not="hw-tc-offload is off (fixed off by the driver)")
    text = " | ".join(v.reasons)
    assert "not supported on eth0: hw-tc-offload is off (fixed off by the driver)" in text
    assert "the eBPF map classifier is required" in text
    assert "tenants on 3 priority levels need HTB prio" in text
    assert f"{MLX5_MAX_LEAVES + 2} leaf classes: mlx5 offload allows {MLX5_MAX_LEAVES}" in text  # + default
    assert "filters in the HTB tree (cls_bpf mark, u32) cannot be offloaded" in text
    assert not dp.root.offload and dp.offload_why == "; ".join(
        r for r in v.reasons if not r.startswith("htb offload not supported"))
    (w,) = p.warnings[-1:]
    assert w.startswith("htb offload on eth0 not used: ") and "priority levels" in w


def test_whole_percent_weights_that_would_shortchange_a_guarantee_keep_the_device_in_software():
    # 10 Gbit: a's 1.99 Gbit is weight 19, b's 7.9 Gbit 79, the default class's 100 Mbit 1: with all busy a gets
    # 10 * 19/99 = 1.919 Gbit, below 98 % of 1.99.
    tenants = [{"name": "a", "bandwidthGuarantee": "1990Mbps"}, {"name": "b", "bandwidthGuarantee": "7900Mbps"}]
    assert mlx5_bw_share(1_990_000_000, 10_000_000_000) == 19
    assert mlx5_bw_share(1_000_000, 100_000_000_000) == 1  # below 1 %: rounded up to the minimum
    dp, p = device(cfg(tenants, capacity="10Gbps"), inv())
    assert not dp.root.offload
    assert "class 7368:" in dp.offload_why and "(tenant a)" in dp.offload_why and "every sibling busy" in dp.offload_why
    assert any(w.startswith("htb offload on eth0 not used") for w in p.warnings)
    ok = [{"name": "a", "bandwidthGuarantee": "2Gbps"}, {"name": "b", "bandwidthGuarantee": "7Gbps"}]
    assert device(cfg(ok, capacity="10Gbps"), inv())[0].root.offload


def test_a_refusal_is_data_for_the_planner_the_device_stays_in_software():
    dp, p = device(cfg(), inv(), refused={(2, "eth0"): "Operation not supported (hw-tc-offload ethtool feature flag "
                                                         "must be on)"})
    assert not dp.root.offload and "the kernel refused htb offload on eth0: Operation not supported" in dp.offload_why
    assert any("refused htb offload on eth0" in w for w in p.warnings)
    dp, _ = device(cfg(), inv(ifindex=9), refused={(2, "eth0"): "refused before"})  # another device by that name
    assert dp.root.offload


def _ctx(c, i):
    return PlanInput(c, i, tenancy(c, i))


def test_the_backend_remembers_a_refusal_per_device_and_forgets_it_when_the_device_goes():
    b = HtbBackend(writer=None)
    c, i = cfg(), inv()
    dp = b.plan(_ctx(c, i)).devices[0]
    assert dp.root.offload
    root = CreateRoot(device="eth0", ifindex=2, root=dp.root, reason="missing")
    cls = CreateClass(device="eth0", ifindex=2, cls=dp.classes[0], reason="missing")
    res = ApplyResult(failed=[(root, root.error("Operation not supported (hw-tc-offload ethtool feature flag must "
                                                "be on)", errno.EOPNOTSUPP)),
                              (cls, cls.error("Invalid argument", errno.EINVAL))])
    b._offload_refusals(res)
    assert b.offload_refused == {(2, "eth0"): "Operation not supported (hw-tc-offload ethtool feature flag must be on)"}
    assert all(isinstance(e, OffloadRefused) and e.transient for _, e in res.failed)  # retried soon, not at resync
    assert "htb offload refused" in str(res.failed[0][1])
    again = b.plan(_ctx(c, i)).devices[0]
    assert not again.root.offload and "refused" in again.offload_why  # no retry loop: software from now on
    assert b.plan(_ctx(c, inv(ifindex=7))).devices[0].root.offload  # the device went away: forgotten


def test_a_refusal_of_something_else_is_not_an_offload_refusal():
    b = HtbBackend(writer=None)
    b.plan(_ctx(cfg(mode="off"), inv()))
    dp = b.plan(_ctx(cfg(mode="off"), inv())).devices[0]
    cls = CreateClass(device="eth0", ifindex=2, cls=dp.classes[0], reason="missing")
    res = ApplyResult(failed=[(cls, cls.error("Invalid argument", errno.EINVAL))])
    b._offload_refusals(res)
    assert b.offload_refused == {} and type(res.failed[0][1]) is KernelError


def observed(dp, offload=True, kernel_quantum=True):
    """What the kernel dumps back for ``dp``: the kernel's own quantum (rate / r2q 10, 1000..200000)."""
    st = DeviceState("eth0", 2, RootQdisc("htb", ROOT_HANDLE, DEFAULT_CLASS_MINOR, offload=offload))
    for c in dp.classes:
        q = min(200_000, max(1000, units.bps_to_Bps(c.rate_bps) // 10)) if kernel_quantum else c.quantum_bytes
        st.classes[c.classid] = ObservedClass(
            c.classid, c.parent, units.bps_to_Bps(c.rate_bps), units.bps_to_Bps(c.ceil_bps),
            units.xmit_ticks(c.burst_bytes, c.rate_bps), units.xmit_ticks(c.cburst_bytes, c.ceil_bps), q, c.prio)
    st.leaves = {q.parent: q for q in dp.leaves}
    mc = dp.map_classifier
    st.map_classifier = mapcls.ObservedMapClassifier(mc.name, 9, mapcls.HANDLE_EGRESS_CLASSIFY,
                                                     mapcls.PRIO_EGRESS_CLASSIFY,
                                                     {r: dict(e) for r, e in mc.entries.items()})
    return st


def test_an_in_sync_offloaded_tree_sends_no_write():
    dp, _ = device(cfg(), inv())
    assert diff_device(dp, observed(dp)).ops == []


def test_an_offload_mismatch_replaces_the_root_and_says_so():
    dp, _ = device(cfg(), inv())
    ops = diff_device(dp, observed(dp, offload=False)).ops
    assert isinstance(ops[0], DeleteRoot) and isinstance(ops[1], CreateRoot) and ops[1].root.offload
    assert "replacing the software root with an offloaded one" in ops[1].describe()
    soft, _ = device(cfg(mode="off"), inv())
    ops = diff_device(soft, observed(soft, offload=True, kernel_quantum=False)).ops
    assert isinstance(ops[0], DeleteRoot) and not ops[1].root.offload
    assert "replacing the offloaded root with a software one" in ops[1].describe()
    # software HTB still compares its own quantum: a kernel-picked one differs
    ops = diff_device(soft, observed(soft, offload=False, kernel_quantum=True)).ops
    assert ops and all("quantum" in op.reason for op in ops)


def test_the_reconciler_probes_only_the_uplinks_and_nothing_when_offload_is_off(tmp_path):
    from shaperd.engine.reconciler import Reconciler
    from shaperd.core.roots import Roots

    from .test_engine import FakeReader

    class Probe:
        def __init__(self):
            self.asked = []

        def annotate(self, inventory, links):
            from dataclasses import replace

            self.asked.append([l.name for l in links])
            return replace(inventory, links=tuple(replace(l, htb_offload=CAPABLE) if l in links else l
                                                  for l in inventory.links))

    probe = Probe()
    rec = Reconciler(FakeReader(), [], MAPS, roots=Roots.of(proc=str(tmp_path)), device_probe=probe)
    got = rec.inventory(cfg())
    assert probe.asked == [["eth0"]] and got.link("eth0").htb_offload == CAPABLE and got.link("lo").htb_offload is None
    rec.inventory(cfg(mode="off"))
    rec.inventory(None)  # teardown: no config, nothing to decide
    assert probe.asked == [["eth0"]]


def test_a_refused_offload_is_retried_soon_by_the_daemon_an_ordinary_refusal_is_not():
    from types import SimpleNamespace

    from shaperd.daemon.service import _worth_retrying

    op = CreateRoot(device="eth0", ifindex=2, root=device(cfg(), inv())[0].root)
    plain = op.error("Operation not supported", errno.EOPNOTSUPP)
    refused = OffloadRefused(plain.verb, plain.obj, plain.device, plain.cause, plain.errno)

    def rep(err):
        return SimpleNamespace(devices=[SimpleNamespace(error=None, failed=[(op, err)])])

    assert _worth_retrying(rep(refused)) and not _worth_retrying(rep(plain))


def test_one_by_one_a_refused_offloaded_root_is_the_last_write_sent_on_that_device(monkeypatch):
    from shaperd.backends.htb import backend as backend_mod
    from shaperd.backends.htb.diff import diff_device as diff_of

    sent = []

    def fake_apply_ops(writer, ops, batch=True, **kw):
        out = ApplyResult()
        for op in ops:
            sent.append(op)
            if isinstance(op, CreateRoot) and op.root.offload:
                out.failed.append((op, op.error("Operation not supported", errno.EOPNOTSUPP)))
            else:
                out.applied.append(op)
        return out

    monkeypatch.setattr(backend_mod.tc, "apply_ops", fake_apply_ops)
    b = HtbBackend(writer=None)
    dp = b.plan(_ctx(cfg(), inv())).devices[0]
    td = diff_of(dp, DeviceState("eth0", 2, RootQdisc("noqueue", 0)))
    res = b.apply(td, batch=False)
    assert [type(op) for op in sent] == [CreateRoot]  # nothing under a refused root
    assert res.applied == [] and len(res.failed) == len(td.ops)
    assert all(isinstance(e, OffloadRefused) for _, e in res.failed)
    assert "not sent: htb offload was refused on eth0" in str(res.failed[1][1])
    assert (2, "eth0") in b.offload_refused
