"""Prometheus series for SR-IOV VF rates: per tenant and VF, as configured and as the PF reads them back.

Reads the vfrate backend's last snapshot (backends/vfrate/backend.py:
``VfRateBackend.snapshot``, replaced whole by each reconcile), never the
kernel. Rates are in bytes per second (the driver's Mbit/s x 125000):

- ``shaperd_tenant_vf_configured_rate_bytes_per_second{tenant,pf,vf,bound}``
  (bound ``min`` or ``max``): what shaperd wants, after any degrade;
- ``shaperd_tenant_vf_observed_rate_bytes_per_second{...}``: what the PF
  reported at the last reconcile;
- ``shaperd_vf_min_rate_supported{pf,driver}``: 0 where the driver refused a
  minimum and the VFs get the limit only.

Missing is missing: a max of 0 (no cap) has no max series, a driver that
reports only IFLA_VF_TX_RATE has no observed min, a PF that could not be read
has no observed series. ``install`` adds the collector to a
``report.metrics.Metrics``; nothing else there knows about VFs.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

MBIT_BYTES = 1_000_000 // 8  # one Mbit/s in bytes per second (the Prometheus base unit)
LABELS = ["tenant", "pf", "vf", "bound"]


class VfRateCollector(Collector):
    def __init__(self, backend):
        self.backend = backend

    def collect(self):
        snap = self.backend.snapshot
        conf = GaugeMetricFamily("shaperd_tenant_vf_configured_rate_bytes_per_second",
                                 "The VF's min_tx_rate/max_tx_rate shaperd sets for the tenant (no series: no cap)",
                                 labels=LABELS)
        seen = GaugeMetricFamily("shaperd_tenant_vf_observed_rate_bytes_per_second",
                                 "The VF's min_tx_rate/max_tx_rate as the PF reported it at the last reconcile",
                                 labels=LABELS)
        for v in snap.desired.vfs:
            lv = [v.tenant, v.pf, str(v.vf)]
            conf.add_metric(lv + ["min"], v.min_mbps * MBIT_BYTES)
            if v.max_mbps:
                conf.add_metric(lv + ["max"], v.max_mbps * MBIT_BYTES)
            st = snap.observed.pfs.get(v.pf)
            row = st.vf(v.vf) if st is not None and st.reported else None
            if row is None:
                continue
            if row.min_mbps is not None:
                seen.add_metric(lv + ["min"], row.min_mbps * MBIT_BYTES)
            if row.max_mbps:
                seen.add_metric(lv + ["max"], row.max_mbps * MBIT_BYTES)
        yield conf
        yield seen
        sup = GaugeMetricFamily("shaperd_vf_min_rate_supported", "1 if the PF's driver takes a VF minimum rate, 0 "
                                "if it refused one (its VFs get the limit only)", labels=["pf", "driver"])
        for pf, s in sorted(self.backend.status().items()):
            sup.add_metric([pf, s.get("driver") or ""], 1 if s["min_rate_supported"] else 0)
        yield sup


def install(metrics, backends) -> None:
    """Add the ``vfrate`` collector to a ``report.metrics.Metrics`` when a vfrate backend runs."""
    from shaperd.backends.vfrate.backend import VfRateBackend

    b = next((b for b in backends if isinstance(b, VfRateBackend)), None)
    if b is not None:
        metrics.collectors.collectors["vfrate"] = VfRateCollector(b)
