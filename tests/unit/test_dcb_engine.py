"""The DCB backend under the engine: apply, then an in-sync reconcile sends nothing; no RoCE means no reads."""

from __future__ import annotations

from shaperd.core import config
from shaperd.backends.dcb.backend import DcbBackend
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.core.inventory import Capabilities
from shaperd.core.roots import Roots

from ..rdma_fixture import Node
from .test_dcb_plan import TWO, FakeDcb, cfg_text
from .test_engine import FakeReader


def test_apply_twice_the_second_reconcile_writes_nothing(tmp_path):
    roots = Roots.of(sys=str(Node(tmp_path).build().sys), proc=str(tmp_path))
    fake = FakeDcb(["ens1f0"])
    rec = Reconciler(FakeReader(), [DcbBackend(client=fake)], Capabilities(), roots=roots)
    cfg = config.load_text("node: {capacity: 100Gbps}\n" + cfg_text(TWO))
    first = rec.apply(cfg)
    assert first.changes == 3 and first.ok, [d.failed for d in first.devices]
    writes = list(fake.writes)
    second = rec.apply(cfg)
    assert second.changes == 0 and second.ok and fake.writes == writes


def test_default_backends_on_a_node_without_roce_open_no_dcb_socket(tmp_path):
    roots = Roots.of(sys=str(tmp_path / "sys"), proc=str(tmp_path), run=str(tmp_path / "run"))
    backends = default_backends(writer=None, roots=roots)
    dcb = next(b for b in backends if b.name == "dcb")
    rec = Reconciler(FakeReader(), [dcb], Capabilities(), roots=roots)
    rep = rec.diff(config.load_text(cfg_text(TWO)))
    assert rep.changes == 0 and not rep.devices and dcb._client is None
