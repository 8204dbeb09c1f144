"""The vfrate backend through the generic reconciler, on a fixture sysfs tree and a fake NIC.

The fake NIC stands in for kernel/vf.py (read and write are injected) and behaves as the drivers do:
mlx5 takes both rates; i40e/ixgbe refuse any minimum with EINVAL; ice refuses one with EOPNOTSUPP
while DCB is on; a device without VF rates refuses everything. Asserted: the first reconcile sets
each VF once, an in-sync reconcile sends nothing, a refused minimum degrades to the limit only with
one write more and never again (status says so), a config change tries again, VFs that go are
recomputed and reset only when shaperd set them.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from shaperd.core import config
from shaperd.core.protocol import ApplyResult
from shaperd.backends.vfrate.backend import VfRateBackend
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.core.inventory import Capabilities
from shaperd.kernel.rtnl_rows import LinkRow
from shaperd.backends.vfrate.kernel import REFUSED_ERRNOS, PfVfs, VfRateRow
from shaperd.core.roots import Roots

from ..rdma_fixture import Node

CFG = """
tenants:
  - name: tenant-a
    bandwidthGuarantee: 10Gbps
    bandwidthLimit: 25Gbps
    priority: 100
    rdma: {devices: ["mlx5_2", "mlx5_3"]}
  - name: tenant-b
    bandwidthGuarantee: 5Gbps
    priority: 50
"""


class Reader:
    def links(self):
        return [LinkRow(1, "lo", "", 65536, True), LinkRow(5, "ens1f0", "", 1500, True)]

    def routes(self, family):
        return []


class FakeNic:
    """VF rates of PF ens1f0 as a driver keeps them; ``driver`` picks what it refuses."""

    refused_errnos = REFUSED_ERRNOS

    def __init__(self, driver="mlx5", vfs=4):
        self.driver = driver
        self.rates = {n: (0, 0) for n in range(vfs)}
        self.writes: list[tuple[int, int, int]] = []
        self.reads = 0

    def read(self, reads, ifindex, device):
        self.reads += 1
        assert (ifindex, device) == (5, "ens1f0")
        if self.driver == "veth":
            return PfVfs(5, device, None)
        return PfVfs(5, device, len(self.rates), tuple(VfRateRow(n, lo, hi) for n, (lo, hi) in self.rates.items()),
                     True)

    def _refuses(self, lo, hi):
        if self.driver in ("i40e", "ixgbe") and lo:
            return errno.EINVAL
        if self.driver == "ice-dcb" and lo:
            return errno.EOPNOTSUPP
        if self.driver in ("veth", "none"):
            return errno.EOPNOTSUPP
        return None

    def write(self, writer, ops):
        res = ApplyResult()
        for op in ops:
            self.writes.append((op.vf, op.min_mbps, op.max_mbps))
            code = self._refuses(op.min_mbps, op.max_mbps)
            if code:
                res.failed.append((op, op.error(os.strerror(code), code)))
            else:
                self.rates[op.vf] = (op.min_mbps, op.max_mbps)
                res.applied.append(op)
        return res


@pytest.fixture
def rig(tmp_path):
    node = Node(tmp_path).build()
    roots = Roots.of(sys=str(node.sys), proc=str(tmp_path / "proc"), run=str(tmp_path / "run"))

    def make(driver="mlx5", state_file=None, nic=None):
        nic = nic or FakeNic(driver)
        backend = VfRateBackend(writer=None, kernel=nic, state_file=state_file)
        rec = Reconciler(Reader(), [backend], Capabilities(), roots=roots)
        return nic, backend, rec
    return make


def ops(rep):
    return [(op.vf, op.min_mbps, op.max_mbps) for t in rep.devices for op in t.ops]


def test_first_reconcile_sets_each_vf_once_and_an_in_sync_one_sends_nothing(rig):
    nic, backend, rec = rig()
    cfg = config.load_text(CFG)
    rep = rec.apply(cfg)
    assert rep.ok, rep.devices
    assert ops(rep) == [(0, 5000, 12500), (1, 5000, 12500)] and nic.rates[2] == (0, 0)
    n = len(nic.writes)
    rep = rec.apply(cfg)
    assert rep.ok and ops(rep) == [] and len(nic.writes) == n == 2
    assert backend.status() == {"ens1f0": {"driver": "mlx5_core", "min_rate_supported": True, "reason": None}}
    assert backend.snapshot.observed.pfs["ens1f0"].vf(0) == VfRateRow(0, 5000, 12500)


@pytest.mark.parametrize("driver,cause", [("i40e", "Invalid argument"), ("ixgbe", "Invalid argument"),
                                          ("ice-dcb", "Operation not supported")])
def test_a_refused_minimum_degrades_to_the_limit_once_and_is_never_retried(rig, driver, cause):
    nic, backend, rec = rig(driver)
    cfg = config.load_text(CFG)
    rep = rec.apply(cfg)
    assert rep.ok, rep.devices  # the limit landed: the reconcile is not a failure to retry
    # One refused write with the minimum, then the limit only; the second VF goes straight to the limit.
    assert nic.writes == [(0, 5000, 12500), (0, 0, 12500), (1, 0, 12500)]
    assert nic.rates[0] == (0, 12500) and nic.rates[1] == (0, 12500)
    assert [w for w in nic.writes if w[1]] == [(0, 5000, 12500)]  # the refused minimum was sent once
    assert backend.status()["ens1f0"] == {"driver": "mlx5_core", "min_rate_supported": False, "reason": cause}
    n = len(nic.writes)
    for _ in range(3):  # the engine's retries and resyncs
        rep = rec.apply(cfg)
        assert rep.ok and ops(rep) == []
    assert len(nic.writes) == n
    assert any("limit only" in w for w in rep.plan.warnings)


def test_the_second_vf_of_a_refusing_pf_never_sends_the_minimum(rig):
    nic, backend, rec = rig("i40e")
    rec.apply(config.load_text(CFG))
    assert nic.writes == [(0, 5000, 12500), (0, 0, 12500), (1, 0, 12500)]
    rep = rec.apply(config.load_text(CFG))
    assert [op.reason for t in rep.devices for op in t.ops] == []


def test_a_config_change_tries_the_minimum_again(rig):
    nic, backend, rec = rig("i40e")
    rec.apply(config.load_text(CFG))
    n = len(nic.writes)
    rep = rec.apply(config.load_text(CFG.replace("10Gbps", "8Gbps")))
    assert nic.writes[n] == (0, 4000, 12500)  # tried once more, refused again, limit only
    assert backend.status()["ens1f0"]["min_rate_supported"] is False and rep.ok


def test_a_pf_that_refuses_every_rate_is_left_out_after_one_try(rig):
    nic, backend, rec = rig("none")
    cfg = config.load_text(CFG)
    rep = rec.apply(cfg)
    assert not rep.ok and rep.devices[0].failed
    err = rep.devices[0].failed[0][1]
    assert str(err).startswith("set VF 0 rates min 0 max 12500 Mbit/s on ens1f0: Operation not supported")
    n = len(nic.writes)
    rep = rec.apply(cfg)
    assert len(nic.writes) == n and ops(rep) == []
    assert any("refused VF rates" in w for w in rep.plan.warnings)


def test_vfs_that_go_are_recomputed_and_the_one_no_tenant_owns_is_reset_because_shaperd_set_it(rig):
    nic, backend, rec = rig()
    rec.apply(config.load_text(CFG))
    nic.rates[2] = (7, 70)  # someone else's VF: read, never written
    rep = rec.apply(config.load_text(CFG.replace('"mlx5_2", "mlx5_3"', '"mlx5_3"')))
    assert ops(rep) == [(0, 0, 0), (1, 10000, 25000)]  # VF 0 (mlx5_2) is nobody's now: back to 0/0
    assert nic.rates == {0: (0, 0), 1: (10000, 25000), 2: (7, 70), 3: (0, 0)}
    assert rec.apply(config.load_text(CFG.replace('"mlx5_2", "mlx5_3"', '"mlx5_3"'))).changes == 0
    assert backend.ours == {("ens1f0", 1): (10000, 25000)}


def test_teardown_resets_what_this_agent_set(rig):
    nic, backend, rec = rig()
    rec.apply(config.load_text(CFG))
    rep = rec.teardown()
    assert sorted(ops(rep)) == [(0, 0, 0), (1, 0, 0)] and nic.rates[0] == nic.rates[1] == (0, 0)
    assert backend.ours == {}


def test_a_node_without_vfs_reads_nothing_and_writes_nothing(rig):
    nic, backend, rec = rig()
    rep = rec.apply(config.load_text(CFG.replace('"mlx5_2", "mlx5_3"', '"mlx5_1"')))
    assert rep.ok and ops(rep) == [] and nic.reads == 0 and nic.writes == []


def test_a_pf_reporting_no_vf_info_is_blocked_never_written(rig):
    nic, backend, rec = rig("veth")
    rep = rec.apply(config.load_text(CFG))
    assert nic.writes == [] and "reports no VF info" in rep.devices[0].blocked


def test_default_backends_include_vfrate_on_the_shared_writer():
    b = next(b for b in default_backends(writer="w") if isinstance(b, VfRateBackend))
    assert b.writer == "w" and b.name == "vfrate"


def test_a_restarted_agent_and_teardown_reset_what_the_record_says_shaperd_set(rig, tmp_path):
    record = tmp_path / "run" / "shaperd" / "vfrate-owned.json"
    nic, backend, rec = rig(state_file=record)
    rec.apply(config.load_text(CFG))
    assert json.loads(record.read_text())["vfs"] == [
        {"pf": "ens1f0", "vf": 0, "min_mbps": 5000, "max_mbps": 12500},
        {"pf": "ens1f0", "vf": 1, "min_mbps": 5000, "max_mbps": 12500}]
    nic.rates[1] = (1, 2)  # an operator changed VF 1 by hand since: it is not shaperd's to reset
    _, fresh, rec2 = rig(state_file=record, nic=nic)  # a new process: `shaperd teardown`
    rep = rec2.teardown()
    assert ops(rep) == [(0, 0, 0)] and nic.rates[0] == (0, 0) and nic.rates[1] == (1, 2)
    assert json.loads(record.read_text())["vfs"] == []  # VF 0 reset, VF 1 forgotten: someone else's now


def test_an_unreadable_record_resets_nothing(rig, tmp_path):
    record = tmp_path / "owned.json"
    record.write_text("{not json")
    nic, backend, rec = rig(state_file=record)
    nic.rates[0] = (5000, 12500)
    assert backend.ours == {} and ops(rec.teardown()) == [] and nic.writes == []
