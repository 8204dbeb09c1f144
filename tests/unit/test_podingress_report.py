"""What the pod ingress caps report: the labels record, shaperd status's section, top's table, the metrics.

Driven by a fake reader (the rows kernel/rtnl_rows.py decodes); the decoders themselves are tested on
recorded bytes (test_podingress_bytes.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from shaperd.backends.podingress import labels
from shaperd.backends.podingress.backend import PodIngressBackend
from shaperd.backends.podingress.metrics import PodIngressCollector
from shaperd.backends.podingress.objects import ROOT_HANDLE, PodIngress, PodIngressPlan
from shaperd.backends.podingress.plan import tbf_for
from shaperd.backends.podingress.status import Section, TopPlane, Watch
from shaperd.core.errors import KernelError
from shaperd.core.protocol import StatusInput
from shaperd.core.roots import Roots
from shaperd.kernel.rtnl_rows import TC_H_ROOT, FilterRow, LinkRow, QdiscCounters, QdiscRow, TbfParams
from shaperd.report import top


def tbf_row(ifindex, cap_bps, nbytes, handle=ROOT_HANDLE, drops=0):
    t = tbf_for(cap_bps)
    p = TbfParams(t.rate_Bps, 0, t.limit_bytes, round(t.burst_bytes * 1e9 / t.rate_Bps / 64), 0, 1)
    return QdiscRow(ifindex, handle, TC_H_ROOT, "tbf", tbf=p, counters=QdiscCounters(bytes=nbytes, packets=nbytes // 1000,
                                                                                     drops=drops))


class Reader:
    def __init__(self):
        self.links_ = [LinkRow(7, "cali1", "veth", 1500, True), LinkRow(8, "vethb1", "veth", 1500, True),
                       LinkRow(9, "cali3", "veth", 1500, True), LinkRow(10, "bwp0123456789ab", "ifb", 1500, True),
                       LinkRow(11, "cali4", "veth", 1500, True)]
        self.bytes = 0
        self.fail = False
        self.closed = False

    def qdiscs(self):
        if self.fail:
            raise KernelError("dump", "qdiscs", "node", "Operation not permitted", 1)
        return [tbf_row(7, 50_000_000, self.bytes), QdiscRow(8, 0x10000, TC_H_ROOT, "tbf"),
                QdiscRow(8, 0xFFFF0000, 0xFFFFFFF1, "ingress"), QdiscRow(9, 0, TC_H_ROOT, "noqueue"),
                tbf_row(11, 10_000_000, 5)]

    def links(self):
        return self.links_

    def filters(self, ifindex, parent, device):
        assert (ifindex, parent) == (8, 0xFFFF0000)
        return [FilterRow(8, parent, 1, 3, 0x800, "u32", mirred=(1, 10))]

    def close(self):
        self.closed = True


def pods():
    return (PodIngress(7, "cali1", "u1", "team-a", "web-0", "tenant-a", 50_000_000, tbf_for(50_000_000)),
            PodIngress(8, "vethb1", "u2", "team-b", "loader-0", None, 20_000_000, tbf_for(20_000_000)),
            PodIngress(9, "cali3", "u3", "team-a", "new-0", "tenant-a", 30_000_000, tbf_for(30_000_000)))


def test_the_labels_record_round_trips_and_goes_when_empty(tmp_path):
    path = labels.path_for(tmp_path, "ns1")
    assert path == tmp_path / "shaperd" / "podingress-netns-ns1.json"
    labels.write(path, labels.rows(PodIngressPlan(pods=pods())))
    got = labels.read(path)
    assert sorted(got) == [7, 8, 9] and got[7]["name"] == "web-0" and got[8]["tenant"] is None
    labels.write(path, [])
    assert not path.exists() and labels.read(path) == {}
    path.parent.mkdir(exist_ok=True)
    path.write_text("{not json")
    assert labels.read(path) == {}


def test_the_applying_backend_records_its_plan_once_and_a_teardown_removes_it(tmp_path, monkeypatch):
    from shaperd.backends.podingress import backend as bmod
    from shaperd.core.protocol import ApplyResult, TargetDiff

    monkeypatch.setattr(bmod.tc, "apply_ops", lambda *a, **kw: ApplyResult())
    path = tmp_path / "shaperd" / "podingress-host.json"
    b = PodIngressBackend(None, record=path)
    b.snapshot, b.planned = PodIngressPlan(pods=pods()), True
    b.apply(TargetDiff("cali1"))
    assert sorted(labels.read(path)) == [7, 8, 9]
    path.unlink()
    b.apply(TargetDiff("cali1"))
    assert not path.exists()  # unchanged plan: not written again
    labels.write(path, labels.rows(PodIngressPlan(pods=pods())))
    PodIngressBackend(None, record=path).apply(TargetDiff("cali1"))  # a process that never planned: a teardown
    assert not path.exists()


def _status_doc(tmp_path, reader):
    labels.write(labels.path_for(tmp_path, None), labels.rows(PodIngressPlan(pods=pods())))
    sec = Section(StatusInput(config=None, config_path=None, roots=Roots.of(run=str(tmp_path)), run_root=str(tmp_path)))
    now = iter((100.0, 101.0))  # one second apart
    sec.watch.clock = lambda: next(now)
    sec.sample(reader)
    reader.bytes = 1_000_000
    sec.sample(reader)
    return sec, sec.collect(reader)


def test_status_shows_each_capped_pod_with_its_state_and_what_it_received(tmp_path):
    reader = Reader()
    sec, doc = _status_doc(tmp_path, reader)
    rows = {r["device"]: r for r in doc["pod_ingress"]}
    assert list(rows) == ["cali1", "cali3", "cali4", "vethb1"]
    a = rows["cali1"]
    assert (a["namespace"], a["pod"], a["tenant"], a["cap_bps"], a["enforced_rate_bps"], a["state"]) == (
        "team-a", "web-0", "tenant-a", 50_000_000, 50_000_000, "in sync")
    assert a["received_bytes"] == 1_000_000 and a["received_rate_bps"] == 8_000_000
    assert rows["cali3"]["state"] == "not enforced: no shaperd qdisc here" and rows["cali3"]["received_bytes"] is None
    assert rows["vethb1"]["state"] == "left alone: root qdisc tbf 1: is not shaperd's"
    assert rows["vethb1"]["note"] == ("ingress qdisc redirecting to bwp0123456789ab (the CNI bandwidth plugin's "
                                      "egress shaping): left alone")
    assert rows["cali4"]["pod"] is None and rows["cali4"]["state"] == "in sync"  # shaperd's, with no label
    text = sec.render(doc)
    assert text.splitlines()[0] == "Pod ingress caps (tbf on each pod's host interface):"
    assert "team-a/web-0" in text and "note: team-b/loader-0 on vethb1: ingress qdisc redirecting" in text
    assert sec.errors() == []


def test_status_says_what_it_could_not_read_and_has_nothing_to_say_without_caps(tmp_path):
    reader = Reader()
    reader.fail = True
    sec = Section(StatusInput(config=None, config_path=None, roots=Roots.of(run=str(tmp_path)), run_root=str(tmp_path)))
    sec.sample(reader)
    assert sec.errors() == ["pod ingress: node: dump qdiscs on node: Operation not permitted"]
    assert sec.collect(reader) == {}
    empty = Reader()
    empty.qdiscs = lambda: [QdiscRow(9, 0, TC_H_ROOT, "noqueue")]
    w = Watch(tmp_path / "none.json")
    w.sample(empty)
    assert w.rows() == []


def test_top_has_a_row_per_enforced_cap_whose_target_names_the_pod(tmp_path):
    from shaperd.core.protocol import ClassTarget
    from shaperd.report.sampler import Accumulator

    reader = Reader()
    labels.write(labels.path_for(tmp_path, None), labels.rows(PodIngressPlan(pods=pods())))
    plane = TopPlane(StatusInput(config=None, config_path=None, roots=Roots.of(run=str(tmp_path)), run_root=str(tmp_path)))
    stats, targets = plane.sample(reader)
    # cali1: shaperd's tbf for web-0; cali4: shaperd's, no label; vethb1 (the plugin's) and cali3 (none): no row.
    assert targets == {("cali1", ROOT_HANDLE): ClassTarget("tenant-a", "cali1", ROOT_HANDLE, 50_000_000, 50_000_000,
                                                           pod="team-a/web-0"),
                       ("cali4", ROOT_HANDLE): ClassTarget("", "cali4", ROOT_HANDLE, 10_000_000, 10_000_000,
                                                           pod="(unknown pod)")}
    acc = Accumulator()
    acc.ingest(1.0, stats, targets)
    reader.bytes = 1_250_000
    acc.ingest(2.0, *plane.sample(reader))
    view = top.PlaneView(plane.name, acc.view(), plane.backlog, plane.errors())
    (row,) = [s for s in view.series if s.target.device == "cali1"]
    assert row.rate_bps == 10_000_000 and row.limit_bps == 50_000_000 and view.backlog(row) == (0, None)
    text = top.render([view], {}, 2.0)
    assert any("pod ingress" in l and "cali1" in l and "7368:" in l and "50Mbps" in l for l in text.splitlines())
    doc = top.view_doc([view], {}, 2.0)
    assert {(r["plane"], r["device"], r["limit_bps"]) for r in doc["tenants"]} == {
        ("pod ingress", "cali1", 50_000_000), ("pod ingress", "cali4", 10_000_000)}


def test_metrics_are_read_at_scrape_time_only_for_capped_pods_with_shaperds_tbf():
    reader = Reader()
    b = PodIngressBackend(None)
    b.snapshot = PodIngressPlan(pods=pods())
    reg = CollectorRegistry()
    reg.register(PodIngressCollector(b, lambda: reader))
    reader.bytes = 123_000
    text = generate_latest(reg).decode()
    assert ('shaperd_pod_receive_bytes_total{device="cali1",namespace="team-a",pod="web-0",tenant="tenant-a"} 123000.0'
            in text)
    assert ('shaperd_pod_receive_limit_bytes_per_second{device="cali1",namespace="team-a",pod="web-0",'
            'tenant="tenant-a"} 6.25e+06' in text)
    # vethb1 (left alone: the plugin's tbf), cali3 (not enforced yet), cali4 (no capped pod planned): no series.
    assert "vethb1" not in text and "cali3" not in text and "cali4" not in text
    reader.bytes = 124_000  # read again at the next scrape, not a snapshot of the last reconcile
    assert 'tenant="tenant-a"} 124000.0' in generate_latest(reg).decode()
    reader.fail = True
    try:
        generate_latest(reg)
    except KernelError:
        pass
    else:
        raise AssertionError("a failed read must fail the collector, not yield stale or zero series")
    assert reader.closed


def test_a_pod_of_no_tenant_has_an_empty_tenant_label():
    reader = Reader()
    reader.qdiscs = lambda: [tbf_row(8, 20_000_000, 99)]
    b = PodIngressBackend(None)
    b.snapshot = PodIngressPlan(pods=pods())
    reg = CollectorRegistry()
    reg.register(PodIngressCollector(b, lambda: reader))
    assert ('shaperd_pod_receive_bytes_total{device="vethb1",namespace="team-b",pod="loader-0",tenant=""} 99.0'
            in generate_latest(reg).decode())
