"""The devlink backend: node names, plan, diff (with a fake device layer), apply order, read-back, render.

The fake device layer (``FakeDevlink``) keeps rate objects the way the
kernel does (a node needs a unique name, a leaf's parent must exist, a node
with children cannot be deleted) and records every write, so tests see both
what was sent and what the tree looks like afterwards.
"""

from __future__ import annotations

import errno
import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from shaperd.core import config
from shaperd.backends.devlink import objects as o
from shaperd.backends.devlink.backend import DevlinkBackend
from shaperd.backends.devlink.diff import diff
from shaperd.backends.devlink.plan import plan
from shaperd.backends.devlink.render import render
from shaperd.discovery import rdma
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, Inventory, RdmaDevice, RdmaPort
from shaperd.kernel import devlink as nl
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..fake_netlink import FakeKernel
from ..rdma_fixture import Node
from .test_devlink_nl import exchanges as devlink_exchanges

PF = "pci/0000:3b:00.0"
CFG = """
tenants:
  - name: a
    bandwidthGuarantee: 10Mbps
    bandwidthLimit: 100Mbps
    priority: 100
    rdma: {devices: ["0000:3b:00.2"]}
  - name: b
    bandwidthGuarantee: 1Gbps
    priority: 50
    rdma: {devices: ["mlx5_3"]}
  - name: c
    bandwidthGuarantee: 1Gbps
    priority: 10
    rdma: {devices: ["mlx5_1"]}
"""


_trees = itertools.count()


def inputs(tmp_path, text=CFG):
    root = tmp_path / f"node{next(_trees)}"
    devs, notes = rdma.discover(Roots.of(sys=str(Node(root).build().sys)))
    cfg = config.load_text(text)
    inv = Inventory(rdma=devs, rdma_notes=notes)
    return cfg, inv


def planned(tmp_path, text=CFG):
    cfg, inv = inputs(tmp_path, text)
    return plan(cfg, inv, tenancy(cfg, inv))


class FakeDevlink:
    """A devlink device with VF ports 1 and 2 (VFs 0 and 1) and their leaves; writes recorded."""

    def __init__(self, rates=None, ports=None, fail=None, ignore_max=False):
        self.tree = {(r.instance, r.node or r.port_index): r for r in (rates if rates is not None else [
            nl.RateRow(PF, nl.RATE_TYPE_LEAF, port_index=1), nl.RateRow(PF, nl.RATE_TYPE_LEAF, port_index=2)])}
        self.port_rows = ports if ports is not None else [
            nl.PortRow(PF, 0, flavour=nl.PORT_FLAVOUR_PCI_PF, pf=0),
            nl.PortRow(PF, 1, flavour=nl.PORT_FLAVOUR_PCI_VF, pf=0, vf=0),
            nl.PortRow(PF, 2, flavour=nl.PORT_FLAVOUR_PCI_VF, pf=0, vf=1)]
        self.writes: list[tuple] = []
        self.reads = 0
        self.fail, self.ignore_max = fail or {}, ignore_max

    def family(self):
        return 0x15

    def rates_list(self):
        return list(self.tree.values())

    def rates(self):  # noqa: F811 - the DevlinkNl method name
        self.reads += 1
        return sorted(self.rates_list(), key=lambda r: (r.instance, str(r.node or r.port_index)))

    def ports(self):
        return list(self.port_rows)

    def _maybe_fail(self, key):
        if key in self.fail:
            raise self.fail[key]

    def _units(self, *rates):
        # netdevsim and mlx5 take whole Mbit/s only (seen in tests/kernel/test_netdevsim.py)
        if any(r is not None and r % 125_000 for r in rates):
            raise KernelError("set", "rate", PF, "Invalid argument (TX rate value not in link speed units of "
                              "1Mbps.)", errno.EINVAL)

    def new_node(self, inst, node, share, mx):
        self.writes.append(("new", inst, node, share, mx))
        self._maybe_fail(("new", node))
        self._units(share, mx)
        assert (inst, node) not in self.tree
        self.tree[(inst, node)] = nl.RateRow(inst, nl.RATE_TYPE_NODE, node=node, tx_share_Bps=share or 0,
                                              tx_max_Bps=0 if self.ignore_max else (mx or 0))

    def set_node(self, inst, node, share, mx):
        self.writes.append(("set", inst, node, share, mx))
        self._units(share, mx)
        r = self.tree[(inst, node)]
        self.tree[(inst, node)] = nl.RateRow(inst, r.type, node=node, parent=r.parent,
                                              tx_share_Bps=r.tx_share_Bps if share is None else share,
                                              tx_max_Bps=r.tx_max_Bps if mx is None else mx)

    def set_leaf_parent(self, inst, port, parent):
        self.writes.append(("parent", inst, port, parent))
        if parent and (inst, parent) not in self.tree:  # the order check: reconcile() fails on any failure
            raise KernelError("set", f"parent of rate leaf {inst}/{port}", inst, "a node must exist before a leaf "
                              "is parented to it", errno.EINVAL)
        r = self.tree[(inst, port)]
        if parent and r.parent:  # Linux 6.1 devlink_nl_rate_parent_node_set (seen in tests/kernel/test_netdevsim.py)
            raise KernelError("set", f"parent of rate leaf {inst}/{port}", inst, "Device or resource busy (Rate "
                              "object already has parent.)", errno.EBUSY)
        self.tree[(inst, port)] = nl.RateRow(inst, r.type, port_index=port, parent=parent or None)

    def del_node(self, inst, node):
        self.writes.append(("del", inst, node))
        assert not any(r.parent == node for r in self.tree.values() if r.instance == inst), \
            "leaves are un-parented before their node is deleted"
        if (inst, node) not in self.tree:
            raise KernelError("delete", f"rate node {node}", inst, "No such file or directory", errno.ENOENT)
        del self.tree[(inst, node)]

    def close(self):
        pass


def reconcile(b: DevlinkBackend, desired):
    """One read-diff-write pass, as the engine does it; the diffs."""
    diffs = b.diff(desired, b.observe(None, Inventory()))
    for d in diffs:
        if d.ops:
            res = b.apply(d)
            assert not res.failed, res.failed
    return diffs


# -- names ---------------------------------------------------------------------------------------

def test_node_names_are_prefixed_deterministic_and_bounded():
    assert o.node_name("tenant-a") == "shpd_tenant-a"
    long = "x" * 63
    n = o.node_name(long)
    assert n == o.node_name(long) and n.startswith("shpd_") and len(n) <= o.NAME_MAX_CHARS
    assert o.node_name(long) != o.node_name("x" * 62 + "y")  # same stem, different hash
    assert o.owned("shpd_a") and not o.owned("grp") and not o.owned(None)


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-", min_size=1, max_size=63))
def test_every_name_fits_devlink_and_iproute2(tenant):
    n = o.node_name(tenant)
    assert n.startswith(o.PREFIX) and len(n) <= o.NAME_MAX_CHARS and "/" not in n and not n.isdigit()


def test_a_name_collision_is_detected_and_plans_neither(tmp_path):
    long = "t" * 40
    clash = o.node_name(long)[len(o.PREFIX):]  # a tenant literally named like the other's hashed form
    text = f"""
tenants:
  - {{name: {long}, bandwidthGuarantee: 1Mbps, priority: 1, rdma: {{devices: ["mlx5_2"]}}}}
  - {{name: {clash}, bandwidthGuarantee: 1Mbps, priority: 1, rdma: {{devices: ["mlx5_3"]}}}}
"""
    p = planned(tmp_path, text)
    assert p.nodes == ()
    assert len(p.problems) == 2 and all("shared by" in str(x) for x in p.problems)


# -- plan ----------------------------------------------------------------------------------------

def test_plan_nodes_from_tenants_with_bytes_per_second(tmp_path):
    p = planned(tmp_path)
    assert p.nodes == (
        o.TenantNode("a", PF, "shpd_a", 1_250_000, 12_500_000, (o.Vf(PF, 0, "mlx5_2", "ens1f0"),)),
        o.TenantNode("b", PF, "shpd_b", 125_000_000, 0, (o.Vf(PF, 1, "mlx5_3", "ens1f0"),)),
    )  # c holds a dedicated HCA (not a VF): no rate group
    assert p.instances == (PF,)


def test_vf_numbers_come_from_the_pfs_virtfn_links(tmp_path):
    cfg, inv = inputs(tmp_path)
    assert {d.name: d.vf_index for d in inv.rdma} == {"mlx5_0": None, "mlx5_1": None, "mlx5_2": 0, "mlx5_3": 1}


def test_vfs_on_two_devlink_devices_split_the_guarantee_and_limit():
    cfg = config.load_text("""
tenants:
  - {name: a, bandwidthGuarantee: 8Mbps, bandwidthLimit: 80Mbps, priority: 1, rdma: {devices: [v0, v1]}}
""")
    port = lambda n: (RdmaPort(n, 1, "Ethernet"),)  # noqa: E731
    inv = Inventory(rdma=(
        RdmaDevice("v0", pci="0000:3b:00.2", is_vf=True, pf_pci="0000:3b:00.0", vf_index=0, ports=port("v0")),
        RdmaDevice("v1", pci="0000:3b:01.2", is_vf=True, pf_pci="0000:3b:00.1", vf_index=0, ports=port("v1"))))
    p = plan(cfg, inv, tenancy(cfg, inv))
    assert [(n.instance, n.tx_share_Bps, n.tx_max_Bps) for n in p.nodes] == [
        ("pci/0000:3b:00.0", 500_000, 5_000_000), ("pci/0000:3b:00.1", 500_000, 5_000_000)]
    assert any("1/2" in w for w in p.warnings)


tenant_st = st.tuples(st.integers(1, 10**11), st.one_of(st.none(), st.integers(1, 10**12)), st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(tenant_st, min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_plan_is_order_independent_and_share_never_above_max(specs, rnd):
    # VF v<i> is VF i//2 of PF 0000:3b:00.<i%2>; tenant i holds v<i>, and a second one (v<i+6>) when ``two``.
    devs = tuple(RdmaDevice(f"v{i}", pci=f"0000:3b:0{i + 1}.0", is_vf=True, pf_pci=f"0000:3b:00.{i % 2}",
                            vf_index=i // 2, ports=(RdmaPort(f"v{i}", 1, "Ethernet"),)) for i in range(12))
    tenants = []
    for i, (g, lim, two) in enumerate(specs):
        lim = None if lim is None else max(lim, g)
        tenants.append({"name": f"t{i}", "bandwidthGuarantee": f"{g}bps", "priority": 1,
                        "rdma": {"devices": [f"v{i}"] + ([f"v{i + 7}"] if two else [])}, **({"bandwidthLimit": f"{lim}bps"} if lim else {})})
    shuffled = list(tenants)
    rnd.shuffle(shuffled)
    plans = []
    for ts in (tenants, shuffled):
        cfg = config.load_text(json.dumps({"tenants": ts}))
        inv = Inventory(rdma=devs)
        plans.append(plan(cfg, inv, tenancy(cfg, inv)))
    a, b = plans
    assert a.nodes == b.nodes and sorted(a.warnings) == sorted(b.warnings)
    for n in a.nodes:
        assert n.tx_max_Bps == 0 or n.tx_share_Bps <= n.tx_max_Bps
    pfs = ("pci/0000:3b:00.0", "pci/0000:3b:00.1")
    obs = o.DevlinkObserved(rates=tuple(o.Rate(pf, port_index=i + 1) for pf in pfs for i in range(6)),
                            ports=tuple(o.Port(pf, i + 1, flavour=o.FLAVOUR_PCI_VF, vf=i) for pf in pfs for i in range(6)))
    assert [d.ops for d in diff(a, obs)] == [d.ops for d in diff(b, obs)]


# -- diff and apply, with the fake device layer -------------------------------------------------

def test_first_reconcile_creates_then_parents_and_the_second_sends_nothing(tmp_path):
    p = planned(tmp_path)
    fake = FakeDevlink()
    b = DevlinkBackend(lambda: fake)
    assert b.probe(Capabilities()).enabled
    reconcile(b, p)
    assert fake.writes == [("new", PF, "shpd_a", 1_250_000, 12_500_000), ("new", PF, "shpd_b", 125_000_000, None),
                           ("parent", PF, 1, "shpd_a"), ("parent", PF, 2, "shpd_b")]
    fake.writes.clear()
    diffs = reconcile(b, p)
    assert fake.writes == [] and all(not d.ops for d in diffs)  # in sync: no write


def test_changed_limit_is_one_set_with_only_that_field(tmp_path):
    fake = FakeDevlink()
    b = DevlinkBackend(lambda: fake)
    reconcile(b, planned(tmp_path))
    fake.writes.clear()
    reconcile(b, planned(tmp_path, CFG.replace("100Mbps", "200Mbps")))
    assert fake.writes == [("set", PF, "shpd_a", None, 25_000_000)]


def test_foreign_nodes_untouched_and_a_leaf_under_one_is_reported_not_moved(tmp_path):
    rates = [nl.RateRow(PF, nl.RATE_TYPE_NODE, node="ops_grp", tx_max_Bps=5),
             nl.RateRow(PF, nl.RATE_TYPE_LEAF, port_index=1, parent="ops_grp"),
             nl.RateRow(PF, nl.RATE_TYPE_LEAF, port_index=2)]
    fake = FakeDevlink(rates)
    b = DevlinkBackend(lambda: fake)
    diffs = reconcile(b, planned(tmp_path))
    assert ("parent", PF, 1, "shpd_a") not in fake.writes
    assert all(w[2] != "ops_grp" for w in fake.writes)
    assert fake.tree[(PF, "ops_grp")].tx_max_Bps == 5 and fake.tree[(PF, 1)].parent == "ops_grp"
    assert "under node ops_grp, not shaperd's: left there" in diffs[0].blocked


def test_stale_shaperd_node_unparented_then_deleted_foreign_kept(tmp_path):
    rates = [nl.RateRow(PF, nl.RATE_TYPE_NODE, node="shpd_gone", tx_share_Bps=1),
             nl.RateRow(PF, nl.RATE_TYPE_NODE, node="keepme"),
             nl.RateRow(PF, nl.RATE_TYPE_LEAF, port_index=1, parent="shpd_gone"),
             nl.RateRow(PF, nl.RATE_TYPE_LEAF, port_index=2, parent="shpd_gone")]
    fake = FakeDevlink(rates)
    b = DevlinkBackend(lambda: fake)
    reconcile(b, planned(tmp_path, CFG.split("  - name: b")[0]))  # only tenant a remains
    # leaf 1 goes off shpd_gone before it goes under shpd_a: the kernel refuses a second parent (EBUSY)
    assert fake.writes == [("new", PF, "shpd_a", 1_250_000, 12_500_000), ("parent", PF, 1, ""),
                           ("parent", PF, 1, "shpd_a"), ("parent", PF, 2, ""), ("del", PF, "shpd_gone")]
    assert (PF, "keepme") in fake.tree and (PF, "shpd_gone") not in fake.tree


def test_a_leaf_moves_between_shaperd_nodes_off_the_old_one_first(tmp_path):
    fake = FakeDevlink()
    b = DevlinkBackend(lambda: fake)
    reconcile(b, planned(tmp_path))
    fake.writes.clear()
    moved = CFG.replace('rdma: {devices: ["mlx5_3"]}', 'rdma: {devices: ["mlx5_9"]}').replace(
        'rdma: {devices: ["0000:3b:00.2"]}', 'rdma: {devices: ["0000:3b:00.2", "mlx5_3"]}')
    diffs = reconcile(b, planned(tmp_path, moved))  # VF 1 (port 2) goes from b to a; b has no VF left
    assert fake.writes == [("parent", PF, 2, ""), ("parent", PF, 2, "shpd_a"), ("del", PF, "shpd_b")], diffs
    assert fake.tree[(PF, 2)].parent == "shpd_a"


def test_rates_are_whole_mbit_per_second_rounded_down(tmp_path):
    odd = CFG.replace("10Mbps", "10500Kbps").replace("100Mbps", "100500Kbps")
    (a, _b) = planned(tmp_path, odd).nodes
    assert (a.tx_share_Bps, a.tx_max_Bps) == (1_250_000, 12_500_000)
    tiny = planned(tmp_path, CFG.replace("10Mbps", "100Kbps").replace("100Mbps", "200Kbps")).nodes[0]
    assert (tiny.tx_share_Bps, tiny.tx_max_Bps) == (0, 125_000)  # a limit stays a limit (0 is unlimited)
    fake = FakeDevlink()
    reconcile(DevlinkBackend(lambda: fake), planned(tmp_path, odd))
    assert ("new", PF, "shpd_a", 1_250_000, 12_500_000) in fake.writes


def test_teardown_removes_only_shaperds(tmp_path):
    fake = FakeDevlink()
    b = DevlinkBackend(lambda: fake)
    reconcile(b, planned(tmp_path))
    fake.tree[(PF, "ops")] = nl.RateRow(PF, nl.RATE_TYPE_NODE, node="ops")
    fake.writes.clear()
    for d in b.teardown(b.observe(None, Inventory())):
        assert not b.apply(d).failed
    assert fake.writes == [("parent", PF, 1, ""), ("parent", PF, 2, ""), ("del", PF, "shpd_a"), ("del", PF, "shpd_b")]
    assert set(fake.tree) == {(PF, 1), (PF, 2), (PF, "ops")}


def test_stale_node_with_a_foreign_child_node_is_left_and_said():
    obs = o.DevlinkObserved(rates=(o.Rate(PF, node="shpd_x"), o.Rate(PF, node="ops", parent="shpd_x")))
    (d,) = diff(o.DevlinkPlan(), obs)
    assert d.ops == [] and "stale node shpd_x left: node(s) ops are under it" in d.blocked


def test_device_without_rate_objects_is_blocked_without_writes(tmp_path):
    fake = FakeDevlink(rates=[], ports=[])
    b = DevlinkBackend(lambda: fake)
    diffs = reconcile(b, planned(tmp_path))
    assert fake.writes == [] and "no devlink rate objects" in diffs[0].blocked


def test_a_value_the_driver_did_not_keep_is_a_failure(tmp_path):
    fake = FakeDevlink(ignore_max=True)
    b = DevlinkBackend(lambda: fake)
    (d,) = b.diff(planned(tmp_path), b.observe(None, Inventory()))
    res = b.apply(d)
    (op, err), = [(op, e) for op, e in res.failed if op.node == "shpd_a"]
    assert "did not stick: tx_max reads 0 B/s" in str(err) and str(err).startswith("create rate node shpd_a")


def test_kernel_errors_name_the_node_and_do_not_stop_the_rest(tmp_path):
    fail = {("new", "shpd_a"): nl.RateUnsupported("create", "rate node shpd_a", PF, "Operation not supported",
                                                  errno.EOPNOTSUPP)}
    fake = FakeDevlink(fail=fail)
    b = DevlinkBackend(lambda: fake)
    (d,) = b.diff(planned(tmp_path), b.observe(None, Inventory()))
    res = b.apply(d)
    assert [str(e) for _, e in res.failed][0].startswith("create rate node shpd_a (tx_share 1250000 B/s")
    assert (PF, "shpd_b") in fake.tree


def test_an_unreadable_tree_is_an_error_and_no_write(tmp_path):
    class Broken(FakeDevlink):
        def rates(self):
            raise KernelError("dump", "devlink rate objects", "node", "Operation not permitted", errno.EPERM)
    b = DevlinkBackend(lambda: Broken())
    (d,) = b.diff(planned(tmp_path), b.observe(None, Inventory()))
    assert d.ops == [] and "Operation not permitted" in d.error


def test_absent_family_disables_with_one_note_and_nothing_else():
    sent = []

    class Absent(FakeDevlink):
        def family(self):
            sent.append("family")
            raise nl.DevlinkAbsent("resolve", "generic netlink family devlink", "node", "no devlink family",
                                   errno.ENOENT)
    b = DevlinkBackend(lambda: Absent())
    s = b.probe(Capabilities())
    assert not s.enabled and s.notes == ("devlink rate groups: no devlink family",) and sent == ["family"]
    assert b._nl is None  # the socket is closed


def test_render_prints_devlink_cli_lines_in_bit_units(tmp_path):
    p = planned(tmp_path)
    assert render(p, {(PF, 0): 1}) == (
        f"devlink port function rate add {PF}/shpd_a tx_share 10000000bit tx_max 100000000bit\n"
        f"devlink port function rate set {PF}/1 parent shpd_a\n"
        f"devlink port function rate add {PF}/shpd_b tx_share 1000000000bit\n"
        f"devlink port function rate set {PF}/<port of vf 1> parent shpd_b\n")


def test_rendered_rate_is_what_the_encoder_sends(tmp_path):
    """`tx_share 10000000bit` is what devlink turned into 1250000 B/s (fixture rate_add): same value both ways."""
    (n, _) = planned(tmp_path).nodes
    assert int(render(planned(tmp_path)).split("tx_share ")[1].split("bit")[0]) // 8 == n.tx_share_Bps == 1_250_000


def test_stats_snapshot_configured_and_read_back(tmp_path):
    fake = FakeDevlink()
    b = DevlinkBackend(lambda: fake)
    p = planned(tmp_path)
    assert b.stats(p).devices == (PF,)
    reconcile(b, p)
    assert [(c.tenant, c.node, c.tx_share_Bps, c.tx_max_Bps) for c in b.snapshot.configured] == [
        ("a", "shpd_a", 1_250_000, 12_500_000), ("b", "shpd_b", 125_000_000, 0)]
    assert b.snapshot.kernel[(PF, "shpd_a")] == (1_250_000, 12_500_000) and b.snapshot.read_ok


def _default_devlink():
    from shaperd.engine.reconciler import default_backends

    (b,) = [b for b in default_backends(writer=None) if b.name == "devlink"]
    return b


def test_default_backends_include_devlink_and_a_kernel_without_it_disables_it_with_one_note(monkeypatch):
    """The real DevlinkNl on the fake kernel, which answers the family lookup with the ENOENT recorded from a
    kernel without devlink (tests/unit/fixtures/devlink/family_absent.strace)."""
    kernel = FakeKernel().install(monkeypatch)
    b = _default_devlink()
    s = b.probe(Capabilities())
    assert not s.enabled and len(s.notes) == 1 and "no devlink family" in s.notes[0] and b._nl is None
    assert [(r.protocol, r.type) for r in kernel.requests] == [(16, 0x10)]  # the family lookup only
    assert all(sock.closed for sock in kernel.sockets)


def test_a_kernel_with_the_family_enables_the_default_devlink_backend(monkeypatch):
    """The family lookup answered as Debian's 6.1 kernel answered iproute2 (fixtures/devlink/rate_show.strace)."""
    ((_req, replies), *_rest) = devlink_exchanges("rate_show.strace")
    FakeKernel(genl_families={"devlink": replies}).install(monkeypatch)
    b = _default_devlink()
    try:
        assert b.probe(Capabilities()).enabled and b._nl.family() == 0x15
    finally:
        b.close()


def test_through_the_engine_the_second_apply_sends_no_write(tmp_path):
    """The reconciler (real discovery on a fixture sysfs tree) drives the backend: apply, then apply again."""
    from shaperd.engine.reconciler import Reconciler

    from .test_engine import FakeReader

    n = Node(tmp_path / "n").build()
    fake = FakeDevlink()
    rec = Reconciler(FakeReader(), [DevlinkBackend(lambda: fake)], Capabilities(),
                     roots=Roots.of(sys=str(n.sys), proc=str(tmp_path)))
    cfg = config.load_text(CFG)
    first = rec.apply(cfg)
    assert first.changes == 4 and not any(t.failed for t in first.devices)
    assert len(fake.writes) == 4
    second = rec.apply(cfg)
    assert second.changes == 0 and len(fake.writes) == 4 and second.ok


def _one_vf_plan(pf_netdev="ens1f1"):
    return o.DevlinkPlan((o.TenantNode("a", PF, "shpd_a", 125_000, 0, (o.Vf(PF, 0, "mlx5_9", pf_netdev),)),))


def test_a_vfs_port_is_found_by_its_pfs_pfnum_and_its_vfnum_not_by_index():
    # One devlink device with the VFs of two PFs (pfnum 0 and 1), each VF 0: the PF's own pcipf port says which.
    ports = (o.Port(PF, 10, flavour=o.FLAVOUR_PCI_PF, pf=0, netdev="ens1f0"),
             o.Port(PF, 11, flavour=o.FLAVOUR_PCI_PF, pf=1, netdev="ens1f1"),
             o.Port(PF, 1, flavour=o.FLAVOUR_PCI_VF, pf=0, vf=0), o.Port(PF, 2, flavour=o.FLAVOUR_PCI_VF, pf=1, vf=0))
    rates = (o.Rate(PF, port_index=1), o.Rate(PF, port_index=2))
    (d,) = diff(_one_vf_plan(), o.DevlinkObserved(rates, ports))
    assert [(op.port_index, op.parent) for op in d.ops if hasattr(op, "port_index")] == [(2, "shpd_a")]
    # Without pcipf ports, two pfnums are ambiguous: said, and no leaf is guessed.
    (d,) = diff(_one_vf_plan(), o.DevlinkObserved(rates, ports[2:]))
    assert not any(hasattr(op, "port_index") for op in d.ops) and "not guessed" in d.blocked
    # One pfnum only (mlx5's one PF per devlink device, netdevsim): that one.
    (d,) = diff(_one_vf_plan(), o.DevlinkObserved(rates[1:], ports[3:]))
    assert [(op.port_index, op.parent) for op in d.ops if hasattr(op, "port_index")] == [(2, "shpd_a")]


def test_the_pfs_devlink_handle_is_its_bus_and_device_name(tmp_path):
    node = Node(tmp_path).build()
    pf = node.sys / "devices" / "pci0000:3a" / "0000:3b:00.0"
    (node.sys / "bus" / "pci").mkdir(parents=True, exist_ok=True)
    (pf / "subsystem").symlink_to("../../../bus/pci")
    devs = {d.name: d for d in rdma.discover(Roots.of(sys=str(node.sys)))[0]}
    assert devs["mlx5_2"].pf_devlink == "pci/0000:3b:00.0" and devs["mlx5_0"].pf_devlink is None
    # No subsystem link (older fixture trees): the plan still names the PCI PF.
    assert {n.instance for n in planned(tmp_path).nodes} == {PF}
