"""Prometheus series for tenant ingress, read at scrape time from the IFBs' class counters.

Per tenant with an ingress block and per uplink (``device``), what its class on the uplink's IFB counted:

- ``shaperd_tenant_receive_bytes_total{tenant,device}``: bytes received (L2 frames as HTB counts them,
  after GRO: one aggregate is one packet);
- ``shaperd_tenant_receive_packets_total{tenant,device}``;
- ``shaperd_tenant_receive_dropped_packets_total{tenant,device}``: dropped by the class's queue (the
  excess over its limit that TCP did not back off from);

and per tenant, as configured (the plan the backend last made):

- ``shaperd_tenant_ingress_guarantee_bytes_per_second{tenant}`` (0 where the block has no guarantee);
- ``shaperd_tenant_ingress_limit_bytes_per_second{tenant}`` (no series where it has no limit: the
  capacity of each uplink then bounds it).

Named as node_exporter names the receive side (egress keeps ``shaperd_tenant_transmit_*``). The counters
come from one rtnetlink reader the collector opens in the node's namespace (reopened after a failure);
a failed read fails the collector (``shaperd_scrape_collector_success{collector="ingress"} 0``), never
gives zeros. Owns only these families.

Per-tenant series only for the tenants ``series_filter`` wants (report/presence.py: by default those present
on the node; every tenant with ``shaperd run --metrics-all-tenants``).
"""

from __future__ import annotations

import threading

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LABELS = ["tenant", "device"]


class IngressCollector:
    def __init__(self, backend, reader_factory=None, series_filter=None):
        self.backend = backend
        self.wanted = series_filter.wanted if series_filter is not None else (lambda _tenant: True)
        self._factory = reader_factory
        self._reader = None
        self._lock = threading.Lock()  # scrapes may overlap (threaded HTTP server); one socket, one exchange

    def _open(self):
        if self._factory is not None:
            return self._factory()
        from shaperd.kernel.rtnl import RtnlReader

        w = self.backend.writer
        return RtnlReader(getattr(w, "netns", None), run_root=getattr(w, "run_root", "/run"))

    def _counters(self) -> dict:
        from shaperd.backends.ingress.status import read_counters

        with self._lock:
            if self._reader is None:
                self._reader = self._open()
            try:
                return read_counters(self._reader)
            except Exception:
                self._reader.close()
                self._reader = None
                raise

    def collect(self):
        desired = self.backend.last
        tenants = {t.classid: t for dp in (desired.devices if desired is not None else ()) for t in dp.tenants
                   if self.wanted(t.tenant)}
        g = GaugeMetricFamily("shaperd_tenant_ingress_guarantee_bytes_per_second",
                              "The tenant's configured ingress guarantee (tenants[].ingress.bandwidthGuarantee), "
                              "bytes per second; 0 where its ingress block has none", labels=["tenant"])
        lim = GaugeMetricFamily("shaperd_tenant_ingress_limit_bytes_per_second",
                                "The tenant's configured ingress limit (tenants[].ingress.bandwidthLimit), bytes per "
                                "second; no series where it has none (each uplink's capacity bounds it)",
                                labels=["tenant"])
        seen = set()
        for t in sorted(tenants.values(), key=lambda t: t.tenant):
            if t.tenant in seen:
                continue
            seen.add(t.tenant)
            g.add_metric([t.tenant], (t.guarantee_bps or 0) // 8)
            if t.limit_bps is not None:
                lim.add_metric([t.tenant], t.limit_bps // 8)
        yield g
        yield lim
        if not tenants:
            return  # no tenant ingress planned: no receive series (and no read)
        rx_bytes = CounterMetricFamily("shaperd_tenant_receive_bytes", "Bytes the tenant's class on the uplink's "
                                       "ingress IFB received (L2 frame length, as HTB counts)", labels=LABELS)
        rx_pkts = CounterMetricFamily("shaperd_tenant_receive_packets", "Packets the tenant's class on the uplink's "
                                      "ingress IFB received (a GRO aggregate counts once)", labels=LABELS)
        rx_drop = CounterMetricFamily("shaperd_tenant_receive_dropped_packets", "Packets dropped by the tenant's "
                                      "class queue on the uplink's ingress IFB", labels=LABELS)
        for (device, cid), row in sorted(self._counters().items()):
            t = tenants.get(cid)
            if t is None:
                continue  # the default and root classes: no tenant's
            rx_bytes.add_metric([t.tenant, device], row.bytes)
            rx_pkts.add_metric([t.tenant, device], row.packets)
            rx_drop.add_metric([t.tenant, device], row.drops)
        yield rx_bytes
        yield rx_pkts
        yield rx_drop

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


def install(metrics, backend) -> None:
    """Add the ``ingress`` collector to a ``report.metrics.Metrics`` for a running ingress backend."""
    metrics.collectors.collectors["ingress"] = IngressCollector(backend, series_filter=getattr(metrics, "series_filter", None))
