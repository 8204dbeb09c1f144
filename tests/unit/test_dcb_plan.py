"""The DCB planner and diff, pure: DSCP -> priority -> TC, ETS shares, max rates, grouping, in-sync = no op.

Devices are the mlx5 fixture (tests/rdma_fixture.py): PF mlx5_0 on ens1f0 with
VFs mlx5_2/mlx5_3; a VF's DCB is its PF's. The kernel side is a fake
``DcbClient`` keeping one DcbState per netdev, which can be told to drop ETS
or max-rate writes silently, as a driver without the op does.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings, strategies as st

from shaperd.core import config
from shaperd.backends.dcb import plan as dp
from shaperd.backends.dcb.backend import DcbBackend
from shaperd.backends.dcb.diff import diff, maxrate_in_sync
from shaperd.backends.dcb.ops import AddDscpApps, DeleteDscpApps, SetEts, SetMaxrate
from shaperd.backends.dcb.render import render
from shaperd.rdma import plan as rp
from shaperd.core.protocol import PlanInput
from shaperd.discovery import rdma
from shaperd.core.inventory import Inventory, Link, RdmaDevice, RdmaPort
from shaperd.kernel import dcb
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy
from shaperd.engine.teardown import kept

from ..rdma_fixture import Node

GBPS = 10**9
CAP = 100 * GBPS


def inventory(tmp_path) -> Inventory:
    devs, notes = rdma.discover(Roots.of(sys=str(Node(tmp_path).build().sys)))
    return Inventory(links=(Link("ens1f0", 2, speed_bps=CAP),), rdma=devs, rdma_notes=notes)


def cfg_text(tenants) -> str:
    """tenants: (name, guarantee Gbit/s, limit Gbit/s or None, priority, device)."""
    out = "tenants:\n"
    for name, g, lim, prio, dev in tenants:
        limit = f", bandwidthLimit: {lim}Gbps" if lim is not None else ""
        out += (f"  - {{name: {name}, bandwidthGuarantee: {g}Gbps{limit}, priority: {prio}, "
                f"rdma: {{devices: [{dev}]}}}}\n")
    return out


def planned(inv, text) -> dp.DcbPlan:
    cfg = config.load_text(text)
    return dp.plan(cfg, inv, rp.plan(cfg, inv, tenancy(cfg, inv)).tenants)


TWO = [("a", 40, 60, 100, "mlx5_2"), ("b", 20, None, 50, "mlx5_3")]


def test_two_tenants_on_their_vfs_configure_the_pf_uplink(tmp_path):
    p = planned(inventory(tmp_path), cfg_text(TWO))
    assert [n.netdev for n in p.netdevs] == ["ens1f0"]
    n = p.netdevs[0]
    # TC0: the 40 % the guarantees leave; a (rank 0) TC1 40 %, b (rank 1) TC2 20 %.
    assert n.tc_bw_pct == (40, 40, 20, 0, 0, 0, 0, 0)
    assert n.tc_tsa == (dp.TSA_ETS,) * 8 and n.prio_tc == tuple(range(8))
    assert n.maxrate_kbps == (0, 60_000_000, 0, 0, 0, 0, 0, 0)  # b has no limit: unlimited
    assert n.dscp_prio == ((24, 2), (26, 1))  # rank DSCPs AF31 26 and CS3 24
    assert [(t.tenant, t.tc, t.share_pct, t.maxrate_kbps) for t in n.tenants] == [("a", 1, 40, 60_000_000),
                                                                                   ("b", 2, 20, 0)]
    assert render(p).splitlines()[1:4] == [
        "dcb ets set dev ens1f0 tc-tsa all:ets tc-bw 0:40 1:40 2:20 3:0 4:0 5:0 6:0 7:0 "
        "prio-tc 0:0 1:1 2:2 3:3 4:4 5:5 6:6 7:7",
        "dcb maxrate set dev ens1f0 tc-maxrate 0:0 1:60000000kbit 2:0 3:0 4:0 5:0 6:0 7:0",
        "dcb app add dev ens1f0 dscp-prio 24:2 26:1"]


def test_infiniband_and_no_devices_plan_nothing(tmp_path):
    p = planned(inventory(tmp_path), cfg_text([("a", 1, None, 1, "mlx5_1")]))
    assert p.netdevs == () and render(p) == ""


def test_software_roce_has_no_dcb_and_is_skipped_with_a_warning():
    rxe = RdmaDevice("rxe0", parent="veth0", ports=(RdmaPort("rxe0", 1, "Ethernet", netdevs=("veth0",)),))
    inv = dataclasses.replace(INV, rdma=INV.rdma + (rxe,))
    p = planned(inv, cfg_text([("a", 1, None, 1, "rxe0")]))
    assert p.netdevs == () and p.warnings == ("DCB: rxe0 of tenant a is software RoCE on veth0: no DCB there",)


def test_no_speed_and_no_capacity_is_a_problem_not_a_guess(tmp_path):
    # no link speed: the PF port's rate (the fixture's mlx5_0) is the capacity
    inv = inventory(tmp_path)
    n = planned(dataclasses.replace(inv, links=()), cfg_text(TWO)).netdevs[0]
    assert n.capacity_bps == int(inv.rdma_device("mlx5_0").ports[0].rate_gbps * 1e9)
    # neither a link speed nor a port rate: a problem, not a guess
    p = planned(dataclasses.replace(INV, links=()), cfg_text([("a", 1, None, 1, "vf0_0")]))
    assert p.netdevs == () and [pr.path for pr in p.problems] == ["node.capacity"]


def test_shared_dscp_goes_to_the_higher_ranked_tenants_tc(tmp_path):
    text = cfg_text(TWO).replace("devices: [mlx5_3]", "devices: [mlx5_3], trafficClass: 106")
    n = planned(inventory(tmp_path), text).netdevs[0]
    assert [(t.tenant, t.tc) for t in n.tenants] == [("a", 1), ("b", 1)]
    assert n.dscp_prio == ((26, 1),) and n.tc_bw_pct[:3] == (40, 60, 0)


# -- properties -------------------------------------------------------------------
def many_vfs(n: int = 14) -> Inventory:
    """Two RoCE PFs (ens1f0, ens2f0) with ``n`` VFs each, built directly (a device per tenant: config rule)."""
    devs = []
    for pf, nd in enumerate(("ens1f0", "ens2f0")):
        ppci = f"0000:3{pf}:00.0"
        devs.append(RdmaDevice(f"pf{pf}", pci=ppci, ports=(RdmaPort(f"pf{pf}", 1, "Ethernet", netdevs=(nd,)),)))
        for i in range(n):
            devs.append(RdmaDevice(f"vf{pf}_{i}", pci=f"0000:3{pf}:01.{i}", is_vf=True, pf_pci=ppci,
                                   ports=(RdmaPort(f"vf{pf}_{i}", 1, "Ethernet", netdevs=(f"{nd}v{i}",)),)))
    return Inventory(links=(Link("ens1f0", 2, speed_bps=CAP), Link("ens2f0", 3, speed_bps=CAP // 4)),
                     rdma=tuple(devs))


tenant_lists = st.lists(
    st.tuples(st.integers(1, 12), st.one_of(st.none(), st.integers(0, 40)), st.integers(0, 12), st.integers(0, 1)),
    min_size=1, max_size=13)


def _text(specs) -> str:
    rows = []
    for i, (g, extra, prio, pf) in enumerate(specs):
        lim = g + extra if extra is not None else None
        rows.append((f"t{i:02d}", g, lim, prio, f"vf{pf}_{i}"))
    # keep the sum of guarantees within the capacity minus the default reserve (config validation)
    total = sum(r[1] for r in rows)  # within the smaller uplink (25G) less the default reserve
    if total > 20:
        rows = [(n, max(1, g * 20 // total), lim, prio, dev) for n, g, lim, prio, dev in rows]
    return cfg_text(rows)


INV = many_vfs()


@settings(max_examples=60, deadline=None)
@given(tenant_lists, st.randoms(use_true_random=False))
def test_plan_invariants(specs, rnd):
    inv = INV
    text = _text(specs)
    p = planned(inv, text)
    cfg = config.load_text(text)
    for n in p.netdevs:
        assert sum(n.tc_bw_pct) == 100
        assert n.tc_bw_pct[dp.DEFAULT_TC] >= 1
        by = {t.name: t for t in cfg.tenants}
        for t in n.tenants:
            assert 0 <= t.tc < dp.MAX_TCS
            if by[t.tenant].guarantee_bps:
                assert t.share_pct >= 1, "a tenant with a guarantee got no ETS share"
            if t.maxrate_kbps:
                assert t.maxrate_kbps * 1000 * 100 >= t.share_pct * n.capacity_bps, "max rate below the share"
        # grouping: more distinct priorities than tenant TCs still fit, lowest ranks share TC7
        ranks = rp.priority_ranks(tuple(by[t.tenant] for t in n.tenants))
        for t in n.tenants:
            if t.dscp:
                assert t.tc in (dp.tc_of_rank(ranks[t.tenant]),) or any(
                    o.dscp == t.dscp and o.tc == t.tc for o in n.tenants if o.tenant != t.tenant)
    # the result does not depend on the order of the tenants in the file
    lines = text.splitlines()
    body = lines[1:]
    rnd.shuffle(body)
    assert planned(inv, "\n".join([lines[0]] + body) + "\n") == p


@given(st.dictionaries(st.integers(0, 7), st.integers(0, 10**12), min_size=1, max_size=8))
def test_shares_sum_to_100_and_every_used_tc_gets_one(weights):
    s = dp.shares(weights)
    assert sum(s.values()) == 100 and set(s) == set(weights) and min(s.values()) >= 1


def test_nine_priorities_group_the_lowest_ranks_in_tc7():
    rows = [(f"t{i}", 1, None, 100 - i, f"vf0_{i}") for i in range(9)]
    text = cfg_text(rows)
    p = planned(INV, text)
    tcs = {t.tenant: t.tc for t in p.netdevs[0].tenants}
    assert [tcs[f"t{i}"] for i in range(6)] == [1, 2, 3, 4, 5, 6]
    # ranks 6.. get the best-effort DSCP 0 by rank (DSCP_BY_RANK): never mapped, they stay in TC0, with a warning
    assert {tcs[f"t{i}"] for i in range(6, 9)} == {0}
    assert sum("DSCP 0 (best effort)" in w for w in p.warnings) == 3
    # with DSCPs of their own, ranks 6, 7 and 8 share TC7
    for i, d in zip(range(6, 9), (40, 42, 44)):
        text = text.replace(f"devices: [vf0_{i}]", f"devices: [vf0_{i}], trafficClass: {d << 2}")
    n = planned(INV, text).netdevs[0]
    tcs = {t.tenant: t.tc for t in n.tenants}
    assert {tcs[f"t{i}"] for i in range(6, 9)} == {7}
    assert (40, 7) in n.dscp_prio and (44, 7) in n.dscp_prio and n.tc_bw_pct[7] == 3


# -- diff and apply against a fake device layer -------------------------------------
class FakeDcb:
    """DcbClient's surface over in-memory DcbStates; ``drops`` = kinds a driver without the op ignores."""

    def __init__(self, netdevs, drops=()):
        self.states = {nd: dcb.DcbState(nd, ets=dcb.Ets(), maxrate_kbps=(0,) * 8) for nd in netdevs}
        self.drops = set(drops)
        self.mlx5_replaces = False  # mlx5: adding a DSCP's entry drops its old one; deleting that is ENOENT
        self.writes: list[tuple[str, str]] = []

    def get(self, nd):
        if nd not in self.states:
            raise dcb.DcbNotSupported("read", "DCB IEEE configuration", nd, "Operation not supported", 95)
        return self.states[nd]

    def set(self, nd, *, ets=None, maxrate_kbps=None, apps=()):
        s = self.states[nd]
        if ets is not None:
            self.writes.append((nd, "ets"))
            if "ets" not in self.drops:
                s = dataclasses.replace(s, ets=ets)
        if maxrate_kbps is not None:
            self.writes.append((nd, "maxrate"))
            if "maxrate" not in self.drops:
                # the driver keeps 100 Mbit/s steps
                s = dataclasses.replace(s, maxrate_kbps=tuple(r // 100_000 * 100_000 for r in maxrate_kbps))
        if apps:
            self.writes.append((nd, "app"))
            s = dataclasses.replace(s, apps=s.apps + tuple(a for a in apps if a not in s.apps))
        self.states[nd] = s

    def delete_apps(self, nd, apps):
        self.writes.append((nd, "app-del"))
        if self.mlx5_replaces:
            raise dcb.KernelError("delete", "APP entries", nd, "the driver refused: No such file or directory", 2)
        s = self.states[nd]
        self.states[nd] = dataclasses.replace(s, apps=tuple(a for a in s.apps if a not in apps))


def _reconcile(b: DcbBackend, ctx, inv):
    desired = b.plan(ctx)
    out = []
    for td in b.diff(desired, b.observe(None, inv)):
        out.append((td, b.apply(td) if td.ops else None))
    return out


def _ctx(inv, text):
    cfg = config.load_text(text.replace("60Gbps", "60050Mbps"))  # not a multiple of the driver's step
    return PlanInput(cfg, inv, tenancy(cfg, inv))


def test_apply_then_in_sync_is_no_op_and_foreign_entries_stay(tmp_path):
    inv = inventory(tmp_path)
    fake = FakeDcb(["ens1f0"])
    fake.states["ens1f0"] = dataclasses.replace(fake.states["ens1f0"], apps=(
        dcb.App(dcb.SEL_DSCP, 46, 5), dcb.App(dcb.SEL_DSCP, 26, 4), dcb.App(1, 0x8915, 3)))
    b = DcbBackend(client=fake)
    first = _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    (td, res), = first
    assert [type(o) for o in td.ops] == [SetEts, SetMaxrate, AddDscpApps, DeleteDscpApps]
    assert not res.failed and len(res.applied) == 4
    # 26:4 (a DSCP shaperd maps) was replaced; 46:5 (not shaperd's) and the EtherType entry stay
    assert set(fake.states["ens1f0"].apps) == {dcb.App(5, 46, 5), dcb.App(1, 0x8915, 3), dcb.App(5, 26, 1),
                                               dcb.App(5, 24, 2)}
    assert b.status()["ens1f0"].foreign_apps == ((46, 5),)
    n = len(fake.writes)
    (td2, res2), = _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    assert td2.ops == [] and res2 is None and len(fake.writes) == n, "an in-sync netdev got a write"
    assert fake.states["ens1f0"].maxrate_kbps[1] == 60_000_000  # 60.05 Gbit/s rounded by the driver: in sync


def test_an_already_replaced_entry_is_a_reached_delete(tmp_path):
    inv = inventory(tmp_path)
    fake = FakeDcb(["ens1f0"])
    fake.states["ens1f0"] = dataclasses.replace(fake.states["ens1f0"], apps=(dcb.App(dcb.SEL_DSCP, 26, 4),))
    fake.mlx5_replaces = True
    orig = fake.set

    def set_(nd, **kw):  # the driver's replacement of the old entry
        orig(nd, **kw)
        s = fake.states[nd]
        fake.states[nd] = dataclasses.replace(s, apps=tuple(a for a in s.apps if a != dcb.App(5, 26, 4)))

    fake.set = set_
    (td, res), = _reconcile(DcbBackend(client=fake), _ctx(inv, cfg_text(TWO)), inv)
    assert [type(o) for o in td.ops][-2:] == [AddDscpApps, DeleteDscpApps] and not res.failed


def test_a_write_that_does_not_stick_is_reported_once_and_not_resent(tmp_path):
    inv = inventory(tmp_path)
    fake = FakeDcb(["ens1f0"], drops={"maxrate"})
    b = DcbBackend(client=fake)
    (td, res), = _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    failed = [(type(op), str(e)) for op, e in res.failed]
    assert len(failed) == 1 and failed[0][0] is SetMaxrate
    assert "the kernel acknowledged, but the read-back max rates are" in failed[0][1]
    writes = list(fake.writes)
    (td2, res2), = _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    assert td2.ops == [] and fake.writes == writes, "the same non-sticking write was sent again"
    assert "maxrate did not stick on ens1f0" in td2.blocked
    assert b.status()["ens1f0"].not_sticking == ("maxrate",)
    # a new plan for the netdev sends it again
    (td3, _), = _reconcile(b, _ctx(inv, cfg_text(TWO).replace("60Gbps", "70Gbps")), inv)
    assert [type(o) for o in td3.ops] == [SetMaxrate]


def test_a_netdev_without_dcb_is_a_read_error_for_its_target(tmp_path):
    inv = inventory(tmp_path)
    b = DcbBackend(client=FakeDcb([]))
    ctx = _ctx(inv, cfg_text(TWO))
    (td,) = b.diff(b.plan(ctx), b.observe(None, inv))
    assert td.ops == [] and "Operation not supported (the driver of ens1f0 has no DCB)" in td.error


def test_a_node_without_roce_reads_nothing(tmp_path):
    inv = Inventory()
    b = DcbBackend(client=None)  # a real client would open a socket: none is needed
    cfg = config.load_text(cfg_text(TWO))
    desired = b.plan(PlanInput(cfg, inv, tenancy(cfg, inv)))
    assert desired.netdevs == () and b.diff(desired, b.observe(None, inv)) == [] and b._client is None


def test_pfc_is_read_and_reported_never_written(tmp_path):
    inv = inventory(tmp_path)
    fake = FakeDcb(["ens1f0"])
    fake.states["ens1f0"] = dataclasses.replace(fake.states["ens1f0"], pfc=dcb.Pfc(8, 0b1000))
    b = DcbBackend(client=fake)
    _reconcile(b, _ctx(inv, cfg_text(TWO)), inv)
    s = b.status()["ens1f0"]
    assert s.pfc_priorities == (3,) and len(s.pfc_notes) == 2 and "priority 1" in s.pfc_notes[0]
    assert fake.states["ens1f0"].pfc == dcb.Pfc(8, 0b1000)


def test_readback_mismatch_in_diff_produces_the_write():
    want = dp.NetdevDcb("x", CAP, (50, 50, 0, 0, 0, 0, 0, 0), dscp_prio=((26, 1),))
    ok = dcb.DcbState("x", dcb.Ets(tc_tx_bw=want.tc_bw_pct, tc_tsa=want.tc_tsa, prio_tc=want.prio_tc), (0,) * 8,
                      (dcb.App(5, 26, 1),))
    obs = type("O", (), {"states": {"x": ok}, "errors": {}, "stuck": {}})()
    assert diff(dp.DcbPlan((want,)), obs)[0].ops == []
    off = dataclasses.replace(ok, ets=dataclasses.replace(ok.ets, tc_tx_bw=(40, 60, 0, 0, 0, 0, 0, 0)))
    obs.states = {"x": off}
    assert [type(o) for o in diff(dp.DcbPlan((want,)), obs)[0].ops] == [SetEts]


def test_maxrate_rounding_tolerance():
    assert maxrate_in_sync(0, 0) and maxrate_in_sync(60_050_000, 60_000_000)
    assert not maxrate_in_sync(0, 5) and not maxrate_in_sync(60_000_000, 60_000_001)
    assert not maxrate_in_sync(60_000_000, 0)


def _state_of(n) -> dcb.DcbState:
    return dcb.DcbState(n.netdev, dcb.Ets(tc_tx_bw=n.tc_bw_pct, tc_tsa=n.tc_tsa, prio_tc=n.prio_tc),
                        n.maxrate_kbps, tuple(dcb.App(dcb.SEL_DSCP, d, p) for d, p in n.dscp_prio))


def _observed(states):
    from shaperd.backends.dcb.backend import DcbObserved

    return DcbObserved(states=dict(states))


@settings(max_examples=40, deadline=None)
@given(tenant_lists, st.integers(0, 7), st.integers(1, 50))
def test_diff_in_sync_is_no_op_and_any_drift_is_one_write(specs, tc, delta):
    p = planned(INV, _text(specs))
    states = {n.netdev: _state_of(n) for n in p.netdevs}
    assert all(td.ops == [] and td.blocked is None for td in diff(p, _observed(states)))
    for n in p.netdevs:
        s = states[n.netdev]
        bw = list(s.ets.tc_tx_bw)
        bw[tc] = (bw[tc] + delta) % 101
        drifted = {**states, n.netdev: dataclasses.replace(s, ets=dataclasses.replace(s.ets, tc_tx_bw=tuple(bw)))}
        got = {td.target: [type(op) for op in td.ops] for td in diff(p, _observed(drifted))}
        assert got[n.netdev] == ([SetEts] if tuple(bw) != n.tc_bw_pct else [])


def test_fewer_tcs_than_needed_or_no_ets_report_blocks_ets_but_not_app():
    want = dp.NetdevDcb("x", CAP, (50, 30, 20, 0, 0, 0, 0, 0), maxrate_kbps=(0, 5, 0, 0, 0, 0, 0, 0),
                        dscp_prio=((26, 1),))
    two_tcs = dcb.DcbState("x", dcb.Ets(ets_cap=2), (0,) * 8)
    (td,) = diff(dp.DcbPlan((want,)), _observed({"x": two_tcs}))
    assert [type(o) for o in td.ops] == [AddDscpApps]
    assert "supports 2 ETS traffic classes, the plan needs 3" in td.blocked
    no_ets = dcb.DcbState("x", None, None)
    (td,) = diff(dp.DcbPlan((want,)), _observed({"x": no_ets}))
    assert [type(o) for o in td.ops] == [AddDscpApps] and "reports no ETS" in td.blocked


def test_teardown_lifts_max_rates_and_leaves_shares_and_apps():
    b = DcbBackend(client=FakeDcb([]))
    capped = dcb.DcbState("x", dcb.Ets(tc_tx_bw=(50, 50, 0, 0, 0, 0, 0, 0)), (0, 5, 0, 0, 0, 0, 0, 0),
                          (dcb.App(5, 26, 1),))
    free = dcb.DcbState("y", dcb.Ets(), (0,) * 8)
    tds = kept(b.teardown(_observed({"x": capped, "y": free})))  # y has nothing to lift: the engine drops it
    assert [(td.target, [type(o) for o in td.ops]) for td in tds] == [("x", [SetMaxrate])]
    assert tds[0].ops[0].maxrate_kbps == (0,) * 8
