"""Prometheus series for devlink rate groups: per tenant node, tx_share/tx_max as configured and as read back.

Reads the devlink backend's ``snapshot`` (backends/devlink/backend.py), never
the kernel: ``configured`` is the last plan, ``kernel`` what the last RATE_GET
dump said (at observe, and again after writes). Bytes per second, as devlink
keeps them. A node the kernel does not have, or a tree that could not be
read, has no ``kernel`` series (never a fake zero); a tx_max of 0 is devlink's
"unlimited" and has no series either. ``install`` adds the collector to a
``Metrics``; nothing in report/metrics.py knows about devlink.

Per-tenant series only for the tenants ``series_filter`` wants (report/presence.py: by default those present
on the node; every tenant with ``shaperd run --metrics-all-tenants``).
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LABELS = ["tenant", "device", "node", "rate"]


class DevlinkCollector(Collector):
    def __init__(self, backend, series_filter=None):
        self.wanted = series_filter.wanted if series_filter is not None else (lambda _tenant: True)
        self.backend = backend  # anything with a ``snapshot`` (DevlinkSnapshot)

    def collect(self):
        snap = self.backend.snapshot
        conf = GaugeMetricFamily("shaperd_tenant_devlink_rate_configured_bytes_per_second",
                                 "The tenant's devlink rate node as planned: rate=tx_share (its guarantee) or "
                                 "tx_max (its limit; absent when unlimited)", labels=LABELS)
        kern = GaugeMetricFamily("shaperd_tenant_devlink_rate_kernel_bytes_per_second",
                                 "The tenant's devlink rate node as the kernel reported it at the last read "
                                 "(absent when the node is missing or the tree could not be read)", labels=LABELS)
        for c in snap.configured:
            if not self.wanted(c.tenant):
                continue
            lv = [c.tenant, c.instance, c.node]
            conf.add_metric(lv + ["tx_share"], c.tx_share_Bps)
            if c.tx_max_Bps:
                conf.add_metric(lv + ["tx_max"], c.tx_max_Bps)
            got = snap.kernel.get((c.instance, c.node)) if snap.read_ok else None
            if got is not None:
                kern.add_metric(lv + ["tx_share"], got[0])
                if got[1]:
                    kern.add_metric(lv + ["tx_max"], got[1])
        yield conf
        yield kern


def install(metrics, backend) -> None:
    metrics.collectors.collectors["devlink"] = DevlinkCollector(backend, getattr(metrics, "series_filter", None))
