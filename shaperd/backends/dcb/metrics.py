"""Prometheus series for the DCB backend: per-tenant TC, ETS share and TC max rate, configured and read back.

Reads the DCB backend's last status (``DcbBackend.status()``: what it
planned and what the last IEEE_GET showed per RoCE uplink), never the
kernel. ``source="configured"`` is the plan, ``source="read"`` the device's
answer, looked up through the read-back prio_tc of the tenant's priority.
Missing data is a missing series: a netdev that could not be read has no
``read`` samples (``shaperd_dcb_netdev_readable`` says 0), an unlimited TC
(max rate 0) has no max-rate sample, a driver that reports no max rates has
no ``read`` max-rate sample.

Per-tenant series only for the tenants ``series_filter`` wants (report/presence.py: by default those present
on the node; every tenant with ``shaperd run --metrics-all-tenants``).
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LABELS = ["tenant", "netdev"]


class DcbCollector(Collector):
    def __init__(self, source, series_filter=None):
        self.wanted = series_filter.wanted if series_filter is not None else (lambda _tenant: True)
        self.source = source  # () -> {netdev: NetdevStatus}

    def collect(self):
        status = self.source()
        tc = GaugeMetricFamily("shaperd_tenant_dcb_traffic_class", "The DCB traffic class the tenant's RoCE DSCP "
                               "maps to on the netdev (configured)", labels=LABELS)
        share = GaugeMetricFamily("shaperd_tenant_dcb_share_ratio", "ETS bandwidth share (0-1) of the tenant's TC "
                                  "(shared by the TC's tenants), configured and read back", labels=LABELS + ["source"])
        rate = GaugeMetricFamily("shaperd_tenant_dcb_maxrate_bytes_per_second", "Max rate (bytes per second) of the tenant's TC "
                                 "(IEEE_MAXRATE), configured and read back; absent when unlimited",
                                 labels=LABELS + ["source"])
        readable = GaugeMetricFamily("shaperd_dcb_netdev_readable", "1 if the netdev's DCB configuration could be "
                                     "read at the last reconcile, 0 if not", labels=["netdev"])
        stuck = GaugeMetricFamily("shaperd_dcb_write_not_sticking", "1 for a kind of DCB write (ets, maxrate, app) "
                                  "the kernel acknowledged but the read-back did not show; not re-sent until the "
                                  "plan changes", labels=["netdev", "kind"])
        pfc = GaugeMetricFamily("shaperd_dcb_pfc_enabled", "1 for each priority with PFC on (read only: the fabric "
                                "team's setting)", labels=["netdev", "priority"])
        foreign = GaugeMetricFamily("shaperd_dcb_foreign_app_entries", "DSCP APP entries not in shaperd's plan "
                                    "(left alone)", labels=["netdev"])
        for nd, s in sorted(status.items()):
            readable.add_metric([nd], 0 if s.read is None else 1)
            for kind in s.not_sticking:
                stuck.add_metric([nd, kind], 1)
            if s.read is not None:
                foreign.add_metric([nd], len(s.foreign_apps))
            for p in s.pfc_priorities or ():
                pfc.add_metric([nd, str(p)], 1)
            if s.configured is None:
                continue
            for t in s.configured.tenants:
                if not self.wanted(t.tenant):
                    continue
                lv = [t.tenant, nd]
                tc.add_metric(lv, t.tc)
                share.add_metric(lv + ["configured"], t.share_pct / 100)
                if t.maxrate_kbps:
                    rate.add_metric(lv + ["configured"], t.maxrate_kbps * 1000 / 8)
                ets = getattr(s.read, "ets", None)
                if ets is None:
                    continue
                read_tc = ets.prio_tc[t.priority]
                share.add_metric(lv + ["read"], ets.tc_tx_bw[read_tc] / 100)
                have = s.read.maxrate_kbps
                if have is not None and have[read_tc]:
                    rate.add_metric(lv + ["read"], have[read_tc] * 1000 / 8)
        yield from (tc, share, rate, readable, stuck, pfc, foreign)


def install(metrics, backends) -> None:
    """Add the ``dcb`` collector to a ``report.metrics.Metrics`` when the reconciler runs the DCB backend."""
    b = next((b for b in backends if getattr(b, "name", None) == "dcb"), None)
    if b is not None:
        metrics.collectors.collectors["dcb"] = DcbCollector(b.status, getattr(metrics, "series_filter", None))
