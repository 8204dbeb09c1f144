"""The Grafana dashboard and the Prometheus rules only use metrics the daemon exposes."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shaperd.core.config import load_text
from shaperd.report.degraded import Degraded
from shaperd.report.metrics import Metrics
from shaperd.report.sampler import Sampler, Target

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "shaperd-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "shaperd-alerts.yaml"
NAME_RE = re.compile(r"\bshaperd_[a-z0-9_]+\b")
DURATION_RE = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


@dataclass(frozen=True)
class _C:
    bytes: int = 1000
    packets: int = 1
    drops: int = 0
    overlimits: int = 0
    backlog_bytes: int = 0
    qlen: int = 0
    rate_Bps: int = 1000
    ceil_Bps: int = 2000


def exposed_names() -> set[str]:
    """Every sample name a daemon with a config, a reconcile and two samples exposes."""
    key = ("eth0", 0x73680010)
    s = Sampler(lambda: {key: _C()})
    s.set_targets({key: Target("a", "eth0", key[1], 8000, 16000)})
    s.sample_once()
    s.sample_once()
    m = Metrics(s, CollectorRegistry())
    cfg = load_text("tenants: [{name: a, bandwidthGuarantee: 1Gbps, priority: 1}]")
    m.config_loaded(True, cfg)
    m.config_loaded(False)
    # bpf() refused by seccomp: shaperd_bpf_syscall_refused exists only then (its alert needs the name)
    m.reconciled(0.01, {"plan"}, ok=True, drift=False, endpoints={"a": {"cidr": 1, "interface": 0}},
                 degraded=Degraded(refused=("bpf_refused_by_seccomp",)))
    names = set()
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        names.update(sample.name for sample in fam.samples)
    return names


def dashboard_exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            exprs.append(q["query"])
    return exprs


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_exposed_names_include_the_core_series():
    names = exposed_names()
    for n in ("shaperd_tenant_transmit_bytes_total", "shaperd_tenant_below_guarantee_seconds_total",
              "shaperd_reconcile_duration_seconds_bucket", "shaperd_last_reconcile_success_timestamp_seconds"):
        assert n in names


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_metric_in_expressions_is_exposed(source):
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    assert exprs
    names = exposed_names()
    used = {n for e in exprs for n in NAME_RE.findall(e)}
    assert used, "no shaperd metric referenced"
    assert used - names == set()
    for e in exprs:
        assert e.count("(") == e.count(")") and e.count("[") == e.count("]") and e.count("{") == e.count("}"), e


def test_rules_have_the_prometheus_rule_group_structure():
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"}
    alerts = set()
    for g in doc["groups"]:
        assert set(g) <= {"name", "interval", "rules", "limit"} and g["name"] and g["rules"]
        for r in g["rules"]:
            assert ("alert" in r) != ("record" in r)
            assert set(r) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
            assert isinstance(r["expr"], str) and r["expr"].strip()
            if "for" in r:
                assert DURATION_RE.match(r["for"]), r["for"]
            for k in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in r.get(k, {}).values())
            alerts.add(r.get("alert"))
    assert {"ShaperdTenantBelowGuarantee", "ShaperdNotReconciling", "ShaperdConfigRejected",
            "ShaperdAgentDown", "ShaperdAgentAbsent"} <= alerts


# promtool itself (check rules, test rules, check metrics): tests/unit/test_promtool.py.


def test_dashboard_is_a_grafana_dashboard():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["panels"]
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    titles = " ".join(p["title"].lower() for p in d["panels"])
    assert "guarantee" in titles and "drops" in titles and "below guarantee" in titles


# The runbooks live in docs/; each alert's runbook_url is an absolute link to docs/ on GitHub, at main in
# the tree (scripts/pin-runbooks points them at a release's tag).
DOCS_URL = "https://github.com/shaperd/shaperd/blob/main/docs/"


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {github_anchor(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def test_every_alert_links_a_runbook_section_that_exists():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    linked = set()
    for r in rules:
        if r["alert"] == "ShaperdTenantDropping":
            continue  # informational; its summary is the whole story
        url = r.get("annotations", {}).get("runbook_url", "")
        assert url.startswith(DOCS_URL), (r["alert"], url)
        page, _, anchor = url.removeprefix(DOCS_URL).partition("#")
        assert (ROOT / "docs" / page).is_file(), f"{r['alert']}: no docs/{page}"
        assert anchor in anchors(ROOT / "docs" / page), f"{r['alert']}: docs/{page} has no section #{anchor}"
        linked.add(anchor)
    assert {"runbook-agent-down-or-absent", "runbook-not-reconciling",
            "runbook-webhook-unavailable-or-failing-open"} <= linked


def test_a_missing_runbook_section_is_noticed():
    # The check above can fail: an anchor no heading gives.
    assert "runbook-agent-down-or-absent" in anchors(ROOT / "docs" / "operations.md")
    assert "runbook-agent-gone-fishing" not in anchors(ROOT / "docs" / "operations.md")


def test_pinning_the_runbooks_to_a_tag_keeps_the_rules_and_the_prometheusrule_equal(tmp_path):
    import subprocess
    import sys

    files = ["scripts/pin-runbooks", "scripts/gen-prometheusrule", "deploy/prometheus/shaperd-alerts.yaml",
             "deploy/prometheus/shaperd-alerts.test.yaml", "daemonset/components/monitoring/prometheusrule.yaml"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text((ROOT / f).read_text())

    def script(name, *args):
        return subprocess.run([sys.executable, str(tmp_path / "scripts" / name), *args], capture_output=True,
                              text=True, timeout=60, start_new_session=True)

    r = script("pin-runbooks", "v9.8.7", "--root", str(tmp_path))
    assert r.returncode == 0, r.stderr
    for f in files[2:]:
        text = (tmp_path / f).read_text()
        assert "/blob/main/" not in text and text.count("/blob/v9.8.7/docs/operations.md#runbook-") >= 8, f
    r = script("gen-prometheusrule", "--check")  # its ROOT is the copy: the pinned pair still agrees
    assert r.returncode == 0, r.stderr
    assert script("pin-runbooks", "v9.8.7", "--root", str(tmp_path)).returncode == 1  # pinned already: said
    assert script("pin-runbooks", "not a tag", "--root", str(tmp_path)).returncode == 2
