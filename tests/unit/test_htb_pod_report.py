"""Capped pods in status, top and metrics (pure): labels file, rows under their tenant, per-pod series only for caps."""

from __future__ import annotations

import json
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from shaperd.backends.common.objects import ROOT_HANDLE, fmt_handle
from shaperd.backends.htb import podlabels
from shaperd.backends.htb import status as htb_status
from shaperd.backends.htb.backend import HtbBackend
from shaperd.core.protocol import ClassTarget, PlanInput, TargetDiff
from shaperd.core.tenancy import tenancy
from shaperd.report import top
from shaperd.report.collectors import TenantCollector
from shaperd.report.sampler import Accumulator, Snapshot, TenantSeries

from tests.unit.test_htb_pod_caps import PODS, TEXT, cls_of, inv, planned
from shaperd.core import config


@dataclass(frozen=True)
class Row:
    """The fields of an HtbClassRow the report reads."""

    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    backlog_bytes: int = 0
    qlen: int = 0
    rate_Bps: int = 1_000_000
    ceil_Bps: int = 12_500_000
    borrows: int = 0


def test_the_labels_file_round_trips_and_names_rests():
    p = planned()
    doc = podlabels.doc_of(p)
    own = cls_of(p, "u1")
    assert doc["pods"][fmt_handle(own)] == {"pod": "team-a/u1", "uid": "u1", "tenant": "a", "cap_bps": 100 * 10**6}
    assert doc["pods"][fmt_handle(cls_of(p, "u4"))]["tenant"] is None
    assert set(doc["rests"].values()) == {"a", "b"}  # both tenants are inner by pods alone
    assert podlabels.doc_of(planned(pods=())) == {}


def test_the_backend_writes_the_labels_where_it_writes_the_tree_and_removes_them_with_the_last_cap(tmp_path):
    path = tmp_path / "shaperd" / "htb-pods-netns-x.json"

    class NoWriter:  # apply with no tc operation sends nothing
        pass

    b = HtbBackend(NoWriter(), labels_file=path)
    cfg = config.load_text(TEXT)
    i = inv()
    b.plan(PlanInput(cfg, i, tenancy(cfg, i)))
    assert not path.exists()  # planning (plan, diff, status) writes nothing
    b.apply(TargetDiff("up0"))
    pods, rests = podlabels.read(path)
    assert {v["pod"] for v in pods.values()} == {"team-a/u1", "team-b/u3", "other/u4"} and len(rests) == 2
    assert json.loads(path.read_text())["pid"] > 0
    i = inv(pods=[p.__class__(**{**p.__dict__, "egress_bandwidth": None}) for p in PODS])
    b.plan(PlanInput(cfg, i, tenancy(cfg, i)))
    b.apply(TargetDiff("up0"))
    assert not path.exists()


def test_stats_give_each_capped_pods_class_a_target_naming_it():
    p = planned()
    b = HtbBackend(None)
    st = b.stats(p)
    own = cls_of(p, "u1")
    t = st.targets[("up0", own)]
    assert (t.tenant, t.pod, t.limit_bps) == ("a", "team-a/u1", 100 * 10**6)
    assert st.targets[("up0", cls_of(p, "u4"))].tenant == ""  # a pod of no tenant
    assert {t.pod for t in st.targets.values()} == {"", "team-a/u1", "team-b/u3", "other/u4"}


def _status_rows():
    p = planned()
    labels = {ROOT_HANDLE | 1: "(root)", ROOT_HANDLE | 2: "(default)"}
    labels.update({cid: n for n, cid in p.devices[0].tenant_classes.items()})
    assert podlabels.read(None) == ({}, {})
    doc = podlabels.doc_of(p)
    pods = {podlabels._cid(h): v for h, v in doc["pods"].items()}
    labels.update({podlabels._cid(h): f"{t}/rest" for h, t in doc["rests"].items()})
    cur = {("up0", c.classid): Row(bytes=1000 + n) for n, c in enumerate(p.devices[0].classes)}
    return p, htb_status.rows({}, cur, 1.0, labels, pods)


def test_status_shows_each_capped_pod_right_under_its_tenant_with_its_cap():
    p, rs = _status_rows()
    order = [(r.tenant, r.pod) for r in rs]
    a = order.index(("a", None))
    assert order[a + 1] == ("a", "team-a/u1")
    assert order[order.index(("(default)", None)) + 1] == ("", "other/u4")
    r = next(r for r in rs if r.pod == "team-a/u1")
    assert r.cap_bps == 100 * 10**6 and r.classid == fmt_handle(cls_of(p, "u1")) and r.bytes > 0
    text = htb_status.render_table(rs)
    lines = text.splitlines()
    i = next(n for n, l in enumerate(lines) if l.split()[1:2] == ["a"])
    assert lines[i + 1].split()[1:5] == ["pod", "team-a/u1", "(cap", "100Mbps)"], lines[i + 1]
    assert any("a/rest" in l for l in lines)


def test_top_ranks_a_pods_row_right_after_its_tenants():
    acc = Accumulator()
    targets = {("up0", 0x10): ClassTarget("a", "up0", 0x10), ("up0", 0x20): ClassTarget("b", "up0", 0x20),
               ("up0", 0x30): ClassTarget("a", "up0", 0x30, pod="team-a/trainer-0"),
               ("up0", 0x40): ClassTarget("", "up0", 0x40, pod="other/lone")}
    for t in (0.0, 1.0):
        acc.ingest(t, {k: Row(bytes=int(1000 * (t + 1))) for k in targets}, targets)
    views = [top.PlaneView("htb", acc.view())]
    assert [(s.target.tenant, s.target.pod) for _, s in top.ranked(views)] == [
        ("", "other/lone"), ("a", ""), ("a", "team-a/trainer-0"), ("b", "")]
    text = top.render(views, {}, 2.0, sent_base={("htb", "up0", 0x30): 500})
    lines = text.splitlines()
    assert lines[1].split()[:1] == ["TENANT"] and "SENT" in lines[1].split()
    assert lines[2].startswith("pod other/lone (no tenant)")
    assert lines[3].startswith("a ") and lines[4].startswith("  pod team-a/trainer-0")
    assert " 1.5KB " in lines[4]  # 2000 bytes counted, 500 of them before top started
    doc = top.view_doc(views, {}, 2.0, sent_base={("htb", "up0", 0x30): 500})
    row = next(r for r in doc["tenants"] if r["pod"])
    assert row["pod"] == "other/lone" and row["tenant"] == ""
    row = next(r for r in doc["tenants"] if r["pod"] == "team-a/trainer-0")
    assert row["sent_bytes_since_start"] == 2000 - 500 and row["tenant"] == "a"


def _snapshot(pods: int, tenants: int = 4, devices: int = 1) -> Snapshot:
    series = []
    for d in range(devices):
        for t in range(tenants):
            series.append(TenantSeries(ClassTarget(f"t{t}", f"eth{d}", 0x10 + t), 10**9, 2 * 10**9, bytes=1))
        for p in range(pods):
            series.append(TenantSeries(ClassTarget(f"t{p % tenants}", f"eth{d}", 0x1000 + p, pod=f"ns{p % 3}/pod-{p}"),
                                       10**6, 10**8, bytes=5))
    return Snapshot(tuple(series), 1.0, True)


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_per_pod_series_exist_only_for_capped_pods_two_each_per_uplink():
    fams = _families(TenantCollector.render_snapshot(_snapshot(100)))
    pod_series = [s for n, f in fams.items() if n.startswith("shaperd_pod_transmit") for s in f.samples]
    # 100 capped pods on one uplink: 200 series (bytes and limit), and nothing per pod in the tenant families
    assert len(pod_series) == 200
    assert {tuple(sorted(s.labels)) for s in pod_series} == {("device", "namespace", "pod", "tenant")}
    sent = fams["shaperd_pod_transmit_bytes"].samples
    assert {s.name for s in sent} == {"shaperd_pod_transmit_bytes_total"}
    s0 = next(s for s in sent if s.labels["pod"] == "pod-0")
    assert s0.labels == {"namespace": "ns0", "pod": "pod-0", "tenant": "t0", "device": "eth0"} and s0.value == 5
    lim = next(s for s in fams["shaperd_pod_transmit_limit_bytes_per_second"].samples if s.labels["pod"] == "pod-0")
    assert lim.value == 10**8 / 8
    tenant_series = [s for s in fams["shaperd_tenant_transmit_bytes"].samples]
    assert len(tenant_series) == 4 and all(s.value == 1 for s in tenant_series)
    # two uplinks: two series per capped pod on each
    fams2 = _families(TenantCollector.render_snapshot(_snapshot(100, devices=2)))
    assert sum(len(f.samples) for n, f in fams2.items() if n.startswith("shaperd_pod_transmit")) == 400
    # no capped pod: the families are there, empty
    none = _families(TenantCollector.render_snapshot(_snapshot(0)))
    assert none["shaperd_pod_transmit_bytes"].samples == []
