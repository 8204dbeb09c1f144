"""Bounded series: per-tenant series cover the tenants present on the node; --metrics-all-tenants restores all."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shaperd.cli.main import build_parser
from shaperd.core import config
from shaperd.core.inventory import CgroupRef, Inventory, Link, Pod, RdmaDevice, RdmaPort
from shaperd.core.protocol import ClassTarget
from shaperd.core.tenancy import tenancy
from shaperd.daemon.service import Daemon
from shaperd.engine.reconciler import PlanResult, Report
from shaperd.report.metrics import Metrics
from shaperd.report.presence import present_tenants
from shaperd.report.sampler import Sampler, Snapshot, Target, TenantSeries

CFG = config.load_text("""
node: {interfaces: [v0], capacity: 10Gbps}
tenants:
  - {name: pods, bandwidthGuarantee: 1Gbps, match: {namespaces: [team-pods]}}
  - {name: addr, bandwidthGuarantee: 1Gbps, match: {cidrs: [10.9.0.0/16]}}
  - {name: ifc, bandwidthGuarantee: 1Gbps, match: {interfaces: [ten1]}}
  - {name: cg, bandwidthGuarantee: 1Gbps, match: {cgroups: [/sys/fs/cgroup/cg.slice]}}
  - {name: hca, bandwidthGuarantee: 1Gbps, match: {cidrs: [10.77.0.0/16]}, rdma: {devices: ["mlx5_0:1"]}}
  - {name: away, bandwidthGuarantee: 1Gbps, match: {cidrs: [10.88.0.0/16], interfaces: [gone0],
                                                    cgroups: [/sys/fs/cgroup/gone.slice], namespaces: [team-away]},
     rdma: {devices: ["mlx5_9"]}}
""")
EVERY = {"pods", "addr", "ifc", "cg", "hca", "away"}
LINKS = (Link("v0", 2), Link("ten1", 3))
RDMA = (RdmaDevice("mlx5_0", ports=(RdmaPort("mlx5_0", 1, "InfiniBand"),)),)


def inventory(pods=()) -> Inventory:
    return Inventory(links=LINKS, default_route_devices=("v0",), pods=tuple(pods),
                     cgroups=(CgroupRef("/sys/fs/cgroup/cg.slice", 1, 42),), rdma=RDMA)


POD_A = Pod("u1", "team-pods", "trainer-0", ips=("10.1.0.5",))
POD_B = Pod("u2", "default", "web-0", ips=("10.9.3.4", "fd00::1"))  # of no tenant; its address is addr's


def present(pods, pods_known=True) -> frozenset[str]:
    inv = inventory(pods)
    return present_tenants(CFG, inv, tenancy(CFG, inv), pods_known=pods_known)


def test_present_means_a_pod_an_address_an_interface_a_cgroup_or_a_device_here():
    assert present([POD_A, POD_B]) == {"pods", "addr", "ifc", "cg", "hca"}  # "away" has each kind, none here
    assert present([POD_A]) == {"pods", "ifc", "cg", "hca"}  # no pod address in addr's cidrs: absent
    # A pod of another namespace whose IP falls in away's cidrs makes it present (an address here).
    assert "away" in present([Pod("u3", "x", "y", ips=("10.88.0.9",))])


def test_without_kubernetes_a_tenant_matched_by_cidrs_counts_as_present():
    # The inventory has no host addresses: a cidrs tenant may be sending from here, so it is never hidden.
    assert present([], pods_known=False) == {"addr", "ifc", "cg", "hca", "away"}


def series(tenants) -> Snapshot:
    rows = tuple(TenantSeries(Target(t, dev, 0x10 + i), 10**9, 10**10, bytes=1000 + i)
                 for i, t in enumerate(sorted(tenants)) for dev in ("v0", "v1"))
    return Snapshot(rows, 1.7e9, True, None, 0.01, 1, 0)


def tenants_in(text: str, family: str = "shaperd_tenant_transmit_bytes") -> set[str]:
    return {s.labels["tenant"] for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith(family)}


class FixedSampler(Sampler):
    def __init__(self, snap):
        super().__init__(lambda: {})
        self.snapshot = snap


def metrics(snap, all_tenants) -> Metrics:
    m = Metrics(FixedSampler(snap), CollectorRegistry(auto_describe=False), wall=lambda: 1.7e9,
                monotonic=lambda: 100.0, all_tenants=all_tenants)
    m.kubernetes(True, None, {t: 0 for t in EVERY})
    m.reconciled(0.01, set(), ok=True, drift=False, endpoints={t: {"cidr": 1} for t in EVERY})
    return m


def test_an_absent_tenant_has_no_series_a_present_one_has_them():
    m = metrics(series(EVERY), all_tenants=False)
    m.present(frozenset({"pods", "addr"}))
    text = m.exposition().decode()
    reference = generate_latest(m.registry).decode()
    for t in (text, reference):  # what /metrics serves and prometheus_client's rendering agree
        assert tenants_in(t) == {"pods", "addr"}
        assert tenants_in(t, "shaperd_tenant_pods") == {"pods", "addr"}
        assert tenants_in(t, "shaperd_tenant_endpoints") == {"pods", "addr"}
    assert text.count('shaperd_tenant_transmit_bytes_total{') == 4  # 2 tenants x 2 devices


def test_the_flag_restores_every_tenant():
    m = metrics(series(EVERY), all_tenants=True)
    m.present(frozenset({"pods"}))  # ignored with the flag
    text = m.exposition().decode()
    assert tenants_in(text) == EVERY
    assert tenants_in(text, "shaperd_tenant_pods") == EVERY
    assert tenants_in(generate_latest(m.registry).decode()) == EVERY


def test_a_tenant_that_becomes_present_appears_on_the_next_scrape():
    snap = series(EVERY)
    m = metrics(snap, all_tenants=False)
    assert tenants_in(m.exposition().decode()) == set()  # before any reconcile: nothing known present
    m.present(frozenset({"pods"}))
    assert tenants_in(m.exposition().decode()) == {"pods"}
    m.present(frozenset({"pods", "away"}))  # same snapshot: the cached tenant text must not be served
    assert tenants_in(m.exposition().decode()) == {"pods", "away"}
    m.present(frozenset({"away"}))
    assert tenants_in(m.exposition().decode()) == {"away"}


def test_a_capped_pods_own_series_stay_whatever_its_tenant():
    rows = (TenantSeries(Target("away", "v0", 0x20, pod="team-away/p"), 10**9, 10**10, bytes=5),)
    m = metrics(Snapshot(rows, 1.7e9, True, None, 0.01, 1, 0), all_tenants=False)
    assert "shaperd_pod_transmit_bytes_total{" in m.exposition().decode()


def test_the_daemon_records_presence_after_each_reconcile_and_the_flag_reaches_it():
    assert build_parser().parse_args(["run", "--metrics-all-tenants"]).metrics_all_tenants is True
    assert build_parser().parse_args(["run"]).metrics_all_tenants is False
    d = Daemon("/nonexistent", None)
    d.config = CFG
    snap = series(EVERY)
    d.metrics = Metrics(FixedSampler(snap), all_tenants=d.metrics_all_tenants, wall=lambda: 1.7e9)
    d.pods = SimpleNamespace(synced=True, last_error=None)
    for pods, want in (([POD_A], {"pods", "ifc", "cg", "hca"}), ([POD_A, POD_B], {"pods", "addr", "ifc", "cg", "hca"})):
        inv = inventory(pods)
        ten = tenancy(CFG, inv)
        rep = Report(PlanResult(tenancy=ten), [], inventory=inv)
        d._observe(rep, ok=True, drift=False)
        assert tenants_in(d.metrics.exposition().decode()) == want


def test_backend_collectors_leave_absent_tenants_out():
    from shaperd.backends.devlink.metrics import install as devlink_install
    from shaperd.backends.edt.metrics import install as edt_install

    class Loop:
        errors: dict = {}

        def snapshot(self):
            return [("v0", "pods", 1, 8e9, 4e9), ("v0", "away", 2, 8e9, 0.0), ("v0", "", 0, 8e9, 0.0)]

        def pod_snapshot(self):
            return []

    conf = [SimpleNamespace(tenant=t, instance="pci/0000:3b:00.0", node=f"shaperd_{t}", tx_share_Bps=1,
                            tx_max_Bps=0) for t in ("pods", "away")]
    devlink = SimpleNamespace(snapshot=SimpleNamespace(configured=conf, kernel={}, read_ok=False))
    for all_tenants, want in ((False, {"pods", "(none)"}), (True, {"pods", "away", "(none)"})):
        m = Metrics(None, all_tenants=all_tenants)
        m.present(frozenset({"pods"}))
        edt_install(m, lambda: Loop())
        devlink_install(m, devlink)
        text = m.exposition().decode()
        assert tenants_in(text, "shaperd_tenant_edt_rate_bytes_per_second") == want
        assert tenants_in(text, "shaperd_tenant_devlink_rate_configured") == want - {"(none)"}
