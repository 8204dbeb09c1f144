"""The tenant-ingress backend without a kernel: apply's order (the IFB first, its ifindex filled in, the redirect
last), what a failure stops, observe on fake reads, status rows, the top plane and the receive metrics."""

from __future__ import annotations

import errno

from prometheus_client import CollectorRegistry, generate_latest

from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.common import mapcls
from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.ingress import diff as differ
from shaperd.backends.ingress import ops
from shaperd.backends.ingress.backend import IngressBackend
from shaperd.backends.ingress.metrics import IngressCollector
from shaperd.backends.ingress.objects import INGRESS_DEFAULT_CLASS, INGRESS_ROOT, IngressObserved
from shaperd.backends.ingress.status import IngressSection, TopPlane, read_counters, rows
from shaperd.core.errors import KernelError
from shaperd.core.protocol import ApplyResult, StatusInput
from shaperd.kernel import tc
from shaperd.kernel.rtnl_rows import TC_H_ROOT, FilterRow, HtbClassRow, LinkRow, QdiscRow

from .test_ingress_plan import make, pod


class Recorder:
    """Stands in for kernel/tc.apply_ops and the classifier's: records each call, fails what it is told to."""

    def __init__(self, fail=lambda op: None):
        self.calls: list[tuple[str, list, bool]] = []
        self.fail = fail

    def tc(self, writer, ops_, batch=True, codec=None, **kw):
        return self._run("tc", ops_, batch)

    def cls(self, writer, ops_, pins=None):
        return self._run("cls", ops_, False)

    def _run(self, kind, ops_, batch):
        self.calls.append((kind, list(ops_), batch))
        res = ApplyResult()
        for op in ops_:
            code = self.fail(op)
            if code:
                res.failed.append((op, op.error("refused", code)))
            else:
                res.applied.append(op)
        return res


def fresh(monkeypatch, fail=lambda op: None, links=lambda: [(2, "eth0"), (20, "shpi-eth0")]):
    _, p = make(pods=[pod("p1", "team-a", ["198.18.9.5"])])
    rec = Recorder(fail)
    monkeypatch.setattr(tc, "apply_ops", rec.tc)
    monkeypatch.setattr(bpf_classify, "apply_ops", rec.cls)
    b = IngressBackend(writer=None, links=links)
    return b, differ.diff(p, IngressObserved())[0], rec


def test_apply_creates_the_ifb_first_fills_in_its_ifindex_and_redirects_last(monkeypatch):
    b, td, rec = fresh(monkeypatch)
    res = b.apply(td)
    assert not res.failed and len(res.applied) == len(td.ops)
    kinds = [(k, [type(op).__name__ for op in o][:1], batch) for k, o, batch in rec.calls]
    assert kinds == [("tc", ["CreateIfb"], False), ("tc", ["AddClsact"], False), ("tc", ["CreateRoot"], True),
                     ("cls", ["AttachMapClassifier"], False), ("tc", ["AddRedirect"], True)]
    tree = rec.calls[2][1]
    assert all(op.ifindex == 20 for op in tree) and rec.calls[3][1][0].ifindex == 20
    (red,) = rec.calls[4][1]
    assert (red.ifindex, red.ifb_ifindex) == (2, 20)


def test_an_ifb_that_cannot_be_created_stops_the_rest(monkeypatch):
    b, td, rec = fresh(monkeypatch, fail=lambda op: errno.EOPNOTSUPP if isinstance(op, ops.CreateIfb) else 0)
    res = b.apply(td)
    assert len(rec.calls) == 1 and not res.applied
    assert all("not sent: the IFB could not be created" in str(e) for op, e in res.failed[1:])
    assert len(res.failed) == len(td.ops)


def test_a_tree_that_cannot_be_written_gets_no_redirect(monkeypatch):
    b, td, rec = fresh(monkeypatch, fail=lambda op: errno.EINVAL if isinstance(op, ops.CreateClass) else 0)
    res = b.apply(td)
    assert not any(isinstance(op, ops.AddRedirect) for _, o, _ in rec.calls for op in o)
    red = [e for op, e in res.failed if isinstance(op, ops.AddRedirect)]
    assert len(red) == 1 and "tree could not be written" in str(red[0])


def test_a_clsact_another_backend_added_meanwhile_is_the_one_wanted(monkeypatch):
    b, td, rec = fresh(monkeypatch, fail=lambda op: errno.EEXIST if isinstance(op, AddClsact) else 0)
    res = b.apply(td)
    assert not res.failed and any(isinstance(op, AddClsact) for op in res.applied)


def test_an_unreadable_link_table_after_the_create_is_said(monkeypatch):
    def broken():
        raise KernelError("read", "links", "node", "Interrupted system call")

    b, td, rec = fresh(monkeypatch, links=broken)
    res = b.apply(td)
    assert len(res.applied) == 1 and all("ifindex could not be read" in str(e) for _, e in res.failed)


# ------------------------------------------------------------------ reads


def _class(idx, cid, parent, rate, ceil, nbytes=0, pkts=0, drops=0):
    return HtbClassRow(idx, cid, parent, 0, rate // 8, ceil // 8, 1, 1, 1514, 0, nbytes, pkts, drops)


class Reads:
    """Enough of the rtnetlink reader: an uplink, its IFB with shaperd's tree, a foreign IFB."""

    def __init__(self, plan):
        self.dp = plan.devices[0]
        self.a = next(t.classid for t in self.dp.tenants if t.tenant == "tenant-a")

    def links(self):
        return [LinkRow(2, "eth0", "", 1500, True), LinkRow(20, "shpi-eth0", "ifb", 1500, True),
                LinkRow(30, "bwp1", "ifb", 1500, True), LinkRow(40, "shpi-eth1", "veth", 1500, True)]

    def all_qdiscs(self):
        return [QdiscRow(20, INGRESS_ROOT, TC_H_ROOT, "htb", default_minor=2),
                QdiscRow(20, 0xFFFF0000, 0xFFFFFFF1, "clsact"), QdiscRow(2, 0xFFFF0000, 0xFFFFFFF1, "clsact")]

    root_qdiscs = all_qdiscs

    def htb_classes(self, idx, dev):
        assert idx == 20
        return [_class(20, INGRESS_ROOT | 1, TC_H_ROOT, 10**9, 10**9, 9000, 90),
                _class(20, INGRESS_DEFAULT_CLASS, INGRESS_ROOT | 1, 8 * 10**8, 10**9, 1000, 10),
                _class(20, self.a, INGRESS_ROOT | 1, 2 * 10**8, 4 * 10**8, 8000, 80, drops=3)]

    def filters(self, idx, parent, dev):
        if idx == 2:
            return [FilterRow(2, 0xFFFFFFF2, 1, 3, 1, "bpf", name="cil_from_netdev"),
                    FilterRow(2, 0xFFFFFFF2, 0x7369, 3, 0x800800, "u32", keys=((0, 0, 0),), mirred=(1, 20))]
        return []


def test_observe_finds_its_ifb_the_redirect_what_is_in_the_way_and_others_ifbs():
    _, p = make()
    b = IngressBackend(None)
    b._uplinks = {"eth0", "eth1"}  # what plan() sets: the uplinks whose ingress hook is read
    obs = b.observe(Reads(p), None)
    assert set(obs.ifbs) == {"shpi-eth0"} and obs.ifbs["shpi-eth0"].owned_root
    assert obs.squatters == {"shpi-eth1": "veth"} and obs.foreign_ifbs == ("bwp1",)
    up = obs.uplinks["eth0"]
    assert up.clsact and [r.mirred for r in up.redirects] == [(1, 20)]
    assert up.foreign == [(1, "ingress bpf prio 1 cil_from_netdev")]
    assert obs.ifbs["shpi-eth0"].classes[INGRESS_ROOT | 1].parent == INGRESS_ROOT  # top level: under the qdisc


def test_status_rows_label_tenants_and_the_top_plane_shows_only_tenants():
    cfg, p = make()
    r = Reads(p)
    cur = read_counters(r)
    assert set(cur) == {("eth0", INGRESS_ROOT | 1), ("eth0", INGRESS_DEFAULT_CLASS), ("eth0", r.a)}
    prev = {k: v._replace(bytes=v.bytes - 1000) for k, v in cur.items()}
    got = {x.tenant: x for x in rows(prev, cur, 1.0, cfg)}
    assert set(got) == {"(root)", "(default)", "tenant-a"}
    a = got["tenant-a"]
    assert (a.guarantee_bps, a.limit_bps, a.rate_bps, a.drops, a.device) == (200 * 10**6, 400 * 10**6, 8000.0, 3,
                                                                              "eth0")
    inp = StatusInput(config=cfg, config_path=None, roots=None)
    sec = IngressSection(inp)
    sec.sample(r)
    sec.sample(r)
    doc = sec.collect(r)
    assert [x["tenant"] for x in doc["ingress"]] == ["(root)", "(default)", "tenant-a"]
    text = sec.render(doc)
    assert text.startswith("Tenant ingress") and "tenant-a" in text and "7369:" in text
    stats, targets = TopPlane(inp).sample(r)
    assert set(targets) == {("eth0", r.a)} and targets[("eth0", r.a)].tenant == "tenant-a"
    assert TopPlane.name == "ingress"


def test_status_has_no_ingress_key_where_nothing_is_shaped_inbound_nor_asked_for():
    cfg, _ = make(SOURCE_NO_INGRESS)
    sec = IngressSection(StatusInput(config=cfg, config_path=None, roots=None))

    class NoIfb:
        def links(self):
            return [LinkRow(2, "eth0", "", 1500, True)]

    sec.sample(NoIfb())
    assert sec.collect(NoIfb()) == {} and sec.render({}) == ""


def test_receive_metrics_are_read_at_scrape_time_per_tenant_and_uplink():
    cfg, p = make()
    b = IngressBackend(None)
    b.stats(p)
    r = Reads(p)
    reg = CollectorRegistry()
    reg.register(IngressCollector(b, reader_factory=lambda: ReadsWithClose(p)))
    text = generate_latest(reg).decode()
    assert 'shaperd_tenant_receive_bytes_total{device="eth0",tenant="tenant-a"} 8000.0' in text
    assert 'shaperd_tenant_receive_packets_total{device="eth0",tenant="tenant-a"} 80.0' in text
    assert 'shaperd_tenant_receive_dropped_packets_total{device="eth0",tenant="tenant-a"} 3.0' in text
    assert 'shaperd_tenant_ingress_guarantee_bytes_per_second{tenant="tenant-a"} 2.5e+07' in text
    assert 'shaperd_tenant_ingress_guarantee_bytes_per_second{tenant="tenant-b"} 0.0' in text
    assert 'shaperd_tenant_ingress_limit_bytes_per_second{tenant="tenant-b"} 1.875e+07' in text
    # Only tenant classes: no series for the default or root class, none for a tenant without a block.
    assert 'tenant="tenant-c"' not in text and "(default)" not in text
    assert r.a  # the reads are the same fake


class ReadsWithClose(Reads):
    def close(self):
        pass


def test_metrics_without_tenant_ingress_read_nothing():
    b = IngressBackend(None)
    _, p = make(SOURCE_NO_INGRESS)
    b.stats(p)

    def never():
        raise AssertionError("no read without tenant ingress")

    fams = list(IngressCollector(b, reader_factory=never).collect())
    assert [f.name for f in fams] == ["shaperd_tenant_ingress_guarantee_bytes_per_second",
                                      "shaperd_tenant_ingress_limit_bytes_per_second"]
    assert all(not f.samples for f in fams)


def test_a_failed_read_fails_the_collector_and_reopens_next_time():
    _, p = make()
    b = IngressBackend(None)
    b.stats(p)
    opened = []

    class Broken(ReadsWithClose):
        def root_qdiscs(self):
            raise KernelError("read", "qdiscs", "node", "Interrupted")

    def factory():
        opened.append(1)
        return Broken(p)

    c = IngressCollector(b, reader_factory=factory)
    for _ in range(2):
        try:
            list(c.collect())
        except KernelError:
            pass
        else:
            raise AssertionError("a failed read must fail the collector")
    assert len(opened) == 2


SOURCE_NO_INGRESS = """
node: {interfaces: [eth0], capacity: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 100Mbps, priority: 1, match: {cidrs: [198.18.1.0/24]}}
"""


def test_stats_names_the_ifbs_and_keeps_the_plan_for_the_metrics():
    _, p = make()
    b = IngressBackend(None)
    st = b.stats(p)
    assert st.devices == ("shpi-eth0", "shpi-eth1") and b.last is p
    assert b.paths == {"eth0": ("shpi-eth0", "ebpf"), "eth1": ("shpi-eth1", "ebpf")}
    assert mapcls.is_ours_dst(p.devices[0].map_classifier.name)


def test_before_any_plan_every_clsact_is_read_so_a_teardown_finds_a_dangling_redirect():
    _, p = make()

    class WithDangling(Reads):
        def links(self):
            return super().links() + [LinkRow(5, "eth3", "", 1500, True)]

        def all_qdiscs(self):
            return super().all_qdiscs() + [QdiscRow(5, 0xFFFF0000, 0xFFFFFFF1, "clsact")]

        def filters(self, idx, parent, dev):
            if idx == 5:  # shaperd's redirect, its IFB gone (mirred dumps ifindex 0 then)
                return [FilterRow(5, 0xFFFFFFF2, 0x7369, 3, 0x800800, "u32", keys=((0, 0, 0),), mirred=(1, 0))]
            return super().filters(idx, parent, dev)

    fresh_process = IngressBackend(None)
    tds = fresh_process.teardown(fresh_process.observe(WithDangling(p), None))
    by = {td.target: [type(op).__name__ for op in td.ops] for td in tds}
    assert by["eth3"] == ["DeleteRedirect"] and by["shpi-eth0"] == ["DeleteRedirect", "DeleteIfb"]
    # A reconcile reads only the uplinks it plans and those its IFBs are fed from.
    reconciling = IngressBackend(None)
    reconciling._uplinks = {"eth0"}
    assert "eth3" not in reconciling.observe(WithDangling(p), None).uplinks


def test_probe_disables_the_backend_where_the_kernels_files_say_ifb_or_mirred_is_absent():
    """Where the probe read the kernel's files instead of testing (no probe namespace), an absent ifb or
    act_mirred disables tenant ingress with a note naming the module and the evidence; present or unknown
    (verified at apply) leaves it enabled."""
    from shaperd.core.inventory import Capabilities

    b = IngressBackend(None)
    assert b.probe(Capabilities()).enabled
    for module in ("ifb", "act_mirred"):
        caps = Capabilities(kinds=((module, "absent", "modules.dep of 6.1.0 lists no ifb"),))
        s = b.probe(caps)
        assert not s.enabled and module in s.notes[0] and "modules.dep of 6.1.0" in s.notes[0]
        assert b.probe(Capabilities(kinds=((module, "unknown", "no evidence"),))).enabled
        assert b.probe(Capabilities(kinds=((module, "present", "/proc/modules"),))).enabled
    assert not b.probe(Capabilities(u32=False)).enabled


def test_receive_metrics_leave_out_a_tenant_absent_from_the_node():
    from shaperd.report.presence import SeriesFilter

    _, p = make()
    b = IngressBackend(None)
    b.stats(p)
    only_a = SeriesFilter()
    only_a.set_present(frozenset({"tenant-a"}))
    for flt, b_there in ((only_a, False), (SeriesFilter(all_tenants=True), True)):
        reg = CollectorRegistry()
        reg.register(IngressCollector(b, reader_factory=lambda: ReadsWithClose(p), series_filter=flt))
        text = generate_latest(reg).decode()
        assert 'shaperd_tenant_receive_bytes_total{device="eth0",tenant="tenant-a"}' in text
        assert ('tenant="tenant-b"' in text) is b_there
