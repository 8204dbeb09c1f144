"""The VF-rate plan and diff, pure: sysfs places of VFs, the split of guarantee and limit, ownership.

Property tests (hypothesis): per-VF rates stay within the tenant's guarantee and limit, the VFs'
minimums sum to at most the guarantee (and their caps to at most the limit), min <= max per VF,
and the plan does not depend on the order of tenants or devices.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from shaperd.core import config
from shaperd.rdma import plan as rp
from shaperd.backends.vfrate import plan as vp
from shaperd.backends.vfrate.diff import VfObserved, diff, teardown
from shaperd.backends.vfrate.render import render
from shaperd.core.config import Config, Node as CfgNode, Rdma, RdmaDeviceRef, Tenant
from shaperd.discovery import rdma
from shaperd.core.inventory import Inventory, Link, RdmaDevice, RdmaPort
from shaperd.backends.vfrate.kernel import PfVfs, VfRateRow
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..rdma_fixture import Node

CFG = """
tenants:
  - name: tenant-a
    bandwidthGuarantee: 10Gbps
    bandwidthLimit: 25Gbps
    priority: 100
    rdma: {devices: ["0000:3b:00.2", "mlx5_3"]}
  - name: tenant-b
    bandwidthGuarantee: 20Gbps
    priority: 50
    rdma: {devices: ["mlx5_0", "mlx5_1"]}
"""


def fixture_plan(tmp_path, text=CFG, **kw):
    devs, notes = rdma.discover(Roots.of(sys=str(Node(tmp_path).build().sys)))
    cfg = config.load_text(text)
    inv = Inventory(links=(Link("ens1f0", 5),), rdma=devs, rdma_notes=notes)
    return vp.plan(cfg, inv, rp.plan(cfg, inv, tenancy(cfg, inv)), **kw)


def test_discovery_places_each_vf_on_its_pf_from_sysfs(tmp_path):
    devs, _ = rdma.discover(Roots.of(sys=str(Node(tmp_path).build().sys)))
    by = {d.name: d for d in devs}
    assert [(by[n].vf_index, by[n].pf_netdev, by[n].pf_driver) for n in ("mlx5_2", "mlx5_3")] == [
        (0, "ens1f0", "mlx5_core"), (1, "ens1f0", "mlx5_core")]
    assert (by["mlx5_0"].vf_index, by["mlx5_0"].pf_netdev) == (None, None)  # a PF is not placed


def test_the_guarantee_and_limit_are_split_equally_over_the_tenants_vfs(tmp_path):
    p = fixture_plan(tmp_path)
    assert [(v.tenant, v.pf, v.vf, v.pci, v.min_mbps, v.max_mbps) for v in p.vfs] == [
        ("tenant-a", "ens1f0", 0, "0000:3b:00.2", 5000, 12500),
        ("tenant-a", "ens1f0", 1, "0000:3b:00.3", 5000, 12500)]
    assert p.pfs == ("ens1f0",) and p.warnings == ()  # tenant-b holds a PF and an HCA: no VF, no rates


def test_no_limit_is_max_0_and_fewer_vfs_are_recomputed(tmp_path):
    text = CFG.replace("bandwidthLimit: 25Gbps", "").replace('"0000:3b:00.2", "mlx5_3"', '"mlx5_3"')
    p = fixture_plan(tmp_path, text)
    assert [(v.vf, v.min_mbps, v.max_mbps) for v in p.vfs] == [(1, 10000, 0)]


def test_a_refused_minimum_plans_the_limit_only_and_says_so(tmp_path):
    p = fixture_plan(tmp_path, refused_min={("0000:3b:00.0", "mlx5_core"): "Invalid argument"})
    assert [(v.min_mbps, v.max_mbps, v.wanted_min_mbps) for v in p.vfs] == [(0, 12500, 5000)] * 2
    assert p.degraded == {"ens1f0": "Invalid argument"}
    assert any("limit only" in w and "ens1f0" in w for w in p.warnings)
    q = fixture_plan(tmp_path / "again", unsupported={("0000:3b:00.0", "mlx5_core"): "Operation not supported"})
    assert q.vfs == () and q.unsupported == {"ens1f0": "Operation not supported"}


def test_a_vf_whose_pf_netdev_is_elsewhere_gets_no_rates_and_a_warning(tmp_path):
    devs, _ = rdma.discover(Roots.of(sys=str(Node(tmp_path).build().sys)))
    cfg = config.load_text(CFG)
    inv = Inventory(links=(), rdma=devs)
    p = vp.plan(cfg, inv, rp.plan(cfg, inv, tenancy(cfg, inv)))
    assert p.vfs == () and len(p.warnings) == 2 and "not in this network namespace" in p.warnings[0]


def test_render_is_ip_link_commands(tmp_path):
    text = render(fixture_plan(tmp_path))
    assert "ip link set dev ens1f0 vf 0 min_tx_rate 5000 max_tx_rate 12500" in text.splitlines()
    assert "ip link set dev ens1f0 vf 1 min_tx_rate 5000 max_tx_rate 12500" in text.splitlines()
    assert render(vp.VfPlan()) == ""


# ---------------------------------------------------------------- properties

def _inv(n_pfs: int, vfs_per_pf: int) -> Inventory:
    links, devs = [], []
    for p in range(n_pfs):
        links.append(Link(f"pf{p}", 10 + p))
        for v in range(vfs_per_pf):
            name = f"mlx5_{p}_{v}"
            devs.append(RdmaDevice(name=name, pci=f"0000:{p + 1:02x}:00.{v + 1}", is_vf=True,
                                   pf_pci=f"0000:{p + 1:02x}:00.0", vf_index=v, pf_netdev=f"pf{p}",
                                   pf_driver="mlx5_core", ports=(RdmaPort(name, 1, "Ethernet"),)))
    return Inventory(links=tuple(links), rdma=tuple(devs))


@st.composite
def scenario(draw):
    n_pfs, per = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    inv = _inv(n_pfs, per)
    names = [d.name for d in inv.rdma]
    tenants = []
    free = list(names)
    for i in range(draw(st.integers(1, 4))):
        g = draw(st.integers(0, 400_000_000_000))
        limit = draw(st.one_of(st.none(), st.integers(max(g, 1), 400_000_000_000)))
        mine = draw(st.lists(st.sampled_from(names), max_size=len(names), unique=True)) if free else []
        tenants.append(Tenant(name=f"t{i}", guarantee_bps=g, limit_bps=limit, priority=100 - i,
                              rdma=Rdma(devices=tuple(RdmaDeviceRef(name=n) for n in mine))))
    return inv, tenants, draw(st.randoms(use_true_random=False))


def _run(inv, tenants):
    cfg = Config(node=CfgNode(), tenants=tuple(tenants))
    return vp.plan(cfg, inv, rp.plan(cfg, inv, tenancy(cfg, inv)))


@settings(max_examples=200, deadline=None)
@given(scenario())
def test_per_vf_rates_stay_within_the_guarantee_and_limit_and_do_not_depend_on_order(s):
    inv, tenants, rnd = s
    p = _run(inv, tenants)
    by_t = {t.name: t for t in tenants}
    for name, t in by_t.items():
        mine = [v for v in p.vfs if v.tenant == name]
        assert sum(v.min_mbps for v in mine) * vp.MBIT <= t.guarantee_bps
        for v in mine:
            assert v.min_mbps * vp.MBIT <= t.guarantee_bps
            if t.limit_bps is not None:
                assert 1 <= v.max_mbps and v.min_mbps <= v.max_mbps
                assert v.max_mbps * vp.MBIT <= max(t.limit_bps, vp.MBIT)
                if t.limit_bps // vp.MBIT >= len(mine):
                    assert sum(v.max_mbps for v in mine) * vp.MBIT <= t.limit_bps
            else:
                assert v.max_mbps == 0
    assert len({v.key for v in p.vfs}) == len(p.vfs)  # a VF is never planned twice
    shuffled_t = list(tenants)
    rnd.shuffle(shuffled_t)
    shuffled_t = [replace(t, rdma=replace(t.rdma, devices=tuple(rnd.sample(t.rdma.devices, len(t.rdma.devices)))))
                  for t in shuffled_t]
    inv2 = Inventory(links=tuple(rnd.sample(inv.links, len(inv.links))), rdma=tuple(rnd.sample(inv.rdma, len(inv.rdma))))
    assert _run(inv2, shuffled_t).vfs == p.vfs


@settings(max_examples=100, deadline=None)
@given(scenario())
def test_diff_of_the_plan_against_itself_is_empty_and_against_zero_sets_every_vf(s):
    inv, tenants, _ = s
    p = _run(inv, tenants)
    synced = _observed(p, lambda v: VfRateRow(v.vf, v.min_mbps, v.max_mbps))
    assert all(not d.ops and not d.blocked for d in diff(p, synced, {}))
    zero = _observed(p, lambda v: VfRateRow(v.vf, 0, 0))
    ops = [op for d in diff(p, zero, {}) for op in d.ops]
    want = {v.key for v in p.vfs if (v.min_mbps, v.max_mbps) != (0, 0)}
    assert {(op.device, op.vf) for op in ops} == want


def _observed(p, row) -> VfObserved:
    pfs = {}
    for v in p.vfs:
        cur = pfs.get(v.pf)
        rows = (cur.vfs if cur else ()) + (row(v),)
        pfs[v.pf] = PfVfs(v.pf_ifindex, v.pf, len(rows), rows, True)
    return VfObserved(pfs=pfs, ifindexes={v.pf: v.pf_ifindex for v in p.vfs})


# ---------------------------------------------------------------- diff and ownership

def _obs(*rows, reported=True):
    return VfObserved(pfs={"ens1f0": PfVfs(5, "ens1f0", len(rows), tuple(rows), reported)}, ifindexes={"ens1f0": 5})


def test_diff_sets_changed_vfs_leaves_foreign_ones_and_compares_tx_rate_only_drivers_on_max(tmp_path):
    p = fixture_plan(tmp_path)
    obs = _obs(VfRateRow(0, 0, 0), VfRateRow(1, None, 12500), VfRateRow(2, 50, 70))  # VF 2: nobody's, not ours
    (d,) = diff(p, obs, {})
    assert [(op.vf, op.min_mbps, op.max_mbps, op.tenant) for op in d.ops] == [(0, 5000, 12500, "tenant-a")]
    assert d.ops[0].describe() == ("set VF 0 rates min 5000 max 12500 Mbit/s on ens1f0 (tenant tenant-a): "
                                   "was min 0 max 0 Mbit/s")


def test_a_vf_shaperd_set_is_reset_when_no_tenant_owns_it_and_only_if_unchanged():
    ours = {("ens1f0", 2): (100, 1000), ("ens1f0", 3): (100, 1000)}
    obs = _obs(VfRateRow(2, 100, 1000), VfRateRow(3, 0, 777))  # someone changed VF 3 since: not ours now
    (d,) = diff(vp.VfPlan(), obs, ours)
    assert [(op.vf, op.min_mbps, op.max_mbps) for op in d.ops] == [(2, 0, 0)]
    assert [(op.vf,) for t in teardown(obs, ours) for op in t.ops] == [(2,)]
    assert teardown(obs, {}) == []  # without its record shaperd resets nothing


def test_a_pf_without_vf_info_or_a_missing_vf_is_blocked_not_written(tmp_path):
    p = fixture_plan(tmp_path)
    (d,) = diff(p, _obs(reported=False), {})
    assert not d.ops and "reports no VF info" in d.blocked
    (d,) = diff(p, _obs(VfRateRow(0, 5000, 12500)), {})
    assert not d.ops and "VF 1 (0000:3b:00.3, tenant tenant-a) is not among ens1f0's VFs" in d.blocked
    (d,) = diff(p, VfObserved(errors={"ens1f0": "get VF rates on ens1f0: boom"}), {})
    assert d.error == "get VF rates on ens1f0: boom"
