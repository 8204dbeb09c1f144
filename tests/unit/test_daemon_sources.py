"""The daemon's issue-12 wiring: the effective config after Volcano weights, and the bounded wait for Volcano."""

from __future__ import annotations

from types import SimpleNamespace

from shaperd.core import config
from shaperd.daemon import service as daemon_mod
from shaperd.daemon.service import VOLCANO_SYNC_WAIT_S, Daemon

CFG = config.load_text("""
tenants:
  - {name: a, bandwidthGuarantee: 1Gbps, priority: 1, priorityFrom: volcanoQueue, match: {volcanoQueues: [qa]}}
  - {name: b, bandwidthGuarantee: 1Gbps, priority: 5}
""")


class FakeView:
    def __init__(self, synced: bool, weights: dict):
        self.has_synced, self.weights, self.started = synced, weights, False

    def start(self):
        self.started = True

    def effective(self, cfg):
        from shaperd.discovery.kubernetes.volcano import with_queue_priorities

        return with_queue_priorities(cfg, self.weights)


class FakeRec:
    def __init__(self):
        self.applied = []

    def apply(self, cfg):
        self.applied.append(cfg)
        return SimpleNamespace(devices=[], problems=(), changes=0, planned_devices=(), duration_s=0.0, ok=True)


def _daemon(view, monkeypatch, clock):
    d = Daemon("/nonexistent", None, volcano_factory=lambda on_change: view)
    d.config = CFG
    d._observe = lambda *a, **kw: None
    monkeypatch.setattr(daemon_mod.time, "monotonic", lambda: clock[0])
    return d


def test_the_reconcile_enforces_queue_weights_and_counts_a_weight_change_as_config(monkeypatch):
    view, rec, clock = FakeView(True, {"qa": 10}), FakeRec(), [100.0]
    d = _daemon(view, monkeypatch, clock)
    d.reconcile(rec)
    assert view.started and rec.applied[-1].tenant("a").priority == 10
    gen = d.config_gen
    view.weights = {"qa": 3}
    d.reconcile(rec)
    assert rec.applied[-1].tenant("a").priority == 3 and d.config_gen == gen + 1


def test_a_volcano_that_never_lists_delays_enforcement_only_boundedly(monkeypatch):
    view, rec, clock = FakeView(False, {}), FakeRec(), [100.0]
    d = _daemon(view, monkeypatch, clock)
    assert d.reconcile(rec) is not None and rec.applied == []  # waits at first
    clock[0] += VOLCANO_SYNC_WAIT_S + 0.1
    d.reconcile(rec)
    assert rec.applied and rec.applied[-1].tenant("a").priority == 1  # then goes on with the configured priority
