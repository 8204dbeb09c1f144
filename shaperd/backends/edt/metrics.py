"""Prometheus series for the edt data plane: per tenant and device, the rate the controller wrote and what it measured.

Reads the daemon's rate loop (engine/edt_loop.py ``EdtLoop.snapshot``), never
the kernel:

- ``shaperd_tenant_edt_rate_bytes_per_second{tenant,device}``: the departure
  rate in the stamper's map (guarantee headroom included);
- ``shaperd_tenant_edt_measured_bytes_per_second{tenant,device}``: what the
  stamper passed over the controller's last window;
- ``shaperd_pod_edt_rate_bytes_per_second{namespace,pod,tenant,device}``: a
  capped pod's static departure rate in the stamper (min(cap, its tenant's
  limit, capacity)), only for pods with an egress cap (tenant "" for a pod of
  no tenant);
- ``shaperd_pod_edt_measured_bytes_per_second{namespace,pod,tenant,device}``:
  what the stamper passed for that pod over the controller's window (absent
  before a first window);
- ``shaperd_edt_device_controlled{device}``: 1 while the loop steps the
  device, 0 while its maps cannot be read (the error is in the log);
- ``shaperd_edt_refused{device}``: 1 for each device where node.dataplane asked
  for edt but the kernel refused it at apply (a qdisc kind it does not know),
  so htb enforces there until the daemon restarts (the reason is in the log
  line "edt refused; the device goes to htb"; backends/edt/refusals.py).

Values are bytes per second (Prometheus base units), the loop's bit/s divided by 8.
Traffic of no tenant appears as tenant ``(none)``. No loop (no uplink on the
edt data plane): no series. ``install`` adds the collector to a
``report.metrics.Metrics``; nothing else there knows about edt.

Per-tenant series only for the tenants ``series_filter`` wants (report/presence.py: by default those present
on the node; every tenant with ``shaperd run --metrics-all-tenants``).
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class EdtCollector(Collector):
    def __init__(self, loop_source, backends=(), series_filter=None):
        self.wanted = series_filter.wanted if series_filter is not None else (lambda _tenant: True)
        self.loop_source = loop_source  # () -> EdtLoop | None (the daemon starts it on first use)
        # The edt backend keeps its refusals (device -> (ifindex, reason)); read at scrape time.
        self.refusals = next((b for b in backends if getattr(b, "name", "") == "edt" and hasattr(b, "refused")), None)

    def collect(self):
        rate = GaugeMetricFamily("shaperd_tenant_edt_rate_bytes_per_second",
                                 "Departure rate the edt controller wrote for the tenant", labels=["tenant", "device"])
        seen = GaugeMetricFamily("shaperd_tenant_edt_measured_bytes_per_second",
                                 "What the edt stamper passed for the tenant over the controller's window",
                                 labels=["tenant", "device"])
        ok = GaugeMetricFamily("shaperd_edt_device_controlled",
                               "1 while the edt rate controller steps the device, 0 while its maps cannot be read",
                               labels=["device"])
        pod_labels = ["namespace", "pod", "tenant", "device"]
        pod_rate = GaugeMetricFamily("shaperd_pod_edt_rate_bytes_per_second",
                                     "Departure rate of a capped pod's own key in the edt stamper (its cap, "
                                     "within its tenant's limit)", labels=pod_labels)
        pod_seen = GaugeMetricFamily("shaperd_pod_edt_measured_bytes_per_second",
                                     "What the edt stamper passed for a capped pod over the controller's window",
                                     labels=pod_labels)
        loop = self.loop_source()
        if loop is not None:
            devices = set()
            for dev, tenant, _key, r, m in loop.snapshot():
                devices.add(dev)
                if tenant and not self.wanted(tenant):
                    continue  # a tenant with nothing on this node ("(none)", no tenant's traffic, is always kept)
                rate.add_metric([tenant or "(none)", dev], r / 8)  # the loop works in bit/s; base unit bytes
                seen.add_metric([tenant or "(none)", dev], m / 8)
            for dev, ref, tenant, _key, r, m in loop.pod_snapshot():
                ns, _, name = ref.partition("/")
                labels = [ns, name, tenant or "", dev]
                pod_rate.add_metric(labels, r / 8)
                if m is not None:
                    pod_seen.add_metric(labels, m / 8)
            for dev in sorted(devices | set(loop.errors)):
                ok.add_metric([dev], 0 if dev in loop.errors else 1)
        yield rate
        yield seen
        yield pod_rate
        yield pod_seen
        yield ok
        if self.refusals is not None:
            refused = GaugeMetricFamily("shaperd_edt_refused",
                                        "1 where the kernel refused the edt data plane at apply (htb enforces there)",
                                        labels=["device"])
            for dev in sorted(self.refusals.refused(None)):
                refused.add_metric([dev], 1)
            yield refused


def install(metrics, loop_source, backends=()) -> None:
    metrics.collectors.collectors["edt"] = EdtCollector(loop_source, backends, getattr(metrics, "series_filter", None))
