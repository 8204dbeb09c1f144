"""The devlink metrics collector: configured and read-back node rates; missing data is a missing series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from shaperd.backends.devlink.backend import DevlinkSnapshot, NodeRates
from shaperd.backends.devlink.metrics import DevlinkCollector, install
from shaperd.report.metrics import Metrics

PF = "pci/0000:3b:00.0"


class Src:
    def __init__(self, snap):
        self.snapshot = snap


def text(snap) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DevlinkCollector(Src(snap)))
    return generate_latest(reg).decode()


CONF = (NodeRates("a", PF, "shpd_a", 1_250_000, 12_500_000), NodeRates("b", PF, "shpd_b", 125_000_000, 0))


def test_configured_and_kernel_series():
    out = text(DevlinkSnapshot(CONF, {(PF, "shpd_a"): (1_250_000, 12_000_000)}, True))
    lbl = f'device="{PF}",node="shpd_a",rate="tx_max",tenant="a"'
    assert f"shaperd_tenant_devlink_rate_configured_bytes_per_second{{{lbl}}} 1.25e+07" in out
    assert f"shaperd_tenant_devlink_rate_kernel_bytes_per_second{{{lbl}}} 1.2e+07" in out  # drift is visible
    # b: unlimited (no tx_max series), and not in the kernel (no kernel series at all)
    assert 'node="shpd_b",rate="tx_max"' not in out
    assert 'kernel_bytes_per_second{device="pci/0000:3b:00.0",node="shpd_b"' not in out
    assert 'configured_bytes_per_second{device="pci/0000:3b:00.0",node="shpd_b",rate="tx_share",tenant="b"} 1.25e+08' \
        in out


def test_unreadable_tree_has_no_kernel_series():
    out = text(DevlinkSnapshot(CONF, {(PF, "shpd_a"): (1, 2)}, read_ok=False))
    assert "kernel_bytes_per_second{" not in out and "configured_bytes_per_second{" in out


def test_install_into_metrics_serves_it():
    m = Metrics(None, CollectorRegistry(auto_describe=False))
    install(m, Src(DevlinkSnapshot(CONF, {}, True)))
    body = m.exposition().decode()
    assert 'shaperd_tenant_devlink_rate_configured_bytes_per_second{' in body
    assert 'shaperd_scrape_collector_success{collector="devlink"} 1' in body
