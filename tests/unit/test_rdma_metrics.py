"""RDMA egress in the metrics: one family per name across both paths, tenant series only for owned ports, no fake zeros."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shaperd.discovery import rdma as rdma_discovery
from shaperd.discovery import rdma_counters
from shaperd.report import rdma_metrics
from shaperd.report.metrics import Metrics
from shaperd.report.rdma_sampler import RdmaSampler, targets_of
from shaperd.report.sampler import Sampler, Target
from shaperd.core.roots import Roots

from ..rdma_fixture import Node

MAX32 = 2**32 - 1


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


def setup_metrics(tmp_path, owners=None, before=None):
    node = Node(tmp_path).build()
    roots = Roots.of(sys=str(node.sys))
    key = ("eth0", 0x73680010)
    tc = Sampler(lambda: {key: _C()})
    tc.set_targets({key: Target("tenant-a", "eth0", key[1], 8000, 16000)})
    tc.sample_once()
    tc.sample_once()
    clock = iter(float(i) for i in range(100))
    rs = RdmaSampler(lambda ports: rdma_counters.read_ports(roots, ports), clock=lambda: next(clock))
    devs, _ = rdma_discovery.discover(roots)
    rs.set_targets(targets_of(devs, owners if owners is not None else {("mlx5_1", 1): "tenant-a",
                                                                       ("mlx5_2", 1): "tenant-b"}))
    if before:
        before(node)
    node.set_counter("mlx5_1", 1, "port_xmit_data", 1000)
    rs.sample_once()
    node.set_counter("mlx5_1", 1, "port_xmit_data", 3000)
    node.set_counter("mlx5_1", 1, "port_xmit_wait", 7)
    node.set_counter("mlx5_1", 1, "np_cnp_sent", 2, hw=True)
    rs.sample_once()
    m = Metrics(tc, CollectorRegistry())
    rdma_metrics.install(m, rs)
    return m, node, rs


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def lbl(tenant, device, port=None, path="rdma", **extra):
    d = {"tenant": tenant, "device": device, **extra}
    if port is not None:
        d.update(port=str(port), path=path)
    else:
        d["path"] = "tc"
    return tuple(sorted(d.items()))


def test_both_paths_share_one_family_per_name_with_a_path_label(tmp_path):
    m, _, _ = setup_metrics(tmp_path)
    text = m.exposition().decode()
    for name in ("shaperd_tenant_transmit_bytes_total", "shaperd_tenant_transmit_packets_total",
                 "shaperd_tenant_transmit_rate_bytes_per_second"):
        assert text.count(f"# TYPE {name} ") == 1 and text.count(f"# HELP {name} ") == 1
    got = samples(text)
    assert got[("shaperd_tenant_transmit_bytes_total", lbl("tenant-a", "eth0"))] == 1000
    assert got[("shaperd_tenant_transmit_bytes_total", lbl("tenant-a", "mlx5_1", 1))] == 12000
    # the sampler reads the clock twice a sample: t = 1 s and 3 s
    assert got[("shaperd_tenant_transmit_rate_bytes_per_second", lbl("tenant-a", "mlx5_1", 1))] == 2000 * 4 / 2
    assert got[("shaperd_tenant_transmit_bytes_total", lbl("tenant-b", "mlx5_2", 1))] == 0  # read: a real zero
    assert got[("shaperd_tenant_rdma_transmit_wait_total", (("device", "mlx5_1"), ("port", "1"), ("tenant", "tenant-a")))] == 7
    assert got[("shaperd_tenant_rdma_hw_events_total",
                (("counter", "np_cnp_sent"), ("device", "mlx5_1"), ("port", "1"), ("tenant", "tenant-a")))] == 2
    assert got[("shaperd_scrape_collector_success", (("collector", "rdma"),))] == 1
    # Ports nobody owns have no tenant series.
    assert not any(dict(k[1]).get("device") in ("mlx5_0", "mlx5_3") for k in got if k[0].startswith("shaperd_tenant_"))
    assert got[("shaperd_rdma_port_counters_readable", (("device", "mlx5_0"), ("port", "1")))] == 1


def test_the_registry_rendering_agrees_with_the_served_text(tmp_path):
    m, _, _ = setup_metrics(tmp_path)
    served = samples(m.exposition().decode())
    reference = samples(generate_latest(m.registry).decode())
    def stable(k):  # values that change between two renderings: collector durations, the process's CPU and memory
        return k[0] != "shaperd_scrape_collector_duration_seconds" and not k[0].startswith("process_")

    assert {k: v for k, v in served.items() if stable(k)} == {k: v for k, v in reference.items() if stable(k)}
    assert {k for k in served if not stable(k)} == {k for k in reference if not stable(k)}


def test_unreadable_saturated_and_counterless_ports_have_no_series_never_zeros(tmp_path):
    def break_ports(node):
        ports = node.sys / "class" / "infiniband"
        shutil.rmtree(ports / "mlx5_2" / "ports" / "1" / "counters")  # like rxe: no PMA counters
        (ports / "mlx5_1" / "ports" / "1" / "counters" / "unicast_xmit_packets").unlink()  # legacy 32-bit

    m, node, rs = setup_metrics(tmp_path, before=break_ports)
    node.set_counter("mlx5_1", 1, "port_xmit_data", MAX32)
    rs.sample_once()
    got = samples(m.exposition().decode())
    assert ("shaperd_tenant_transmit_bytes_total", lbl("tenant-a", "mlx5_1", 1)) not in got
    assert ("shaperd_tenant_transmit_rate_bytes_per_second", lbl("tenant-a", "mlx5_1", 1)) not in got
    assert got[("shaperd_rdma_counter_saturated", (("counter", "port_xmit_data"), ("device", "mlx5_1"), ("port", "1")))] == 1
    assert ("shaperd_tenant_transmit_bytes_total", lbl("tenant-b", "mlx5_2", 1)) not in got
    assert got[("shaperd_tenant_rdma_hw_events_total",
                (("counter", "np_cnp_sent"), ("device", "mlx5_2"), ("port", "1"), ("tenant", "tenant-b")))] == 0
    shutil.rmtree(node.sys / "class" / "infiniband" / "mlx5_2" / "ports")  # the VF went away mid-flight
    rs.sample_once()
    got = samples(m.exposition().decode())
    assert not any(dict(k[1]).get("device") == "mlx5_2" for k in got if k[0].startswith("shaperd_tenant_"))
    assert got[("shaperd_rdma_port_counters_readable", (("device", "mlx5_2"), ("port", "1")))] == 0


def test_before_the_first_rdma_sample_the_collector_says_so(tmp_path):
    m = Metrics(None, CollectorRegistry())
    rdma_metrics.install(m, RdmaSampler(lambda ports: {}))
    got = samples(m.exposition().decode())
    assert got[("shaperd_scrape_collector_success", (("collector", "rdma"),))] == 0
    assert not any(k[0].startswith(("shaperd_tenant_rdma", "shaperd_rdma_port", "shaperd_rdma_counter")) for k in got)
    assert ("shaperd_rdma_last_sample_timestamp_seconds", ()) not in got


def test_the_daemon_takes_ports_from_the_reconciles_inventory_and_owners_from_the_rdma_plan(tmp_path):
    from types import SimpleNamespace

    from shaperd.core import config
    from shaperd.daemon.service import rdma_targets
    from shaperd.core.inventory import Inventory
    from shaperd.core.tenancy import tenancy

    node = Node(tmp_path).build()
    devs, notes = rdma_discovery.discover(Roots.of(sys=str(node.sys)))
    cfg = config.load_text("tenants: [{name: a, bandwidthGuarantee: 1Gbps, priority: 1, rdma: {devices: [mlx5_3]}}]")
    inv = Inventory(rdma=devs, rdma_notes=notes)
    rep = SimpleNamespace(inventory=inv, plan=SimpleNamespace(desired={}, tenancy=tenancy(cfg, inv)))
    t = rdma_targets(cfg, rep)
    assert len(t) == 4 and t[("mlx5_3", 1)].tenant == "a" and t[("mlx5_0", 1)].tenant is None
    # A backend that planned RDMA already: its owners are used as they are.
    rep.plan.desired["rdma"] = SimpleNamespace(owners={("mlx5_0", 1): "b"})
    t = rdma_targets(cfg, rep)
    assert t[("mlx5_0", 1)].tenant == "b" and t[("mlx5_3", 1)].tenant is None
    assert rdma_targets(cfg, SimpleNamespace(inventory=None)) == {}
