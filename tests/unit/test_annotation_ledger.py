"""The ledger of refused pod annotations (engine/annotations.py): said once, counted once, forgotten when gone.

Then through the reconciler (fake backend, pods from a fake source): several reconciles log one warning
and count one refusal; the pod stays in its tenant, uncapped; a changed value is said again. And the
family on the daemon's metrics endpoint: every reason from 0. Plan and diff print every refusal.
"""

from __future__ import annotations

import logging

import pytest
import structlog
from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from shaperd.core import config
from shaperd.core.podcaps import EGRESS_ANNOTATION, INGRESS_ANNOTATION, REASONS, InvalidAnnotation
from shaperd.discovery.kubernetes.pods import FrozenMap, PodInfo
from shaperd.engine.annotations import AnnotationLedger
from tests.unit.test_engine import FakeBackend, reconciler


def refused(uid="u1", key=EGRESS_ANNOTATION, value="fast", reason="syntax") -> InvalidAnnotation:
    return InvalidAnnotation(uid, f"ns/{uid}", key, value, reason, "because")


def test_the_same_refusal_is_said_once_and_counted_once():
    ledger = AnnotationLedger()
    assert ledger.observe([refused()]) == [refused()]
    for _ in range(5):
        assert ledger.observe([refused()]) == []
    assert ledger.counts()["syntax"] == 1 and sum(ledger.counts().values()) == 1


def test_a_changed_value_is_new():
    ledger = AnnotationLedger()
    ledger.observe([refused(value="fast")])
    assert ledger.observe([refused(value="0", reason="zero")]) == [refused(value="0", reason="zero")]
    assert ledger.observe([refused(value="faster")]) == [refused(value="faster")]
    assert ledger.counts() == {**{r: 0 for r in REASONS}, "syntax": 2, "zero": 1}


def test_a_pod_that_goes_away_is_forgotten_and_said_again_if_it_comes_back():
    ledger = AnnotationLedger()
    ledger.observe([refused("u1"), refused("u2")])
    assert ledger.current == 2
    assert ledger.observe([refused("u2")]) == []  # u1 deleted
    assert ledger.current == 1
    assert ledger.observe([refused("u1"), refused("u2")]) == [refused("u1")]  # a new pod object, same uid
    assert ledger.counts()["syntax"] == 3


def test_a_value_fixed_and_broken_again_is_said_again():
    ledger = AnnotationLedger()
    ledger.observe([refused()])
    ledger.observe([])  # the value became valid, or the annotation was removed
    assert ledger.observe([refused()]) == [refused()]


def test_each_key_of_one_pod_is_its_own_refusal():
    ledger = AnnotationLedger()
    both = [refused(key=EGRESS_ANNOTATION), refused(key=INGRESS_ANNOTATION, value="-1", reason="negative")]
    assert ledger.observe(both) == both
    assert ledger.observe(both) == []
    assert ledger.observe(both + both) == []  # duplicates in one reconcile are one refusal


def test_the_family_exports_every_reason_from_zero():
    ledger = AnnotationLedger()
    reg = CollectorRegistry()
    reg.register(ledger.collector())
    text = generate_latest(reg).decode()
    for r in REASONS:
        assert f'shaperd_pod_annotation_invalid_total{{reason="{r}"}} 0.0' in text
    assert "# TYPE shaperd_pod_annotation_invalid_total counter" in text
    ledger.observe([refused(reason="multiple", value="1M,2M")])
    assert 'shaperd_pod_annotation_invalid_total{reason="multiple"} 1.0' in generate_latest(reg).decode()


# -- through the reconciler -----------------------------------------------------------------------------------

CFG = config.load_text("node: {capacity: 1Gbps}\ntenants:\n"
                       "  - {name: tenant-a, bandwidthGuarantee: 100Mbps, match: {podLabels: {team: a}}}\n")


def pod_info(uid: str, egress: str | None = None, ingress: str | None = None) -> PodInfo:
    ann = {k: v for k, v in ((EGRESS_ANNOTATION, egress), (INGRESS_ANNOTATION, ingress)) if v is not None}
    return PodInfo(uid=uid, namespace="team-a", name=f"p-{uid}", labels=FrozenMap({"team": "a"}), ips=(),
                   host_network=False, qos_class=None, phase="Running", node="n1", annotations=FrozenMap(ann))


@pytest.fixture(autouse=True)
def warnings_reach_the_capture():
    """An earlier test's ``shaperd`` command may have configured logging off (cli/main.py: a one-shot command
    logs only when asked); capture_logs swaps the processors, not that level filter."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        yield
    finally:
        structlog.configure(**{k: before[k] for k in ("processors", "wrapper_class", "logger_factory",
                                                      "context_class", "cache_logger_on_first_use")})


def refusals(logs) -> list[dict]:
    return [e for e in logs if e["event"] == "pod annotation refused"]


def test_several_reconciles_log_one_warning_and_count_one_refusal_the_pod_stays_in_its_tenant(tmp_path):
    pods = {"bad": pod_info("bad", egress="fast"),
            "good": pod_info("good", egress="100M")}
    rec = reconciler(FakeBackend("one", {"a": 1}), tmp_path=tmp_path)
    rec.pods_source = lambda: list(pods.values())
    with capture_logs() as logs:
        reps = [rec.apply(CFG) for _ in range(4)]
    said = refusals(logs)
    assert len(said) == 1, said
    assert said[0]["pod"] == "team-a/p-bad" and said[0]["annotation"] == EGRESS_ANNOTATION
    assert said[0]["value"] == "'fast'" and said[0]["reason"] == "syntax"
    assert rec.annotations.counts()["syntax"] == 1
    t = reps[-1].plan.tenancy
    assert t.pod_tenants == {"bad": "tenant-a", "good": "tenant-a"}  # stays in its tenant
    assert set(t.pod_caps) == {"good"}  # uncapped; the other pod keeps its cap
    assert not any("fast" in w for r in reps for w in r.plan.warnings)  # not a per-reconcile plan warning

    # A changed (still bad) value is new: said and counted once more.
    pods["bad"] = pod_info("bad", egress="0")
    with capture_logs() as logs:
        rec.apply(CFG)
        rec.apply(CFG)
    assert [e["reason"] for e in refusals(logs)] == ["zero"]
    # The pod deleted: forgotten; nothing more said.
    del pods["bad"]
    with capture_logs() as logs:
        rec.apply(CFG)
    assert refusals(logs) == [] and rec.annotations.current == 0
    assert rec.annotations.counts() == {**{r: 0 for r in REASONS}, "syntax": 1, "zero": 1}


def test_diff_does_not_feed_the_ledger(tmp_path):
    rec = reconciler(FakeBackend("one", {"a": 1}), tmp_path=tmp_path)
    rec.pods_source = lambda: [pod_info("bad", egress="fast")]
    with capture_logs() as logs:
        rep = rec.diff(CFG)
    assert refusals(logs) == [] and sum(rec.annotations.counts().values()) == 0
    assert [a.value for a in rep.plan.tenancy.invalid_annotations] == ["fast"]


def test_the_daemon_serves_the_family_from_the_reconcilers_ledger(tmp_path):
    from shaperd.daemon.service import install_annotation_metrics
    from shaperd.report.metrics import Metrics

    rec = reconciler(FakeBackend("one", {"a": 1}), tmp_path=tmp_path)
    rec.pods_source = lambda: [pod_info("bad", ingress="100M,200M")]
    m = Metrics(None, CollectorRegistry(auto_describe=False))
    install_annotation_metrics(m, rec)
    before = m.exposition().decode()
    assert all(f'shaperd_pod_annotation_invalid_total{{reason="{r}"}} 0.0' in before for r in REASONS)
    rec.apply(CFG)
    rec.apply(CFG)
    after = m.exposition().decode()
    assert 'shaperd_pod_annotation_invalid_total{reason="multiple"} 1.0' in after
    assert 'shaperd_scrape_collector_success{collector="annotations"} 1' in after


def test_plan_and_diff_print_every_refusal_as_a_warning(tmp_path):
    from shaperd.cli.reconcile import _print_outcomes, outcomes_result, plan_warnings

    rec = reconciler(FakeBackend("one", {"a": 1}), tmp_path=tmp_path)
    rec.pods_source = lambda: [pod_info("bad", egress="fast")]
    rep = rec.diff(CFG)
    ws = plan_warnings(rep.plan)
    assert any(w.startswith(f"pod team-a/p-bad: annotation {EGRESS_ANNOTATION}='fast' ignored (syntax)") for w in ws)
    assert outcomes_result(rep, planned=True)["warnings"] == ws
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _print_outcomes(rep, planned=True)
    assert f"warning: pod team-a/p-bad: annotation {EGRESS_ANNOTATION}='fast' ignored" in buf.getvalue()
